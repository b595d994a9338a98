#!/usr/bin/env python3
"""The 1 % update in a branch against the same Postgres on the same disk without overlay.

    sudo .venv/bin/python bench/wal_plain.py [--sizes 1,5] [--cycles 3] [--cache cold,warm]
        [--work DIR] [--keep]

The update bench/engine.py times: `UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE
aid <= scale × 1000` (the first 1 % of the rows), then `CHECKPOINT`, each timed on its own.
Every run starts from a fresh instance of the same base, and the methods take turns:

- *plain*: Postgres on a full copy of the base (`cp --reflink=never`) on the pool's filesystem;
- *writeback hints off*: the same with `checkpoint_flush_after`, `bgwriter_flush_after` and
  `backend_flush_after` at 0: in a branch they do nothing, as OverlayFS ignores the
  sync_file_range(2) they make (timed once per run on the pool's XFS and through OverlayFS);
- *reflink copy*: Postgres on a reflink copy of it (`cp --reflink=always`): XFS copy-on-write
  of the base's blocks, no overlay;
- *branch*: a pgoverlay branch;
- *branch, copied up ahead*: a branch whose files the update writes were copied up (opened for
  writing through the overlay) before the update; that copy-up is timed on its own.

Fair by construction: the plain servers run with every setting a branch's server was started
with (read from a probe branch's pg_settings), and the report lists what `SHOW ALL` still
differs in; both connect as the superuser over the server's Unix socket; *cold* drops the page
cache right before the update, *warm* first reads every file of the data directory through the
path the server uses (after the copy-up a branch's first open of a relation makes). The section
between the wal-plain markers of docs/benchmarks.md is replaced. A measurement script: it
asserts nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from engine import (
    DB,
    SCALE_PER_GIB,
    UPDATE_SQL,
    Conn,
    buffer_writes,
    connect,
    console,
    now,
    scalar,
    wal_pos,
)
from engine_report import Sample, SizeRun, machine_line, shown_args, write_report
from wal import SHIPPED, WalBench

from pgoverlay.runner import branch
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.pool.registry import Branch
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.units import format_bytes

START, END = "<!-- wal-plain:start -->", "<!-- wal-plain:end -->"
PORTS = (56700, 56799)
METHODS = {
    "plain": "plain Postgres, full copy",
    "hintless": "plain Postgres, full copy, its writeback hints off (`*_flush_after = 0`)",
    "reflink": "plain Postgres, reflink copy (XFS copy-on-write, no overlay)",
    "branch": "pgoverlay branch",
    "ahead": "pgoverlay branch, the update's files copied up ahead",
}
CACHES = {
    "cold": "page cache dropped right before the update",
    "warm": "every file of the data directory read in first",
}
# Postgres's writeback hints: each asks the kernel with sync_file_range(2) to start writing a
# range out, which OverlayFS ignores (it has no page cache of its own to write): in a branch
# they do nothing, and a plain server with them off shows what that costs.
HINTS_OFF = {"checkpoint_flush_after": "0", "bgwriter_flush_after": "0", "backend_flush_after": "0"}
# Settings that name a server's own files, socket and port: different by design.
OWN = frozenset(
    {
        "data_directory",
        "config_file",
        "hba_file",
        "ident_file",
        "port",
        "listen_addresses",
        "unix_socket_directories",
        "unix_socket_permissions",
        "unix_socket_group",
        "cluster_name",
        "external_pid_file",
    }
)
# What a reader checks first when two servers write at different speeds.
KEY_SETTINGS = (
    "shared_buffers",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "wal_segment_size",
    "wal_init_zero",
    "wal_recycle",
    "min_wal_size",
    "max_wal_size",
    "checkpoint_timeout",
    "checkpoint_completion_target",
)
SEGMENT_NAME_LEN = 24
SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writing the range out, wait for nothing
PROBE_MIB = 64


@dataclass
class SizeResults:
    run: SizeRun
    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)  # (cache, method)
    differ: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (branch, plain)
    key_values: dict[str, str] = field(default_factory=dict)


def checkpoint_times(conn: Conn) -> tuple[float, float] | None:
    """Milliseconds the checkpointer spent writing buffers and in fsync, so far (Postgres 17
    moved them from pg_stat_bgwriter to pg_stat_checkpointer)."""
    for query in (
        "SELECT write_time, sync_time FROM pg_stat_checkpointer",
        "SELECT checkpoint_write_time, checkpoint_sync_time FROM pg_stat_bgwriter",
    ):
        try:
            with conn.transaction():
                row = conn.execute(query).fetchone()
        except psycopg.Error:
            continue
        if row is not None:
            return float(row[0]), float(row[1])
    return None


def wal_segments(pg_wal: Path) -> set[str]:
    return {p.name for p in pg_wal.iterdir() if len(p.name) == SEGMENT_NAME_LEN and p.is_file()}


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def all_settings(conn: Conn) -> dict[str, str]:
    rows = conn.execute("SELECT name, setting FROM pg_settings").fetchall()
    return {str(name): str(value) for name, value in rows}


def started_with(conn: Conn) -> dict[str, str]:
    """The settings a server was given (command line, configuration files), in SHOW's form,
    without those naming its own files and port: what a plain server needs to run as it."""
    rows = conn.execute(
        "SELECT name, current_setting(name) FROM pg_settings"
        " WHERE source IN ('command line', 'configuration file')"
    ).fetchall()
    return {str(n): str(v) for n, v in rows if n not in OWN}


def hint_probe(directory: Path, rounds: int = 5) -> tuple[float, float]:
    """What Postgres's writeback hint does in ``directory``: PROBE_MIB written (not synced),
    then sync_file_range(SYNC_FILE_RANGE_WRITE) on the file, then fdatasync, each timed.
    Median milliseconds of both: a hint that starts writeback takes time itself and leaves
    less to the fdatasync; one that is ignored takes none and leaves all of it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    block, hints, syncs = os.urandom(1 << 20), [], []
    for i in range(rounds):
        path = directory / f"probe-{i}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            for _ in range(PROBE_MIB):
                os.write(fd, block)
            start = now()
            if libc.sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE) != 0:
                raise OSError(ctypes.get_errno(), "sync_file_range")
            hints.append((now() - start) * 1000)
            start = now()
            os.fdatasync(fd)
            syncs.append((now() - start) * 1000)
        finally:
            os.close(fd)
            path.unlink()
    return statistics.median(hints), statistics.median(syncs)


