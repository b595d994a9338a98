"""Sampling pg_locks: which relation locks the branch role's backends hold or wait for, seen
every ``interval`` seconds, folded into spans (``LockSpan``) from the first sample that saw a
lock to the last.

One prepared query per sample, on the sampler's own superuser connection; the fold is a pure
function of the samples (``Spans.add``), tested without a server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgoverlay.errors import PgoverlayError
from pgoverlay.runner.postgres import sqlerror
from pgoverlay.runner.service.views import LockSpan

log = logging.getLogger(__name__)

MAX_QUERY_CHARS = 2000

# One row per lock (pid, relation, mode, granted, transaction, query_start, query), each with
# the sample's time; a sample that sees no lock is one row of NULLs but the time, which closes
# open spans.
SAMPLE = """
SELECT t.at, s.pid, s.relation, s.mode, s.granted, s.vxid, s.query_start, s.query
  FROM (SELECT pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) AS at) t
  LEFT JOIN (
        SELECT l.pid, l.relation::pg_catalog.int8 AS relation, l.mode, l.granted,
               l.virtualtransaction AS vxid,
               pg_catalog.date_part('epoch', a.query_start) AS query_start,
               pg_catalog.left(a.query, %(chars)s) AS query
          FROM pg_catalog.pg_locks l
          JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'relation'
           AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                              WHERE d.datname = pg_catalog.current_database())
           AND l.relation >= 16384::pg_catalog.oid
           AND a.usename = %(user)s
           AND a.backend_type = 'client backend') s ON true
"""

# pid, relation, mode, granted, and the transaction: the same lock taken again by the next
# transaction between two samples is another span.
Key = tuple[int, int, str, bool, str]


@dataclass
class Spans:
    """Open spans (seen by the last sample) and closed ones (not seen since), not yet taken."""

    open: dict[Key, LockSpan] = field(default_factory=dict)
    closed: list[LockSpan] = field(default_factory=list)

    def add(self, at: float, rows: Iterable[tuple[Any, ...]]) -> None:
        """Fold one sample taken at ``at``: rows of (pid, relation, mode, granted, transaction,
        query_start, query). A lock seen again extends its span; one not seen any more closes."""
        seen: set[Key] = set()
        for pid, relation, mode, granted, vxid, query_start, query in rows:
            key: Key = (int(pid), int(relation), str(mode), bool(granted), str(vxid))
            seen.add(key)
            span = self.open.get(key)
            if span is None:
                self.open[key] = LockSpan(
                    pid=key[0],
                    relation=key[1],
                    mode=key[2],
                    granted=key[3],
                    first=at,
                    last=at,
                    query_start=float(query_start) if query_start is not None else None,
                    query=str(query or "")[:MAX_QUERY_CHARS],
                )
            else:
                self.open[key] = span.replace(last=at)
        for key in [k for k in self.open if k not in seen]:
            self.closed.append(self.open.pop(key))

    def take(self) -> list[LockSpan]:
        """The spans closed since the last take, and those still open (they come again)."""
        taken = [*self.closed, *self.open.values()]
        self.closed = []
        return sorted(taken, key=lambda s: (s.first, s.pid, s.relation, s.mode))


class Sampler(threading.Thread):
    """Samples pg_locks every ``interval`` seconds until stopped or ``max_seconds`` pass, then
    calls ``on_expiry`` (once, when the time ran out). A failure (the branch stopped) ends the
    sampling and is kept in ``problem``."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        *,
        user: str,
        interval: float,
        max_seconds: float,
        on_expiry: Callable[[], None],
        name: str,
    ) -> None:
        super().__init__(name=f"trace-{name}", daemon=True)
        self._connect = connect
        self.user = user
        self.interval = interval
        self.max_seconds = max_seconds
        self._on_expiry = on_expiry
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._spans = Spans()
        self.problem: str | None = None
        self.samples = 0

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=30)

    def take(self) -> list[LockSpan]:
        with self._lock:
            return self._spans.take()

    def run(self) -> None:
        try:
            with self._connect() as conn:
                self._loop(conn)
        except psycopg.Error as err:
            self.problem = f"lock sampling stopped: {sqlerror.reason(err)}"
            log.warning("trace %s: %s", self.name, self.problem)
            return
        if not self._halt.is_set():
            try:
                self._on_expiry()
            except PgoverlayError as err:
                self.problem = f"the trace ended itself, but: {err}"
                log.warning("trace %s: %s", self.name, self.problem)

    def _loop(self, conn: psycopg.Connection[Any]) -> None:
        params = {"user": self.user, "chars": MAX_QUERY_CHARS}
        started: float | None = None
        while not self._halt.is_set():
            tick = time.monotonic()
            rows = conn.execute(SAMPLE, params, prepare=True).fetchall()
            at = float(rows[0][0])
            started = at if started is None else started
            with self._lock:
                self._spans.add(at, [r[1:] for r in rows if r[1] is not None])
            self.samples += 1
            if at - started >= self.max_seconds:
                return
            # The sampler's one wait: until the next sample is due, or a stop.
            self._halt.wait(max(0.0, tick + self.interval - time.monotonic()))
