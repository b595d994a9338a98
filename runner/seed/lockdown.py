"""What preparing a base takes away, so that a branch reaches neither the OS nor production.

A base is a copy of production's catalogs: its roles keep their passwords, powers and
memberships, its subscriptions point at the real publisher and its foreign servers' user
mappings hold production credentials. Preparing runs these steps as the bootstrap superuser,
and each returns one note per thing it changed, which the seed prints and the registry keeps.

Invariants once a base is prepared:

- no role but the bootstrap superuser (oid 10) and the branch role can log in, and no role
  but the branch role has a password;
- no role other than a superuser is a member of a superuser or of ``DANGEROUS`` (so no chain
  of ``SET ROLE`` from the branch role leads to a shell or to the server's files), nor has
  ``CREATEROLE`` on Postgres 15 or older (which could grant itself those roles);
- no role other than a superuser may execute the server-side file functions
  (``FILE_FUNCTIONS``), nor holds a privilege on a configuration parameter (Postgres 15+);
- every subscription is disabled, has ``slot_name = NONE`` and no connection string;
- no foreign server has a user mapping (the servers themselves stay, so schemas load);
- no routine outside an extension runs as a superuser for its caller (``SECURITY DEFINER``);
- no event trigger outside an extension is enabled: production's DDL tooling is meaningless in
  a branch, and would run in whichever session runs DDL there, with code (its function, the
  tables and helpers it reaches) the branch role may own or replace;
- the catalogs that held secrets (passwords, connection strings, user mapping options) are
  rewritten, so their old row versions are not left in the base's files.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from pgoverlay.errors import SeedError

# Predefined roles whose members reach the OS (a shell, the server's files) or connect out.
DANGEROUS = (
    "pg_execute_server_program",
    "pg_read_server_files",
    "pg_write_server_files",
    "pg_create_subscription",
)
# Server-side functions on the server's files; EXECUTE is revoked from PUBLIC by default, but a
# production GRANT to an application role would carry into the base.
FILE_FUNCTIONS = (
    "pg_read_file",
    "pg_read_binary_file",
    "pg_ls_dir",
    "pg_stat_file",
    "lo_import",
    "lo_export",
    # adminpack's
    "pg_file_write",
    "pg_file_rename",
    "pg_file_unlink",
    "pg_file_sync",
    "pg_logdir_ls",
)

Conn = psycopg.Connection[Any]


def check_branch_user(conn: Conn, *, branch_user: str, branch_superuser: bool) -> None:
    """Refuse a base whose bootstrap superuser has the branch role's name."""
    if _bootstrap(conn) == branch_user and not branch_superuser:
        raise SeedError(
            f"the source's bootstrap superuser is named {branch_user!r}, the branch login role's "
            "name: branches would log in as a superuser. Set PGOVERLAY_BRANCH_USER to another "
            "name and seed again"
        )


def roles(conn: Conn, *, branch_user: str) -> list[str]:
    """Cluster-wide (roles are shared by every database): memberships, powers, logins."""
    major = conn.info.server_version // 10000
    notes = _memberships(conn, branch_user=branch_user, major=major)
    if major <= 15:
        notes += _createrole(conn)
    notes += _logins(conn, branch_user=branch_user)
    if major >= 15:
        notes += _parameters(conn, branch_user=branch_user)
    return notes


# Grantees lockdown takes a privilege from: PUBLIC, non-superusers, and the branch role even
# when the source made it a superuser (it becomes one when the login role is made). Used with
# the branch role's name as its one parameter; ``r`` is the grantee's pg_roles row.
_NOT_SUPERUSER = "(r.oid IS NULL OR NOT r.rolsuper OR r.rolname = %s)"


def _memberships(conn: Conn, *, branch_user: str, major: int) -> list[str]:
    notes = []
    for role, member, grantor in conn.execute(
        f"""SELECT g.rolname, r.rolname, gr.rolname FROM pg_auth_members a
              JOIN pg_roles g ON g.oid = a.roleid
              JOIN pg_roles r ON r.oid = a.member
              LEFT JOIN pg_roles gr ON gr.oid = a.grantor
             WHERE {_NOT_SUPERUSER} AND (g.rolsuper OR g.rolname = ANY(%s))
             ORDER BY 2, 1""",
        (branch_user, list(DANGEROUS)),
    ).fetchall():
        query = sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(role), sql.Identifier(member))
        if major >= 16 and grantor:  # from 16 on, each grantor's grant is a row of its own
            query = sql.SQL("{} GRANTED BY {} CASCADE").format(query, sql.Identifier(grantor))
        conn.execute(query)
        notes.append(f"role {member}: membership in {role} revoked")
    return notes


def _createrole(conn: Conn) -> list[str]:
    notes = []
    for (role,) in conn.execute(
        "SELECT rolname FROM pg_roles WHERE rolcreaterole AND NOT rolsuper ORDER BY 1"
    ).fetchall():
        conn.execute(sql.SQL("ALTER ROLE {} NOCREATEROLE").format(sql.Identifier(role)))
        notes.append(f"role {role}: CREATEROLE removed (it could grant itself any role)")
    return notes


