"""Another machine, for tests: a network namespace joined to the host by a veth pair.

A process started in it (``Machine.run``, ``Machine.popen``) has its own loopback and one
interface, ``peer`` (an address of a /30 whose other address, ``host``, is the host's end), so
it reaches the host only as a reviewer's laptop would reach a runner: through the host's
address, never its loopback. Nothing else of the host's network is shared (the host does not
route for it). Each machine gets its own /30 from 10.231.0.0/16, by its index.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import uuid
from collections.abc import Sequence
from typing import Any

_NEXT = itertools.count(1 + (os.getpid() % 4000) * 4)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class Machine:
    """A namespace named ``pgo-<random>``, with ``host`` (the host's end) and ``peer`` (its own
    address). Use as a context manager: the namespace and both ends of the pair go on exit."""

    def __init__(self) -> None:
        index = next(_NEXT) % 16000
        base = 4 * index
        self.name = "pgo-" + uuid.uuid4().hex[:8]
        self.host = f"10.231.{base // 256}.{base % 256 + 1}"
        self.peer = f"10.231.{base // 256}.{base % 256 + 2}"
        self._host_if = "vh" + self.name[4:]
        self._peer_if = "vn" + self.name[4:]

    def __enter__(self) -> Machine:
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self._host_if, "type", "veth", "peer", "name", self._peer_if)
            _ip("link", "set", self._peer_if, "netns", self.name)
            _ip("addr", "add", f"{self.host}/30", "dev", self._host_if)
            _ip("link", "set", self._host_if, "up")
            inside = ("netns", "exec", self.name, "ip")
            _ip(*inside, "addr", "add", f"{self.peer}/30", "dev", self._peer_if)
            _ip(*inside, "link", "set", self._peer_if, "up")
            _ip(*inside, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        _ip("netns", "del", self.name, check=False)
        _ip("link", "del", self._host_if, check=False)  # the pair's deletion is asynchronous

    def route_to(self, address: str) -> None:
        """Reach ``address``, another of the host's own addresses (another machine's ``host``),
        through this machine's pair: the host answers for any of its addresses on any link. The
        route is for that one address: the machine still reaches nothing else."""
        _ip("netns", "exec", self.name, "ip", "route", "add", f"{address}/32", "dev", self._peer_if)

    def command(self, argv: Sequence[str], *, user: str | None = None) -> list[str]:
        """``argv`` run inside the namespace (as ``user`` when given, through runuser)."""
        as_user = ["runuser", "-u", user, "--"] if user else []
        return ["ip", "netns", "exec", self.name, *as_user, *argv]

    def run(
        self, argv: Sequence[str], *, user: str | None = None, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 60)
        return subprocess.run(self.command(argv, user=user), check=False, **kwargs)

    def popen(
        self, argv: Sequence[str], *, user: str | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]:
        return subprocess.Popen(self.command(argv, user=user), **kwargs)
