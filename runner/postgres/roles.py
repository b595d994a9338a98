"""The branch's login role: who it is and what it may do.

Migrations run as this role, so by default it is not a superuser (a superuser can run programs
on the runner with ``COPY ... TO PROGRAM``). It may read and write all data, and it is made a
member of every non-superuser role that owns objects in the branch's database, so it can alter
what those roles own, as a deploy user would.

It never has ``CREATEROLE`` on Postgres 15 or older: there, ``CREATEROLE`` may grant any
non-superuser role, ``pg_execute_server_program`` included. From 16 on, ``CREATEROLE`` only
administers the roles it creates, and the role has it when ``createrole`` asks. The roles it is
granted cannot lead it further: :mod:`pgoverlay.runner.seed.lockdown` has removed, in the base,
every membership of a non-superuser in a superuser or a dangerous predefined role.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import string
from typing import Any

import psycopg
from psycopg import sql

from pgoverlay.runner.names import LEDGER_SCHEMA, SCRAM_ITERATIONS

# Predefined roles a deploy user needs (pg_checkpoint exists from Postgres 15 on).
PREDEFINED = ["pg_read_all_data", "pg_write_all_data", "pg_checkpoint"]

# Roles that own user objects (not system catalogs) in the current database.
_OWNERS = """
SELECT DISTINCT r.rolname, r.rolsuper
  FROM (SELECT c.relowner AS owner FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%'
        UNION SELECT nspowner FROM pg_namespace
         WHERE nspname <> 'information_schema' AND nspname NOT LIKE 'pg\\_%'
        UNION SELECT p.proowner FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%'
        UNION SELECT datdba FROM pg_database WHERE datname = current_database()) o
  JOIN pg_roles r ON r.oid = o.owner
 WHERE r.rolname NOT LIKE 'pg\\_%'
 ORDER BY 1
"""


def owners(conn: psycopg.Connection[Any]) -> list[tuple[str, bool]]:
    """(role, is superuser) for every role owning user objects in the connected database."""
    return [(str(name), bool(sup)) for name, sup in conn.execute(_OWNERS).fetchall()]


def superuser_owned_tables(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        """SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            JOIN pg_roles r ON r.oid = c.relowner
           WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S')
             AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%'
             AND r.rolsuper"""
    ).fetchone()
    return int(row[0]) if row else 0


def _power(conn: psycopg.Connection[Any], *, superuser: bool, createrole: bool) -> sql.SQL:
    may_create_roles = createrole and conn.info.server_version >= 160000
    if superuser:
        return sql.SQL("SUPERUSER")
    return sql.SQL(
        "NOSUPERUSER CREATEDB {} NOREPLICATION NOBYPASSRLS".format(
            "CREATEROLE" if may_create_roles else "NOCREATEROLE"
        )
    )


def verifier(conn: psycopg.Connection[Any], *, user: str, password: str) -> str:
    """The SCRAM verifier of ``password``, computed here: the password never reaches the
    server, nor a log line of it."""
    return conn.pgconn.encrypt_password(password.encode(), user.encode(), b"scram-sha-256").decode()


_TOKEN_ALPHABET = frozenset(string.ascii_letters + string.digits + "-_")


def scram_verifier(
    password: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS
) -> str:
    """The SCRAM-SHA-256 verifier of ``password`` (RFC 5802, in Postgres's stored form), without
    a connection: a claim computes it while the engine's connection is being made, and
    hashlib's PBKDF2 lets other threads run meanwhile.

    Only for the passwords pgoverlay makes (``secrets.token_urlsafe``): for them SASLprep,
    which Postgres applies first, changes nothing; any other password goes to ``verifier``."""
    if not password or not set(password) <= _TOKEN_ALPHABET:
        raise ValueError("scram_verifier takes only URL-safe token passwords")
    salt = os.urandom(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    b64 = base64.b64encode
    return (
        f"SCRAM-SHA-256${iterations}:{b64(salt).decode()}"
        f"${b64(stored_key).decode()}:{b64(server_key).decode()}"
    )


def set_password(
    conn: psycopg.Connection[Any],
    *,
    user: str,
    secret: str | None,
    superuser: bool,
    createrole: bool = False,
    flush: bool = True,
) -> None:
    """Give existing role ``user`` its rights and the password whose SCRAM verifier is
    ``secret`` (None: no password, so no login over a branch's TCP port, where pg_hba.conf
    admits it with SCRAM only), in one statement: one round trip. The session must not log
    statements (the engine's connections set ``log_statement`` to ``none``).

    Without ``flush`` the commit does not wait for the WAL to reach the disk (Postgres's WAL
    writer writes it a moment later): a server that crashes first comes back with the role as
    it was before, so only for a change whatever restarts the server makes again."""
    if secret is not None and not secret.startswith("SCRAM-SHA-256$"):
        raise ValueError("set_password takes a SCRAM verifier, never a password")
    alter = sql.SQL("ALTER ROLE {} LOGIN {} PASSWORD {}").format(
        sql.Identifier(user),
        _power(conn, superuser=superuser, createrole=createrole),
        sql.NULL if secret is None else sql.Literal(secret),
    )
    if not flush:
        # One simple query: its statements share one implicit transaction, which SET LOCAL
        # applies to, in the same round trip.
        alter = sql.SQL("SET LOCAL synchronous_commit = off; {}").format(alter)
    conn.execute(alter)


def set_login(
    conn: psycopg.Connection[Any],
    *,
    user: str,
    password: str,
    superuser: bool,
    createrole: bool = False,
    refresh: bool = True,
) -> None:
    """Create or update ``user`` with ``password``; only a SCRAM verifier is sent.

    Seeding prepares the role, its grants and the ledger schema in the base once; a branch
    then passes ``refresh=False`` and only sets its password (one catalog row), unless the
    role is missing (a base prepared for another user name). ``createrole`` is honoured on
    Postgres 16 and newer only.
    """
    secret = verifier(conn, user=user, password=password)
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,)).fetchone()
    verb = sql.SQL("ALTER ROLE" if exists else "CREATE ROLE")
    power = _power(conn, superuser=superuser, createrole=createrole)
    with conn.transaction():
        conn.execute("SET LOCAL log_statement = 'none'")
        conn.execute(
            sql.SQL("{} {} LOGIN {} PASSWORD {}").format(
                verb, sql.Identifier(user), power, sql.Literal(secret)
            )
        )
        if exists and not refresh:
            return
        # The migration ledger's schema, owned by the branch user, whoever owns the database.
        # Not named like the user: "$user" leads search_path, and new tables would land there.
        conn.execute(
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
                sql.Identifier(LEDGER_SCHEMA), sql.Identifier(user)
            )
        )
        if superuser:
            return
        for granted in conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s) ORDER BY 1", (PREDEFINED,)
        ).fetchall():
            conn.execute(
                sql.SQL("GRANT {} TO {}").format(sql.Identifier(granted[0]), sql.Identifier(user))
            )
        for owner, owner_is_superuser in owners(conn):
            if not owner_is_superuser and owner != user:
                conn.execute(
                    sql.SQL("GRANT {} TO {}").format(sql.Identifier(owner), sql.Identifier(user))
                )
