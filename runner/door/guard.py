"""What the front door counts to protect itself and the branches, sans I/O: connections per
source address and per branch, failed logins per source in a sliding window, and how long real
branches take over each step of a login (the unknown branch's imitation waits as long).

Nothing here outlives the door's process, and nothing is shared between door processes: a
restart forgives every source (the window is minutes, so that costs an attacker a restart of
the door per few guesses, which it cannot cause).
"""

from __future__ import annotations

import ipaddress
import random
from collections import Counter, deque
from collections.abc import Callable

# Steps of a SCRAM login, as a client waits for them: the branch's AuthenticationSASL after the
# startup packet (a connection and a backend's fork), its server-first after the client-first,
# its verdict after the client-final.
STEPS = ("sasl", "continue", "final")
# Until real logins were timed: about what a local branch takes on a quiet machine.
_FIRST_GUESS = {"sasl": 0.0025, "continue": 0.0003, "final": 0.0004}
_SAMPLES = 64
_SWEEP_AT = 10_000  # sources remembered before the failure table is swept of old ones


def source_of(peer: object) -> str:
    """A transport's ``peername`` as the address text the caps count (IPv4-mapped IPv6 as
    IPv4; a non-IP peer, which only tests make, as its text)."""
    if isinstance(peer, tuple) and peer:
        try:
            ip = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
        except ValueError:
            return str(peer[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return str(ip)
    return str(peer)


def is_loopback(source: str) -> bool:
    try:
        return ipaddress.ip_address(source).is_loopback
    except ValueError:
        return False


class Guard:
    """Counts for one door; ``clock`` is monotonic seconds (injected by tests)."""

    def __init__(
        self, *, failed_logins: int, failed_window: float, clock: Callable[[], float]
    ) -> None:
        self.failed_logins = failed_logins
        self.failed_window = failed_window
        self.clock = clock
        self.per_source: Counter[str] = Counter()
        self.per_branch: Counter[str] = Counter()
        self._failures: dict[str, deque[float]] = {}
        self._timings = {step: deque[float](maxlen=_SAMPLES) for step in STEPS}

    # -- failed logins -----------------------------------------------------------------

    def failed(self, source: str) -> None:
        now = self.clock()
        if len(self._failures) >= _SWEEP_AT:
            for key in [k for k, q in self._failures.items() if self._prune(q, now) == 0]:
                del self._failures[key]
        self._failures.setdefault(source, deque()).append(now)

    def banned(self, source: str) -> bool:
        """Whether ``source`` failed ``failed_logins`` times within the last window."""
        found = self._failures.get(source)
        if found is None:
            return False
        if self._prune(found, self.clock()) == 0:
            del self._failures[source]
            return False
        return len(found) >= self.failed_logins

    def _prune(self, found: deque[float], now: float) -> int:
        while found and found[0] <= now - self.failed_window:
            found.popleft()
        return len(found)

    # -- how long real logins take -------------------------------------------------------

    def timed(self, step: str, seconds: float) -> None:
        self._timings[step].append(seconds)

    def pause(self, step: str) -> float:
        """How long the imitation waits before answering ``step``: one of the recent real
        times, picked at random (a guess until there is one)."""
        samples = self._timings[step]
        if not samples:
            return _FIRST_GUESS[step]
        return random.choice(samples)  # noqa: S311 - a delay's shape, not a secret
