"""What the front door counts to protect itself and the branches, sans I/O: the connections
each cap holds (``Slots``: per client, per branch), failed logins per client in a sliding
window, and how long real branches take over each step of a login (the unknown branch's
imitation waits as long).

A client is what one party can be assumed to hold: an IPv4 address, or an IPv6 prefix
(``door_ipv6_prefix`` bits, /64 by default: one site or one host's share of addresses, which
its owner may use freely). Memory is bounded whatever a client sends: a client's failures are
its last ``failed_logins`` times (all a ban needs), and the table holds at most
``MAX_CLIENTS`` clients, sweeping out those whose window passed first.

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
MAX_CLIENTS = 10_000  # clients remembered with failures; past it, old ones are swept out


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


def client_of(source: str, *, ipv6_prefix: int) -> str:
    """What the limits count ``source`` (an address as ``source_of`` gives it) as: an IPv4
    address as itself, an IPv6 address as its ``ipv6_prefix``-bit network (``2001:db8::/64``)."""
    try:
        ip = ipaddress.ip_address(source)
    except ValueError:
        return source
    if isinstance(ip, ipaddress.IPv6Address) and ipv6_prefix < 128:
        return str(ipaddress.IPv6Network((ip, ipv6_prefix), strict=False))
    return str(ip)


def is_loopback(source: str) -> bool:
    try:
        return ipaddress.ip_address(source).is_loopback
    except ValueError:
        return False


class Slots:
    """The connections the door holds now, per cap and key (a cap's kind, such as "source" or
    "branch", and a client or a branch): the one count every cap reads. A connection takes
    its slots through a ``Taken`` of its own, which gives back all it took at once when the
    connection ends, so no count is left behind whichever way a connection ends."""

    def __init__(self) -> None:
        self._held: Counter[tuple[str, str]] = Counter()

    def held(self, kind: str, key: str) -> int:
        """How many connections hold a slot of ``kind`` for ``key`` now."""
        return self._held[(kind, key)]

    def total(self) -> int:
        """Every slot held now, of every cap (zero when no connection is open)."""
        return sum(self._held.values())

    def taker(self) -> Taken:
        """The slots of one new connection: none yet."""
        return Taken(self)

    def _take(self, slot: tuple[str, str]) -> int:
        self._held[slot] += 1
        return self._held[slot]

    def _give_back(self, slot: tuple[str, str]) -> None:
        self._held[slot] -= 1
        if self._held[slot] <= 0:
            del self._held[slot]


class Taken:
    """The slots one connection holds."""

    def __init__(self, slots: Slots) -> None:
        self._slots = slots
        self._taken: dict[str, str] = {}  # kind: key

    def take(self, kind: str, key: str) -> int:
        """Hold a slot of ``kind`` for ``key`` (one of each kind a connection) until
        ``release``; how many are held for ``key`` now, this one included."""
        if kind in self._taken:
            raise ValueError(f"a connection holds one {kind} slot at most")
        self._taken[kind] = key
        return self._slots._take((kind, key))

    def count(self, kind: str) -> int:
        """How many connections hold the slot of ``kind`` this one holds (0: it holds none)."""
        key = self._taken.get(kind)
        return 0 if key is None else self._slots.held(kind, key)

    def release(self) -> None:
        """Give back every slot taken (the connection ended); a second call does nothing."""
        for kind, key in self._taken.items():
            self._slots._give_back((kind, key))
        self._taken.clear()


class Guard:
    """Counts for one door; ``clock`` is monotonic seconds (injected by tests)."""

    def __init__(
        self, *, failed_logins: int, failed_window: float, clock: Callable[[], float]
    ) -> None:
        self.failed_logins = failed_logins
        self.failed_window = failed_window
        self.clock = clock
        self.slots = Slots()
        self._failures: dict[str, deque[float]] = {}  # oldest first, bounded (see the module)
        self._timings = {step: deque[float](maxlen=_SAMPLES) for step in STEPS}
        self._wrong = deque[tuple[float, float, float]](maxlen=_SAMPLES)

    # -- failed logins -----------------------------------------------------------------

    def failed(self, source: str) -> None:
        now = self.clock()
        found = self._failures.get(source)
        if found is None:
            if len(self._failures) >= MAX_CLIENTS:
                self._sweep(now)
            found = self._failures[source] = deque(maxlen=self.failed_logins)
        found.append(now)

    def forgive(self, source: str) -> None:
        """Take back ``source``'s latest failure (a wake it caused ended in a good login)."""
        found = self._failures.get(source)
        if found:
            found.pop()
            if not found:
                del self._failures[source]

    def _sweep(self, now: float) -> None:
        for key in [k for k, q in self._failures.items() if self._prune(q, now) == 0]:
            del self._failures[key]
        while len(self._failures) >= MAX_CLIENTS:  # all recent: the one that failed least lately
            oldest = min(self._failures, key=lambda k: self._failures[k][-1])
            del self._failures[oldest]

    def remembered(self) -> int:
        """How many failure times the door holds (what the tests of its memory count)."""
        return sum(len(q) for q in self._failures.values())

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
        """One step of a real login (any outcome) took ``seconds``."""
        self._timings[step].append(seconds)

    def failed_login_timed(self, waits: tuple[float, float, float]) -> None:
        """A real login that ended in a wrong password waited ``waits`` for its three
        answers: what the imitation copies whole (a slow fork and a slow verdict come
        together on a loaded machine, so its steps are not drawn apart)."""
        self._wrong.append(waits)

    def pauses(self) -> tuple[float, float, float]:
        """How long the imitation waits before each of its three answers: a recent real wrong
        password's waits, picked at random; until there is one, each step's own recent times
        (a guess until there are some)."""
        if self._wrong:
            return random.choice(self._wrong)  # noqa: S311 - a delay's shape, not a secret
        sasl, cont, final = (self.pause(step) for step in STEPS)
        return sasl, cont, final

    def pause(self, step: str) -> float:
        """One of the recent real times of ``step``, picked at random (a guess until there is
        one)."""
        samples = self._timings[step]
        if not samples:
            return _FIRST_GUESS[step]
        return random.choice(samples)  # noqa: S311 - a delay's shape, not a secret
