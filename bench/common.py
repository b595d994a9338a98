"""What several benchmarks share: their start as root, their throwaway source server, taking a
bench pool down, and the machine rows of their reports.

A benchmark runs as `sudo .venv/bin/python bench/X.py`: Python puts bench/ (not the checkout's
top, whose pgoverlay/ folder would hide the installed package) first on the path, so
`from common import ...` finds this module, and `pgoverlay` the installed package.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import psycopg
from engine_report import first_field

from pgoverlay.runner import pool as poolmod
from pgoverlay.runner import proc, seed
from pgoverlay.runner.branch import lifecycle
from pgoverlay.runner.pool import Pool, mounts
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.units import format_bytes

# A source filled in bulk: nothing of it needs to survive a crash, and a seed copies it with
# pg_basebackup (wal_level replica).
BULK_LOAD = {"fsync": "off", "wal_level": "replica", "max_wal_size": "4GB"}


def build_source(
    work: Path,
    owner: proc.OsUser,
    install: pgbin.PgInstall,
    fill: Callable[[cluster.Running], None],
    *,
    options: Mapping[str, str] | None = None,
) -> Path:
    """The data directory of the benchmark's source, ``work/src/data``: made by initdb, then
    ``fill`` runs against it started (the ``postgres`` superuser over its socket). A later run
    finds it made and reuses it as it is."""
    datadir = work / "src" / "data"
    if datadir.exists():
        return datadir
    datadir.parent.mkdir(parents=True)
    os.chown(datadir.parent, owner.uid, owner.gid)
    cluster.initdb(install, datadir, owner=owner)
    with cluster.running(
        install, datadir, owner=owner, scratch=work / "tmp", options=options
    ) as srv:
        fill(srv)
    return datadir


def small_app(srv: cluster.Running) -> None:
    """A database ``app`` owned by ``app_owner`` with one table of 10,000 rows."""
    with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
        conn.execute("CREATE ROLE app_owner")
        conn.execute("CREATE DATABASE app OWNER app_owner")
    with psycopg.connect(**srv.conninfo(user="postgres", dbname="app"), autocommit=True) as c:
        # A branch's role takes over what app_owner owns: the database, hence its schema.
        c.execute("SET ROLE app_owner")
        c.execute("CREATE TABLE items (id bigint PRIMARY KEY, label text NOT NULL)")
        c.execute("INSERT INTO items SELECT g, md5(g::text) FROM generate_series(1, 10000) g")


def dismantle(settings: Settings) -> None:
    """Remove a bench pool completely (best effort: also after a failed run)."""
    home = settings.home
    root = home / "pool"
    if poolmod.read_info(home) is not None and mounts.is_mounted(root):
        pool = Pool.open(settings)
        try:
            for b in pool.registry.branches():
                lifecycle.teardown(pool, b)
            for base in pool.registry.bases():
                seed.remove_version(pool, base.name, base.version)
        finally:
            pool.close()
            shutil.rmtree(pool.socket_root, ignore_errors=True)
    for target in sorted(mounts.mounts_under(home), key=len, reverse=True):
        mounts.unmount(Path(target))
    if mounts.is_mounted(root):
        mounts.unmount(root)
    shutil.rmtree(home, ignore_errors=True)


def start(work: str) -> tuple[Path, str]:
    """Begin a run as root, SIGTERM ending it through its clean-up: the work folder (and its
    tmp/) made and open to the server's user, and the load averages as the run starts."""
    poolmod.require_root()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    folder = Path(work).resolve()
    for path in (folder, folder / "tmp"):
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o755)
    return folder, load


def machine_rows(ctx: Mapping[str, object]) -> str:
    """A report's machine table, its first rows: when it ran and for how long (``started``,
    ``minutes``), the CPU, the RAM and the kernel."""
    ram = int(first_field("/proc/meminfo", "MemTotal").split()[0]) * 1024
    return f"""| | |
|---|---|
| Date | {ctx["started"]:%Y-%m-%d %H:%M} UTC (the run took {ctx["minutes"]:.0f} min) |
| CPU | {first_field("/proc/cpuinfo", "model name")}, {os.cpu_count()} cores |
| RAM | {format_bytes(ram)} |
| Kernel | {platform.system()} {platform.release()} |"""
