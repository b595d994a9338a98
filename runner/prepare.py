"""Prepare a freshly seeded base so that branches start from a clean shutdown.

Run Postgres once directly on the base (finishing recovery), shut it down cleanly, confirm the
control file says "shut down", then shrink the WAL segment size so a branch's first write
copies 1 MiB of WAL instead of 16 MiB (DESIGN.md facts 4-6).
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from pgoverlay.errors import SeedError
from pgoverlay.runner import baseconf, cluster, proc, roles, tablespaces
from pgoverlay.runner.pgbin import PgInstall
from pgoverlay.runner.proc import OsUser

log = logging.getLogger(__name__)

_STATE = re.compile(r"^Database cluster state:\s+(.+)$", re.MULTILINE)
_START_LSN = re.compile(r"^START WAL LOCATION:\s+(\S+)", re.MULTILINE)
# Files a base must not carry into branches: they would make a branch a standby, or are
# leftovers of the source's running server.
_DROP = ("standby.signal", "recovery.signal", "postmaster.pid", "postmaster.opts", "recovery.conf")


@dataclass(frozen=True)
class Prepared:
    superuser: str
    size_bytes: int
    databases: list[str]
    superuser_tables: int  # tables, views, sequences owned by a superuser in the branch database


def start_lsn(datadir: Path) -> str:
    label = datadir / "backup_label"
    if not label.exists():
        return ""
    match = _START_LSN.search(label.read_text())
    return match.group(1) if match else ""


def cluster_state(install: PgInstall, datadir: Path, *, owner: OsUser) -> str:
    out = proc.run([install.tool("pg_controldata"), "-D", datadir], timeout=60, user=owner).stdout
    match = _STATE.search(out)
    return match.group(1).strip() if match else "unknown"


def _connect_any(
    running: cluster.Running, candidates: list[str]
) -> psycopg.Connection[tuple[Any, ...]]:
    last: Exception | None = None
    for user in dict.fromkeys(c for c in candidates if c):
        try:
            return psycopg.connect(
                **running.conninfo(user=user),
                autocommit=True,
                connect_timeout=10,
            )
        except psycopg.OperationalError as err:
            last = err
    raise SeedError(f"cannot connect to the base while preparing it: {last}")


def prepare(
    install: PgInstall,
    datadir: Path,
    *,
    owner: OsUser,
    scratch: Path,
    login_candidates: list[str],
    database: str,
    branch_user: str,
    branch_superuser: bool,
    wal_segsize_mb: int,
    timeout: float,
) -> Prepared:
    """Finish recovery, shut down cleanly, shrink WAL segments; ``database`` is the one
    branches will serve."""
    for name in _DROP:
        (datadir / name).unlink(missing_ok=True)
    for warning in baseconf.confine_includes(datadir):
        log.warning("%s", warning)
    superuser_tables = 0
    options = {"allow_in_place_tablespaces": "on"} if tablespaces.has_in_place(datadir) else {}
    with cluster.running(
        install, datadir, owner=owner, scratch=scratch, options=options, timeout=timeout
    ) as srv:
        with _connect_any(srv, [*login_candidates, "postgres", owner.name]) as conn:
            row = conn.execute("SELECT rolname FROM pg_roles WHERE oid = 10").fetchone()
            superuser = str(row[0]) if row else "postgres"
            size_row = conn.execute(
                "SELECT sum(pg_database_size(oid))::bigint FROM pg_database"
            ).fetchone()
            databases = [
                str(r[0])
                for r in conn.execute(
                    "SELECT datname FROM pg_database WHERE datallowconn ORDER BY datname"
                )
            ]
            if conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,):
                raise SeedError("the base is still in recovery after start; it cannot be prepared")
        if database in databases:
            with psycopg.connect(
                **srv.conninfo(user=superuser, dbname=database), autocommit=True, connect_timeout=10
            ) as conn:
                superuser_tables = roles.superuser_owned_tables(conn)
                # Done once here rather than in every branch: the login role, its grants and the
                # ledger schema. A branch then only sets its own password.
                roles.set_login(
                    conn,
                    user=branch_user,
                    password=secrets.token_urlsafe(32),
                    superuser=branch_superuser,
                )
    state = cluster_state(install, datadir, owner=owner)
    if state != "shut down":
        raise SeedError(
            f"the base's control file says {state!r} after a clean stop, expected 'shut down'; "
            "the base was not prepared"
        )
    proc.run(
        [install.tool("pg_resetwal"), f"--wal-segsize={wal_segsize_mb}", "-D", datadir],
        timeout=600,
        user=owner,
    )
    return Prepared(
        superuser=superuser,
        size_bytes=int(size_row[0] or 0) if size_row else 0,
        databases=databases,
        superuser_tables=superuser_tables,
    )
