#!/usr/bin/env python3
"""Engine benchmark: pgoverlay branches against the seed article's method and CREATE DATABASE.

    sudo .venv/bin/python bench/engine.py [--sizes 1,5] [--cycles 5] [--work DIR] [--keep]

For each size a pgbench database is built once (cached in the work dir), seeded into a pool of
our own, and copied once more with a plain pg_basebackup. Then every method runs one
create / point read / update / destroy cycle per round, side by side. The Markdown report
replaces the section between the engine markers in docs/benchmarks.md. This is a measurement
script: it asserts nothing about timings.
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
from functools import partial
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
STATEMENT_TIMEOUT = "-c statement_timeout=1800000"  # 30 min: every statement has a deadline
BUILD_OPTS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "1h",
    "maintenance_work_mem": "512MB",
}
# The seed article's branch settings: the same safety overrides as a pgoverlay branch.
ARTICLE_OPTS = {
    "recovery_init_sync_method": "syncfs",
    "archive_mode": "off",
    "archive_command": "",
    "restore_command": "",
    "primary_conninfo": "",
    "ssl": "off",
    "external_pid_file": "",
    "logging_collector": "off",
    "listen_addresses": "127.0.0.1",
}
METHODS = {
    "pgoverlay": "pgoverlay (prepared base, reflink XFS)",
    "article": "seed article's method (unprepared base, plain OverlayFS on ext4)",
    "wal_log": "CREATE DATABASE … TEMPLATE (WAL_LOG)",
    "file_copy": "CREATE DATABASE … TEMPLATE (FILE_COPY)",
}
ROWS = [  # key, row label, kind: "s", "ms" or "bytes"
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
SEED_CREATE_S, SEED_LAYER, SEED_UPDATE_5G = 1.89, int(33.1 * 2**20), int(5.20 * 2**30)
NOTES = """\
### How it is measured

- *create until ready*: pgoverlay: `branch.create` (mount, start, set the branch login, then a
  TCP connection with the password). Seed article's method: mount, start on the unprepared copy
  (crash recovery with `recovery_init_sync_method=syncfs`), first TCP connection. CREATE
  DATABASE: the statement plus a first connection to the copy.
- *physical*: the bytes of extents the writable layer does not share with the base (FIEMAP):
  the disk a branch really costs. ext4 shares nothing, so there physical = allocated. For
  CREATE DATABASE: `pg_database_size` of the copy; the WAL it wrote is listed apart.
- *point read*: `{read}`, the first statement on a fresh connection, after the page cache was
  dropped; every method reads the same random aid in a round.
- *update*: `{update}` (1 % of the rows), then `CHECKPOINT`. *Buffer writes* are the pages
  Postgres wrote meanwhile (pg_stat_bgwriter: checkpointer + bgwriter + backends; a page
  written twice counts twice).
- Every server runs with `shared_buffers={shared_buffers}`. The CREATE DATABASE server is the
  source itself (fsync on); it stays up, idle, while the other methods run.
