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
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from engine_report import REPORT, Context, Sample, SizeRun, render, write_report
from psycopg import sql
from rich.console import Console

from pgoverlay.runner import branch, proc, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.branch import sizes
from pgoverlay.runner.branch.sizes import LayerSize
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import mounts
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster, postmaster
from pgoverlay.runner.settings import Settings

SCALE_PER_GIB = 68.4  # pgbench -s 68 is about 1 GiB, -s 342 about 5 GiB
DB = "bench"
READ_SQL = "SELECT abalance FROM pgbench_accounts WHERE aid = %s"
UPDATE_SQL = "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid <= %s"
STATEMENT_TIMEOUT = "-c statement_timeout=1800000"  # 30 min: every statement has a deadline


def settings_of(text: str) -> dict[str, str]:
    """'a=1 b=' -> {"a": "1", "b": ""}: Postgres settings, written compactly."""
    return dict(item.split("=", 1) for item in text.split())


BUILD_OPTS = settings_of(
    "fsync=off synchronous_commit=off full_page_writes=off max_wal_size=8GB "
    "checkpoint_timeout=1h maintenance_work_mem=512MB"
)
# The seed article's branch: the same safety overrides as a pgoverlay branch, no passwords.
ARTICLE_OPTS = settings_of(
    "recovery_init_sync_method=syncfs archive_mode=off archive_command= "
    "restore_command= primary_conninfo= ssl=off external_pid_file= "
    "logging_collector=off listen_addresses=127.0.0.1"
)
console = Console(highlight=False)
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


