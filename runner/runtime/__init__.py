"""Runtimes run a branch's Postgres: ``local`` (a process on this host) or ``docker``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


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


class Runtime(Protocol):
    name: str

    def attach(self, layout: Layout, *, lower: Path) -> None:
        """Make ``layout.data`` the branch's copy-on-write view of ``lower``."""

    def detach(self, layout: Layout) -> None:
        """Undo ``attach``; idempotent."""

    def start(self, layout: Layout, *, options: dict[str, str]) -> None:
        """Start Postgres on ``layout.data`` and return once it accepts connections."""

    def stop(self, layout: Layout) -> None:
        """Stop the branch's Postgres if it runs; idempotent."""

    def is_running(self, layout: Layout) -> bool: ...
