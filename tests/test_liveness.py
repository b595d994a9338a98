"""A runtime's liveness probe says running, stopped, or that it could not tell (and why)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from pgoverlay.runner import branch
from pgoverlay.runner.branch import lookup
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import postmaster
from pgoverlay.runner.proc import OsUser
from pgoverlay.runner.runtime import Layout, Liveness
from pgoverlay.runner.runtime.local import LocalRuntime


def local_runtime() -> LocalRuntime:
    return LocalRuntime(
        pgbin.newest, owner=OsUser.lookup("root"), start_timeout=10, stop_timeout=10
    )


def test_a_local_branch_without_a_pid_file_is_stopped(tmp_path: Path) -> None:
    lay = Layout(root=tmp_path, socket_dir=tmp_path / "sockets")
    lay.upper.mkdir()
    assert local_runtime().liveness(lay).state == "stopped"


def test_a_local_pid_file_that_cannot_be_looked_at_is_unknown_not_stopped(tmp_path: Path) -> None:
    lay = Layout(root=tmp_path, socket_dir=tmp_path / "sockets")
    os.symlink("upper", lay.upper)  # a loop: looking into it fails with ELOOP
    alive = local_runtime().liveness(lay)
    assert alive.state == "unknown" and not alive.running
    assert alive.reason.startswith(f"cannot look at {lay.upper / 'postmaster.pid'}")
    assert "symbolic links" in alive.reason


def test_a_local_branch_whose_binaries_are_gone_is_still_seen_running(
    pool: Pool, base: BaseVersion, tmp_path: Path
) -> None:
    """Asking whether a branch runs needs no binaries: only starting it does."""
    made = branch.create(pool, "live-nobin", runtime="local", base_name=base.name)
    empty = tmp_path / "no-postgres-here"
    empty.mkdir()
    previous = pool.settings.pg_bindir
    pool.settings.pg_bindir = empty
    try:
        assert lookup.liveness(pool, made) == Liveness("running")
    finally:
        pool.settings.pg_bindir = previous
        branch.destroy(pool, "live-nobin")


def test_a_server_is_running_though_the_clock_was_stepped_since_it_started(
    pool: Pool, base: BaseVersion
) -> None:
    """The pid file holds the wall clock at the server's start and /proc the boot clock: after
    the wall clock is stepped, the server is told by its working directory, and a pid file
    naming another data directory is still refused."""
    made = branch.create(pool, "stepped-clock", base_name=base.name)
    try:
        pidfile = branch.layout(pool, made.key).upper / "postmaster.pid"
        info = postmaster.read_pidfile(pidfile)
        assert info is not None and postmaster.is_running(info)
        stepped = dataclasses.replace(info, start_epoch=info.start_epoch - 90)
        assert postmaster.is_running(stepped)
        elsewhere = dataclasses.replace(stepped, datadir=info.datadir + "-other")
        assert not postmaster.is_running(elsewhere)
    finally:
        branch.destroy(pool, "stepped-clock")
