"""Blocking measured on live traffic: while a migration runs, light probe queries on the
existing tables it touches say how long reads and writes were really kept waiting.

For each probed table two sessions of the branch's role (``application_name``
``pgoverlay-probe``) run a few queries a second: a point read by ``ctid`` (a TID scan: no
statistics counter moves, so the trace's scan analysis does not see the probe), and a write
probe, ``LOCK TABLE ... IN ROW EXCLUSIVE MODE`` (the lock an ``UPDATE`` takes) then ``SELECT
... FOR NO KEY UPDATE`` of rows spread over the table (``spread_pages``, ``probe_rows``), in one
``DO`` statement: it changes no data and fires no trigger, and it waits on the row lock of a
migration that updated or deleted one of those rows. A monitor session
looks every ``MONITOR_PERIOD`` at which probe queries still running wait on a lock; a probe
query counts as blocked when the monitor saw it waiting, or when it ran out of its
``lock_timeout``.

Invariants (what a hostile migration can and cannot make the probe do):

- The probe runs as the branch's role, like the pull request's own SQL: it gains no privilege.
- Every probe statement has a ``lock_timeout`` and a ``statement_timeout`` under half the
  server's ``deadlock_timeout``: a probe never stays in a wait cycle long enough for the
  deadlock detector to pick the migration as its victim. A probe waits for a table lock
  holding nothing on that table; a write probe waits for a row lock holding ROW EXCLUSIVE, so
  that wait is cut at ``probers.ROW_LOCK_MS``: a migration that asks for a stronger lock meanwhile
  waits on the probe no longer than that. A blocked probe times out and asks again at once, so
  a long block is seen as a run of blocked probes (its length is the worst wait,
  ``blocking.summarise``).
- A statement the migration's code could make slow (a row security policy, a table turned
  into a view) is bounded by those timeouts, and by the monitor, which cancels a probe query
  that outlives its timeout (the code it runs could have changed the session's settings).
- The probe's sessions resolve names in ``pg_catalog`` only (``search_path`` pinned) and
  name tables through ``psycopg.sql.Identifier``.
- Every session is closed in a ``finally`` of its own thread (``probers``); ``stop`` ends them
  all, waiting a bounded time, and never raises. A probe that cannot start or breaks says so in
  a note, and the migration runs on as it would without it.

The queue simulation (``Options.long_transaction``): before the migration starts, one more
session reads each probed table in a transaction held that long, as a long report query in
production would. A migration that needs a lock conflicting with it waits behind it, and the
probes' reads queue behind the migration: how long they queued is the table's
``reads_queued``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgoverlay.action.insight.blocking import (
    HEADROOM,
    Kind,
    Sample,
    Table,
    choose,
    classify,
    summarise,
    tables_within,
)
from pgoverlay.action.insight.model import TableBlocking
from pgoverlay.action.insight.probers import (
    Holder,
    Limits,
    Prober,
    cancel,
    read_query,
    reason,
    write_query,
)
from pgoverlay.runner.service.views import Connection

log = logging.getLogger(__name__)

APPLICATION = "pgoverlay-probe"
PERIOD = 0.25  # seconds between the starts of one prober's queries: 4 a second
MONITOR_PERIOD = 0.05  # how often the monitor looks for probe sessions waiting on a lock
IN_FLIGHT = 0.02  # a probe query running this long may be waiting: the monitor asks
MAX_TABLES = 5  # tables probed per migration (two sessions each)
DISCOVER_PERIOD = 0.2  # how often the monitor looks for the tables a migrate command locks
CONNECT_TIMEOUT = 10
# The rows a write probe locks, spread over the table: the first ROWS_PER_PAGE live rows of
# PAGES pages evenly spaced over it, found by a TID scan (no sequential scan is counted against
# the table). A migration that locks one row in ten (``DELETE ... WHERE id % 10 = 0``) holds
# one of any ten rows written one after another. Only pages of the table's first 1 GiB file
# are chosen: a probe's row lock writes the row's page, and the branch's layer already holds
# that file once the probe locked its first row.
PAGES = 8
ROWS_PER_PAGE = 10
_SEGMENT_PAGES = 131072  # 1 GiB of 8 KiB pages: the first of a table's files
_OFFSETS = range(1, 292)  # every tuple an 8 KiB heap page can hold


def spread_pages(pages: int, *, count: int = PAGES) -> list[int]:
    """``count`` page numbers evenly spaced over a table of ``pages`` pages (its first file's;
    the first ``count`` pages when it has none on record, as a table never analysed)."""
    within = min(max(pages, 0), _SEGMENT_PAGES)
    if within <= count:
        return list(range(count))
    return sorted({within * k // count for k in range(count)})


def probe_rows(found: Sequence[str], *, per_page: int = ROWS_PER_PAGE) -> list[str]:
    """Of live rows' tids (in order), the first ``per_page`` of each page."""
    kept: list[str] = []
    taken: dict[str, int] = {}
    for tid in found:
        page = tid.strip("()").split(",")[0]
        if taken.get(page, 0) < per_page:
            taken[page] = taken.get(page, 0) + 1
            kept.append(tid)
    return kept


