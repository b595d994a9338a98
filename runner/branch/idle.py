"""The engine service's idle watcher: a ready branch that nobody has been connected to for its
``suspend_after`` seconds is suspended (``branch.suspend``); its next connection through the
front door wakes it.

Invariants:

- A branch is in use while it has any client connection other than the watcher's own: an idle
  session, and one idle in a transaction, count (a suspend would end them), and so does a
  trace this process holds open on it (the insight observer watching a migration).
- A branch is idle since the last round that saw it in use, else since it became ready
  (created, claimed, reset or woken: ``ready_at``), and never since before this watcher
  started: a service that restarts does not know what its branches did meanwhile, so each
  gets its whole time again.
- A branch whose lock is taken is left for a later round: a command is working on it. The
  suspend looks once more under the lock, the branch marked ``suspending`` (a front door
  connection arriving then waits for the lock instead of reaching a server about to stop),
  and leaves the branch up when a client came meanwhile or the look failed.
- A branch that cannot be asked (its server does not answer) is never suspended by this: gc
  restarts a server that died.

Cost: a round asks each ready branch that may be suspended once, with one short connection of
the engine's (the base's superuser, through the branch's private socket: no TCP, no password)
and one read of ``pg_stat_activity``, about 10 ms each on a busy host; 100 branches take about a
second of the housekeeping thread, every ``service_idle_interval`` seconds. It is not held
between rounds: a held session is a backend of a few MiB per branch, what suspending saves.
The clock is injectable, so tests need no sleeps to say when a branch is due.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pgoverlay.errors import LockBusyError, PgoverlayError
from pgoverlay.runner import branch as branches
from pgoverlay.runner.branch import access, lookup

if TYPE_CHECKING:
    import psycopg

    from pgoverlay.runner.pool import Pool
    from pgoverlay.runner.pool.registry import Branch
    from pgoverlay.runner.settings import Settings

log = logging.getLogger(__name__)

# Every connection of the branch's server but the one asking: client backends (an idle one and
# one idle in a transaction included) and replication connections (a logical replica, a
# pg_basebackup). Background workers, autovacuum and the checkpointer are not connections.
CONNECTIONS = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE pid <> pg_backend_pid() AND backend_type IN ('client backend', 'walsender')"
)


def suspend_after(settings: Settings, b: Branch) -> float:
    """The idle seconds after which ``b`` is suspended: its own (given when it was created),
    else the pool's ``suspend_after``; 0: never."""
    return settings.suspend_after if b.suspend_after is None else b.suspend_after


def asking(pool: Pool, b: Branch) -> psycopg.Connection[Any]:
    """The engine's connection to branch ``b``, to ask it how many others it has: one for
    both of a round's looks at a branch (a second connection would find the first one's
    backend, closed a moment before, still on its way out, and count it)."""
    return access.engine_connection(pool, b, lookup.base_of(pool, b))


def connections(conn: psycopg.Connection[Any]) -> int:
    """How many connections the server of ``conn`` has, other than ``conn``."""
    row = conn.execute(CONNECTIONS).fetchone()
    return int(row[0]) if row else 0


def traced(pool: Pool, name: str) -> bool:
    """Whether this process has a trace open on branch ``name``. One that never imported the
    trace module has none (and does not import it, with psycopg, for nothing)."""
    trace = sys.modules.get("pgoverlay.runner.trace")
    return trace is not None and bool(trace.is_open(pool, name))


@dataclass
class Round:
    """What one round did: the branches it suspended, those in use, those whose lock was
    taken, and those it could not ask (with why)."""

    suspended: list[str] = field(default_factory=list)
    in_use: list[str] = field(default_factory=list)
    locked: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        found = []
        if self.suspended:
            found.append("suspended idle " + ", ".join(self.suspended))
        if self.failed:
            found.append(
                "could not ask " + "; ".join(f"{n} ({why})" for n, why in self.failed.items())
            )
        return found


class Watcher:
    """Remembers, from round to round, when each ready branch was last seen in use."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.started = clock()
        self._in_use_at: dict[str, float] = {}

    def idle_since(self, b: Branch) -> float:
        """When ``b`` was last known to be in use (see the module's invariants)."""
        became_ready = b.ready_at if b.ready_at is not None else b.created_at
        return max(self._in_use_at.get(b.name, 0.0), became_ready, self.started)

    def round(self, pool: Pool) -> Round:
        """Ask each ready branch that may be suspended whether it is in use; suspend each one
        idle for its time."""
        import psycopg

        done = Round()
        ready = [b for b in pool.registry.branches() if b.state == "ready"]
        names = {b.name for b in ready}
        self._in_use_at = {n: t for n, t in self._in_use_at.items() if n in names}
        for b in ready:
            after = suspend_after(pool.settings, b)
            if after <= 0:
                continue
            conn = None
            try:
                conn = asking(pool, b)
                self._look(pool, b, conn, after=after, done=done)
            except (psycopg.Error, PgoverlayError, OSError) as err:
                done.failed[b.name] = str(err).strip().splitlines()[0] if str(err) else repr(err)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):  # its server may have just stopped
                        conn.close()
        return done

    def _look(
        self, pool: Pool, b: Branch, conn: psycopg.Connection[Any], *, after: float, done: Round
    ) -> None:
        """Look at ``b`` through ``conn``: note it in use, or suspend it when it is due."""
        import psycopg

        now = self._clock()
        if traced(pool, b.name) or connections(conn) > 0:
            self._in_use_at[b.name] = now
            done.in_use.append(b.name)
            return
        idle_for = now - self.idle_since(b)
        if idle_for < after:
            return

        def still_in_use(current: Branch) -> bool:
            try:
                return traced(pool, current.name) or connections(conn) > 0
            except (psycopg.Error, OSError):
                return True  # not known to be idle: left up

        try:
            after_suspend = branches.suspend(pool, b.name, lock_wait=0, unless=still_in_use)
        except LockBusyError:
            done.locked.append(b.name)
            return
        if after_suspend.state != "suspended":  # a client came between the two looks
            self._in_use_at[b.name] = self._clock()
            done.in_use.append(b.name)
            return
        log.info(
            "suspended branch %s: no connection for %.0f s (its suspend_after: %g s)",
            b.name,
            idle_for,
            after,
        )
        self._in_use_at.pop(b.name, None)
        done.suspended.append(b.name)
