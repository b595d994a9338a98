"""One probe session's work (``probe.py`` runs them): a prober repeating one kind of probe
query on one table, the queue simulation's long transaction, the probe queries themselves, and
their timeouts.

A probe statement's locks last no longer than its ``statement_timeout``, under half the
server's ``deadlock_timeout`` (``Limits``); a write probe waits for a row lock at most
``ROW_LOCK_MS`` at a time, holding ``ROW EXCLUSIVE`` on the table meanwhile. Each session is
closed by its own thread when it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal

import psycopg
from psycopg import sql

from pgoverlay.action.insight.blocking import Kind, Table

log = logging.getLogger(__name__)

CANCEL_TIMEOUT = 10  # seconds a cancel request may take
ROW_LOCK_MS = 50  # the longest a write probe waits for a row lock at a time


class Limits:
    """The probe statements' timeouts, from the server's deadlock_timeout (milliseconds)."""

    def __init__(self, deadlock_ms: int) -> None:
        self.lock_ms = max(1, int(deadlock_ms * 0.4))
        self.statement_ms = max(2, int(deadlock_ms * 0.5))
        # A write probe waits for a row lock while it holds ROW EXCLUSIVE on the table: only
        # this long, so a migration that then asks for a stronger lock waits no longer on it.
        self.row_lock_ms = min(ROW_LOCK_MS, self.lock_ms)

    def options(self) -> str:
        return (
            "-c search_path=pg_catalog,pg_temp -c enable_seqscan=off "
            f"-c lock_timeout={self.lock_ms} -c statement_timeout={self.statement_ms}"
        )


class Prober(threading.Thread):
    """One session running one kind of probe query on one table until stopped."""

    def __init__(
        self, conn: psycopg.Connection[Any], query: sql.Composed, *, kind: Kind, period: float,
        table: Table, halt: threading.Event,
    ) -> None:  # fmt: skip
        super().__init__(name=f"probe-{kind}-{table.relation}", daemon=True)
        self.conn, self.query, self.kind, self.period = conn, query, kind, period
        self.table, self.halt = table, halt
        self.pid = conn.info.backend_pid
        self.runs: list[tuple[float, float, bool]] = []
        self.started: float | None = None  # the query in flight, if one is
        self.problem = ""
        self.ready = threading.Event()  # its first query has been answered (or it stopped)

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                began = time.monotonic()
                outcome = self._once(began)
                self.ready.set()
                if outcome == "stopped":
                    return
                if outcome == "timed out":
                    continue  # still blocked: ask again at once, so the wait is seen whole
                # The prober's one wait: until its next query is due, or a stop.
                self.halt.wait(max(0.0, began + self.period - time.monotonic()))
        finally:
            self.ready.set()
            self.conn.close()

    def _once(self, began: float) -> Literal["answered", "timed out", "stopped"]:
        self.started = began
        timed_out = False
        try:
            self.conn.execute(self.query)
        except psycopg.errors.LockNotAvailable:
            timed_out = True
        except psycopg.errors.QueryCanceled:
            if self.halt.is_set():  # cancelled by stop: what it waited until then still counts
                self.runs.append((began, time.monotonic(), False))
                return "stopped"
            self.problem = self.problem or (
                f"a {self.kind} probe of {self.table.relation} outlived its statement_timeout "
                "without waiting on a lock (something the migration made runs in it)"
            )
        except psycopg.errors.UndefinedTable:
            self.problem = f"{self.table.relation} was dropped or renamed: probing it stopped"
            return "stopped"
        except psycopg.Error as err:
            self.problem = f"the {self.kind} probe of {self.table.relation} stopped: {reason(err)}"
            return "stopped"
        finally:
            self.started = None
        self.runs.append((began, time.monotonic(), timed_out))
        return "timed out" if timed_out else "answered"


class Holder(threading.Thread):
    """The queue simulation's long transaction: reads each table, then stays open for
    ``seconds`` (or until stopped), then rolls back."""

    def __init__(
        self, conn: psycopg.Connection[Any], tables: Sequence[Table], *, seconds: float,
        halt: threading.Event,
    ) -> None:  # fmt: skip
        super().__init__(name="probe-long-transaction", daemon=True)
        self.conn, self.tables, self.seconds, self.halt = conn, tables, seconds, halt
        self.pid = conn.info.backend_pid
        self.window: tuple[float, float] | None = None
        self.holding = threading.Event()
        self.problem = ""

    def run(self) -> None:
        began: float | None = None
        try:
            with self.conn.transaction(force_rollback=True):
                for t in self.tables:
                    self.conn.execute(read_query(t, "(0,1)"))  # ACCESS SHARE, held
                began = time.monotonic()
                self.holding.set()
                # The transaction's one wait: its assumed length, or a stop.
                self.halt.wait(self.seconds)
        except psycopg.Error as err:
            self.problem = f"the long transaction of the queue simulation failed: {reason(err)}"
        finally:
            if began is not None:
                self.window = (began, time.monotonic())
            self.holding.set()
            self.conn.close()


def cancel(conn: psycopg.Connection[Any]) -> None:
    """Ask the server to cancel what ``conn`` runs (its own thread then sees QueryCanceled)."""
    try:
        conn.cancel_safe(timeout=CANCEL_TIMEOUT)
    except psycopg.Error as err:
        log.warning("a probe query could not be cancelled: %s", reason(err))


def reason(err: psycopg.Error) -> str:
    from pgoverlay.runner.postgres import sqlerror

    return sqlerror.reason(err)


def read_query(t: Table, tid: str) -> sql.Composed:
    return sql.SQL("SELECT 1 FROM {} WHERE ctid OPERATOR(pg_catalog.=) {}::pg_catalog.tid").format(
        t.identifier(), sql.Literal(tid)
    )


def write_query(
    t: Table, tids: Sequence[str], conn: psycopg.Connection[Any], *, row_lock_ms: int
) -> sql.Composed:
    """One statement, so its locks last no longer than its statement_timeout: the lock an
    UPDATE takes on the table (waited for holding nothing), then the row locks of ``tids``, rows
    spread over the table (each waited for at most ``row_lock_ms``), all released at its end
    (the block commits: a row lock leaves no change behind). Its body, quoted by ``conn``, is a
    literal."""
    body = sql.SQL(
        "BEGIN LOCK TABLE {table} IN ROW EXCLUSIVE MODE; "
        "PERFORM pg_catalog.set_config('lock_timeout', {row}, true); "
        "PERFORM 1 FROM {table} WHERE ctid OPERATOR(pg_catalog.=) "
        "ANY({tids}::pg_catalog.tid[]) FOR NO KEY UPDATE; END"
    ).format(
        table=t.identifier(),
        row=sql.Literal(str(row_lock_ms)),
        tids=sql.Literal("{" + ",".join(f'"{tid}"' for tid in tids) + "}"),
    )
    return sql.SQL("DO {}").format(sql.Literal(body.as_string(conn)))