@dataclass(frozen=True, kw_only=True)
class Options:
    """How to probe: where (the branch, as its role), how often, and the queue simulation."""

    target: Connection
    long_transaction: float = 0.0  # seconds; 0: no queue simulation
    period: float = PERIOD
    max_tables: int = MAX_TABLES


@dataclass(frozen=True)
class Outcome:
    """What the probe of one migration saw: per table, and the sessions to leave out of the
    trace."""

    blocking: list[TableBlocking]
    notes: list[str]
    pids: frozenset[int]
    long_transaction: float = 0.0


# -- the sessions ---------------------------------------------------------------------------


# Tables and materialized views (a materialized view's rows cannot be locked: no writes).
_TABLES = """
SELECT c.oid::pg_catalog.int8, n.nspname, c.relname, c.relpages::pg_catalog.int8,
       pg_catalog.has_table_privilege(c.oid, 'SELECT'),
       c.relkind OPERATOR(pg_catalog.=) 'r' AND pg_catalog.has_table_privilege(c.oid, 'UPDATE')
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'm')
"""
# Every index's name and its table: a statement that names only an index (DROP INDEX,
# REINDEX INDEX) locks its table.
_INDEXES = """
SELECT c.relname, i.indrelid::pg_catalog.int8
  FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid >= 16384::pg_catalog.oid
"""
# Connections still free on the server (less those kept for superusers), the role's own
# connection limit (-1: none) and how many sessions it has.
_ROOM = """
SELECT pg_catalog.current_setting('max_connections')::pg_catalog.int4
       - pg_catalog.current_setting('superuser_reserved_connections')::pg_catalog.int4
       - (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity
           WHERE backend_type = 'client backend')::pg_catalog.int4,
       (SELECT rolconnlimit FROM pg_catalog.pg_roles WHERE rolname = CURRENT_USER),
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity
         WHERE usename = CURRENT_USER)::pg_catalog.int4
"""
# Tables and materialized views the role's other sessions (the migration's) hold or wait for a
# lock on, or on one of their indexes (the index's table is what its lock stops).
_LOCKED = """
SELECT DISTINCT c.oid::pg_catalog.int8, n.nspname, c.relname, c.relpages::pg_catalog.int8,
       pg_catalog.has_table_privilege(c.oid, 'SELECT'),
       c.relkind OPERATOR(pg_catalog.=) 'r' AND pg_catalog.has_table_privilege(c.oid, 'UPDATE')
  FROM pg_catalog.pg_locks l
  JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
  LEFT JOIN pg_catalog.pg_index i ON i.indexrelid = l.relation
  JOIN pg_catalog.pg_class c ON c.oid = COALESCE(i.indrelid, l.relation)
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE l.locktype = 'relation' AND c.relkind IN ('r', 'm')
   AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                      WHERE d.datname = pg_catalog.current_database())
   AND a.usename = CURRENT_USER AND NOT l.pid = ANY(%s)
"""
_WAITING = """
SELECT pid FROM pg_catalog.pg_stat_activity
 WHERE pid = ANY(%s) AND wait_event_type = 'Lock'
"""


