#!/usr/bin/env python3
"""WAL benchmark: which WAL configuration lets a branch write at plain Postgres's speed.

    sudo .venv/bin/python bench/wal.py [--sizes 1,5] [--cycles 3] [--rounds 3] [--duration 20]

For each size a pgbench database is built once (cached in the work dir, as bench/engine.py
does), then seeded into a pool of our own once per WAL segment size tried. Part 1 runs the
1 % update (then CHECKPOINT) in a fresh branch for every WAL configuration, the
configurations taking turns: its time, the layer's physical growth against what Postgres wrote
(buffer writes + WAL), and the layer right after create. Part 2 runs pgbench (TPC-B
read-write, then read-only -S) for a fixed time in a branch with the shipped configuration,
against plain Postgres on a plain copy of the same base on the pool's filesystem (same
settings, no overlay) and against the seed article's method (plain OverlayFS over an
unprepared basebackup), the methods taking turns. The Markdown section replaces the one between
the wal markers in docs/benchmarks.md. A measurement script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from engine import DB, SCALE_PER_GIB, UPDATE_SQL, Bench, Conn, connect, console, now, scalar
from engine_report import Sample, SizeRun, machine_line, remove_pool, write_report

from pgoverlay.runner import branch, proc, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.branch import conf as branchconf
from pgoverlay.runner.branch.sizes import LayerSize
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.units import format_bytes

START, END = "<!-- wal:start -->", "<!-- wal:end -->"
PORTS = (56300, 56399)
MiB = 1024 * 1024
PGBENCH = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)


@dataclass(frozen=True)
class WalConfig:
    """One way a branch may write WAL: the base's segment size and the branch's settings."""

    segsize_mb: int
    wal_init_zero: bool
    wal_recycle: bool
    max_wal_size: str = "512MB"
    checkpoint_timeout: str = "5min"

    @classmethod
    def of(cls, s: Settings) -> WalConfig:
        return cls(
            s.wal_segsize_mb, s.wal_init_zero, s.wal_recycle, s.max_wal_size, s.checkpoint_timeout
        )

    def apply(self, s: Settings) -> None:
        """Make new branches (and new bases) of the pool use this configuration."""
        s.wal_segsize_mb, s.wal_init_zero, s.wal_recycle = (
            self.segsize_mb,
            self.wal_init_zero,
            self.wal_recycle,
        )
        s.max_wal_size, s.checkpoint_timeout = self.max_wal_size, self.checkpoint_timeout

    @property
    def label(self) -> str:
        onoff = {True: "on", False: "off"}
        return (
            f"{self.segsize_mb} MiB segments, init_zero {onoff[self.wal_init_zero]}, "
            f"recycle {onoff[self.wal_recycle]}, max_wal_size {self.max_wal_size}, "
            f"checkpoint_timeout {self.checkpoint_timeout}"
        )


SHIPPED = WalConfig.of(Settings())
BEFORE = WalConfig(1, True, True)  # what bases and branches had until this benchmark
CONFIGS = list(
    dict.fromkeys(
        [
            BEFORE,
            WalConfig(1, False, False),
            WalConfig(4, True, False),
            WalConfig(16, True, True),
            WalConfig(16, False, False),
            WalConfig(16, True, False),
            WalConfig(16, True, False, "2GB", "30min"),
            WalConfig(64, True, False),
            SHIPPED,
        ]
    )
)
# Configurations pgbench read-write also runs with in a branch, besides the shipped one.
TPS_CONFIGS = [c for c in (BEFORE, WalConfig(16, False, False)) if c != SHIPPED]
# Plain Postgres runs with Postgres's own WAL settings (zeroed, recycled segments) on a copy of
# the shipped base: what the same server does on the same disk without pgoverlay.
STOCK_WAL = {"wal_init_zero": "on", "wal_recycle": "on"}
METHODS = {
    "branch": "pgoverlay branch (shipped WAL configuration)",
    "plain": "plain Postgres on a copy of the base (same disk, stock WAL settings)",
    "article": "seed article's method (plain OverlayFS, unprepared basebackup)",
}
MODES = {"rw": ("TPC-B read-write", []), "ro": ("read-only (-S)", ["-S"])}


@dataclass
class SizeResults:
    run: SizeRun
    updates: dict[WalConfig, list[Sample]] = field(default_factory=dict)
    tps: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (method, mode)
    segments: dict[int, int] = field(default_factory=dict)  # segsize MiB -> measured bytes
    warm: dict[str, list[float]] = field(default_factory=dict)  # method -> warm-up seconds


class WalBench(Bench):
    """bench/engine.py's machinery (sources, pools, the seed article's overlay) on our own
    ports, with pgbench where engine.py measures a read and an update."""

    def __init__(self, work: Path, *, pool_size: str, clients: int, duration: int) -> None:
        super().__init__(work, drop_caches=False, pool_size=pool_size, creates=0)
        self.settings = Settings(
            home=work / "pool-home", port_min=PORTS[0], port_max=PORTS[1], runtime="local"
        )
        self.clients, self.duration = clients, duration
        self.inside: Callable[[Conn], None] | None = None  # what a cycle runs in its server
        self.warm_times: dict[str, list[float]] = {}  # method -> warm-up seconds

    # -- what runs inside a server: engine.py's cycles call measure() ---------------------
    def measure(
        self, conn: Conn, s: Sample, aid: int, scale: int, layer: Callable[[], LayerSize]
    ) -> None:
        if self.inside is None:
            super().measure(conn, s, aid, scale, layer)
        else:
            self.inside(conn)

    def pgbench(self, sockets: str, port: int, user: str, mode: str, key: str) -> float:
        """pgbench for ``self.duration`` seconds on a server's Unix socket as its superuser (the
        same path for every method), after a warm-up: its TPS. The warm-up's time is kept
        under ``key``."""
        self.warm_times.setdefault(key, []).append(self.warm_up(sockets, port, user))
        os.sync()  # what the previous run or the warm-up left dirty is not this one's to write
        jobs = str(min(self.clients, os.cpu_count() or 1))
        args = [
            "-h",
            sockets,
            "-p",
            str(port),
            "-U",
            user,
            "-n",
            "-c",
            str(self.clients),
            "-j",
            jobs,
        ]
        args += ["-T", str(self.duration), *MODES[mode][1], DB]
        done = proc.run(
            [self.install.tool("pgbench"), *args], timeout=self.duration + 600, user=self.owner
        )
        match = PGBENCH.search(done.stdout)
        if not match:
            raise RuntimeError(f"no TPS in pgbench's output: {done.stdout[-500:]}")
        return float(match.group(1))

    # -- bases: one per segment size ------------------------------------------------------
    def warm_up(self, sockets: str, port: int, user: str) -> float:
        """Bring the server to a steady state: every pgbench relation opened (which copies it
        up in an overlay), then every file of its data directory read once through the path
        the server uses. A copied-up file is a new inode whose page cache starts empty, while
        plain Postgres's files stay cached from run to run: without this, a comparison of
        write paths would measure cache misses. Returns the seconds it took."""
        start = now()
        with connect(host=sockets, port=port, user=user, dbname=DB) as conn:
            datadir = Path(str(scalar(conn, "SHOW data_directory")))
            for table, key in (("accounts", "aid"), ("branches", "bid"), ("tellers", "tid")):
                conn.execute(f"SELECT * FROM pgbench_{table} WHERE {key} = 1").fetchall()
            conn.execute("SELECT count(*) FROM pgbench_history").fetchone()
        for path in sorted(datadir.rglob("*")):
            if path.is_file() and not path.is_symlink():
                with suppress(OSError), open(path, "rb", buffering=0) as f:
                    while f.read(1 << 20):
                        pass
        return now() - start

    def base_name(self, run: SizeRun, segsize: int) -> str:
        return f"bench-{run.key}-seg{segsize}"

    def ensure_bases(self, run: SizeRun, srv: cluster.Running, segsizes: set[int]) -> None:
        pool = self.pool
        assert pool is not None
        dsn = f"host={srv.socket_dir} port={srv.port} user=postgres dbname={DB}"
        keep = pool.settings.wal_segsize_mb
        try:
            for segsize in sorted(segsizes):
                name = self.base_name(run, segsize)
                for old in pool.registry.bases(name) if run.fresh else []:
                    seed.remove_version(pool, name, old.version)
                if pool.registry.latest_base(name) is not None:
                    continue
                console.log(f"{run.label}: seeding {name} ({segsize} MiB WAL segments) …")
                pool.settings.wal_segsize_mb = segsize
                start = now()
                seed.seed(pool, name, source_dsn=dsn, refresh=True)
                run.setup[f"seed {segsize} MiB"] = now() - start
        finally:
            pool.settings.wal_segsize_mb = keep

    def segment_bytes(self, run: SizeRun, segsize: int) -> int:
        """The segment size the base really has (pg_wal), as branches will see it."""
        pool = self.pool
        assert pool is not None
        base = pool.registry.latest_base(self.base_name(run, segsize))
        assert base is not None
        return branchconf.wal_segment_bytes(pool.base_dir(base.name, base.version)) or 0

    # -- part 1: the 1 % update per configuration ------------------------------------------
    def cycle_config(self, run: SizeRun, cfg: WalConfig, cycle: int, aid: int) -> Sample:
        pool, name, s = self.pool, f"wal-{run.key}-c{cycle}", Sample()
        assert pool is not None
        branch.destroy(pool, name)  # left over by a killed run
        cfg.apply(pool.settings)
        os.sync()  # what the previous cycle left dirty is not this one's to write
        start = now()
        try:
            made = branch.create(pool, name, base_name=self.base_name(run, cfg.segsize_mb))
            s["create_s"] = now() - start
            with connect(**branch.connection(pool, made).connect_kwargs()) as conn:
                super().measure(conn, s, aid, run.scale, partial(branch.layer_size, pool, name))
        finally:
            branch.destroy(pool, name)
        return s

    # -- part 2: pgbench per method --------------------------------------------------------
    @contextmanager
    def plain(self, run: SizeRun, cfg: WalConfig) -> Iterator[cluster.Running]:
        """Plain Postgres: a full (unshared) copy of the shipped base on the pool's
        filesystem, started directly with the settings a branch gets but Postgres's own
        wal_init_zero and wal_recycle."""
        pool = self.pool
        assert pool is not None
        base = pool.registry.latest_base(self.base_name(run, cfg.segsize_mb))
        assert base is not None
        copy = pool.root / f"bench-plain-{run.key}"
        shutil.rmtree(copy, ignore_errors=True)
        start = now()
        subprocess.run(
            ["cp", "-a", "--reflink=never", str(pool.store_dir(base.name, base.version)), copy],
            check=True,
        )
        os.sync()  # the copy's dirty pages would otherwise be written back during a run
        run.setup["plain copy"] = now() - start
        s = pool.settings
        options = {
            "shared_buffers": s.shared_buffers,
            "max_connections": str(s.max_connections),
            "work_mem": s.work_mem,
            "maintenance_work_mem": s.maintenance_work_mem,
            **branchconf.wal_options(s, branchconf.wal_segment_bytes(copy)),
            **STOCK_WAL,
        }
        try:
            with cluster.running(
                self.install, copy, owner=self.owner, scratch=self.scratch, options=options
            ) as srv:
                yield srv
        finally:
            shutil.rmtree(copy, ignore_errors=True)

    def tps_branch(self, run: SizeRun, cfg: WalConfig, cycle: int, mode: str, key: str) -> float:
        pool, name = self.pool, f"tps-{run.key}-c{cycle}"
        assert pool is not None
        branch.destroy(pool, name)
        cfg.apply(pool.settings)
        try:
            made = branch.create(pool, name, base_name=self.base_name(run, cfg.segsize_mb))
            base = pool.registry.base(made.base_name, made.base_version)
            assert base is not None
            sockets = os.fspath(branch.layout(pool, name).socket_dir)
            return self.pgbench(sockets, made.port, base.superuser, mode, key)
        finally:
            branch.destroy(pool, name)

    def tps_article(self, run: SizeRun, cycle: int, mode: str) -> float:
        got: list[float] = []

        def inside(conn: Conn) -> None:
            sockets = str(scalar(conn, "SHOW unix_socket_directories")).split(",")[0].strip()
            port = int(scalar(conn, "SHOW port"))
            got.append(self.pgbench(sockets, port, str(conn.info.user), mode, "article"))

        self.inside = inside
        try:
            self.cycle_article(run, cycle, aid=0)
        finally:
            self.inside = None
        return got[0]

    def tps_plain(self, srv: cluster.Running, mode: str) -> float:
        return self.pgbench(os.fspath(srv.socket_dir), srv.port, "postgres", mode, "plain")

    # -- one size ---------------------------------------------------------------------------
    def run_wal_size(
        self, res: SizeResults, cycles: int, rounds: int, configs: list[WalConfig]
    ) -> None:
        """Part 1 for ``configs``, then part 2, on one size."""
        run = res.run
        self.ensure_source(run)
        with self.source(run, {}) as srv:
            with connect(**srv.conninfo(user="postgres")) as conn:
                run.db_bytes = int(scalar(conn, "SELECT pg_database_size(%s)", (DB,)))
            self.ensure_bases(run, srv, {c.segsize_mb for c in configs})
            self.ensure_raw(run, srv)
        res.segments = {c.segsize_mb: self.segment_bytes(run, c.segsize_mb) for c in configs}
        rng = random.Random(run.scale)
        for cycle in range(1, cycles + 1):
            aid = rng.randint(1, run.scale * 100_000)
            turn = (cycle - 1) % len(configs)
            order = configs[turn:] + configs[:turn]  # who goes first rotates
            for cfg in order:
                res.updates.setdefault(cfg, []).append(self.cycle_config(run, cfg, cycle, aid))
            done = ", ".join(f"{c.segsize_mb}:{res.updates[c][-1]['update_s']:.2f}" for c in order)
            console.log(f"{run.label} update cycle {cycle}/{cycles}: {done}")
        with self.plain(run, SHIPPED) as srv:
            for r in range(1, rounds + 1):
                for mode in MODES:
                    methods: dict[str, Callable[[], float]] = {
                        "branch": partial(self.tps_branch, run, SHIPPED, r, mode, "branch"),
                        "plain": partial(self.tps_plain, srv, mode),
                        "article": partial(self.tps_article, run, r, mode),
                    }
                    if mode == "rw":  # the other configurations, where WAL matters
                        for i, cfg in enumerate(TPS_CONFIGS):
                            key = f"branch-{i}"
                            methods[key] = partial(self.tps_branch, run, cfg, r, mode, key)
                    names = list(methods)
                    names = names[r - 1 :] + names[: r - 1]
                    for method in names:
                        res.tps.setdefault((method, mode), []).append(methods[method]())
                    got = ", ".join(f"{m} {res.tps[(m, mode)][-1]:.0f}" for m in names)
                    console.log(f"{run.label} pgbench {mode} round {r}/{rounds}: {got}")
        res.warm = dict(self.warm_times)
        self.warm_times.clear()

    def remove_size(self, run: SizeRun) -> None:
        """Free the disk a size took (bases, sources, copies) before the next size."""
        pool = self.pool
        assert pool is not None
        for version in pool.registry.bases():
            if version.name.startswith(f"bench-{run.key}-"):
                seed.remove_version(pool, version.name, version.version)
        for pattern in (f"src-{run.key}*", f"raw-{run.key}*"):
            for path in self.work.glob(pattern):
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()

    def remove_everything(self) -> None:
        if self.pool is not None:
            remove_pool(self.pool)
            self.pool = None
        for pattern in ("pool-home", "tmp", "src-*", "raw-*", "ovl-*", "setup.json"):
            for path in self.work.glob(pattern):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink()
        with suppress(OSError):
            self.work.rmdir()


SYNC_KINDS = {
    "prezeroed": "a file written with zeros first (a new segment, wal_init_zero=on)",
    "sparse": "a sparse file (a new segment, wal_init_zero=off)",
    "clone": "a reflink clone of a zeroed file (the base's segment, copied up)",
}


def sync_rate(directory: Path, kind: str, *, writes: int = 1000) -> float:
    """fdatasync()s per second of 8 KiB writes, each followed by fdatasync, into a 16 MiB file
    of ``kind`` on ``directory``'s filesystem: how a commit meets the WAL file it writes."""
    path, src = directory / kind, directory / f"{kind}.src"
    for stale in (path, src):
        stale.unlink(missing_ok=True)
    zeros = bytes(16 * MiB)
    if kind == "sparse":
        with open(path, "wb") as f:
            f.truncate(len(zeros))
    else:
        with open(src if kind == "clone" else path, "wb") as f:
            f.write(zeros)
            os.fsync(f.fileno())
        if kind == "clone":
            subprocess.run(["cp", "--reflink=always", src, path], check=True)
    os.sync()
    fd = os.open(path, os.O_WRONLY)
    try:
        start, page = now(), b"x" * 8192
        for i in range(writes):
            os.pwrite(fd, page, i * len(page) % len(zeros))
            os.fdatasync(fd)
        return writes / (now() - start)
    finally:
        os.close(fd)
        for done in (path, src):
            done.unlink(missing_ok=True)