def _logins(conn: Conn, *, branch_user: str) -> list[str]:
    notes = []
    for role, oid, login, password in conn.execute(
        """SELECT rolname, oid, rolcanlogin, rolpassword IS NOT NULL FROM pg_authid
            WHERE rolname <> %s AND (rolcanlogin OR rolpassword IS NOT NULL)
            ORDER BY 1""",
        (branch_user,),
    ).fetchall():
        if oid == 10:  # the engine logs in as the bootstrap superuser, over a private socket
            if password:
                conn.execute(sql.SQL("ALTER ROLE {} PASSWORD NULL").format(sql.Identifier(role)))
                notes.append(f"role {role}: password removed (bootstrap superuser)")
            continue
        conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN PASSWORD NULL").format(sql.Identifier(role)))
        what = ["login"] * bool(login) + ["password"] * bool(password)
        notes.append(f"role {role}: {' and '.join(what)} removed")
    return notes


def _parameters(conn: Conn, *, branch_user: str) -> list[str]:
    notes = []
    for parameter, grantee in conn.execute(
        f"""SELECT p.parname, r.rolname
              FROM pg_parameter_acl p, aclexplode(p.paracl) a
              LEFT JOIN pg_roles r ON r.oid = a.grantee
             WHERE {_NOT_SUPERUSER}
             GROUP BY 1, 2 ORDER BY 1, 2""",
        (branch_user,),
    ).fetchall():
        conn.execute(
            sql.SQL("REVOKE ALL ON PARAMETER {} FROM {}").format(
                sql.Identifier(*parameter.split(".")), _grantee(grantee)
            )
        )
        notes.append(f"role {grantee or 'PUBLIC'}: privileges on parameter {parameter} revoked")
    return notes


def _grantee(name: str | None) -> sql.Composable:
    """A role, or PUBLIC for None (a role may be named "PUBLIC")."""
    return sql.SQL("PUBLIC") if name is None else sql.Identifier(name)


def database(conn: Conn, *, branch_user: str) -> list[str]:
    """In the connected database: routines that reach the OS or run as a superuser, user
    mappings, subscriptions."""
    dbname = conn.info.dbname
    # First: the statements below are DDL, which fires event triggers.
    notes = _event_triggers(conn)
    notes += _file_functions(conn, branch_user=branch_user)
    notes += _definers(conn)
    notes += _untrusted(conn, branch_user=branch_user)
    notes += _user_mappings(conn)
    notes += _subscriptions(conn)
    return [f"database {dbname}: {note}" for note in notes]


# The connected database's own routines: not in the system schemas, not an extension's.
_OWN = """n.nspname NOT IN ('pg_catalog', 'information_schema')
    AND NOT EXISTS (SELECT 1 FROM pg_depend d
                     WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                       AND d.deptype = 'e')"""
_ROUTINES = """
    FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace
    JOIN pg_language l ON l.oid = p.prolang
    JOIN pg_roles o ON o.oid = p.proowner"""
# Who may execute a routine (no ACL yet means the default: its owner and PUBLIC); ``r`` is the
# grantee's pg_roles row, as _NOT_SUPERUSER expects.
_EXECUTORS = """
    CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
    LEFT JOIN pg_roles r ON r.oid = a.grantee"""


def _event_triggers(conn: Conn) -> list[str]:
    """Disable every enabled event trigger no extension owns (``ALTER EVENT TRIGGER`` fires
    none). An extension's are left as it made them: its own bookkeeping may need them, and a
    trace refuses to begin beside one."""
    notes = []
    for name, event, function in conn.execute(
        """SELECT e.evtname, e.evtevent,
                  format('%I.%I(%s)', n.nspname, p.proname,
                         pg_get_function_identity_arguments(p.oid))
             FROM pg_event_trigger e
             JOIN pg_proc p ON p.oid = e.evtfoid
             JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE e.evtenabled <> 'D'
              AND NOT EXISTS (SELECT 1 FROM pg_depend d
                               WHERE d.classid = 'pg_event_trigger'::regclass
                                 AND d.objid = e.oid AND d.deptype = 'e')
            ORDER BY 1"""
    ).fetchall():
        conn.execute(sql.SQL("ALTER EVENT TRIGGER {} DISABLE").format(sql.Identifier(name)))
        notes.append(f"event trigger {name} ({event}, {function}) disabled")
    return notes


def _revoke_execute(conn: Conn, signature: str, grantee: str | None) -> None:
    # regprocedure's text is Postgres's own quoted spelling of the routine's signature.
    conn.execute(
        sql.SQL("REVOKE EXECUTE ON ROUTINE {} FROM {}").format(
            sql.SQL(signature), _grantee(grantee)
        )
    )


