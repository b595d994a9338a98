"""Runtimes run a branch's Postgres: ``local`` (a process on this host) or ``docker`` (a
container of a Postgres image). ``choose`` decides which one serves a purpose, and which
programs (``postgres.tools.Tools``) go with it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

LivenessState = Literal["running", "stopped", "unknown"]


@dataclass(frozen=True)
class Layout:
    """Where one branch keeps its layers and files."""

    root: Path
    socket_dir: Path

    @property
    def upper(self) -> Path:
        return self.root / "upper"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def conf(self) -> Path:
        return self.root / "conf"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def log_file(self) -> Path:
        return self.log / "postgres.log"


@dataclass(frozen=True)
class Liveness:
    """Whether a branch's server runs: ``unknown`` when the runtime could not be asked (the
    Docker daemon does not answer, a file could not be read), with ``reason`` saying why."""

    state: LivenessState
    reason: str = ""

    @property
    def running(self) -> bool:
        return self.state == "running"


RUNNING = Liveness("running")
STOPPED = Liveness("stopped")


class Runtime(Protocol):
    name: str

    def attach(self, layout: Layout, *, lower: Path) -> None:
        """Make ``layout.data`` the branch's copy-on-write view of ``lower``."""

    def detach(self, layout: Layout) -> None:
        """Undo ``attach``; idempotent."""

    def start(self, layout: Layout, *, options: dict[str, str]) -> None:
        """Start Postgres on ``layout.data`` and return once it accepts connections."""

    def stop(self, layout: Layout, *, discard: bool = False) -> None:
        """Stop the branch's Postgres if it runs; idempotent. With ``discard`` its layer is
        thrown away next, so nothing need be written on the way out."""

    def liveness(self, layout: Layout) -> Liveness:
        """Whether the branch's Postgres runs; ``unknown`` (never ``stopped``) when it cannot
        tell. Cheap: it reads no more than a pid file or asks the daemon about one container."""

    def server_pid(self, layout: Layout) -> int | None:
        """The host's process id of the branch's postmaster, None if it does not run."""
