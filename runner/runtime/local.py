"""The local runtime: the overlay is mounted here and Postgres runs as a process of this host."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pgoverlay.errors import BranchStartError, NotRootError, PgoverlayError, PoolFullError
from pgoverlay.runner.pool import mounts
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import postmaster
from pgoverlay.runner.postgres.binaries import PgInstall
from pgoverlay.runner.proc import OsUser
from pgoverlay.runner.runtime import RUNNING, STOPPED, Layout, Liveness, MayRemove

if TYPE_CHECKING:
    from pgoverlay.runner.pool import Pool
    from pgoverlay.runner.pool.registry import BaseVersion
    from pgoverlay.runner.settings import Settings


class LocalRuntime:
    """``install`` gives the host's binaries of the branch's major; only a start asks for them,
    so a branch whose binaries were removed can still be stopped and asked whether it runs."""

    name = "local"

    def __init__(
        self,
        install: Callable[[], PgInstall],
        *,
        owner: OsUser,
        start_timeout: float,
        stop_timeout: float,
    ) -> None:
        self._install = install
        self.owner = owner
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout

    # the pool's side: this host's binaries, nothing beside the pool ----------------------

    @classmethod
    def for_base(cls, pool: Pool, base: BaseVersion) -> LocalRuntime:
        s = pool.settings
        major = base.pg_major or 0
        return cls(
            lambda: pgbin.for_major(major, s.pg_bindir),
            owner=pool.owner,
            start_timeout=s.start_timeout,
            stop_timeout=s.stop_timeout,
        )

    @classmethod
    def readiness(cls, settings: Settings) -> tuple[bool, str]:
        return True, ""

    @classmethod
    def verify(cls, settings: Settings, major: int, *, what: str) -> str:
        install = pgbin.for_major(major, settings.pg_bindir)
        return f"this host's Postgres {install.version} ({install.bindir})"

    @classmethod
    def seed_tools(
        cls, pool: Pool, *, major: int, base_name: str, mounts: Sequence[Path]
    ) -> PgInstall:
        return pgbin.for_major(major, pool.settings.pg_bindir)  # says what to install

    @classmethod
    def leftovers(
        cls, pool: Pool, *, known: Iterable[str], may_remove: MayRemove, in_use: bool
    ) -> list[str]:
        return []  # its mounts and servers are in the branches' directories, which gc sweeps

    @classmethod
    def remove_all(cls, settings: Settings, pool_id: str) -> list[str]:
        return []

    # a branch's side ---------------------------------------------------------------------

    def attach(self, layout: Layout, *, lower: Path) -> None:
        if os.geteuid() != 0:
            raise NotRootError(
                "the local runtime mounts OverlayFS, which needs root: run pgoverlay with sudo"
            )
        if not mounts.is_mounted(layout.data):
            mounts.mount_overlay(
                lower=lower, upper=layout.upper, work=layout.work, target=layout.data
            )

    def detach(self, layout: Layout) -> None:
        mounts.unmount(layout.data)

    def start(self, layout: Layout, *, options: dict[str, str]) -> None:
        # A dead server's postmaster.pid may name a PID that another process has since taken
        # (after a reboot); Postgres would then refuse to start. It is ours to remove.
        stale = postmaster.read_pidfile(layout.data / "postmaster.pid")
        if stale is not None and not postmaster.is_running(stale):
            postmaster.reap(stale.pid)
            postmaster.wait_detached(stale, timeout=self.stop_timeout)
            (layout.data / "postmaster.pid").unlink(missing_ok=True)
        child = postmaster.start(
            self._install(),
            datadir=layout.data,
            options=options,
            user=self.owner,
            log_path=layout.log_file,
        )
        try:
            postmaster.wait_ready(
                layout.data, child=child, log_path=layout.log_file, timeout=self.start_timeout
            )
        except BranchStartError:
            if "No space left on device" in postmaster.log_tail(layout.log_file, 20):
                raise PoolFullError(
                    "the pool is full, so the branch could not start: destroy branches "
                    "(`pgoverlay branch list` shows their sizes) or grow the pool"
                ) from None
            raise

    def stop(self, layout: Layout, *, discard: bool = False) -> None:
        # postmaster.pid is a new file, so it lives in the upper layer even when unmounted.
        postmaster.stop(layout.upper / "postmaster.pid", timeout=self.stop_timeout, discard=discard)

    def server_pid(self, layout: Layout) -> int | None:
        info = postmaster.read_pidfile(layout.upper / "postmaster.pid")
        return info.pid if info is not None and postmaster.is_running(info) else None

    def liveness(self, layout: Layout) -> Liveness:
        pidfile = layout.upper / "postmaster.pid"
        try:
            os.lstat(pidfile)  # no file: stopped; a file that cannot be looked at: unknown
        except FileNotFoundError:
            return STOPPED
        except OSError as err:
            return Liveness("unknown", f"cannot look at {pidfile}: {err.strerror}")
        try:
            info = postmaster.read_pidfile(pidfile)
            alive = info is not None and postmaster.is_running(info)
        except (PgoverlayError, OSError) as err:
            return Liveness("unknown", f"cannot read {pidfile}: {err}")
        return RUNNING if alive else STOPPED