def sync_rates(directory: Path, rounds: int) -> dict[str, list[float]]:
    """sync_rate for every kind, the kinds taking turns."""
    directory.mkdir(exist_ok=True)
    rates: dict[str, list[float]] = {k: [] for k in SYNC_KINDS}
    try:
        for r in range(rounds):
            kinds = list(SYNC_KINDS)
            for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                rates[kind].append(sync_rate(directory, kind))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return rates


def configs_for(gib: float, large: set[int]) -> list[WalConfig]:
    """The configurations a size tries: above 2 GiB only those whose base segment size is in
    ``large`` (every segment size is a full copy of the database in the pool)."""
    if gib <= 2:
        return CONFIGS
    return [c for c in CONFIGS if c.segsize_mb in large | {SHIPPED.segsize_mb}]


# -- the report ---------------------------------------------------------------------------
def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: list[float], fmt: Callable[[float], str]) -> str:
    if not values:
        return "–"
    return f"{fmt(median(values))} ({fmt(min(values))} – {fmt(max(values))})"


def written(s: Sample) -> float:
    return s.get("update_pages", 0) + s.get("update_wal", 0)


def fits(samples: list[Sample]) -> bool:
    """The space targets: growth within 1.2x of what Postgres wrote, create <= 1 MiB."""
    growth = median([s["update_physical"] for s in samples])
    return (
        growth <= 1.2 * median([written(s) for s in samples])
        and max(s["create_physical"] for s in samples) <= 1 * MiB
    )


