#!/usr/bin/env python3
"""Engine benchmark: pgoverlay branches against the seed article's method and CREATE DATABASE.

    sudo .venv/bin/python bench/engine.py [--sizes 1,5] [--cycles 5] [--work DIR] [--keep]

For each size, a pgbench database is built once (cached in the work dir), seeded into a pool of
our own, copied once more with a plain pg_basebackup, and then every method runs one
create/read/update/destroy cycle per round, side by side. The Markdown report replaces the section
between the engine markers in docs/benchmarks.md. This is a measurement script: it asserts
nothing about timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from rich.console import Console

from pgoverlay.runner import branch, cluster, mounts, pgbin, postmaster, proc, seed, sizes
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.sizes import LayerSize, format_bytes

REPORT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
START, END = "<!-- engine:start -->", "<!-- engine:end -->"
SCALE_PER_GIB = 68.4  # pgbench -s 68 is about 1 GiB, -s 342 about 5 GiB
DB = "bench"
READ_SQL = "SELECT abalance FROM pgbench_accounts WHERE aid = %s"
UPDATE_SQL = "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid <= %s"
STATEMENT_TIMEOUT = "-c statement_timeout=1800000"  # 30 min: every query has a deadline
BUILD_OPTS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "1h",
    "maintenance_work_mem": "512MB",
}
METHODS = {
    "pgoverlay": "pgoverlay (prepared base, reflink XFS)",
    "article": "seed article's method (unprepared base, plain OverlayFS on ext4)",
    "wal_log": "CREATE DATABASE … TEMPLATE (WAL_LOG)",
    "file_copy": "CREATE DATABASE … TEMPLATE (FILE_COPY)",
}
# key, row label, kind ("s", "ms" or "bytes")
ROWS = [
    ("create_s", "create until ready (s)", "s"),
    ("create_logical", "layer after create, logical", "bytes"),
    ("create_physical", "layer after create, physical", "bytes"),
    ("create_wal", "WAL written by create", "bytes"),
    ("read_ms", "first point read (ms)", "ms"),
    ("read_logical", "point read: logical growth", "bytes"),
    ("read_physical", "point read: physical growth", "bytes"),
    ("update_s", "1% UPDATE + CHECKPOINT (s)", "s"),
    ("update_logical", "update: logical growth", "bytes"),
    ("update_physical", "update: physical growth", "bytes"),
    ("update_pages", "update: buffer writes × block size", "bytes"),
    ("update_wal", "update: WAL generated", "bytes"),
    ("destroy_s", "destroy / DROP DATABASE (s)", "s"),
]
SEED_ARTICLE = {"create_s": 1.89, "create_layer": 33.1 * 2**20, "update_5g": 5.20 * 2**30}
console = Console(highlight=False)
Sample = dict[str, float]
Conn = psycopg.Connection[Any]


def now() -> float:
    return time.perf_counter()


def connect(**kwargs: Any) -> Conn:
    return psycopg.connect(**kwargs, autocommit=True, connect_timeout=10, options=STATEMENT_TIMEOUT)


def try_connect(kwargs: dict[str, Any]) -> Conn | None:
    try:
        return connect(**kwargs)
    except psycopg.OperationalError:
        return None


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def scalar(conn: Conn, query: str, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    return row[0] if row else None


def wal_pos(conn: Conn) -> int:
    return int(scalar(conn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


def buffer_writes(conn: Conn) -> int | None:
    """Bytes of buffers written (checkpointer + bgwriter + backends); PG 15 and older."""
    try:
        return int(
            scalar(
                conn,
                "SELECT (buffers_checkpoint + buffers_clean + buffers_backend)"
                " * current_setting('block_size')::bigint FROM pg_stat_bgwriter",
            )
        )
    except psycopg.Error:
        return None


@dataclass
class SizeRun:
    size: int
    scale: int
    db_bytes: int = 0
    build_s: float | None = None  # None: reused from the cache
    seed_s: float | None = None
    raw_s: float | None = None
    runs: dict[str, list[Sample]] = field(default_factory=dict)


class Bench:
    def __init__(self, work: Path, *, drop_caches: bool, pool_size: str) -> None:
        self.work = work
        self.settings = Settings(home=work / "pool-home", port_min=56100, port_max=56199)
        self.install = pgbin.newest(self.settings.pg_bindir)
        self.owner = proc.OsUser.lookup(self.settings.os_user)
        self.scratch = work / "tmp"
        self.drop = drop_caches
        self.pool_size = pool_size
        self.pool: poolmod.Pool | None = None

    # -- plumbing -------------------------------------------------------------------------
    def own_dir(self, path: Path, mode: int = 0o700) -> Path:
        path.mkdir(mode=mode)
        os.chown(path, self.owner.uid, self.owner.gid)
        os.chmod(path, mode)
        return path

    def drop_caches(self) -> None:
        if self.drop:
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3\n")

    def open_pool(self) -> poolmod.Pool:
        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o755)
        self.scratch.mkdir(exist_ok=True)
        os.chmod(self.scratch, 0o755)
        self.pool = poolmod.init(self.settings, size=self.pool_size)
        return self.pool

    def free_port(self) -> int:
        used = {b.port for b in self.pool.registry.branches()} if self.pool else set()
        for port in range(self.settings.port_max, self.settings.port_min - 1, -1):
            if port not in used and port_free(port):
                return port
        raise RuntimeError("no free port in 56100-56199")

    def step(self, label: str, action: Callable[[], Any]) -> None:
        """Run a cleanup step; report its failure without hiding the error being handled."""
        try:
            action()
        except Exception as err:  # noqa: BLE001 - cleanup goes on
            console.print(f"[yellow]cleanup: {label} failed: {err}")

    # -- the source database (one per size, cached) ---------------------------------------
    @contextmanager
    def source(self, size: int, options: dict[str, str]) -> Iterator[cluster.Running]:
        options = {
            "shared_buffers": self.settings.shared_buffers,
            "max_connections": str(self.settings.max_connections),
            **options,
        }
        with cluster.running(
            self.install,
            self.work / f"src-{size}g" / "data",
            owner=self.owner,
            scratch=self.scratch,
            options=options,
            timeout=600,
        ) as srv:
            yield srv

    def ensure_source(self, run: SizeRun) -> None:
        root, marker = self.work / f"src-{run.size}g", self.work / f"src-{run.size}g.ready"
        if marker.exists() and marker.read_text().strip() == str(run.scale):
            console.log(f"{run.size} GiB source: reusing {root} (pgbench scale {run.scale})")
            return
        marker.unlink(missing_ok=True)
        postmaster.stop(root / "data" / "postmaster.pid", timeout=60)
        shutil.rmtree(root, ignore_errors=True)
        self.own_dir(root)
        cluster.initdb(self.install, root / "data", owner=self.owner)
        console.log(f"{run.size} GiB source: pgbench -i -q -s {run.scale} (fsync=off) …")
        start = now()
        with self.source(run.size, BUILD_OPTS) as srv:
            with connect(**srv.conninfo(user="postgres")) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB)))
            proc.run(
                [
                    self.install.tool("pgbench"),
                    "-i",
                    "-q",
                    "-s",
                    str(run.scale),
                    "-h",
                    srv.socket_dir,
                    "-p",
                    str(srv.port),
                    "-U",
                    "postgres",
                    DB,
                ],
                timeout=4 * 3600,
                user=self.owner,
            )
            with connect(**srv.conninfo(user="postgres", dbname=DB)) as conn:
                conn.execute("CHECKPOINT")
        os.sync()  # fsync was off: make the cached copy durable before marking it good
        run.build_s = now() - start
        marker.write_text(f"{run.scale}\n")

    def ensure_base(self, run: SizeRun, srv: cluster.Running) -> None:
        assert self.pool is not None
        name = f"bench-{run.size}g"
        if run.build_s is not None:  # a new source: older bases of it are stale
            for old in self.pool.registry.bases(name):
                seed.remove_version(self.pool, name, old.version)
        if self.pool.registry.latest_base(name) is not None:
            console.log(f"{run.size} GiB base: reusing {name}")
            return
        console.log(f"{run.size} GiB base: seeding (pg_basebackup + verify + prepare) …")
        dsn = psycopg.conninfo.make_conninfo(
            host=os.fspath(srv.socket_dir), port=srv.port, user="postgres", dbname=DB
        )
        start = now()
        seed.seed(self.pool, name, source_dsn=dsn, refresh=True)
        run.seed_s = now() - start

    def ensure_raw(self, run: SizeRun, srv: cluster.Running) -> None:
        """The seed article's base: pg_basebackup output as is (crash-consistent, unprepared)."""
        root, marker = self.work / f"raw-{run.size}g", self.work / f"raw-{run.size}g.ready"
        if run.build_s is not None:  # a new source: the old copy is stale
            marker.unlink(missing_ok=True)
        if marker.exists():
            console.log(f"{run.size} GiB unprepared basebackup: reusing {root}")
            return
        shutil.rmtree(root, ignore_errors=True)
        self.own_dir(root)
        console.log(f"{run.size} GiB unprepared basebackup …")
        start = now()
        proc.run(
            [
                self.install.tool("pg_basebackup"),
                "-D",
                root / "data",
                "-h",
                srv.socket_dir,
                "-p",
                str(srv.port),
                "-U",
                "postgres",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-password",
            ],
            timeout=self.settings.command_timeout,
            user=self.owner,
        )
        run.raw_s = now() - start
        marker.write_text("ok\n")

    # -- the common second half of every cycle --------------------------------------------
    def measure(
        self, conn: Conn, s: Sample, aid: int, scale: int, layer: Callable[[], LayerSize]
    ) -> None:
        a = layer()
        s["create_logical"], s["create_physical"] = a.logical_bytes, a.physical_bytes
        self.drop_caches()
        start = now()
        conn.execute(READ_SQL, (aid,)).fetchone()
        s["read_ms"] = (now() - start) * 1000
        b = layer()
        s["read_logical"] = b.logical_bytes - a.logical_bytes
        s["read_physical"] = b.physical_bytes - a.physical_bytes
        lsn, writes = wal_pos(conn), buffer_writes(conn)
        start = now()
        conn.execute(UPDATE_SQL, (scale * 1000,))
        conn.execute("CHECKPOINT")
        s["update_s"] = now() - start
        c = layer()
        s["update_logical"] = c.logical_bytes - b.logical_bytes
        s["update_physical"] = c.physical_bytes - b.physical_bytes
        s["update_wal"] = wal_pos(conn) - lsn
        after = buffer_writes(conn)
        if writes is not None and after is not None:
            s["update_pages"] = after - writes

    # -- method 1: pgoverlay --------------------------------------------------------------
    def cycle_pgoverlay(self, run: SizeRun, cycle: int, aid: int) -> Sample:
        pool = self.pool
        assert pool is not None
        name, s = f"bench-{run.size}g-c{cycle}", Sample()
        branch.destroy(pool, name)  # a leftover of a killed run
        self.drop_caches()
        start = now()
        try:
            made = branch.create(pool, name, base_name=f"bench-{run.size}g")
            s["create_s"] = now() - start
            with connect(**branch.connect_kwargs(pool, made)) as conn:
                self.measure(conn, s, aid, run.scale, lambda: branch.layer_size(pool, name))
        finally:
            start = now()
            branch.destroy(pool, name)
            s["destroy_s"] = now() - start
        return s

    # -- method 2: the seed article's plain OverlayFS over an unprepared copy -------------
    def remove_overlay(self, root: Path) -> None:
        postmaster.stop(root / "upper" / "postmaster.pid", timeout=self.settings.stop_timeout)
        if (root / "data").exists():
            mounts.unmount(root / "data")
        shutil.rmtree(root, ignore_errors=True)

    def cycle_article(self, run: SizeRun, cycle: int, aid: int) -> Sample:
        root, s = self.work / f"ovl-{run.size}g-c{cycle}", Sample()
        self.remove_overlay(root)
        port = self.free_port()
        data, conf, log = root / "data", root / "conf", root / "log" / "postgres.log"
        options = {
            "data_directory": os.fspath(data),
            "config_file": os.fspath(conf / "postgresql.conf"),
            "hba_file": os.fspath(conf / "pg_hba.conf"),
            "ident_file": os.fspath(conf / "pg_ident.conf"),
            "external_pid_file": "",
            "listen_addresses": "127.0.0.1",
            "port": str(port),
            "unix_socket_directories": os.fspath(root / "sock"),
            "recovery_init_sync_method": "syncfs",
            "archive_mode": "off",
            "archive_command": "",
            "restore_command": "",
            "primary_conninfo": "",
            "ssl": "off",
            "shared_buffers": self.settings.shared_buffers,
            "max_connections": str(self.settings.max_connections),
            "work_mem": self.settings.work_mem,
            "maintenance_work_mem": self.settings.maintenance_work_mem,
            "logging_collector": "off",
        }
        child: subprocess.Popen[bytes] | None = None
        self.drop_caches()
        start = now()
        try:
            root.mkdir(mode=0o711)
            for sub in ("upper", "conf", "sock", "log"):
                self.own_dir(root / sub)
            (root / "work").mkdir(mode=0o700)
            data.mkdir(mode=0o700)
            files = {
                "postgresql.conf": f"include_if_exists '{data / 'postgresql.conf'}'\n",
                "pg_hba.conf": "local all all trust\nhost all all 127.0.0.1/32 trust\n",
                "pg_ident.conf": "",
            }
            for filename, text in files.items():
                (conf / filename).write_text(text)
                os.chown(conf / filename, self.owner.uid, self.owner.gid)
            mounts.mount_overlay(
                lower=self.work / f"raw-{run.size}g" / "data",
                upper=root / "upper",
                work=root / "work",
                target=data,
            )
            child = postmaster.start(
                self.install, datadir=data, options=options, user=self.owner, log_path=log
            )
            postmaster.wait_ready(
                data, child=child, log_path=log, timeout=self.settings.start_timeout
            )
            kwargs = {"host": "127.0.0.1", "port": port, "user": "postgres", "dbname": DB}
            conn = wait_for(
                lambda: try_connect(kwargs),
                timeout=self.settings.start_timeout,
                what=f"a TCP connection to port {port}",
            )
            s["create_s"] = now() - start
            with conn:
                self.measure(conn, s, aid, run.scale, lambda: sizes.layer_size(root / "upper"))
        finally:
            start = now()
            self.remove_overlay(root)
            s["destroy_s"] = now() - start
            if child is not None:
                child.wait(timeout=30)
        return s

    # -- method 3: CREATE DATABASE … TEMPLATE in the running source server ----------------
    def cycle_createdb(self, srv: cluster.Running, strategy: str, run: SizeRun, aid: int) -> Sample:
        copy, s = f"bench_copy_{strategy}", Sample()
        ident = sql.Identifier(copy)
        with connect(**srv.conninfo(user="postgres")) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(ident))
            admin.execute("CHECKPOINT")

            def db_size() -> LayerSize:
                n = int(scalar(admin, "SELECT pg_database_size(%s)", (copy,)))
                return LayerSize(logical_bytes=n, physical_bytes=n)

            self.drop_caches()
            lsn, start = wal_pos(admin), now()
            try:
                admin.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY {}").format(
                        ident, sql.Identifier(DB), sql.SQL(strategy)
                    )
                )
                with connect(**srv.conninfo(user="postgres", dbname=copy)) as conn:
                    conn.execute("SELECT 1")
                    s["create_s"] = now() - start
                    s["create_wal"] = wal_pos(admin) - lsn
                    self.measure(conn, s, aid, run.scale, db_size)
            finally:
                start = now()
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(ident))
                s["destroy_s"] = now() - start
        return s

    # -- one size -------------------------------------------------------------------------
    def run_size(self, run: SizeRun, cycles: int) -> None:
        self.ensure_source(run)
        strategies = ["wal_log", "file_copy"] if self.install.major >= 15 else ["file_copy"]
        with self.source(run.size, {}) as srv:
            with connect(**srv.conninfo(user="postgres")) as conn:
                for (stale,) in conn.execute(
                    "SELECT datname FROM pg_database WHERE datname LIKE 'bench_copy_%'"
                ).fetchall():
                    conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(stale)))
                run.db_bytes = int(scalar(conn, "SELECT pg_database_size(%s)", (DB,)))
            self.ensure_base(run, srv)
            self.ensure_raw(run, srv)
            run.runs = {m: [] for m in ["pgoverlay", "article", *strategies]}
            rng = random.Random(run.size)
            for cycle in range(1, cycles + 1):
                aid = rng.randint(1, run.scale * 100_000)
                run.runs["pgoverlay"].append(self.cycle_pgoverlay(run, cycle, aid))
                run.runs["article"].append(self.cycle_article(run, cycle, aid))
                for strategy in strategies:
                    run.runs[strategy].append(self.cycle_createdb(srv, strategy, run, aid))
                console.log(
                    f"{run.size} GiB cycle {cycle}/{cycles}: create "
                    + ", ".join(f"{m} {r[-1]['create_s']:.3f} s" for m, r in run.runs.items())
                )

    # -- cleanup --------------------------------------------------------------------------
    def sweep(self) -> None:
        """Stop and remove what a cycle (this run's or a killed one's) left running."""
        if self.pool is not None:
            pool = self.pool
            for b in pool.registry.branches():
                self.step(f"destroy branch {b.name}", lambda b=b: branch.destroy(pool, b.name))
            for v in pool.registry.bases():
                if v.state != "ready":
                    self.step(
                        f"remove base {v.name}",
                        lambda v=v: seed.remove_version(pool, v.name, v.version),
                    )
        for root in sorted(self.work.glob("ovl-*")):
            self.step(f"remove {root}", lambda root=root: self.remove_overlay(root))
        for data in sorted(self.work.glob("src-*/data")):
            self.step(
                f"stop {data}",
                lambda data=data: postmaster.stop(
                    data / "postmaster.pid", timeout=self.settings.stop_timeout
                ),
            )

    def remove_all(self) -> None:
        pool_root = self.settings.home / "pool"
        if self.pool is not None:
            self.pool.registry.close()
        for target in mounts.mounts_under(self.work):
            self.step(f"unmount {target}", lambda t=target: mounts.unmount(Path(t)))
        self.step("unmount the pool", lambda: mounts.unmount(pool_root))
        if mounts.is_mounted(pool_root):
            console.print(f"[red]{pool_root} is still mounted; leaving {self.work} in place")
            return
        for path in [
            self.settings.home,
            self.scratch,
            *self.work.glob("src-*"),
            *self.work.glob("raw-*"),
            *self.work.glob("ovl-*"),
        ]:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        if self.work.is_dir() and not any(self.work.iterdir()):
            self.work.rmdir()


