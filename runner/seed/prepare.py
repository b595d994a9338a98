"""Prepare a freshly seeded base so that branches start from a clean shutdown.

Run Postgres once directly on the base (finishing recovery), shut it down cleanly, confirm the
control file says "shut down", then reset the WAL with the pool's segment size
(``wal_segsize_mb``: 16 MiB, measured in docs/benchmarks.md, "wal"). A masked base is masked while
it runs (:mod:`pgoverlay.runner.mask`); ``pg_resetwal`` then also drops the WAL that carried the
original values. While it runs, :mod:`pgoverlay.runner.seed.lockdown` takes away what would let a
branch reach the OS or production (logins, passwords, dangerous memberships, subscriptions,
user mappings, production's event triggers), the branch login role is made, and the trace's
event triggers (:mod:`pgoverlay.runner.trace.instrument`) are made, switched off. All of it runs
as the copy's bootstrap superuser on the private server, whatever role the source was copied
as.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from pgoverlay.errors import SeedError
from pgoverlay.runner import safefs
from pgoverlay.runner.names import check_hba_name
from pgoverlay.runner.postgres import cluster, roles, sqlerror
from pgoverlay.runner.postgres.tools import Tools
from pgoverlay.runner.proc import OsUser
from pgoverlay.runner.seed import baseconf, lockdown, tablespaces
from pgoverlay.runner.seed.steps import Laps

if TYPE_CHECKING:  # masking (pydantic's rules among it) is imported only to mask
    from pgoverlay.runner import mask
    from pgoverlay.runner.mask.rules import RulesFile

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
    masked: mask.Masked | None = None  # what masking did, when the base is masked
    dropped_databases: tuple[str, ...] = ()  # databases a masked base does not keep
    neutralised: tuple[str, ...] = ()  # what lockdown took away, one note per thing


def start_lsn(datadir: Path) -> str:
    text = safefs.read_small(datadir / "backup_label")  # the Postgres user's copy: no link
    if text is None:
        return ""
    match = _START_LSN.search(text)
    return match.group(1) if match else ""


def cluster_state(install: Tools, datadir: Path, *, owner: OsUser) -> str:
    out = install.run("pg_controldata", ["-D", datadir], timeout=60, user=owner).stdout
    match = _STATE.search(out)
    return match.group(1).strip() if match else "unknown"


def _bootstrap_superuser(running: cluster.Running, candidates: list[str]) -> str:
    """The name of the copy's bootstrap superuser (oid 10), asked as the first of
    ``candidates`` that can log in (the private server trusts every local role): the source's
    user may be a replication role with no other rights, so nothing else is done as it."""
    last: Exception | None = None
    for user in dict.fromkeys(c for c in candidates if c):
        try:
            with psycopg.connect(
                **running.conninfo(user=user), autocommit=True, connect_timeout=10
            ) as conn:
                row = conn.execute("SELECT rolname FROM pg_roles WHERE oid = 10").fetchone()
                return str(row[0]) if row else "postgres"
        except psycopg.OperationalError as err:
            last = err
    raise SeedError(f"cannot connect to the base while preparing it: {last}")


def prepare(
    install: Tools,
    datadir: Path,
    *,
    owner: OsUser,
    scratch: Path,
    login_candidates: list[str],
    database: str,
    branch_user: str,
    branch_superuser: bool,
    wal_segsize_mb: int,
    branch_createrole: bool = False,
    timeout: float,
    masking: RulesFile | None = None,
    mask_progress: mask.Progress | None = None,
    laps: Laps | None = None,
) -> Prepared:
    """Finish recovery, mask (when ``masking`` is given, telling ``mask_progress`` of each
    step), shut down cleanly, reset the WAL with ``wal_segsize_mb`` segments; ``database`` is
    the one branches will serve. Nothing is flushed to disk: the caller syncs the base before
    it declares it ready."""
    laps = Laps() if laps is None else laps
    _edit_files(datadir)
    superuser_tables = 0
    masked: mask.Masked | None = None
    # Nothing is flushed while the base is prepared, neither the copy at the start
    # (recovery_init_sync_method) nor the checkpoints: the seed flushes the base once, before
    # it is declared ready (runner/seed/durable.py), and removes a base a crash cut short.
    options = {"fsync": "off"}
    if tablespaces.has_in_place(datadir):
        options["allow_in_place_tablespaces"] = "on"
    if masking is not None:
        from pgoverlay.runner import mask

        options.update(mask.SERVER_OPTIONS)
    # Every statement below is the engine's own, on its own copy: a failure is a seed failure
    # (the half-made version is removed), said in one line once the server has stopped.
    with (
        sqlerror.wrapped(
            SeedError,
            what="preparing the base failed",
            fix="the copy is removed; fix what the message names (often a role or an extension "
            "of the source) and seed again",
        ),
        cluster.running(
            install, datadir, owner=owner, scratch=scratch, options=options, timeout=timeout
        ) as srv,
    ):
        laps.lap("start")

        def connect(dbname: str) -> psycopg.Connection[tuple[Any, ...]]:
            return psycopg.connect(
                **srv.conninfo(user=superuser, dbname=dbname), autocommit=True, connect_timeout=10
            )

        # Everything after the copy runs as the copy's own superuser, never as the source's user.
        superuser = _bootstrap_superuser(srv, [*login_candidates, "postgres", owner.name])
        check_hba_name(superuser)
        with connect("postgres") as conn:
            databases, dropped, neutralised, size = _cluster_wide(
                conn,
                connect,
                database=database,
                masking=masking,
                branch_user=branch_user,
                branch_superuser=branch_superuser,
            )
        laps.lap("lockdown: roles")
        for dbname in databases:
            with connect(dbname) as conn:
                neutralised += lockdown.database(conn, branch_user=branch_user)
        laps.lap("lockdown: databases")
        if database in databases:
            with connect(database) as conn:
                superuser_tables, masked, masked_size = _in_served_database(
                    conn,
                    lambda: connect(database),
                    masking=masking,
                    mask_progress=mask_progress,
                    timeout=timeout,
                    datadir=datadir,
                    branch_user=branch_user,
                    branch_superuser=branch_superuser,
                    branch_createrole=branch_createrole,
                )
                size = size if masked_size is None else masked_size
        laps.lap("login role, trace triggers")
        for dbname in databases[:1]:  # shared catalogs: from any one database, once
            with connect(dbname) as conn:
                lockdown.scrub_shared(conn)
        laps.lap("lockdown: shared catalogs")
    laps.lap("stop")
    state = cluster_state(install, datadir, owner=owner)
    if state != "shut down":
        raise SeedError(
            f"the base's control file says {state!r} after a clean stop, expected 'shut down'; "
            "the base was not prepared"
        )
    laps.lap("controldata")
    if masked is not None:
        from pgoverlay.runner import mask

        mask.finish(datadir, masked)
    install.run(
        "pg_resetwal", [f"--wal-segsize={wal_segsize_mb}", "-D", datadir], timeout=600, user=owner
    )
    laps.lap("resetwal")
    return Prepared(
        superuser=superuser,
        size_bytes=size,
        databases=databases,
        superuser_tables=superuser_tables,
        masked=masked,
        dropped_databases=tuple(dropped),
        neutralised=tuple(neutralised),
    )


def _edit_files(datadir: Path) -> None:
    """What is done to the copy's files before its server starts: the files of a standby or
    of a running server removed, the configuration made self-contained and its secrets taken
    out."""
    for name in _DROP:
        (datadir / name).unlink(missing_ok=True)
    for warning in baseconf.confine_includes(datadir):
        log.warning("%s", warning)
    for note in baseconf.remove_secret_settings(datadir):
        log.info("%s", note)


def _cluster_wide(
    conn: psycopg.Connection[tuple[Any, ...]],
    connect: Callable[[str], psycopg.Connection[tuple[Any, ...]]],
    *,
    database: str,
    masking: RulesFile | None,
    branch_user: str,
    branch_superuser: bool,
) -> tuple[list[str], list[str], list[str], int]:
    """What is done once for the whole cluster, from the ``postgres`` database: the checks,
    the other databases dropped when masking, the roles locked down. The databases branches
    may connect to, those dropped, what was neutralised, and the cluster's size in bytes."""
    lockdown.check_branch_user(conn, branch_user=branch_user, branch_superuser=branch_superuser)
    if conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,):
        raise SeedError("the base is still in recovery after start; it cannot be prepared")
    databases = [
        str(r[0])
        for r in conn.execute("SELECT datname FROM pg_database WHERE datallowconn ORDER BY datname")
    ]
    dropped: list[str] = []
    if masking is not None:
        if database not in databases:
            raise SeedError(
                f"database {database!r} from the DSN is not in the base (it has: "
                f"{', '.join(databases)}), so it cannot be masked; fix dbname in the DSN"
            )
        from pgoverlay.runner import mask  # masking's rules and SQL: only to mask

        dropped = mask.drop_other_databases(conn, connect, keep=database)
        databases = [d for d in databases if d not in dropped]
    neutralised = lockdown.roles(conn, branch_user=branch_user)
    return databases, dropped, neutralised, _cluster_size(conn)