"""
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


def scalar(conn: Conn, query: str, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def wal_pos(conn: Conn) -> int:
    return int(scalar(conn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


def buffer_writes(conn: Conn) -> int | None:
    """Bytes of buffers written by checkpointer, bgwriter and backends (Postgres <= 16)."""
    query = (
        "SELECT (buffers_checkpoint + buffers_clean + buffers_backend)"
        " * current_setting('block_size')::bigint FROM pg_stat_bgwriter"
    )
    try:
        return int(scalar(conn, query))
    except psycopg.Error:
        return None


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class SizeRun:
    gib: float
    scale: int
    db_bytes: int = 0
    build_s: float | None = None  # None: reused from the cache
    seed_s: float | None = None
    raw_s: float | None = None
    runs: dict[str, list[Sample]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.gib:g} GiB"

    @property
    def key(self) -> str:  # names every cached thing of this size
        return f"s{self.scale}"


class Bench:
    def __init__(self, work: Path, *, drop_caches: bool, pool_size: str) -> None:
        self.work, self.scratch = work, work / "tmp"
        self.settings = Settings(home=work / "pool-home", port_min=56100, port_max=56199)
        self.install = pgbin.newest(self.settings.pg_bindir)
        self.owner = proc.OsUser.lookup(self.settings.os_user)
        self.drop, self.pool_size = drop_caches, pool_size
        self.pool: poolmod.Pool | None = None

    # -- plumbing ---------------------------------------------------------------------------
    def own_dir(self, path: Path) -> Path:
        path.mkdir(mode=0o700)
        os.chown(path, self.owner.uid, self.owner.gid)
        return path

    def drop_caches(self) -> None:
        if self.drop:
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3\n")

    def open_pool(self) -> None:
        for path in (self.work, self.scratch):
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, 0o755)  # Postgres (another user) must reach what is below
        self.pool = poolmod.init(self.settings, size=self.pool_size)

    def free_port(self) -> int:
        used = {b.port for b in self.pool.registry.branches()} if self.pool else set()
        for port in range(self.settings.port_max, self.settings.port_min - 1, -1):
            if port not in used and port_free(port):
                return port
        raise RuntimeError(f"no free port in {self.settings.port_min}-{self.settings.port_max}")

    def pg_tool(self, srv: cluster.Running, tool: str, *args: str | Path, timeout: float) -> None:
        where: list[str | Path] = ["-h", srv.socket_dir, "-p", str(srv.port), "-U", "postgres"]
        proc.run([self.install.tool(tool), *where, *args], timeout=timeout, user=self.owner)

    # -- the source database, the seeded base and the plain copy (cached per size) ----------
    @contextmanager
    def source(self, run: SizeRun, options: dict[str, str]) -> Iterator[cluster.Running]:
        options = {"shared_buffers": self.settings.shared_buffers, **options}
        datadir = self.work / f"src-{run.key}" / "data"
        with cluster.running(
            self.install,
            datadir,
            owner=self.owner,
            scratch=self.scratch,
            options=options,
            timeout=600,
        ) as srv:
            yield srv

    def ensure_source(self, run: SizeRun) -> None:
        root, marker = self.work / f"src-{run.key}", self.work / f"src-{run.key}.ready"
        if marker.exists():
            console.log(f"{run.label} source: reusing {root}")
            return
        postmaster.stop(root / "data" / "postmaster.pid", timeout=60)
        shutil.rmtree(root, ignore_errors=True)
        cluster.initdb(self.install, self.own_dir(root) / "data", owner=self.owner)
        console.log(f"{run.label} source: pgbench -i -q -s {run.scale} (fsync=off) …")
        start = now()
        with self.source(run, BUILD_OPTS) as srv:
            with connect(**srv.conninfo(user="postgres")) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB)))
            self.pg_tool(srv, "pgbench", "-i", "-q", "-s", str(run.scale), DB, timeout=4 * 3600)
            with connect(**srv.conninfo(user="postgres", dbname=DB)) as conn:
                conn.execute("CHECKPOINT")
        os.sync()  # fsync was off: make the cache durable before marking it good
        run.build_s = now() - start
        marker.write_text("ok\n")

    def ensure_base(self, run: SizeRun, srv: cluster.Running) -> None:
        pool, name = self.pool, f"bench-{run.key}"
        assert pool is not None
        for old in pool.registry.bases(name) if run.build_s is not None else []:
            seed.remove_version(pool, name, old.version)  # seeded from an older source
        if pool.registry.latest_base(name) is not None:
            console.log(f"{run.label} base: reusing {name}")
            return
        console.log(f"{run.label} base: seeding (pg_basebackup, verify, prepare) …")
        dsn = f"host={srv.socket_dir} port={srv.port} user=postgres dbname={DB}"
        start = now()
        seed.seed(pool, name, source_dsn=dsn, refresh=True)
        run.seed_s = now() - start

    def ensure_raw(self, run: SizeRun, srv: cluster.Running) -> None:
        """The seed article's base: pg_basebackup's output as is (crash-consistent)."""
        root, marker = self.work / f"raw-{run.key}", self.work / f"raw-{run.key}.ready"
        if run.build_s is not None:
            marker.unlink(missing_ok=True)  # copied from an older source
        if marker.exists():
            console.log(f"{run.label} unprepared basebackup: reusing {root}")
            return
        shutil.rmtree(root, ignore_errors=True)
        self.own_dir(root)
        console.log(f"{run.label} unprepared basebackup …")
        start = now()
        self.pg_tool(
            srv,
            "pg_basebackup",
            "-D",
            root / "data",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-password",
            timeout=self.settings.command_timeout,
        )
        run.raw_s = now() - start
        marker.write_text("ok\n")

    # -- the second half of every cycle, the same for all methods ---------------------------
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

    # -- method 1: pgoverlay ----------------------------------------------------------------
    def cycle_pgoverlay(self, run: SizeRun, cycle: int, aid: int) -> Sample:
        pool, name, s = self.pool, f"bench-{run.key}-c{cycle}", Sample()
        assert pool is not None
        branch.destroy(pool, name)  # left over by a killed run
        self.drop_caches()
        start = now()
        try:
            made = branch.create(pool, name, base_name=f"bench-{run.key}")
            s["create_s"] = now() - start
            with connect(**branch.connect_kwargs(pool, made)) as conn:
                self.measure(conn, s, aid, run.scale, partial(branch.layer_size, pool, name))
        finally:
            start = now()
            branch.destroy(pool, name)
            s["destroy_s"] = now() - start
        return s

    # -- method 2: the seed article's plain OverlayFS over an unprepared copy ---------------
    def remove_overlay(self, root: Path) -> None:
        postmaster.stop(root / "upper" / "postmaster.pid", timeout=self.settings.stop_timeout)
        mounts.unmount(root / "data")
        shutil.rmtree(root, ignore_errors=True)

    def cycle_article(self, run: SizeRun, cycle: int, aid: int) -> Sample:
        root, s = self.work / f"ovl-{run.key}-c{cycle}", Sample()
        self.remove_overlay(root)
        port, data, conf = self.free_port(), root / "data", root / "conf"
        options = {
            **ARTICLE_OPTS,
            "port": str(port),
            "data_directory": str(data),
            "unix_socket_directories": str(root / "sock"),
            "shared_buffers": self.settings.shared_buffers,
            "max_connections": str(self.settings.max_connections),
        }
        files = {
            "postgresql.conf": f"include_if_exists '{data / 'postgresql.conf'}'\n",
            "pg_hba.conf": "local all all trust\nhost all all 127.0.0.1/32 trust\n",
            "pg_ident.conf": "",
        }
        options.update(
            config_file=str(conf / "postgresql.conf"),
            hba_file=str(conf / "pg_hba.conf"),
            ident_file=str(conf / "pg_ident.conf"),
        )
        child: subprocess.Popen[bytes] | None = None
        self.drop_caches()
        start = now()
        try:
            root.mkdir(mode=0o711)
            for sub in ("upper", "conf", "sock", "log"):
                self.own_dir(root / sub)
            for sub in ("work", "data"):
                (root / sub).mkdir(mode=0o700)
            for filename, text in files.items():
                (conf / filename).write_text(text)
                os.chown(conf / filename, self.owner.uid, self.owner.gid)
            mounts.mount_overlay(
                lower=self.work / f"raw-{run.key}" / "data",
                upper=root / "upper",
                work=root / "work",
                target=data,
            )
            log = root / "log" / "postgres.log"
            child = postmaster.start(
                self.install, datadir=data, options=options, user=self.owner, log_path=log
            )
            postmaster.wait_ready(
                data, child=child, log_path=log, timeout=self.settings.start_timeout
            )
            kwargs = {"host": "127.0.0.1", "port": port, "user": "postgres", "dbname": DB}
            conn = wait_for(
                partial(try_connect, kwargs),
                timeout=self.settings.start_timeout,
                what=f"a TCP connection to port {port}",
            )
            s["create_s"] = now() - start
            with conn:
                self.measure(conn, s, aid, run.scale, partial(sizes.layer_size, root / "upper"))
        finally:
            start = now()
            self.remove_overlay(root)
            s["destroy_s"] = now() - start
            if child is not None:
                child.wait(timeout=30)
        return s

    # -- method 3: CREATE DATABASE … TEMPLATE in the running source server ------------------
    def cycle_createdb(self, srv: cluster.Running, strategy: str, run: SizeRun, aid: int) -> Sample:
        copy, s = f"bench_copy_{strategy}", Sample()
        drop = sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(copy))
        create = sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY {}").format(
            sql.Identifier(copy), sql.Identifier(DB), sql.SQL(strategy)
        )
        with connect(**srv.conninfo(user="postgres")) as admin:
            admin.execute(drop)
            admin.execute("CHECKPOINT")

            def db_size() -> LayerSize:
                n = int(scalar(admin, "SELECT pg_database_size(%s)", (copy,)))
                return LayerSize(logical_bytes=n, physical_bytes=n)

            self.drop_caches()
            lsn, start = wal_pos(admin), now()
            try:
                admin.execute(create)
                with connect(**srv.conninfo(user="postgres", dbname=copy)) as conn:
                    conn.execute("SELECT 1")
                    s["create_s"] = now() - start
                    s["create_wal"] = wal_pos(admin) - lsn
                    self.measure(conn, s, aid, run.scale, db_size)
            finally:
                start = now()
                admin.execute(drop)
                s["destroy_s"] = now() - start
        return s

    # -- one size ---------------------------------------------------------------------------
    def run_size(self, run: SizeRun, cycles: int) -> None:
        self.ensure_source(run)
        strategies = ["wal_log", "file_copy"] if self.install.major >= 15 else ["file_copy"]
        with self.source(run, {}) as srv:
            with connect(**srv.conninfo(user="postgres")) as conn:
                stale = "SELECT datname FROM pg_database WHERE datname LIKE 'bench_copy_%'"
                for (name,) in conn.execute(stale).fetchall():
                    conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(name)))
                run.db_bytes = int(scalar(conn, "SELECT pg_database_size(%s)", (DB,)))
            self.ensure_base(run, srv)
            self.ensure_raw(run, srv)
            run.runs = {m: [] for m in ["pgoverlay", "article", *strategies]}
            rng = random.Random(run.scale)
            for cycle in range(1, cycles + 1):
                aid = rng.randint(1, run.scale * 100_000)
                run.runs["pgoverlay"].append(self.cycle_pgoverlay(run, cycle, aid))
                run.runs["article"].append(self.cycle_article(run, cycle, aid))
                for strategy in strategies:
                    run.runs[strategy].append(self.cycle_createdb(srv, strategy, run, aid))
                done = ", ".join(f"{m} {r[-1]['create_s']:.3f} s" for m, r in run.runs.items())
                console.log(f"{run.label} round {cycle}/{cycles}, create: {done}")

    # -- cleanup ----------------------------------------------------------------------------
    def sweep(self) -> None:
        """Stop and remove whatever a cycle (of this run or a killed one) left behind."""
        steps: list[tuple[str, Callable[[], object]]] = []
        if self.pool is not None:
            pool = self.pool
            steps += [
                (f"destroy branch {b.name}", partial(branch.destroy, pool, b.name))
                for b in pool.registry.branches()
            ]
            steps += [
                (f"remove base {v.name}", partial(seed.remove_version, pool, v.name, v.version))
                for v in pool.registry.bases()
                if v.state != "ready"
            ]
        steps += [
            (f"remove {root}", partial(self.remove_overlay, root))
            for root in sorted(self.work.glob("ovl-*"))
        ]
        steps += [
            (f"stop {pid}", partial(postmaster.stop, pid, timeout=60))
            for pid in sorted(self.work.glob("src-*/data/postmaster.pid"))
        ]
        for label, action in steps:
            try:
                action()
            except Exception as err:  # noqa: BLE001 - report and go on cleaning
                console.print(f"[yellow]cleanup: {label} failed: {err}")

    def remove_all(self) -> None:
        pool_root = self.settings.home / "pool"
        if self.pool is not None:
            self.pool.registry.close()
        for target in [*mounts.mounts_under(self.work), str(pool_root)]:  # deepest first
            mounts.unmount(Path(target))
        for pattern in ("pool-home", "tmp", "src-*", "raw-*", "ovl-*"):
            for path in self.work.glob(pattern):
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        if not any(self.work.iterdir()):
            self.work.rmdir()


# -- report ---------------------------------------------------------------------------------
def fmt(kind: str, value: float) -> str:
    if kind == "bytes":
        return format_bytes(int(value))
    digits = (1 if value < 100 else 0) if kind == "ms" else (3 if value < 10 else 1)
    return f"{value:.{digits}f}"


def cell(kind: str, values: list[float]) -> str:
    if not values:
        return "–"
    mid, lo, hi = statistics.median(values), min(values), max(values)
    return f"{fmt(kind, mid)} ({fmt(kind, lo)} – {fmt(kind, hi)})"


def col(run: SizeRun, method: str, key: str) -> list[float]:
    return [s[key] for s in run.runs.get(method, []) if key in s]


def first_field(path: str, prefix: str) -> str:
    lines = Path(path).read_text().splitlines()
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(prefix)), "?")


def machine(bench: Bench, started: dt.datetime, elapsed: float) -> list[str]:
    ram = int(first_field("/proc/meminfo", "MemTotal").split()[0]) * 1024
    cache = (
        "dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`) before every create and "
        "again before every first read: both are **cold**"
        if bench.drop
        else "never dropped: reads are **warm**"
    )
    return [
        "| | |",
        "|---|---|",
        f"| Date | {started:%Y-%m-%d %H:%M} UTC (the run took {elapsed / 60:.0f} min) |",
        f"| CPU | {first_field('/proc/cpuinfo', 'model name')}, {os.cpu_count()} cores |",
        f"| RAM | {format_bytes(ram)} |",
        f"| Kernel | {platform.system()} {platform.release()} |",
        f"| Work dir | `{bench.work}` on {poolmod.fs_type(bench.work)}; the pgoverlay pool is a "
        f"sparse {poolmod.fs_type(bench.settings.home / 'pool')} image (reflink) in it |",
        f"| Postgres | {bench.install.version} |",
        f"| Page cache | {cache} |",
    ]


def targets(runs: list[SizeRun]) -> list[str]:
    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    def worst(key: str) -> int:
        return int(max(v for r in runs for v in col(r, "pgoverlay", key)))

    med = {r.label: statistics.median(col(r, "pgoverlay", "create_s")) for r in runs}
    lines = [
        "| target | pgoverlay, measured | seed article | verdict |",
        "|---|---|---|---|",
        f"| create ≤ 0.3 s (median) | {', '.join(f'{k}: {v:.3f} s' for k, v in med.items())}"
        f" | {SEED_CREATE_S} s at 5 GiB | {verdict(max(med.values()) <= 0.3)} |",
    ]
    if len(runs) > 1:
        a, b = med[runs[0].label], med[runs[-1].label]
        lines.append(
            f"| flat in size: median at {runs[-1].label} within 25 % or 50 ms of "
            f"{runs[0].label} | {b / a:.2f}× ({b - a:+.3f} s) | 1.90 s → 1.89 s | "
            f"{verdict(b <= 1.25 * a or b - a <= 0.05)} |"
        )
    phys, logical, read = worst("create_physical"), worst("create_logical"), worst("read_physical")
    lines += [
        f"| layer after create ≤ 1 MiB (worst cycle) | physical {format_bytes(phys)}, "
        f"logical {format_bytes(logical)} | {format_bytes(SEED_LAYER)} | "
        f"{verdict(phys <= 2**20)} |",
        f"| point read adds ~0 physical (worst cycle ≤ 1 MiB) | {format_bytes(read)} | "
        f"whole segments | {verdict(read <= 2**20)} |",
    ]
    for r in runs:
        grow = int(statistics.median(col(r, "pgoverlay", "update_physical")))
        cost = int(
            statistics.median(
                [s.get("update_pages", 0) + s["update_wal"] for s in r.runs["pgoverlay"]]
            )
        )
        here = format_bytes(int(statistics.median(col(r, "article", "update_physical"))))
        ref = f"{format_bytes(SEED_UPDATE_5G)} (here: {here})" if r.gib == 5 else f"here: {here}"
        lines.append(
            f"| {r.label}: 1% update grows by the pages written + WAL (≤ 2×) | "
            f"{format_bytes(grow)} for {format_bytes(cost)} written | {ref} | "
            f"{verdict(grow <= 2 * cost)} |"
        )
    return lines


def render(
    bench: Bench, runs: list[SizeRun], argv: list[str], started: dt.datetime, elapsed: float
) -> str:
    out = [
        START,
        "## Engine benchmark",
        "",
        f"Generated by `python bench/engine.py {' '.join(argv)}`. Each cell is the median over "
        "the cycles, with the range (min – max) in brackets. The methods take turns (one "
        "cycle of each per round), so drift on a noisy machine hits them alike.",
        "",
        "### Machine",
        "",
        *machine(bench, started, elapsed),
        "",
        "### Methods",
        "",
        *[f"- **{label}**" for label in METHODS.values()],
        "",
        "### Setup (one-off, per size)",
        "",
        "| size | pgbench scale | database | pgbench -i | seed: basebackup, verify, prepare "
        "| plain pg_basebackup |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        once = [f"{v:.1f} s" if v is not None else "cached" for v in (r.build_s, r.seed_s, r.raw_s)]
        out.append(f"| {r.label} | {r.scale} | {format_bytes(r.db_bytes)} | {' | '.join(once)} |")
    for r in runs:
        out += [
            "",
            f"### {r.label} database ({format_bytes(r.db_bytes)}), "
            f"{len(r.runs['pgoverlay'])} cycles",
            "",
            "| | " + " | ".join(METHODS[m] for m in r.runs) + " |",
            "|---|" + "---|" * len(r.runs),
        ]
        out += [
            f"| {label} | " + " | ".join(cell(kind, col(r, m, key)) for m in r.runs) + " |"
            for key, label, kind in ROWS
            if any(col(r, m, key) for m in r.runs)
        ]
    out += [
        "",
        "### Targets",
        "",
        *targets(runs),
        "",
        NOTES.format(
            read=READ_SQL % "<random aid>",
            update=UPDATE_SQL % "scale × 1000",
            shared_buffers=bench.settings.shared_buffers,
        ),
        "<details><summary>Every cycle</summary>",
        "",
    ]
    for r in runs:
        for m, samples in r.runs.items():
            out += [
                f"- {r.label}, {m}, cycle {i}: "
                + ", ".join(f"{k}={fmt(kind, s[k])}" for k, _, kind in ROWS if k in s)
                for i, s in enumerate(samples, 1)
            ]
    return "\n".join([*out, "", "</details>", END]) + "\n"


def write_report(section: str) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    text = REPORT.read_text() if REPORT.exists() else "# Benchmarks\n"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + section.rstrip("\n") + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    REPORT.write_text(text)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Benchmark the branch engine (run as root).")
    parser.add_argument("--sizes", default="1,5", help="database sizes in GiB (default: 1,5)")
    parser.add_argument("--cycles", type=int, default=5, help="cycles per method and size")
    parser.add_argument("--work", default="/var/tmp/pgoverlay-bench", help="work directory")
    parser.add_argument("--keep", action="store_true", help="keep pool and sources for a re-run")
    parser.add_argument("--pool-size", default="40G", help="sparse pool image size")
    parser.add_argument("--no-drop-caches", action="store_true", help="keep the page cache warm")
    args = parser.parse_args(argv)
    gibs = sorted({float(x) for x in args.sizes.split(",") if x.strip()})
    if not gibs or args.cycles < 1:
        parser.error("need at least one size and one cycle")
    poolmod.require_root()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally blocks run
    bench = Bench(
        Path(args.work).resolve(), drop_caches=not args.no_drop_caches, pool_size=args.pool_size
    )
    runs = [SizeRun(gib=g, scale=max(1, round(g * SCALE_PER_GIB))) for g in gibs]
    started, t0 = dt.datetime.now(dt.UTC), now()
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
