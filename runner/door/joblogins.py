"""Which branches a job on another runner may reach through the front door as the branch's own
role: the one credential the door lets in that the engine did not mint for it (people and the
preview app log in with the grants the engine made; PR SQL and a read-write reviewer can change
the branch role's password, so that role is no way in by itself).

A job of the network API (the Action with `server:`, the listener on another host) reads its
branch's login (``GET /branches/{name}/connection``) after the pool checked its token and
policy; from then on, for ``JOB_SECONDS`` (the longest a GitHub-hosted job runs), the door lets
the branch's own role log in, so the job's later steps can use its `dsn`. Without the network
API, or past that time, the branch role is refused as an unknown user is.

Kept in the door's memory (a restart forgets them: a job's next read of its connection
allows it again) and bounded: one entry per branch, lapsed ones swept as new ones come. The
API's routes write it from its worker threads, the router reads it on the loop: one lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

JOB_SECONDS = 6 * 3600.0  # GitHub ends a job on a hosted runner after 6 hours
_MOST = 10_000  # branches remembered; a pool holds a few thousand at most


class JobLogins:
    def __init__(
        self, *, seconds: float = JOB_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.seconds = seconds
        self._clock = clock
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def allow(self, name: str) -> None:
        """A verified job read branch ``name``'s login: its role may log in for a job's time."""
        now = self._clock()
        with self._lock:
            if name not in self._until and len(self._until) >= _MOST:
                for key in [k for k, until in self._until.items() if until <= now]:
                    del self._until[key]
                if len(self._until) >= _MOST:
                    del self._until[min(self._until, key=self._until.__getitem__)]
            self._until[name] = now + self.seconds

    def allowed(self, name: str) -> bool:
        with self._lock:
            until = self._until.get(name)
            if until is not None and until <= self._clock():
                del self._until[name]
                return False
            return until is not None

    def forget(self, name: str) -> None:
        """Branch ``name`` was destroyed through the API: a new one of that name starts
        unallowed."""
        with self._lock:
            self._until.pop(name, None)