class PlainBench(WalBench):
    def __init__(self, work: Path, *, pool_size: str) -> None:
        super().__init__(work, pool_size=pool_size, clients=1, duration=1)
        self.settings = Settings(
            home=work / "pool-home", port_min=PORTS[0], port_max=PORTS[1], runtime="local"
        )
        self.branch_options: dict[str, str] = {}
        self.branch_settings: dict[str, str] = {}
        self.hints: dict[str, tuple[float, float]] = {}

    def probe_hints(self) -> None:
        """The writeback hint on the pool's XFS and through an OverlayFS mount on it."""
        pool = self.pool
        assert pool is not None
        top = pool.root / "bench-hint-probe"
        subprocess.run(["rm", "-rf", str(top)], check=True)
        dirs = {name: top / name for name in ("plain", "lower", "upper", "work", "merged")}
        for d in dirs.values():
            d.mkdir(parents=True)
        subprocess.run(
            [
                "mount", "-t", "overlay", "overlay", "-o",
                f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}",
                str(dirs["merged"]),
            ],
            check=True,
        )  # fmt: skip
        try:
            self.hints["the pool's XFS"] = hint_probe(dirs["plain"])
            self.hints["OverlayFS on it"] = hint_probe(dirs["merged"])
        finally:
            subprocess.run(["umount", str(dirs["merged"])], check=True)
            subprocess.run(["rm", "-rf", str(top)], check=True)

    # -- what every method runs -----------------------------------------------------------
    def cold(self) -> None:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")

    def prepare_cache(self, cache: str, sockets: str, port: int, user: str) -> None:
        if cache == "warm":
            self.warm_up(sockets, port, user)
            os.sync()  # nothing the warm-up dirtied is the update's to write
        else:
            self.cold()

    def update(self, conn: Conn, scale: int, pg_wal: Path) -> Sample:
        """The update and its checkpoint, each timed, and what they wrote."""
        s = Sample()
        lsn, pages, segments = wal_pos(conn), buffer_writes(conn), wal_segments(pg_wal)
        times = checkpoint_times(conn)
        start = now()
        conn.execute(UPDATE_SQL, (scale * 1000,))
        s["update_s"] = now() - start
        start = now()
        conn.execute("CHECKPOINT")
        s["checkpoint_s"] = now() - start
        s["total_s"] = s["update_s"] + s["checkpoint_s"]
        s["wal"] = wal_pos(conn) - lsn
        s["new_segments"] = len(wal_segments(pg_wal) - segments)
        later = checkpoint_times(conn)
        if times is not None and later is not None:
            s["ckpt_write_s"] = (later[0] - times[0]) / 1000
            s["ckpt_sync_s"] = (later[1] - times[1]) / 1000
        after = buffer_writes(conn)
        if pages is not None and after is not None:
            s["pages"] = after - pages
        return s

    # -- plain Postgres on a copy -----------------------------------------------------------
    @contextmanager
    def copy(self, run: SizeRun, reflink: str) -> Iterator[Path]:
        """A fresh copy of the base's data directory on the pool's filesystem, on disk."""
        pool = self.pool
        assert pool is not None
        base = pool.registry.latest_base(self.base_name(run, SHIPPED.segsize_mb))
        assert base is not None
        copy = pool.root / f"bench-plain-{run.key}"
        subprocess.run(["rm", "-rf", str(copy)], check=True)
        source = pool.store_dir(base.name, base.version)
        subprocess.run(["cp", "-a", f"--reflink={reflink}", str(source), str(copy)], check=True)
        os.sync()
        try:
            yield copy
        finally:
            subprocess.run(["rm", "-rf", str(copy)], check=True)

    def in_plain(
        self, res: SizeResults, cache: str, reflink: str, extra: dict[str, str] | None = None
    ) -> Sample:
        with (
            self.copy(res.run, reflink) as copy,
            cluster.running(
                self.install,
                copy,
                owner=self.owner,
                scratch=self.scratch,
                options={**self.branch_options, **(extra or {})},
            ) as srv,
            connect(host=os.fspath(srv.socket_dir), port=srv.port, user="postgres", dbname=DB) as c,
        ):
            if not res.differ and not extra:
                mine = all_settings(c)
                res.key_values = {
                    k: str(scalar(c, "SELECT current_setting(%s)", (k,))) for k in KEY_SETTINGS
                }
                names = sorted((set(mine) | set(self.branch_settings)) - OWN)
                res.differ = {
                    n: (self.branch_settings.get(n, "–"), mine.get(n, "–"))
                    for n in names
                    if self.branch_settings.get(n) != mine.get(n)
                } or {"(none)": ("", "")}
            self.prepare_cache(cache, os.fspath(srv.socket_dir), srv.port, "postgres")
            return self.update(c, res.run.scale, copy / "pg_wal")

    # -- a branch ---------------------------------------------------------------------------
    @contextmanager
    def fresh_branch(self, run: SizeRun, key: str) -> Iterator[tuple[Branch, Conn]]:
        """A new branch of the shipped base and a superuser connection over its socket."""
        pool, name = self.pool, f"plain-{run.key}-{key}"
        assert pool is not None
        branch.destroy(pool, name)
        SHIPPED.apply(pool.settings)
        try:
            made = branch.create(pool, name, base_name=self.base_name(run, SHIPPED.segsize_mb))
            base = pool.registry.base(made.base_name, made.base_version)
            assert base is not None
            sockets = os.fspath(branch.layout(pool, name).socket_dir)
            with connect(host=sockets, port=made.port, user=base.superuser, dbname=DB) as conn:
                yield made, conn
        finally:
            branch.destroy(pool, name)

    def probe(self, run: SizeRun) -> None:
        """Read the settings a branch's server runs with, for the plain servers to use."""
        with self.fresh_branch(run, "probe") as (_, conn):
            self.branch_options = started_with(conn)
            self.branch_settings = all_settings(conn)

    def copy_up(self, conn: Conn, data: Path) -> float:
        """Open every file of pgbench_accounts and its primary key for writing through the
        overlay, as Postgres's first open of them would: each is copied up. Seconds."""
        paths: list[Path] = []
        for rel in ("pgbench_accounts", "pgbench_accounts_pkey"):
            first = data / str(scalar(conn, "SELECT pg_relation_filepath(%s)", (rel,)))
            paths += sorted(first.parent.glob(f"{first.name}*"))
        start = now()
        for path in paths:
            os.close(os.open(path, os.O_RDWR))
        return now() - start

    def in_branch(self, res: SizeResults, cache: str, ahead: bool, cycle: int) -> Sample:
        pool, run = self.pool, res.run
        assert pool is not None
        with self.fresh_branch(run, f"c{cycle}") as (made, conn):
            lay = branch.layout(pool, made.name)
            before = branch.layer_size(pool, made)
            copy_up = self.copy_up(conn, lay.data) if ahead else None
            sockets = os.fspath(lay.socket_dir)
            self.prepare_cache(cache, sockets, made.port, str(conn.info.user))
            copied = files_under(lay.upper / "base")
            s = self.update(conn, run.scale, lay.data / "pg_wal")
            if copy_up is not None:
                s["copy_up_s"] = copy_up
            else:
                s["copied_up"] = len(files_under(lay.upper / "base") - copied)
            after = branch.layer_size(pool, made)
            s["create_physical"] = before.physical_bytes
            s["growth"] = after.physical_bytes - before.physical_bytes
            return s

    # -- one size ---------------------------------------------------------------------------
    def run_plain_size(self, res: SizeResults, cycles: int, caches: list[str]) -> None:
        run = res.run
        self.ensure_source(run)
        with self.source(run, {}) as srv:
            with connect(**srv.conninfo(user="postgres")) as conn:
                run.db_bytes = int(scalar(conn, "SELECT pg_database_size(%s)", (DB,)))
            self.ensure_bases(run, srv, {SHIPPED.segsize_mb})
        self.probe(run)
        runs: dict[str, Callable[[str, int], Sample]] = {
            "plain": lambda cache, _: self.in_plain(res, cache, "never"),
            "hintless": lambda cache, _: self.in_plain(res, cache, "never", HINTS_OFF),
            "reflink": lambda cache, _: self.in_plain(res, cache, "always"),
            "branch": lambda cache, c: self.in_branch(res, cache, False, c),
            "ahead": lambda cache, c: self.in_branch(res, cache, True, c),
        }
        for cycle in range(1, cycles + 1):
            for cache in caches:
                # A warm read-in copies a branch's relations up first: "ahead" is "branch".
                methods = [m for m in runs if not (cache == "warm" and m == "ahead")]
                turn = (cycle - 1) % len(methods)
                for method in methods[turn:] + methods[:turn]:
                    got = runs[method](cache, cycle)
                    res.samples.setdefault((cache, method), []).append(got)
                done = ", ".join(
                    f"{m} {res.samples[(cache, m)][-1]['total_s']:.2f}" for m in methods
                )
                console.log(f"{run.label} {cache} cycle {cycle}/{cycles}: {done}")