class Bench:
    def __init__(self, work: Path, *, drop_caches: bool, pool_size: str, creates: int) -> None:
        self.work, self.scratch = work, work / "tmp"
        self.settings = Settings(home=work / "pool-home", port_min=56100, port_max=56199)
        self.install = pgbin.newest(self.settings.pg_bindir)
        self.owner = proc.OsUser.lookup(self.settings.os_user)
        self.drop, self.pool_size, self.creates = drop_caches, pool_size, creates
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
            run.reused.add("build")
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
        run.setup["build"], run.fresh = now() - start, True
        marker.write_text("ok\n")

    def ensure_base(self, run: SizeRun, srv: cluster.Running) -> None:
        pool, name = self.pool, f"bench-{run.key}"
        assert pool is not None
        for old in pool.registry.bases(name) if run.fresh else []:
            seed.remove_version(pool, name, old.version)  # seeded from an older source
        if pool.registry.latest_base(name) is not None:
            console.log(f"{run.label} base: reusing {name}")
            run.reused.add("seed")
            return
        console.log(f"{run.label} base: seeding (pg_basebackup, verify, prepare) …")
        dsn = f"host={srv.socket_dir} port={srv.port} user=postgres dbname={DB}"
        start = now()
        seed.seed(pool, name, source_dsn=dsn, refresh=True)
        run.setup["seed"] = now() - start

    def ensure_raw(self, run: SizeRun, srv: cluster.Running) -> None:
        """The seed article's base: pg_basebackup's output as is (crash-consistent)."""
        root, marker = self.work / f"raw-{run.key}", self.work / f"raw-{run.key}.ready"
        if run.fresh:
            marker.unlink(missing_ok=True)  # copied from an older source
        if marker.exists():
            console.log(f"{run.label} unprepared basebackup: reusing {root}")
            run.reused.add("raw")
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
        run.setup["raw"] = now() - start
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
    def cycle_pgoverlay(self, run: SizeRun, cycle: int, aid: int | None) -> Sample:
        """One cycle; with ``aid`` None, only create and destroy."""
        pool, name, s = self.pool, f"bench-{run.key}-c{cycle}", Sample()
        assert pool is not None
        branch.destroy(pool, name)  # left over by a killed run
        self.drop_caches()
        start = now()
        try:
            made = branch.create(pool, name, base_name=f"bench-{run.key}")
            s["create_s"] = now() - start
            if aid is not None:
                with connect(**branch.connection(pool, made).connect_kwargs()) as conn:
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

    def cycle_article(self, run: SizeRun, cycle: int, aid: int | None) -> Sample:
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
                if aid is not None:
                    upper = partial(sizes.layer_size, root / "upper")
                    self.measure(conn, s, aid, run.scale, upper)
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
                    admin.execute("CHECKPOINT")  # flush the copy's dirty buffers, untimed
                    self.measure(conn, s, aid, run.scale, db_size)
            finally:
                start = now()
                admin.execute(drop)
                s["destroy_s"] = now() - start
        return s

    # -- one size ---------------------------------------------------------------------------
    def run_size(self, run: SizeRun, cycles: int) -> None:
        timings = self.work / "setup.json"  # one-off timings, remembered with the caches
        known = json.loads(timings.read_text()) if timings.exists() else {}
        run.setup = dict(known.get(run.key, {}))
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
            timings.write_text(json.dumps({**known, run.key: run.setup}, indent=1) + "\n")
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
            console.log(f"{run.label}: {self.creates} more create/destroy pairs per overlay method")
            for _ in range(self.creates):  # create time is the headline: sample it more
                for method, cycle_of in (
                    ("pgoverlay", self.cycle_pgoverlay),
                    ("article", self.cycle_article),
                ):
                    run.creates.setdefault(method, []).append(cycle_of(run, 0, None)["create_s"])

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
            # The engine leaves its per-pool socket parent (/run/pgoverlay/ID) behind.
            with suppress(OSError):
                branch.layout(self.pool, "any").socket_dir.parent.rmdir()
        for target in [*mounts.mounts_under(self.work), str(pool_root)]:  # deepest first
            mounts.unmount(Path(target))
        for pattern in ("pool-home", "tmp", "src-*", "raw-*", "ovl-*", "setup.json"):
            for path in self.work.glob(pattern):
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        if not any(self.work.iterdir()):
            self.work.rmdir()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Benchmark the branch engine (run as root).")
    parser.add_argument("--sizes", default="1,5", help="database sizes in GiB (default: 1,5)")
    parser.add_argument("--cycles", type=int, default=5, help="cycles per method and size")
    parser.add_argument("--work", default="/var/tmp/pgoverlay-bench", help="work directory")
    parser.add_argument("--keep", action="store_true", help="keep pool and sources for a re-run")
    parser.add_argument("--pool-size", default="40G", help="sparse pool image size")
    parser.add_argument("--creates", type=int, default=20, help="extra create/destroy samples")
    parser.add_argument("--no-drop-caches", action="store_true", help="keep the page cache warm")
    args = parser.parse_args(argv)
    gibs = sorted({float(x) for x in args.sizes.split(",") if x.strip()})
    if not gibs or args.cycles < 1:
        parser.error("need at least one size and one cycle")
    poolmod.require_root()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally blocks run
    bench = Bench(
        Path(args.work).resolve(),
        drop_caches=not args.no_drop_caches,
        pool_size=args.pool_size,
        creates=max(0, args.creates),
    )
    runs = [SizeRun(gib=g, scale=max(1, round(g * SCALE_PER_GIB))) for g in gibs]
    started, t0 = dt.datetime.now(dt.UTC), now()
    try:
        bench.open_pool()
        bench.sweep()
        for run in runs:
            bench.run_size(run, args.cycles)
        ctx = Context(
            argv=argv,
            started=started,
            elapsed=now() - t0,
            work=bench.work,
            work_fs=poolmod.fs_type(bench.work),
            pool_fs=poolmod.fs_type(bench.settings.home / "pool"),
            postgres=bench.install.version,
            drop_caches=bench.drop,
            shared_buffers=bench.settings.shared_buffers,
            read_sql=READ_SQL % "<random aid>",
            update_sql=UPDATE_SQL % "scale × 1000",
        )
        write_report(render(runs, ctx))
        console.log(f"report written to {REPORT}")
    finally:
        bench.sweep()
        if not args.keep:
            bench.remove_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
