"""Where a seed's time goes: a lap timer its steps call as each one ends.

A seed is a chain of steps (copy, verify, start, prepare, stop, resetwal, store); the laps tell
which of them to make faster. ``bench/seed.py`` reports them, and the seed logs them at debug
level.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Laps:
    """Seconds per step, in the order the steps ended; a step run twice adds up."""

    seconds: dict[str, float] = field(default_factory=dict)
    _last: float = field(default_factory=time.perf_counter, repr=False)

    def restart(self) -> None:
        """Start timing from now: what ran before belongs to no step."""
        self._last = time.perf_counter()

    def lap(self, step: str) -> None:
        """``step`` ended now: it took the time since the previous lap."""
        now = time.perf_counter()
        self.seconds[step] = self.seconds.get(step, 0.0) + now - self._last
        self._last = now

    def summary(self) -> str:
        return ", ".join(f"{step} {secs:.2f} s" for step, secs in self.seconds.items())
