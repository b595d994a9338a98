"""After a reboot nothing is mounted and no server runs: `pool init` brings it all back."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import psycopg

from helpers import cli, dismantle, postgres_processes_for, require_root, source_dsn, top_ports
from pgoverlay.runner import branch, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.pool import Pool, mounts
from pgoverlay.runner.postgres import cluster, postmaster
from pgoverlay.runner.settings import Settings


def simulate_reboot(pool: Pool) -> None:
    """Kill every server of the pool and unmount everything, as a power cut would."""
    for b in pool.registry.branches():
        info = postmaster.read_pidfile(branch.layout(pool, b.name).upper / "postmaster.pid")
        if info is not None:
            os.killpg(info.pid, 9)  # the postmaster and its children: they share a group
    for pid in postgres_processes_for(pool.root):
        os.kill(pid, 9)
    pool.close()
    for target in mounts.mounts_under(pool.home):
        mounts.unmount(Path(target))
    mounts.unmount(pool.root)


def test_pool_init_after_a_reboot_remounts_and_restarts_branches_with_their_data(
    source: cluster.Running,
) -> None:
    require_root()
    home = Path(tempfile.mkdtemp(prefix="pgoverlay-reboot-", dir="/var/tmp"))
    low, high = top_ports(80, 10)  # apart from this session's pools
    settings = Settings(home=home, port_min=low, port_max=high)
    pool = poolmod.init(settings, size="1G")
    env = {
        "PGOVERLAY_HOME": os.fspath(home),
        "PGOVERLAY_PORT_MIN": str(low),
        "PGOVERLAY_PORT_MAX": str(high),
    }
    try:
        seed.seed(pool, "app", source_dsn=source_dsn(source))
        b = branch.create(pool, "survivor")
        with psycopg.connect(
            **branch.connection(pool, b).connect_kwargs(), autocommit=True
        ) as conn:
            conn.execute("CREATE TABLE kept (x int)")
            conn.execute("INSERT INTO kept VALUES (42)")
        simulate_reboot(pool)
        assert not mounts.is_mounted(home / "pool")

        refused = cli(["branch", "list"], env=env)
        assert refused.returncode == 5 and "pool init" in refused.stderr

        done = cli(["pool", "init"], env=env)
        assert done.returncode == 0, done.stderr
        assert "restarted branches: survivor" in done.stdout
        pool = Pool.open(settings)
        with psycopg.connect(
            **branch.connection(pool, b).connect_kwargs(), autocommit=True
        ) as conn:
            assert conn.execute("SELECT x FROM kept").fetchone() == (42,)
        target = pool.base_dir("app", 1) / "PG_VERSION"
        assert mounts.is_mounted(pool.base_dir("app", 1))
        try:
            os.open(target, os.O_WRONLY)
        except OSError as err:
            assert err.errno == 30  # EROFS: the base is read-only again
        else:
            raise AssertionError("the base was writable after pool init")
    finally:
        pool.close()
        if not mounts.is_mounted(home / "pool"):
            poolmod.init(settings).close()  # mount it again so it can be taken apart
        dismantle(Pool.open(settings))