# -- the report ---------------------------------------------------------------------------
def med(samples: list[Sample], key: str) -> float:
    values = [s[key] for s in samples if key in s]
    return statistics.median(values) if values else float("nan")


def spread(samples: list[Sample], key: str) -> str:
    values = [s[key] for s in samples if key in s]
    if not values:
        return "–"
    return f"{statistics.median(values):.2f} ({min(values):.2f} – {max(values):.2f})"


def render_size(res: SizeResults, cycles: int) -> list[str]:
    run = res.run
    lines = [
        f"### {run.label} (pgbench scale {run.scale}, database {format_bytes(run.db_bytes)}), "
        f"{cycles} cycles",
        "",
        "| page cache | method | update + CHECKPOINT (s) | speed vs plain | UPDATE (s) "
        "| CHECKPOINT (s) | its writes (s) | its fsyncs (s) | copy-up ahead | WAL written "
        "| new WAL segments | pages written | files copied up by the update "
        "| layer growth, physical |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for (cache, method), samples in res.samples.items():
        plain = med(res.samples[(cache, "plain")], "total_s")
        copied = med(samples, "copied_up")
        growth = med(samples, "growth")
        lines.append(
            f"| {cache} | {METHODS[method]} | {spread(samples, 'total_s')} "
            f"| {plain / med(samples, 'total_s'):.2f}× | {spread(samples, 'update_s')} "
            f"| {spread(samples, 'checkpoint_s')} | {spread(samples, 'ckpt_write_s')} "
            f"| {spread(samples, 'ckpt_sync_s')} | "
            + (f"{med(samples, 'copy_up_s') * 1000:.1f} ms" if method == "ahead" else "–")
            + f" | {format_bytes(int(med(samples, 'wal')))} "
            f"| {med(samples, 'new_segments'):.0f} "
            f"| {format_bytes(int(med(samples, 'pages')))} "
            f"| {'–' if copied != copied else f'{copied:.0f}'} "
            f"| {'–' if growth != growth else format_bytes(int(growth))} |"
        )
    creates = [s["create_physical"] for v in res.samples.values() for s in v if "growth" in s]
    differ = ", ".join(
        f"`{n}` ({b} in the branch, {p} plain)" if b or p else n for n, (b, p) in res.differ.items()
    )
    same = ", ".join(f"{k}={v}" for k, v in res.key_values.items())
    lines += [
        "",
        f"Layer right after create: {format_bytes(int(max(creates)))} physical (worst). "
        f"`SHOW ALL` of a branch and of the plain server differ, besides the servers' own "
        f"files, socket and port, in: {differ}. Both run with {same}.",
    ]
    return lines


def render(
    results: list[SizeResults],
    argv: list[str],
    started: dt.datetime,
    ctx: str,
    hints: dict[str, tuple[float, float]],
) -> str:
    probe = "; ".join(
        f"{where}: {hint:.1f} ms, then fdatasync {sync:.0f} ms"
        for where, (hint, sync) in hints.items()
    )
    lines = [
        START,
        "## The 1 % update: branch against plain Postgres",
        "",
        f"Generated by `python bench/wal_plain.py {shown_args(argv)}` on "
        f"{started:%Y-%m-%d %H:%M} UTC. `{UPDATE_SQL % 'scale × 1000'}` (the first 1 % of the "
        "rows), then `CHECKPOINT`, each timed, over the server's Unix socket as its superuser, "
        "on a fresh instance of the same base per run, the methods taking turns (the first "
        "rotates each cycle); median (min – max) seconds. Speed is plain's median over the "
        "method's. Page cache: "
        + "; ".join(f"*{k}*: {v}" for k, v in CACHES.items())
        + " (through the server's own path; a branch's relations are copied up first).",
        "",
        "- *plain Postgres, full copy*: the base's data directory copied with "
        "`cp --reflink=never` onto the pool's XFS, started with every setting a branch's "
        "server is given (read from a branch's pg_settings).",
        "- *writeback hints off*: the same server with `checkpoint_flush_after`, "
        "`bgwriter_flush_after` and `backend_flush_after` at 0. Postgres gives each hint to "
        "the kernel with sync_file_range(2), to start writing a range out early; OverlayFS "
        "ignores it, so in a branch the hints do nothing and the fsyncs do all the writing. "
        f"The call after {PROBE_MIB} MiB written, median of 5 ({probe}).",
        "- *reflink copy*: the same with `cp --reflink=always`: the base's blocks shared, "
        "every first write to one copy-on-write, no overlay.",
        f"- *pgoverlay branch*: `branch.create` ({SHIPPED.label}). *copied up ahead*: the "
        "files of `pgbench_accounts` and its primary key opened for writing through the overlay "
        "before the update (the column times it), so the update copies nothing up.",
        "- *pages written*: pg_stat_bgwriter's buffer writes (checkpointer, bgwriter, "
        "backends) × block size; *its writes*, *its fsyncs*: the checkpointer's write and sync "
        "time (pg_stat_bgwriter, pg_stat_checkpointer from Postgres 17); *new WAL segments*: "
        "segment files pg_wal did not have before the update; *files copied up by the update*: "
        "files that appeared under the branch's "
        "writable `base/`; *layer growth*: unshared extents (FIEMAP) before and after.",
        "",
    ]
    for res in results:
        lines += render_size(res, cycles=len(next(iter(res.samples.values()))))
        lines.append("")
    lines += [ctx, END, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="The 1 % update: branch against plain.")
    parser.add_argument("--sizes", default="1,5", help="database sizes in GiB (default: 1,5)")
    parser.add_argument("--cycles", type=int, default=3, help="updates per method and size")
    parser.add_argument("--cache", default="cold,warm", help="page cache states: cold,warm")
    parser.add_argument("--work", default="/var/tmp/bench-wal-plain", help="work directory")
    parser.add_argument("--keep", action="store_true", help="keep pool and sources for a re-run")
    parser.add_argument("--pool-size", default="40G", help="sparse pool image size")
    args = parser.parse_args(argv)
    gibs = sorted({float(x) for x in args.sizes.split(",") if x.strip()})
    caches = [c for c in args.cache.split(",") if c in CACHES]
    if not gibs or not caches or args.cycles < 1:
        parser.error("need a size, a page cache state (cold, warm) and at least one cycle")
    poolmod.require_root()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load, started = os.getloadavg()[0], dt.datetime.now(dt.UTC)
    bench = PlainBench(Path(args.work).resolve(), pool_size=args.pool_size)
    results = [SizeResults(SizeRun(gib=g, scale=max(1, round(g * SCALE_PER_GIB)))) for g in gibs]
    try:
        bench.open_pool()
        bench.sweep()
        bench.probe_hints()
        for res in results:
            bench.run_plain_size(res, args.cycles, caches)
            bench.sweep()
            if not args.keep:
                bench.remove_size(res.run)
        ctx = machine_line(bench.install.major, load)
        text = render(results, argv, started, ctx, bench.hints)
        write_report(text, start=START, end=END)
        console.log("report written")
    finally:
        bench.sweep()
        if not args.keep:
            bench.remove_everything()
    return 0


if __name__ == "__main__":
    sys.exit(main())
