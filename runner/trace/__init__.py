"""Tracing a branch while migrations run on it: see ``pgoverlay.runner.service.views.TraceMark``.

A trace is opened (``begin``) on a running branch, asked for marks (``mark``), and closed
(``end``). While open, its instrumentation, made in the base when it was prepared, is switched on
in the branch (``instrument``, whose docstring says what the engine may run there), samples
pg_locks in a thread of its own (``sampler``), and reads the branch's log from where it stood
at the start (``logfile``); each mark adds a snapshot of the relations (``snapshot``).

Traces live in this process, one per branch: the engine service builds an engine per request,
so they are kept here, not in an engine. The engine's sessions connect as the base's superuser
through the branch's private socket with ``search_path`` pinned to ``pg_catalog, pg_temp``, so
no name in their SQL can lead to something the branch's role defined.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from pgoverlay.errors import PgoverlayError, TraceError, UnsafePathError
from pgoverlay.runner import branch as branches
from pgoverlay.runner.branch import lookup, sizes
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import Branch
from pgoverlay.runner.postgres import sqlerror
from pgoverlay.runner.service.views import Layer, RelationState, SchemaDiff, TraceMark
from pgoverlay.runner.trace import instrument, logfile, sampler, schema, snapshot

log = logging.getLogger(__name__)

# The engine's sessions: nothing the role defined is found by name, and a mark does not wait
# long behind a lock a session of the role left held (pg_relation_size takes AccessShareLock).
SESSION_OPTIONS = "-c search_path=pg_catalog,pg_temp -c lock_timeout=5s -c statement_timeout=60s"


@dataclass(frozen=True)
class TracedBranch:
    """What a trace needs of its branch, copied out of the pool (whose registry belongs to
    the thread that opened it)."""

    key: tuple[str, str]  # the pool's home, the branch's name
    name: str
    base_name: str
    socket_dir: Path
    port: int
    user: str  # the role whose sessions are traced: the branch role, or a job's (``grants``)
    database: str
    superuser: str
    log_file: Path
    upper: Path
    owner_uid: int
    role_is_superuser: bool
    base_schema: Path | None = None  # the base version's schema (``schema.keep_base``)

    def connect(self) -> psycopg.Connection[Any]:
        """The base's superuser through the branch's private socket (the engine's access)."""
        return psycopg.connect(
            host=os.fspath(self.socket_dir),
            port=self.port,
            user=self.superuser,
            dbname=self.database,
            autocommit=True,
            connect_timeout=10,
            options=SESSION_OPTIONS,
        )


def target(pool: Pool, b: Branch, *, user: str | None = None) -> TracedBranch:
    base = pool.registry.base(b.base_name, b.base_version)
    if base is None:
        raise TraceError(
            f"branch {b.name}'s base {b.base_name} v{b.base_version} is gone: destroy the branch"
        )
    if not lookup.is_running(pool, b):
        raise TraceError(
            f"branch {b.name} is not running, so it cannot be traced: start it with "
            f"`pgoverlay gc` (as root), or reset it, then open the trace again"
        )
    lay = branches.layout(pool, b.key)
    return TracedBranch(
        key=(os.fspath(pool.home), b.name),
        name=b.name,
        base_name=b.base_name,
        socket_dir=lay.socket_dir,
        port=b.port,
        user=user or b.user,
        database=b.database,
        superuser=base.superuser,
        log_file=lay.log_file,
        upper=lay.upper,
        owner_uid=pool.owner.uid,
        role_is_superuser=pool.settings.branch_superuser,
        base_schema=pool.schema_file(b.base_name, b.base_version),
    )


@dataclass
class Trace:
    """One open trace: what it installed, where its log reading stands, the last snapshot."""

    target: TracedBranch
    interval: float
    max_seconds: float
    installed: instrument.Installed
    log_offset: int
    previous: dict[int, RelationState] | None = None
    since: float | None = None  # server clock of the previous mark (None: no mark yet)
    expired: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    sampling: sampler.Sampler | None = None

    def _wrapped(self, what: str) -> contextlib.AbstractContextManager[None]:
        return sqlerror.wrapped(
            TraceError,
            what=f"{what} of branch {self.target.name}",
            fix=f"check that the branch runs (`pgoverlay branch status {self.target.name}`), "
            "then open the trace again",
        )

    def expire(self) -> None:
        """The sampler ran for ``max_seconds``: switch the instrumentation off."""
        with self.lock:
            self.expired = True
            self._remove()

    def _remove(self) -> None:
        t = self.target
        with self._wrapped("cannot switch the trace's instrumentation off"), t.connect() as conn:
            instrument.disable(conn, user=t.user, database=t.database)

    def take_mark(self) -> TraceMark:
        """What happened since the previous mark: relations, WAL, layer, locks and log."""
        with self.lock:
            return self._mark()

    def _mark(self) -> TraceMark:
        t = self.target
        notes: list[str] = []
        with self._wrapped("cannot take a mark of the trace"), t.connect() as conn:
            if self.since is not None and not snapshot.wait_for_exits(
                conn, user=t.user, since=self.since
            ):
                notes.append(
                    f"sessions of {t.user} opened since the previous mark still run: their "
                    "statistics (scans, tuples) may be missing from this mark"
                )
            taken = snapshot.take(conn)
            now = instrument.installed(conn)
        relations, dropped = snapshot.changes(self.previous, taken.relations)
        self.previous, self.since = taken.relations, taken.at
        instrumented = now is not None and now == self.installed and not self.expired
        if not instrumented:
            notes.append(self._why_not_instrumented(now))
        entries, truncated = self._read_log(notes)
        spans = self.sampling.take() if self.sampling is not None else []
        if self.sampling is not None and self.sampling.problem:
            notes.append(self.sampling.problem)
        if t.role_is_superuser:
            notes.append(
                f"the branch's role {t.user} is a superuser (PGOVERLAY_BRANCH_SUPERUSER): it "
                "can switch the trace's instrumentation and logging off"
            )
        return TraceMark(
            at=taken.at,
            wal_lsn=taken.wal_lsn,
            layer=self._layer(notes),
            relations=relations,
            dropped=dropped,
            locks=spans,
            log=entries,
            log_truncated=truncated,
            interval=self.interval,
            instrumented=instrumented,
            notes=notes,
            statement_marks=instrumented and self.installed.statement_end is not None,
        )

    def _why_not_instrumented(self, now: instrument.Installed | None) -> str:
        if self.expired:
            return (
                f"the trace ended itself after {self.max_seconds:.0f} s (its max_seconds): no "
                "DDL events, statement durations or lock samples since"
            )
        if now is None:
            return (
                f"the trace's event triggers or their functions in {instrument.SCHEMA} are "
                "gone or disabled (only a superuser can do that): DDL events since are missing"
            )
        return (
            f"the trace's event triggers or their functions in {instrument.SCHEMA} were "
            "replaced: DDL events since the previous mark are not to be trusted"
        )

    def _read_log(self, notes: list[str]) -> tuple[list[Any], bool]:
        t = self.target
        try:
            chunk = logfile.read_new(t.log_file, uid=t.owner_uid, offset=self.log_offset)
        except (UnsafePathError, OSError) as err:
            notes.append(f"the branch's log could not be read: {err}")
            return [], False
        self.log_offset = chunk.offset
        if chunk.restarted:
            notes.append("the branch's log started anew (a restart?): read from its start")
        if chunk.truncated:
            notes.append(
                f"more than {logfile.MAX_BYTES} bytes were logged since the previous mark: "
                "only the last are kept"
            )
        entries = logfile.parse(chunk.text, user=t.user, database=t.database)
        entries, forged = logfile.drop_forged(entries)
        if forged:
            notes.append(
                f"{forged} 'pgoverlay-trace' lines logged by the branch's role itself, not by "
                "the trace's event triggers, were left out"
            )
        return entries, chunk.truncated

    def schema_diff(self) -> SchemaDiff:
        """The branch's schema now against its base's (``schema``); what kept them from being
        compared is said in its notes, never raised."""
        t = self.target
        try:
            base = schema.load_base(t.base_schema) if t.base_schema is not None else None
        except (UnsafePathError, OSError, ValueError) as err:
            return SchemaDiff(base_taken_at=0.0, notes=[f"the base's schema is unreadable: {err}"])
        if base is None:
            return SchemaDiff(
                base_taken_at=0.0,
                notes=[
                    f"the base's schema was not recorded (it is read in a branch fresh from the "
                    f"base, and branch {t.name} was made by an earlier release or the read "
                    f"failed): reset the branch (`pgoverlay branch reset {t.name}`) and the "
                    "next run shows the schema changes"
                ],
            )
        try:
            with t.connect() as conn:
                now = schema.take(conn)
        except psycopg.Error as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            return SchemaDiff(
                base_taken_at=base.taken_at,
                notes=[f"the branch's schema could not be read: {first}"],
            )
        return schema.diff(base, now)

    def _layer(self, notes: list[str]) -> Layer:
        try:
            size = sizes.layer_size(self.target.upper)
        except OSError as err:
            notes.append(f"the writable layer could not be measured: {err.strerror}")
            return Layer(logical_bytes=0, physical_bytes=0)
        return Layer(logical_bytes=size.logical_bytes, physical_bytes=size.physical_bytes)

    def close(self, *, remove: bool) -> None:
        """Stop sampling; with ``remove``, switch the instrumentation off."""
        if self.sampling is not None:
            self.sampling.stop()
        if remove and not self.expired:
            with self.lock:
                self._remove()


_TRACES: dict[tuple[str, str], Trace] = {}
_REGISTRY_LOCK = threading.Lock()


def begin(
    pool: Pool, b: Branch, *, interval: float, max_seconds: float, user: str | None = None
) -> TraceMark:
    """Open a trace of ``b`` (ending one left open) and return its first mark, which holds
    every relation. ``user``: the role the traced sessions log in as, when not the branch
    role (a job on another runner logs in with its own credential, ``grants.grant_job``,
    whose sessions act as the branch role)."""
    t = target(pool, b, user=user)
    discard(pool, b.name)
    with (
        sqlerror.wrapped(
            TraceError,
            what=f"cannot switch the trace's instrumentation on in branch {b.name}",
            fix=f"check that it runs (`pgoverlay branch status {b.name}`), then open the trace "
            "again",
        ),
        t.connect() as conn,
    ):
        installed = instrument.enable(conn, user=t.user, database=t.database, base_name=t.base_name)
    try:
        offset = logfile.size(t.log_file, uid=t.owner_uid)
    except (UnsafePathError, OSError):
        offset = 0
    trace = Trace(
        target=t,
        interval=interval,
        max_seconds=max_seconds,
        installed=installed,
        log_offset=offset,
    )
    try:
        first = trace.take_mark()
        trace.sampling = sampler.Sampler(
            t.connect,
            user=t.user,
            interval=interval,
            max_seconds=max_seconds,
            on_expiry=trace.expire,
            name=b.name,
        )
        trace.sampling.start()
    except BaseException:
        with contextlib.suppress(PgoverlayError):
            trace.close(remove=True)
        raise
    with _REGISTRY_LOCK:
        _TRACES[t.key] = trace
    log.info("trace of branch %s opened (every %.3f s)", b.name, interval)
    return first


def _open(pool: Pool, name: str) -> Trace:
    with _REGISTRY_LOCK:
        found = _TRACES.get((os.fspath(pool.home), name))
    if found is None:
        raise TraceError(
            f"branch {name} has no open trace: open one first (the service's "
            f"POST /v1/branches/{name}/trace); a reset or destroy of the branch ends its trace"
        )
    return found


def mark(pool: Pool, name: str) -> TraceMark:
    """What happened on branch ``name`` since its trace's previous mark."""
    return _open(pool, name).take_mark()


def end(pool: Pool, name: str) -> TraceMark:
    """The trace's last mark; then its instrumentation is switched off and the trace
    forgotten."""
    trace = _open(pool, name)
    with _REGISTRY_LOCK:
        if _TRACES.get(trace.target.key) is trace:
            del _TRACES[trace.target.key]
    if trace.sampling is not None:
        trace.sampling.stop()
    try:
        last = trace.take_mark()
    finally:
        trace.close(remove=True)
    last = last.replace(schema_diff=trace.schema_diff())
    log.info("trace of branch %s ended", name)
    return last


def is_open(pool: Pool, name: str) -> bool:
    """Whether this process holds an open trace of branch ``name`` (the insight observer is
    watching it: the branch is in use, whether or not a client is connected)."""
    with _REGISTRY_LOCK:
        return (os.fspath(pool.home), name) in _TRACES


def discard(pool: Pool, name: str) -> None:
    """Forget branch ``name``'s trace, if it has one, without a mark or removing anything (the
    branch is being reset or destroyed, or a new trace replaces it)."""
    with _REGISTRY_LOCK:
        trace = _TRACES.pop((os.fspath(pool.home), name), None)
    if trace is not None:
        trace.close(remove=False)
        log.info("trace of branch %s discarded", name)
