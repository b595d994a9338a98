"""The one way to wait: a deadline, and a backoff between looks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from pgoverlay.errors import TimeoutExpiredError

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    first_interval: float = 0.005,
    max_interval: float = 0.05,
) -> T:
    """Call ``probe`` until it returns something other than None/False, or the deadline passes.

    The backoff stops at ``max_interval``: a server's start or stop takes a few hundred ms, and
    a longer pause would keep a command waiting up to that long after it was done."""
    deadline = time.monotonic() + timeout
    interval = first_interval
    while True:
        result = probe()
        if result is not None and result is not False:
            return result
        now = time.monotonic()
        if now >= deadline:
            raise TimeoutExpiredError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(min(interval, max(deadline - now, 0.0)))
        interval = min(interval * 2, max_interval)