def _cluster_size(conn: psycopg.Connection[tuple[Any, ...]]) -> int:
    row = conn.execute("SELECT sum(pg_database_size(oid))::bigint FROM pg_database").fetchone()
    return int(row[0] or 0) if row else 0


def _in_served_database(
    conn: psycopg.Connection[tuple[Any, ...]],
    lane: Callable[[], psycopg.Connection[tuple[Any, ...]]],
    *,
    masking: RulesFile | None,
    mask_progress: mask.Progress | None,
    timeout: float,
    datadir: Path,
    branch_user: str,
    branch_superuser: bool,
    branch_createrole: bool,
) -> tuple[int, mask.Masked | None, int | None]:
    """What is done in the database branches serve: its tables a superuser owns counted, the
    masking (``lane`` opens another connection to it), the login role and the trace's event
    triggers. The superuser's tables, what masking did, and the cluster's size after masking
    (None when nothing was masked)."""
    superuser_tables = roles.superuser_owned_tables(conn)
    masked: mask.Masked | None = None
    size: int | None = None
    if masking is not None:
        from pgoverlay.runner import mask

        masked = mask.apply(
            conn,
            masking.rules,
            rules_name=masking.name,
            statement_timeout=timeout,
            progress=mask_progress,
            lane=lane,
            datadir=datadir,
        )
        size = _cluster_size(conn)  # masking rewrote tables: measure again
    # Done once here rather than in every branch: the login role, its grants and the ledger
    # schema. A branch then only sets its own password.
    roles.set_login(
        conn,
        user=branch_user,
        password=secrets.token_urlsafe(32),
        superuser=branch_superuser,
        createrole=branch_createrole,
    )
    # The trace's event triggers, disabled: a trace only switches them on and off, so it never
    # runs DDL in a branch (see runner/trace/instrument.py).
    from pgoverlay.runner.trace import instrument

    instrument.create(conn)
    return superuser_tables, masked, size