# -- report ---------------------------------------------------------------------------------
def fmt(kind: str, value: float) -> str:
    if kind == "bytes":
        return format_bytes(int(value))
    if kind == "ms":
        return f"{value:.1f}" if value < 100 else f"{value:.0f}"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def cell(kind: str, values: list[float]) -> str:
    if not values:
        return "–"
    mid, lo, hi = statistics.median(values), min(values), max(values)
    return f"{fmt(kind, mid)} ({fmt(kind, lo)} – {fmt(kind, hi)})"


def col(run: SizeRun, method: str, key: str) -> list[float]:
    return [s[key] for s in run.runs.get(method, []) if key in s]


def machine(bench: Bench, started: dt.datetime, elapsed: float) -> list[str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    mem_kib = int(
        next(
            line.split()[1]
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        )
    )
    pool_fs = poolmod.fs_type(bench.settings.home / "pool")
    return [
        "| | |",
        "|---|---|",
        f"| Date | {started:%Y-%m-%d %H:%M} UTC (run took {elapsed / 60:.0f} min) |",
        f"| CPU | {cpu}, {os.cpu_count()} cores |",
        f"| RAM | {format_bytes(mem_kib * 1024)} |",
        f"| Kernel | {platform.system()} {platform.release()} |",
        f"| Work dir | `{bench.work}` on {poolmod.fs_type(bench.work)}; pgoverlay's pool is a "
        f"sparse {pool_fs} image (reflink) loop-mounted from it |",
        f"| Postgres | {bench.install.version} |",
        "| Page cache | "
        + (
            "dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`) before every "
            "create and again before every first read: both are **cold**"
            if bench.drop
            else "not dropped: reads are **warm**"
        )
        + " |",
    ]


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def targets(runs: list[SizeRun]) -> list[str]:
    lines = ["| target | measured (pgoverlay) | seed article | verdict |", "|---|---|---|---|"]
    medians = {r.size: statistics.median(col(r, "pgoverlay", "create_s")) for r in runs}
    small, big = runs[0], runs[-1]
    per_size = ", ".join(f"{size} GiB {v:.3f} s" for size, v in medians.items())
    lines.append(
        f"| create ≤ 0.3 s (median) | {per_size} | {SEED_ARTICLE['create_s']} s "
        f"(5 GiB, Docker) | {verdict(max(medians.values()) <= 0.3)} |"
    )
    if big is not small:
        a, b = medians[small.size], medians[big.size]
        lines.append(
            f"| flat from {small.size} to {big.size} GiB (medians within 25 % or 50 ms) "
            f"| {b / a:.2f}× ({b - a:+.3f} s) | 1.90 → 1.89 s | "
            f"{verdict(b <= a * 1.25 or b - a <= 0.05)} |"
        )
    layer = max(v for r in runs for v in col(r, "pgoverlay", "create_physical"))
    logical = max(v for r in runs for v in col(r, "pgoverlay", "create_logical"))
    lines.append(
        f"| layer after create ≤ 1 MiB (worst cycle) | physical {format_bytes(int(layer))}"
        f", logical {format_bytes(int(logical))} | {format_bytes(int(SEED_ARTICLE['create_layer']))} "
        f"| {verdict(layer <= 2**20)} |"
    )
    read = max(v for r in runs for v in col(r, "pgoverlay", "read_physical"))
    lines.append(
        f"| point read adds ~0 physical (worst cycle, ≤ 1 MiB) | {format_bytes(int(read))} "
        f"| whole segment (1 GiB) | {verdict(read <= 2**20)} |"
    )
    for r in runs:
        grow = statistics.median(col(r, "pgoverlay", "update_physical"))
        cost = [s.get("update_pages", 0) + s["update_wal"] for s in r.runs["pgoverlay"]]
        article = statistics.median(col(r, "article", "update_physical"))
        seed_ref = (
            f"{format_bytes(int(SEED_ARTICLE['update_5g']))}; here: " if r.size == 5 else "here: "
        ) + format_bytes(int(article))
        ok = grow <= 2 * statistics.median(cost)
        lines.append(
            f"| {r.size} GiB: 1% update grows by pages written + WAL (≤ 2×) | "
            f"{format_bytes(int(grow))} vs {format_bytes(int(statistics.median(cost)))} "
            f"written | {seed_ref} | {verdict(ok)} |"
        )
    return lines


def render(
    bench: Bench, runs: list[SizeRun], argv: list[str], started: dt.datetime, elapsed: float
) -> str:
    out = [
        START,
        "## Engine benchmark",
        "",
        f"Generated by `python bench/engine.py {' '.join(argv)}`. Every figure is the median "
        "over the cycles, with the range (min – max) in brackets. Rounds interleave the "
        "methods (one cycle of each, then the next round), so drift hits them alike.",
        "",
        "### Machine",
        "",
        *machine(bench, started, elapsed),
        "",
        "### Methods",
        "",
    ]
    out += [f"- **{label}**" for label in METHODS.values()]
    out += [
        "",
        "### Setup (one-off, per size)",
        "",
        "| size | pgbench scale | database | pgbench -i | seed: basebackup + verify + prepare "
        "| plain pg_basebackup |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        once = [f"{v:.1f} s" if v is not None else "cached" for v in (r.build_s, r.seed_s, r.raw_s)]
        out.append(
            f"| {r.size} GiB | {r.scale} | {format_bytes(r.db_bytes)} | {' | '.join(once)} |"
        )
    for r in runs:
        methods = list(r.runs)
        out += [
            "",
            f"### {r.size} GiB database ({format_bytes(r.db_bytes)}), "
            f"{len(r.runs['pgoverlay'])} cycles",
            "",
            "| | " + " | ".join(METHODS[m] for m in methods) + " |",
            "|---|" + "---|" * len(methods),
        ]
        for key, label, kind in ROWS:
            if any(col(r, m, key) for m in methods):
                out.append(
                    f"| {label} | " + " | ".join(cell(kind, col(r, m, key)) for m in methods) + " |"
                )
    out += [
        "",
        "### Targets",
        "",
        *targets(runs),
        "",
        "### How it is measured",
        "",
        "- *create until ready*: pgoverlay: `branch.create` (mount, start, set the branch "
        "login, a TCP connection with the password). Seed article's method: mount, start on "
        "the unprepared copy (crash recovery, `recovery_init_sync_method=syncfs`), first TCP "
        "connection. CREATE DATABASE: the statement plus a first connection to the copy.",
        "- *physical*: bytes of extents the writable layer does not share (FIEMAP), i.e. disk "
        "it really costs. On ext4 nothing is shared, so physical = allocated. For CREATE "
        "DATABASE, `pg_database_size` of the copy (its WAL is listed apart).",
        f"- *point read*: `{READ_SQL % '<random aid>'}`, the first statement on a fresh "
        "connection after the page cache was dropped; the same aid for every method in a round.",
        f"- *update*: `{UPDATE_SQL % 'scale × 1000'}` (1 % of rows) then `CHECKPOINT`. "
        "*Buffer writes* are the pages Postgres wrote (pg_stat_bgwriter: checkpoint + bgwriter "
        "+ backends), a page written twice counting twice.",
        "- Every server runs with `shared_buffers` "
        f"{bench.settings.shared_buffers}; the CREATE DATABASE server is the source itself "
        "(fsync on), idle while the other methods run.",
        "",
        "<details><summary>Every cycle</summary>",
        "",
    ]
    for r in runs:
        for m, samples in r.runs.items():
            for i, s in enumerate(samples, 1):
                vals = ", ".join(f"{k}={fmt(kind, s[k])}" for k, _, kind in ROWS if k in s)
                out.append(f"- {r.size} GiB, {m}, cycle {i}: {vals}")
    out += ["", "</details>", END]
    return "\n".join(out) + "\n"


def write_report(section: str) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    text = REPORT.read_text() if REPORT.exists() else "# Benchmarks\n\n"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + section.rstrip("\n") + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    REPORT.write_text(text)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,5", help="database sizes in GiB (default 1,5)")
    parser.add_argument("--cycles", type=int, default=5, help="create/destroy cycles per method")
    parser.add_argument("--work", default="/var/tmp/pgoverlay-bench", help="work directory")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the pool, sources and copies (a re-run reuses them)",
    )
    parser.add_argument("--pool-size", default="40G", help="size of the sparse pool image")
    parser.add_argument(
        "--no-drop-caches",
        action="store_true",
        help="do not drop the OS page cache before creates and first reads",
    )
    args = parser.parse_args(argv)
    size_list = sorted({int(x) for x in args.sizes.split(",") if x.strip()})
    if not size_list or args.cycles < 1:
        parser.error("need at least one size and one cycle")
    poolmod.require_root()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    bench = Bench(
        Path(args.work).resolve(), drop_caches=not args.no_drop_caches, pool_size=args.pool_size
    )
    started, t0 = dt.datetime.now(dt.UTC), now()
    runs = [SizeRun(size=n, scale=round(n * SCALE_PER_GIB)) for n in size_list]
    try:
        bench.open_pool()
        bench.sweep()
        for run in runs:
            bench.run_size(run, args.cycles)
        write_report(render(bench, runs, argv, started, now() - t0))
        console.log(f"report written to {REPORT}")
    finally:
        bench.sweep()
        if not args.keep:
            bench.remove_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
