"""The engine service's expiry timer: a credential's open sessions end at its expiry.

A role's ``VALID UNTIL`` stops new logins at the instant a credential expires, but not the
sessions already open: Postgres checks it at login only. The timer revokes each credential
when its time comes (``grants.expire``: its sessions ended, its role dropped, its row
forgotten), so an expired credential's sessions end within ``BOUND`` seconds of its
``expires_at``, not at the next gc.

Invariants:

- It sleeps until the earliest unexpired ``expires_at`` in the registry, and at most ``POLL``
  seconds: a grant made by another process (the CLI as root) with an earlier expiry is seen
  within that, by one read of the registry.
- A credential whose branch's lock is taken (a reset, a grant of the same branch) is tried
  again ``POLL`` seconds later; one of a suspended branch is forgotten, and its role dropped
  at the branch's wake before any client logs in (``reconcile``).
- The clock and the wait are injectable, so tests need no sleeps to say when it acts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pgoverlay.runner.pool import Pool

log = logging.getLogger(__name__)

# The longest the timer sleeps between two looks at the registry.
POLL = 1.0
# How long after its expiry a credential's sessions may last, at most, on a branch whose lock is
# free: a look (POLL), then each session told to end (``grants.TERMINATE_WAIT_MS``, which a
# backend takes milliseconds to honour).
BOUND = 2.0


def due_in(pool: Pool, *, now: float) -> float | None:
    """Seconds until the earliest credential's expiry (0 or less: one is due); None: no
    credential at all."""
    found = [g.expires_at for g in pool.registry.grants()]
    return min(found) - now if found else None


def tick(pool: Pool, *, now: float) -> list[str]:
    """Revoke every credential due at ``now``; what was revoked ("ROLE in BRANCH")."""
    from pgoverlay.runner.branch import grants

    due = due_in(pool, now=now)
    if due is None or due > 0:
        return []
    done, problems = grants.expire(pool, now=now)
    for line in problems:
        log.warning("expiry: %s", line)
    return done


def run(
    open_pool: Callable[[], Pool],
    stop: threading.Event,
    *,
    clock: Callable[[], float] = time.time,
) -> None:
    """Until ``stop`` is set: revoke each credential at its expiry (see the module's
    invariants). A pool that cannot be opened or read is tried again ``POLL`` s later."""
    pool: Pool | None = None
    while not stop.is_set():
        wait = POLL
        try:
            if pool is None:
                pool = open_pool()
            for line in tick(pool, now=clock()):
                log.info("credential expired: %s", line)
            due = due_in(pool, now=clock())
            if due is not None and due > 0:  # one still due (its branch busy): POLL s
                wait = min(POLL, due)
        except Exception:  # the edge of a loop: log, try again after a pause
            log.exception("expiring credentials failed")
            if pool is not None:
                pool.close()
                pool = None
        stop.wait(wait)
    if pool is not None:
        pool.close()
