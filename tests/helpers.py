"""Shared test helpers: privilege checks and leak checks."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import psycopg
import pytest

from pgoverlay.runner import branch, cluster, mounts
from pgoverlay.runner.pool import Pool


def source_dsn(srv: cluster.Running, *, user: str = "postgres", dbname: str = "app") -> str:
    return psycopg.conninfo.make_conninfo(
        host=os.fspath(srv.socket_dir), port=srv.port, user=user, dbname=dbname
    )


def require(condition: bool, reason: str) -> None:
    """Skip when a prerequisite is missing, but fail under CI=true: CI must run everything."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must be able to run this test: {reason}", pytrace=False)
    pytest.skip(reason)


def require_root() -> None:
    require(os.geteuid() == 0, "needs root (mounts and Postgres as another user)")


def cli(
    args: list[str], *, env: Mapping[str, str], timeout: float = 300, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real `pgoverlay` command in a child process."""
    argv = [sys.executable, "-m", "pgoverlay", *args]
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    return subprocess.run(
        argv,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",
    )


def postgres_processes_for(path: Path) -> list[int]:
    """PIDs of processes whose command line mentions ``path``."""
    needle = os.fspath(path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def assert_no_leaks(pool: Pool, name: str, *, port: int | None = None) -> None:
    lay = branch.layout(pool, name)
    assert pool.registry.branch(name) is None, "registry row left behind"
    assert not lay.root.exists(), f"branch directory left behind: {lay.root}"
    assert not lay.socket_dir.exists(), "socket directory left behind"
    assert not [m for m in mounts.mounted() if m.startswith(os.fspath(lay.root))], "mount leaked"
    assert postgres_processes_for(lay.root) == [], "Postgres process leaked"
    if port is not None:
        assert port_free(port), f"port {port} still bound"


def dismantle(pool: Pool) -> None:
    """Remove a test pool completely: branches, bases, sockets, mounts, files."""
    from pgoverlay.runner import seed

    for b in pool.registry.branches():
        branch.teardown(pool, b)
    for base in pool.registry.bases():
        seed.remove_version(pool, base.name, base.version)
    pool.close()
    shutil.rmtree(branch.socket_root(pool), ignore_errors=True)
    for target in mounts.mounts_under(pool.home):
        mounts.unmount(Path(target))
    mounts.unmount(pool.home / "pool")
    shutil.rmtree(pool.home, ignore_errors=True)