class Probe:
    """The probe of one migration: ``start`` before it runs, ``stop`` after. Never raises a
    database error: problems become notes of the outcome."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self._halt = threading.Event()
        self._probers: list[Prober] = []
        self._holder: Holder | None = None
        self._monitor: threading.Thread | None = None
        self._sightings: dict[int, list[float]] = {}
        self._pids: set[int] = set()
        self._notes: list[str] = []
        self._limits: Limits | None = None
        self._lock = threading.Lock()  # the monitor adds probers while they run
        self._watched: set[int] = set()  # the tables probed (oids)
        self._room = 0  # tables a migrate command's probe may still add as it locks them
        self._discovering = False  # a migrate command's: it probes the tables it locks

    def _open(self, options: str) -> psycopg.Connection[Any]:
        # As the role it logs in as: a job's credential on another runner starts its sessions
        # as the branch role (runner/branch/grants.py), and the probe looks for the sessions
        # of the one it logged in as (the migration's: pg_stat_activity's usename).
        conn = psycopg.connect(
            **self.options.target.connect_kwargs(),
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name=APPLICATION,
            options=f"-c role=none {options}",
        )
        self._pids.add(conn.info.backend_pid)
        return conn

    def start(self, *, text: str | None) -> None:
        """Open the sessions and start probing the tables ``text`` names (without a text, those
        the command locks, as it locks them); with a long transaction, return once it holds
        the tables named."""
        try:
            tables = self._start(text)
        except psycopg.Error as err:
            self._notes.append(f"the probe did not start: {reason(err)}")
            return
        if tables and self.options.long_transaction > 0:
            self._hold(tables)

    def _start(self, text: str | None) -> list[Table]:
        monitor = self._open("-c statement_timeout=5000 -c lock_timeout=2000")
        probers: list[Prober] = []
        try:
            path = monitor.execute("SELECT pg_catalog.current_schemas(false)").fetchone()
            deadlock = monitor.execute(
                "SELECT pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval"
            ).fetchone()
            monitor.execute("SET search_path = pg_catalog, pg_temp")
            rows = monitor.execute(_TABLES).fetchall() if text is not None else []
            indexes = monitor.execute(_INDEXES).fetchall() if text is not None else []
            room = monitor.execute(_ROOM).fetchone()
            assert path is not None and deadlock is not None and room is not None
            self._limits = Limits(int(deadlock[0].total_seconds() * 1000))
            # A migrate command's statements are not known before it runs: its tables are
            # those its sessions lock, found as it runs (``_discover``).
            discovering = text is None
            wanted = choose(
                [Table(int(r[0]), r[1], r[2], int(r[3]), bool(r[4]), bool(r[5])) for r in rows],
                text=text,
                search_path=list(path[0]),
                limit=self.options.max_tables,
                indexes=[(str(r[0]), int(r[1])) for r in indexes],
            ) if text is not None else []  # fmt: skip
            budget = tables_within(
                free=int(room[0]),
                role_limit=int(room[1]),
                role_used=int(room[2]),
                holder=self.options.long_transaction > 0,
            )
            tables = wanted[:budget]
            if len(tables) < len(wanted):
                self._notes.append(
                    f"{len(wanted) - len(tables)} of the {len(wanted)} tables to probe were "
                    f"left out (the smallest), to leave {HEADROOM} of the branch's connections "
                    "free for the migration"
                )
            if discovering:
                self._room = min(self.options.max_tables, budget) - len(tables)
                self._discovering = True
            for t in tables:
                probers += self._probers_for(monitor, t)
        except BaseException:
            monitor.close()
            for p in probers:
                p.conn.close()
            raise
        if not probers and self._room <= 0:
            monitor.close()
            return []
        self._probers = probers
        self._watched = {t.oid for t in tables}
        self._monitor = threading.Thread(
            target=self._watch, args=(monitor,), name="probe-monitor", daemon=True
        )
        self._monitor.start()
        for p in probers:
            p.start()
        # The migration starts once every probe has run: a block from its first statement on
        # is seen (a bounded wait; the probes' own first queries take milliseconds).
        deadline = time.monotonic() + CONNECT_TIMEOUT
        for p in probers:
            p.ready.wait(max(0.0, deadline - time.monotonic()))
        return tables

    def _probers_for(self, monitor: psycopg.Connection[Any], t: Table) -> list[Prober]:
        """The read and the write prober of ``t``, each with a session of its own (not yet
        started; their sessions closed if one cannot be opened)."""
        assert self._limits is not None
        limits = self._limits
        tids = self._rows_of(monitor, t)
        queries: list[tuple[Kind, sql.Composed]] = [("read", read_query(t, tids[0]))]
        if t.writable:
            queries.append(("write", write_query(t, tids, monitor, row_lock_ms=limits.row_lock_ms)))
        found: list[Prober] = []
        try:
            for kind, query in queries:
                conn = self._open(limits.options())
                found.append(
                    Prober(
                        conn, query, kind=kind, period=self.options.period, table=t,
                        halt=self._halt,
                    )
                )  # fmt: skip
        except BaseException:
            for p in found:
                p.conn.close()
            raise
        return found

    def _discover(self, monitor: psycopg.Connection[Any]) -> None:
        """A migrate command's tables, as its sessions lock them: probe each new one while
        there is room (its probes start late, with the lock already taken)."""
        rows = monitor.execute(_LOCKED, (sorted(self._pids),)).fetchall()
        found = [Table(int(r[0]), r[1], r[2], int(r[3]), bool(r[4]), bool(r[5])) for r in rows]
        for t in choose(found, text=None, search_path=[], limit=len(found)):
            if self._room <= 0:
                return
            if t.oid in self._watched:
                continue
            try:
                new = self._probers_for(monitor, t)
            except psycopg.OperationalError as err:
                self._notes.append(f"{t.relation} was locked but not probed: {reason(err)}")
                self._room = 0
                return
            with self._lock:
                if self._halt.is_set():
                    for p in new:
                        p.conn.close()
                    return
                self._probers = [*self._probers, *new]
            self._watched.add(t.oid)
            self._room -= 1
            for p in new:
                p.start()

    def _hold(self, tables: Sequence[Table]) -> None:
        """Open the queue simulation's long transaction, and wait until it holds ``tables``."""
        assert self._limits is not None
        idle_ms = int((self.options.long_transaction + 30) * 1000)
        try:
            conn = self._open(
                f"{self._limits.options()} -c idle_in_transaction_session_timeout={idle_ms}"
            )
        except psycopg.Error as err:
            self._notes.append(f"the queue simulation did not start: {reason(err)}")
            return
        holder = self._holder = Holder(
            conn, tables, seconds=self.options.long_transaction, halt=self._halt
        )
        holder.start()
        holder.holding.wait(CONNECT_TIMEOUT)

    def _rows_of(self, monitor: psycopg.Connection[Any], t: Table) -> list[str]:
        """The rows the write probe locks (``probe_rows`` of the pages ``spread_pages`` picks;
        the read probe reads the first), ['(0,1)'] when the table has none: looked for by a TID
        scan, which moves no statistics counter, then, in a table whose chosen pages hold no
        live row, by a TID range scan for the first (the table's tuples-read counter then
        counts the one row it returns; no scan is counted)."""
        ident = t.identifier()
        listed = sql.SQL(
            "SELECT ctid::pg_catalog.text FROM {} WHERE ctid OPERATOR(pg_catalog.=) "
            "ANY(%s::pg_catalog.tid[])"
        ).format(ident)
        ranged = sql.SQL(
            "SELECT ctid::pg_catalog.text FROM {} WHERE ctid OPERATOR(pg_catalog.>=) "
            "'(0,1)'::pg_catalog.tid LIMIT 1"
        ).format(ident)
        candidates = [f"({page},{offset})" for page in spread_pages(t.pages) for offset in _OFFSETS]
        try:
            with monitor.transaction():
                monitor.execute("SET LOCAL enable_seqscan = off")
                monitor.execute("SET LOCAL lock_timeout = 200")  # a locked table: '(0,1)'
                rows = [str(r[0]) for r in monitor.execute(listed, (candidates,)).fetchall()]
                if not rows:
                    rows = [str(r[0]) for r in monitor.execute(ranged).fetchall()]
        except (
            psycopg.errors.InsufficientPrivilege,
            psycopg.errors.QueryCanceled,
            psycopg.errors.LockNotAvailable,
        ) as err:
            self._notes.append(f"no row of {t.relation} to probe writes on: {reason(err)}")
            return ["(0,1)"]
        return probe_rows(rows) or ["(0,1)"]

    def _watch(self, conn: psycopg.Connection[Any]) -> None:
        """The monitor: every MONITOR_PERIOD, which probe queries in flight for longer than
        IN_FLIGHT wait on a lock (the server is asked only then: a probe answered at once
        costs no monitor query, and no line in the server's log); and the watchdog that cancels
        a probe query that outlives its timeout."""
        assert self._limits is not None
        overdue = self._limits.statement_ms / 1000 + 1.0
        looked = 0.0
        try:
            while not self._halt.is_set():
                sent = time.monotonic()
                if self._room > 0 and sent - looked >= DISCOVER_PERIOD:
                    looked = sent
                    self._discover(conn)
                probers = self._probers
                busy = [
                    p.pid
                    for p in probers
                    if (started := p.started) is not None and sent - started >= IN_FLIGHT
                ]
                if busy:
                    waiting = conn.execute(_WAITING, (busy,), prepare=True).fetchall()
                    at = (sent + time.monotonic()) / 2
                    for (pid,) in waiting:
                        self._sightings.setdefault(int(pid), []).append(at)
                at = time.monotonic()
                for p in probers:
                    started = p.started
                    if started is not None and at - started > overdue:
                        cancel(p.conn)
                # The monitor's one wait: until its next look, or a stop.
                self._halt.wait(max(0.0, sent + MONITOR_PERIOD - time.monotonic()))
        except psycopg.Error as err:
            self._notes.append(f"the probe's monitor stopped: {reason(err)}")
        finally:
            conn.close()

    def _cancel_running(self) -> None:
        for p in self._probers:
            if p.started is not None and p.is_alive():
                cancel(p.conn)

    def stop(self) -> Outcome:
        """End every session (waiting at most a few seconds) and say what was seen: the next
        mark waits for the role's sessions to end."""
        with self._lock:
            self._halt.set()
        statement = self._limits.statement_ms / 1000 if self._limits else 0.0
        limit = statement + 5.0
        threads: list[threading.Thread] = [*self._probers]
        threads += [t for t in (self._holder, self._monitor) if t is not None]
        deadline = time.monotonic() + limit
        # Let the queries in flight end (the migration is over: what blocked them is gone;
        # their statement_timeout ends the rest), then cancel what still runs (its code
        # switched the timeout off), twice, a second apart.
        for grace, cancelling in ((statement + 0.5, False), (1.0, True), (limit, True)):
            if cancelling:
                self._cancel_running()
            until = min(deadline, time.monotonic() + grace)
            for thread in threads:
                if thread.ident is not None:
                    thread.join(max(0.0, until - time.monotonic()))
        stuck = [t.name for t in threads if t.is_alive()]
        notes = list(self._notes)
        notes += [p.problem for p in self._probers if p.problem]
        if self._holder is not None and self._holder.problem:
            notes.append(self._holder.problem)
        if stuck:
            notes.append(f"probe sessions did not end in {limit:.0f} s: {', '.join(stuck)}")
        if self._discovering and not self._probers and not notes:
            notes.append(
                "the command locked no table or materialized view that existed before it ran "
                f"for as long as the probe looks (every {DISCOVER_PERIOD * 1000:.0f} ms): "
                "nothing was probed"
            )
        window = self._holder.window if self._holder is not None else None
        blocking = []
        for table in _unique(p.table for p in self._probers):
            samples: dict[Kind, list[Sample]] = {"read": [], "write": []}
            for p in self._probers:
                if p.table == table:
                    samples[p.kind] = classify(p.runs, self._sightings.get(p.pid, []))
            blocking.append(
                summarise(table.relation, samples["read"], samples["write"], window=window)
            )
        return Outcome(
            blocking=blocking,
            notes=list(dict.fromkeys(notes)),
            pids=frozenset(self._pids),
            long_transaction=self.options.long_transaction if window is not None else 0.0,
        )


def _unique(tables: Iterable[Table]) -> list[Table]:
    seen: dict[int, Table] = {}
    for t in tables:
        seen.setdefault(t.oid, t)
    return list(seen.values())