def best(res: SizeResults) -> WalConfig:
    """The fastest configuration (median update time) that meets the space targets."""
    ok = [c for c, v in res.updates.items() if fits(v)] or list(res.updates)
    return min(ok, key=lambda c: median([s["update_s"] for s in res.updates[c]]))


def render_size(res: SizeResults, cycles: int, rounds: int, duration: int, clients: int) -> str:
    run, b = res.run, best(res)
    size = format_bytes(run.db_bytes)
    lines = [
        f"### {run.label} (pgbench scale {run.scale}, database {size})",
        "",
        f"The 1 % update in a fresh branch, {cycles} cycles per configuration (median, range). "
        "★ marks the shipped configuration, ✓ the fastest that meets the space targets.",
        "",
        "| configuration | update + CHECKPOINT (s) | layer growth, physical "
        "| Postgres wrote (pages + WAL) | growth / written | layer after create, physical |",
        "|---|---|---|---|---|---|",
    ]
    for cfg, samples in res.updates.items():
        mark = ("★ " if cfg == SHIPPED else "") + ("✓ " if cfg == b else "")
        seg = res.segments.get(cfg.segsize_mb, 0)
        segnote = "" if seg == cfg.segsize_mb * MiB else f" (base has {format_bytes(seg)})"
        growth = median([s["update_physical"] for s in samples])
        wrote = median([written(s) for s in samples])
        lines.append(
            f"| {mark}{cfg.label}{segnote} "
            f"| {spread([s['update_s'] for s in samples], lambda v: f'{v:.2f}')} "
            f"| {format_bytes(int(growth))} | {format_bytes(int(wrote))} "
            f"| {growth / wrote if wrote else float('nan'):.2f}× "
            f"| {format_bytes(int(max(s['create_physical'] for s in samples)))} (worst) |"
        )
    lines += [
        "",
        f"pgbench, {clients} clients, {duration} s per run, {rounds} rounds, the methods taking "
        "turns; TPS (median, range), and the median against plain Postgres.",
        "",
        "| method | "
        + " | ".join(label for label, _ in MODES.values())
        + " | warm-up before a run (s) |",
        "|---|" + "---|" * (len(MODES) + 1),
    ]
    labels = dict(METHODS)
    labels.update(
        {f"branch-{i}": f"pgoverlay branch, {c.label}" for i, c in enumerate(TPS_CONFIGS)}
    )
    for method, label in labels.items():
        cells = []
        for mode in MODES:
            values = res.tps.get((method, mode), [])
            plain = median(res.tps.get(("plain", mode), []))
            cells.append(
                f"{spread(values, lambda v: f'{v:.0f}')}, {median(values) / plain:.2f}× plain"
                if values
                else "–"
            )
        warm = spread(res.warm.get(method, []), lambda v: f"{v:.1f}")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {warm} |")
    shipped = res.updates.get(SHIPPED, [])
    if shipped:
        up = median([s["update_s"] for s in shipped])
        growth = median([s["update_physical"] for s in shipped])
        wrote = median([written(s) for s in shipped])
        rw = median(res.tps[("branch", "rw")]) / median(res.tps[("plain", "rw")])
        lines += [
            "",
            f"Shipped configuration at {run.label}: the update in {up:.2f} s, "
            f"layer growth {growth / wrote:.2f}× what Postgres wrote, "
            f"{format_bytes(int(max(s['create_physical'] for s in shipped)))} after create "
            f"(worst); pgbench read-write at {rw:.2f}× plain Postgres.",
        ]
    return "\n".join(lines)


