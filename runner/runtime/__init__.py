"""Runtimes run a branch's Postgres: ``local`` (a process on this host) or ``docker`` (a
container of a Postgres image). ``table`` lists them by name; ``choose`` decides which one
serves a purpose, and which programs (``postgres.tools.Tools``) go with it.

``Layout`` and ``Liveness`` are named tuples, not dataclasses: settings and the command line's
help import ``table``, and with it this module, and importing ``dataclasses`` cost them more
than the rest of their start-up (see ``settings``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

if TYPE_CHECKING:
    from pgoverlay.runner.pool import Pool
    from pgoverlay.runner.pool.registry import BaseVersion
    from pgoverlay.runner.postgres.tools import Tools
    from pgoverlay.runner.settings import Settings

LivenessState = Literal["running", "stopped", "unknown"]


class Layout(NamedTuple):
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


class Liveness(NamedTuple):
    """Whether a branch's server runs: ``unknown`` when the runtime could not be asked (the
    Docker daemon does not answer, a file could not be read), with ``reason`` saying why."""

    state: LivenessState
    reason: str = ""

    @property
    def running(self) -> bool:
        return self.state == "running"


RUNNING = Liveness("running")
STOPPED = Liveness("stopped")

# Whether a gc may remove something a runtime left beside the pool: ``(kind, name)``, kind
# ``seed`` (a base being seeded) or ``branch``; True when no live pgoverlay holds its lock.
MayRemove = Callable[[str, str], bool]


class Runtime(Protocol):
    """One runtime: a class in ``table``. Its class methods act for the pool (which runtime
    can run what, the programs of a seed, what it leaves behind); an instance, made by
    ``for_base``, runs the branches of one base."""

    name: str

    # the pool's side ---------------------------------------------------------------------

    @classmethod
    def for_base(cls, pool: Pool, base: BaseVersion) -> Runtime:
        """The runtime of ``base``'s branches; starts nothing and asks no daemon."""

    @classmethod
    def readiness(cls, settings: Settings) -> tuple[bool, str]:
        """Whether this runtime can run branches now, and the words ``doctor`` prints: what
        it runs with when it can (empty when there is nothing to say), else why not and the
        fix."""

    @classmethod
    def verify(cls, settings: Settings, major: int, *, what: str) -> str:
        """Check, before anything starts, that this runtime can run Postgres ``major`` for
        ``what`` (``base app``); says with which binaries or image. Raises what to fix."""

    @classmethod
    def seed_tools(cls, pool: Pool, *, major: int, base_name: str, mounts: Sequence[Path]) -> Tools:
        """The programs that copy and prepare base ``base_name`` of Postgres ``major``; they
        see the pool and ``mounts``."""

    @classmethod
    def leftovers(
        cls, pool: Pool, *, known: Iterable[str], may_remove: MayRemove, in_use: bool
    ) -> list[str]:
        """Remove what this runtime made beside the pool's files (containers, volumes) that
        no ``known`` branch claims and ``may_remove`` allows; says what it removed. When it
        cannot look (its daemon does not answer) it raises a ``PgoverlayError`` if ``in_use``
        (a branch runs on it), and otherwise has nothing of this pool to remove."""

    @classmethod
    def remove_all(cls, settings: Settings, pool_id: str) -> list[str]:
        """Remove everything this runtime made for pool ``pool_id`` (``pool rm``), whatever
        made it; says what it removed."""

    # a branch's side ---------------------------------------------------------------------

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
