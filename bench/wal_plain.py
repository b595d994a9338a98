#!/usr/bin/env python3
"""The 1 % update in a branch against the same Postgres on the same disk without overlay.

    sudo .venv/bin/python bench/wal_plain.py [--sizes 1,5] [--cycles 5] [--work DIR] [--keep]

bench/wal.py chooses the WAL configuration; this script checks the shipped one against plain
Postgres for the update bench/engine.py times: `UPDATE pgbench_accounts SET abalance =
abalance + 1 WHERE aid <= scale × 1000`, then `CHECKPOINT`. Each cycle, in turns, runs it once
in a fresh branch of a base seeded with the shipped settings, and once in plain Postgres: a fresh
full copy of the same base on the pool's filesystem (copied untimed), started directly with the
settings a branch gets and Postgres's own WAL settings. The section between the wal-plain
markers of docs/benchmarks.md is replaced. A measurement script: it asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import signal
import statistics
import sys
from pathlib import Path

from engine import DB, SCALE_PER_GIB, UPDATE_SQL, Conn, connect, console, now, wal_pos
from engine_report import SizeRun, machine_line, write_report
from wal import SHIPPED, WalBench

from pgoverlay.runner import branch
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.branch.sizes import LayerSize
from pgoverlay.runner.units import format_bytes

START, END = "<!-- wal-plain:start -->", "<!-- wal-plain:end -->"


class PlainBench(WalBench):
    def update(self, conn: Conn, scale: int) -> tuple[float, int]:
        """Seconds of the update and its checkpoint, and the WAL it wrote."""
        lsn = wal_pos(conn)
        start = now()
        conn.execute(UPDATE_SQL, (scale * 1000,))
        conn.execute("CHECKPOINT")
        return now() - start, wal_pos(conn) - lsn

    def in_branch(self, run: SizeRun, cycle: int) -> tuple[float, int, LayerSize]:
        pool, name = self.pool, f"plain-{run.key}-c{cycle}"
        assert pool is not None
        branch.destroy(pool, name)
        SHIPPED.apply(pool.settings)
        os.sync()
        try:
            made = branch.create(pool, name, base_name=self.base_name(run, SHIPPED.segsize_mb))
            before = branch.layer_size(pool, made)
            with connect(**branch.connection(pool, made).connect_kwargs()) as conn:
                seconds, wal = self.update(conn, run.scale)
            after = branch.layer_size(pool, made)
            growth = LayerSize(
                after.logical_bytes - before.logical_bytes,
                after.physical_bytes - before.physical_bytes,
            )
            return seconds, wal, growth
        finally:
            branch.destroy(pool, name)

    def in_plain(self, run: SizeRun) -> tuple[float, int]:
        with (
            self.plain(run, SHIPPED) as srv,
            connect(**srv.conninfo(user="postgres", dbname=DB)) as conn,
        ):
            return self.update(conn, run.scale)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="The 1 % update: branch against plain.")
    parser.add_argument("--sizes", default="1,5", help="database sizes in GiB (default: 1,5)")
    parser.add_argument("--cycles", type=int, default=5, help="updates per method and size")
    parser.add_argument("--work", default="/var/tmp/bench-wal-plain", help="work directory")
    parser.add_argument("--keep", action="store_true", help="keep pool and sources for a re-run")
    parser.add_argument("--pool-size", default="40G", help="sparse pool image size")
    args = parser.parse_args(argv)
    gibs = sorted({float(x) for x in args.sizes.split(",") if x.strip()})
    poolmod.require_root()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load, started = os.getloadavg()[0], dt.datetime.now(dt.UTC)
    bench = PlainBench(Path(args.work).resolve(), pool_size=args.pool_size, clients=1, duration=1)
    rows = []
    try:
        bench.open_pool()
        bench.sweep()
        for gib in gibs:
            run = SizeRun(gib=gib, scale=max(1, round(gib * SCALE_PER_GIB)))
            bench.ensure_source(run)
            with bench.source(run, {}) as srv:
                bench.ensure_bases(run, srv, {SHIPPED.segsize_mb})
            times: dict[str, list[float]] = {"branch": [], "plain": []}
            wal: dict[str, list[int]] = {"branch": [], "plain": []}
            growth: list[int] = []
            rng = random.Random(run.scale)
            for cycle in range(1, args.cycles + 1):
                order = ["branch", "plain"] if rng.random() < 0.5 else ["plain", "branch"]
                for method in order:
                    if method == "branch":
                        seconds, written, layer = bench.in_branch(run, cycle)
                        growth.append(layer.physical_bytes)
                    else:
                        seconds, written = bench.in_plain(run)
                    times[method].append(seconds)
                    wal[method].append(written)
                console.log(
                    f"{run.label} cycle {cycle}: branch {times['branch'][-1]:.2f} s, "
                    f"plain {times['plain'][-1]:.2f} s"
                )
            rows.append((run, times, wal, growth))
            bench.sweep()
            if not args.keep:
                bench.remove_size(run)
        lines = [
            START,
            "## The 1 % update: branch against plain Postgres",
            "",
            f"Generated by `python bench/wal_plain.py {' '.join(argv)}` on "
            f"{started:%Y-%m-%d %H:%M} UTC. The update and its `CHECKPOINT`, in a fresh branch "
            f"({SHIPPED.label}) and in plain Postgres on a fresh full copy of the same base on "
            "the same filesystem (Postgres's own WAL settings), taking turns; median (min – "
            "max) seconds. Speed is plain's median time over the branch's.",
            "",
            "| size | branch | plain | speed vs plain | WAL written | layer growth, physical |",
            "|---|--:|--:|--:|--:|--:|",
        ]
        for run, times, wal, growth in rows:
            b, p = statistics.median(times["branch"]), statistics.median(times["plain"])
            lines.append(
                f"| {run.label} | {b:.2f} ({min(times['branch']):.2f} – "
                f"{max(times['branch']):.2f}) | {p:.2f} ({min(times['plain']):.2f} – "
                f"{max(times['plain']):.2f}) | {p / b:.2f}× | "
                f"{format_bytes(int(statistics.median(wal['branch'])))} | "
                f"{format_bytes(int(statistics.median(growth)))} |"
            )
        lines += ["", machine_line(bench.install.major, load), END, ""]
        write_report("\n".join(lines), start=START, end=END)
        console.log("report written")
    finally:
        bench.sweep()
        if not args.keep:
            bench.remove_everything()
    return 0


if __name__ == "__main__":
    sys.exit(main())