def render_sync(rates: dict[str, list[float]]) -> str:
    """Part 0's table: what a commit's fdatasync costs in each kind of WAL file."""
    lines = [
        "### A commit's fdatasync, by the kind of file it writes",
        "",
        "8 KiB writes, each followed by `fdatasync`, into a 16 MiB file on the pool's "
        f"filesystem; {len(next(iter(rates.values())))} rounds of 1,000, the kinds in turns "
        "(median, range).",
        "",
        "| file | fdatasync per second |",
        "|---|---|",
    ]
    for kind, label in SYNC_KINDS.items():
        lines.append(f"| {label} | {spread(rates[kind], lambda v: f'{v:.0f}')} |")
    return "\n".join(lines)


def render(results: list[SizeResults], args: argparse.Namespace, ctx: dict[str, str]) -> str:
    cycles, rounds, duration, clients = args.cycles, args.rounds, args.duration, args.clients
    parts = [
        START,
        "## WAL configuration: writes in a branch",
        "",
        f"Generated by `python bench/wal.py {ctx['argv']}` on {ctx['date']} "
        f"(the run took {ctx['elapsed']}); Postgres {ctx['postgres']}, every server with "
        f"`shared_buffers={ctx['shared_buffers']}`, the page cache warm (not dropped). The pool "
        "is a sparse XFS image with reflink; the seed article's overlay is on the work "
        f"directory's {ctx['work_fs']}.",
        "",
        f"- *update*: `{UPDATE_SQL % 'scale × 1000'}` (1 % of the rows), then `CHECKPOINT`, "
        "in a fresh branch of a base prepared with that segment size. *Layer growth* is the "
        "bytes of extents the writable layer does not share with the base (FIEMAP), before "
        "and after; *Postgres wrote* is pg_stat_bgwriter's buffer writes × block size plus the "
        "WAL between the two LSNs.",
        "- *pgbench*: `pgbench -n -c N -j J -T D [-S]` over the server's Unix socket as its "
        "superuser, on a fresh branch per run; plain Postgres runs on a full copy of the "
        "shipped base (`cp --reflink=never`) on the pool's filesystem with the same "
        "command-line settings as a branch except Postgres's own `wal_init_zero=on` and "
        "`wal_recycle=on`; the seed article's server starts (crash recovery) "
        "on a fresh overlay per run and copies each relation up on its first write.",
        "",
    ]
    parts += [ctx["sync"], ""]
    for res in results:
        parts += [render_size(res, cycles, rounds, duration, clients), ""]
    parts += [ctx["machine"], END]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Benchmark WAL configurations (run as root).")
    parser.add_argument("--sizes", default="1,5", help="database sizes in GiB (default: 1,5)")
    parser.add_argument("--cycles", type=int, default=3, help="update cycles per configuration")
    parser.add_argument("--rounds", type=int, default=3, help="pgbench rounds per method")
    parser.add_argument("--duration", type=int, default=20, help="seconds per pgbench run")
    parser.add_argument("--clients", type=int, default=4, help="pgbench clients")
    parser.add_argument("--work", default="/var/tmp/bench-wal", help="work directory")
    parser.add_argument("--keep", action="store_true", help="keep pool and sources for a re-run")
    parser.add_argument("--pool-size", default="40G", help="sparse pool image size")
    parser.add_argument(
        "--large-segsizes",
        default="1,16",
        help="above 2 GiB, seed bases of these WAL segment sizes only (each is a full copy)",
    )
    args = parser.parse_args(argv)
    gibs = sorted({float(x) for x in args.sizes.split(",") if x.strip()})
    if not gibs or min(args.cycles, args.rounds, args.duration, args.clients) < 1:
        parser.error("need a size, and at least one cycle, round, second and client")
    large = {int(x) for x in args.large_segsizes.split(",") if x.strip()}
    poolmod.require_root()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally blocks run
    load = os.getloadavg()[0]
    bench = WalBench(
        Path(args.work).resolve(),
        pool_size=args.pool_size,
        clients=args.clients,
        duration=args.duration,
    )
    results = [SizeResults(SizeRun(gib=g, scale=max(1, round(g * SCALE_PER_GIB)))) for g in gibs]
    started, t0 = dt.datetime.now(dt.UTC), now()
    try:
        bench.open_pool()
        bench.sweep()
        assert bench.pool is not None
        rates = sync_rates(bench.pool.root / "bench-sync", rounds=5)
        console.log({k: round(median(v)) for k, v in rates.items()})
        for res in results:
            bench.run_wal_size(res, args.cycles, args.rounds, configs_for(res.run.gib, large))
            bench.sweep()
            if not args.keep:
                bench.remove_size(res.run)
        ctx = {
            "argv": " ".join(argv),
            "date": started.strftime("%Y-%m-%d %H:%M UTC"),
            "elapsed": f"{(now() - t0) / 60:.0f} min",
            "postgres": bench.install.version,
            "shared_buffers": bench.settings.shared_buffers,
            "work_fs": poolmod.fs_type(bench.work),
            "machine": machine_line(bench.install.major, load),
            "sync": render_sync(rates),
        }
        write_report(render(results, args, ctx), start=START, end=END)
        for res in results:
            b = best(res)
            console.log(f"{res.run.label}: fastest within the space targets: {b.label}")
    finally:
        bench.sweep()
        if not args.keep:
            bench.remove_everything()
    return 0


if __name__ == "__main__":
    sys.exit(main())