def _file_functions(conn: Conn, *, branch_user: str) -> list[str]:
    notes = []
    for signature, grantee in conn.execute(
        f"""SELECT p.oid::regprocedure::text, r.rolname {_ROUTINES} {_EXECUTORS}
             WHERE p.proname = ANY(%s) AND a.privilege_type = 'EXECUTE' AND p.proacl IS NOT NULL
               AND {_NOT_SUPERUSER}
             ORDER BY 1, 2""",
        (list(FILE_FUNCTIONS), branch_user),
    ).fetchall():
        _revoke_execute(conn, signature, grantee)
        notes.append(f"EXECUTE on {signature} revoked from {grantee or 'PUBLIC'}")
    return notes


def _definers(conn: Conn) -> list[str]:
    """A ``SECURITY DEFINER`` routine a superuser owns runs its body as that superuser, for
    whoever may call it: one that runs dynamic SQL, or resolves a name through a ``search_path``
    its caller can write to, hands the caller a superuser. In the base such routines run as
    their caller (``SECURITY INVOKER``); those of an extension are left as it made them."""
    notes = []
    for signature, owner in conn.execute(
        f"""SELECT p.oid::regprocedure::text, o.rolname {_ROUTINES}
             WHERE p.prosecdef AND o.rolsuper AND {_OWN}
             ORDER BY 1"""
    ).fetchall():
        conn.execute(sql.SQL("ALTER ROUTINE {} SECURITY INVOKER").format(sql.SQL(signature)))
        notes.append(f"{signature} runs as its caller, not as its owner, the superuser {owner}")
    return notes


def _untrusted(conn: Conn, *, branch_user: str) -> list[str]:
    """A routine in an untrusted language (``internal``, ``c``, ``plpython3u`` ...) runs code in
    the server as the pool's OS user: a wrapper of ``pg_read_file`` left open to PUBLIC, or a
    function passing its argument to the OS, would hand that to its caller. Only superusers
    may call them in the base; one a non-superuser owns is given to the bootstrap superuser."""
    notes = []
    for signature, owner, language in conn.execute(
        f"""SELECT p.oid::regprocedure::text, o.rolname, l.lanname {_ROUTINES}
             WHERE NOT l.lanpltrusted AND {_OWN} AND (NOT o.rolsuper OR o.rolname = %s)
             ORDER BY 1""",
        (branch_user,),
    ).fetchall():
        conn.execute(
            sql.SQL("ALTER ROUTINE {} OWNER TO {}").format(
                sql.SQL(signature), sql.Identifier(_bootstrap(conn))
            )
        )
        notes.append(f"{signature} ({language}) given to the bootstrap superuser, from {owner}")
    for signature, language, grantee in conn.execute(
        f"""SELECT p.oid::regprocedure::text, l.lanname, r.rolname {_ROUTINES} {_EXECUTORS}
             WHERE NOT l.lanpltrusted AND {_OWN} AND a.privilege_type = 'EXECUTE'
               AND {_NOT_SUPERUSER}
             ORDER BY 1, 3""",
        (branch_user,),
    ).fetchall():
        _revoke_execute(conn, signature, grantee)
        notes.append(
            f"EXECUTE on {signature} ({language}, runs code in the server) revoked from "
            f"{grantee or 'PUBLIC'}"
        )
    return notes


def _bootstrap(conn: Conn) -> str:
    row = conn.execute("SELECT rolname FROM pg_roles WHERE oid = 10").fetchone()
    assert row is not None  # the bootstrap superuser always exists
    return str(row[0])


def _user_mappings(conn: Conn) -> list[str]:
    notes = []
    for server, user in conn.execute(
        """SELECT srvname, CASE WHEN umuser <> 0 THEN usename END
             FROM pg_user_mappings ORDER BY 1, 2"""
    ).fetchall():
        conn.execute(
            sql.SQL("DROP USER MAPPING FOR {} SERVER {}").format(
                _grantee(user), sql.Identifier(server)
            )
        )
        notes.append(f"user mapping for {user or 'PUBLIC'} on foreign server {server} removed")
    conn.execute("VACUUM FULL pg_catalog.pg_user_mapping")
    return notes


def _subscriptions(conn: Conn) -> list[str]:
    return [
        _subscription(conn, name)
        for (name,) in conn.execute(
            """SELECT subname FROM pg_subscription
                WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                ORDER BY 1"""
        ).fetchall()
    ]


def scrub_shared(conn: Conn) -> None:
    """Rewrite the shared catalogs that held passwords and subscriptions' connection strings:
    an UPDATE leaves the old row version in the table's file until it is rewritten."""
    conn.execute("VACUUM FULL pg_catalog.pg_authid, pg_catalog.pg_subscription")


def _subscription(conn: Conn, name: str) -> str:
    ident = sql.Identifier(name)
    conn.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(ident))
    conn.execute(sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(ident))
    try:
        with conn.transaction():
            # Checked but not used: the subscription can never be enabled without a slot.
            conn.execute(sql.SQL("ALTER SUBSCRIPTION {} CONNECTION ''").format(ident))
    except psycopg.Error as err:
        return (
            f"subscription {name}: disabled, slot_name NONE; its connection string is kept "
            f"({str(err).strip().splitlines()[0]})"
        )
    return f"subscription {name}: disabled, slot_name NONE, connection string removed"
