#!/usr/bin/env python3
"""Seed benchmark: a whole `pgoverlay base seed` process against `pg_basebackup` plus `sync`.

    sudo .venv/bin/python bench/seed.py [--sizes 1,5] [--rounds 5] [--work DIR] [--keep]

For each size a pgbench database is built once (cached in the work dir, as bench/engine.py
does). Each round then runs the two methods, alternating which goes first, each with the page
cache dropped just before it (`sync; echo 3 > /proc/sys/vm/drop_caches`: the database, the
programs and Python's modules are all cold, as for a person who runs the command):

- **plain**: `pg_basebackup -D DIR -X stream -c fast` of the same server into the pool's
  filesystem (its own fsync of every file, the default), then `sync`, timed together: a copy that
  is on disk when the command returns, which is what a ready base is;
- **seed**: `pgoverlay base seed NAME --from DSN` as a process, from its exec to its exit: the
  interpreter's start, the checks, the copy, the verification, the preparation (lockdown) and
  the flush that makes the base durable.

Every copy and base is removed, untimed, after it is measured, and the pool trimmed (waiting for
XFS's discards) before the next run. `--laps` adds the seed as a function (`seed.seed`) to the
rotation, whose laps give the step breakdown; `--profile DIR` runs each seed process under `py-spy
record --idle --nonblocking` (wall-clock samples of the seed's own process, which waits for its
children) and keeps the collapsed stacks. The Markdown
report replaces the section between the seed markers in docs/benchmarks.md. A measurement
script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from engine import DB, SCALE_PER_GIB, Bench, console
from engine_report import SizeRun, machine_line, quantile, shown_args, write_report
from psycopg.conninfo import make_conninfo

from pgoverlay.runner import seed
from pgoverlay.runner.pool import discard
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.seed.steps import Laps
from pgoverlay.runner.settings import Settings

START, END = "<!-- seed:start -->", "<!-- seed:end -->"
PORTS = (56700, 56799)
METHODS = {
    "plain": "`pg_basebackup -X stream -c fast`, then `sync`",
    "process": "`pgoverlay base seed NAME --from DSN` (the whole process)",
    "function": "`seed.seed()` (the function, for its laps)",
}


class SeedBench(Bench):
    """The engine benchmark's plumbing (sources, pool, caches) with this benchmark's ports."""

    def __init__(
        self,
        work: Path,
        *,
        drop_caches: bool,
        pool_size: str,
        process_laps: bool = False,
        methods: list[str],
        profile: Path | None = None,
    ) -> None:
        super().__init__(work, drop_caches=drop_caches, pool_size=pool_size, creates=0)
        self.process_laps = process_laps  # run the process with -vv and read its laps
        self.methods = methods
        self.profile = profile  # a folder for py-spy's flame graphs of the seed processes
        self.proc_laps: list[Laps] = []
        self.settings = Settings(home=work / "pool-home", port_min=PORTS[0], port_max=PORTS[1])
        self.laps: list[Laps] = []
        self.startup: list[float] = []  # seconds a process spent before its seed began
        self.loads: list[float] = []  # the one-minute load average after each run
        self.times_taken: list[float] = []  # every seed process's wall time, in order
        self.plain_parts: list[tuple[float, float]] = []  # pg_basebackup's seconds, sync's

    def settle(self) -> None:
        """Before each timed run: trim the pool, which waits for the discards of the copy the
        previous run removed (XFS issues them in the background, and they would land on the
        next run, whichever method it is); then `sync` and drop the page cache. Nothing is read
        back in: the programs start cold, as the database does, for both methods."""
        assert self.pool is not None
        discard.trim(self.pool.root)
        self.drop_caches()

    def dsn(self, srv: cluster.Running) -> str:
        return make_conninfo(
            host=os.fspath(srv.socket_dir), port=srv.port, user="postgres", dbname=DB
        )

    def plain(self, srv: cluster.Running, round_: int) -> float:
        """`pg_basebackup -X stream -c fast` into the pool's filesystem, as the pool's Postgres
        user, then `sync`: timed together."""
        assert self.pool is not None
        root = self.pool.tmp / f"plain-{round_}"
        shutil.rmtree(root, ignore_errors=True)
        self.own_dir(root)
        self.settle()
        start = time.perf_counter()
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
        copied = time.perf_counter() - start
        subprocess.run(["sync"], check=True, timeout=self.settings.command_timeout)
        took = time.perf_counter() - start
        self.plain_parts.append((copied, took - copied))
        shutil.rmtree(root)
        return took

    def seed_function(self, srv: cluster.Running, name: str) -> float:
        assert self.pool is not None
        laps = Laps()
        self.settle()
        start = time.perf_counter()
        laps.restart()
        made = seed.seed(self.pool, name, source_dsn=self.dsn(srv), laps=laps)
        took = time.perf_counter() - start
        self.laps.append(laps)
        seed.remove_version(self.pool, name, made.version)
        return took

    def seed_process(self, srv: cluster.Running, name: str) -> float:
        assert self.pool is not None
        env = {
            **os.environ,
            "PGOVERLAY_HOME": os.fspath(self.settings.home),
            "PGOVERLAY_PORT_MIN": str(PORTS[0]),
            "PGOVERLAY_PORT_MAX": str(PORTS[1]),
        }
        command: list[str | Path] = [
            Path(sys.executable).with_name("pgoverlay"),
            *(["-vv"] if self.process_laps else []),
            "base",
            "seed",
            name,
            "--from",
            self.dsn(srv),
        ]
        if self.profile is not None:
            stacks = self.profile / f"seed-{len(self.times_taken)}.txt"
            command = [
                Path(sys.executable).with_name("py-spy"),
                "record",
                "--idle",  # wall clock: the waits for pg_basebackup and Postgres are the time
                "--nonblocking",  # never pause the seed to sample it
                "--rate",
                "200",
                "--format",
                "raw",  # collapsed stacks, one line each: grep them, or feed flamegraph.pl
                "-o",
                stacks,
                "--",
                *command,
            ]
        self.settle()
        start = time.perf_counter()
        done = subprocess.run(
            command,
            env=env,
            check=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if self.process_laps else None,
            text=True,
            timeout=3600,
        )
        took = time.perf_counter() - start
        self.times_taken.append(took)
        if self.process_laps:
            self.proc_laps.append(laps_logged(done.stderr))
        said = re.search(r"in ([0-9.]+) s\s*$", done.stdout)  # the command's own timer
        if said:
            self.startup.append(took - float(said.group(1)))
        base = self.pool.registry.latest_base(name)
        assert base is not None
        seed.remove_version(self.pool, name, base.version)
        return took

    def seed_size(self, run: SizeRun, rounds: int) -> dict[str, list[float]]:
        self.ensure_source(run)
        times: dict[str, list[float]] = {m: [] for m in self.methods}
        self.laps, self.startup, self.proc_laps, self.plain_parts = [], [], [], []
        with self.source(run, {}) as srv:
            order = self.methods
            for r in range(rounds):
                turn = r % len(order)
                for method in order[turn:] + order[:turn]:
                    name = f"seed-bench-{run.key}"
                    if method == "plain":
                        took = self.plain(srv, r)
                    elif method == "process":
                        took = self.seed_process(srv, name)
                    else:
                        took = self.seed_function(srv, name)
                    times[method].append(took)
                    self.loads.append(os.getloadavg()[0])
                    console.log(f"{run.label} round {r + 1}/{rounds}: {method} {took:.2f} s")
        return times


@dataclass(frozen=True)
class SizeResult:
    """One size's measurements: each method's seconds per round, and what they are made of."""

    run: SizeRun
    times: dict[str, list[float]]
    laps: list[Laps]  # the function's, with --laps
    startup: list[float]  # the process's seconds before its seed began
    plain_parts: list[tuple[float, float]]  # pg_basebackup's seconds, then sync's
    proc_laps: list[Laps]  # the process's own, with --process-laps


def laps_logged(stderr: str) -> Laps:
    """The laps a seed process logs at debug level: `seed of NAME version V: copy 2.65 s, ...`."""
    laps = Laps()
    found = re.search(r"seed of \S+ version \d+: (.*)$", stderr, re.MULTILINE)
    for step, secs in re.findall(r"(.+?) ([0-9.]+) s(?:, |$)", found.group(1) if found else ""):
        laps.seconds[step.strip()] = float(secs)
    return laps


def cell(values: list[float]) -> str:
    return (
        f"{statistics.median(values):.2f} (p90 {quantile(values, 0.9):.2f}; "
        f"{min(values):.2f} – {max(values):.2f})"
    )


def breakdown(laps: list[Laps]) -> list[str]:
    steps = list(dict.fromkeys(step for lap in laps for step in lap.seconds))
    rows = []
    for step in steps:
        values = [lap.seconds.get(step, 0.0) for lap in laps]
        rows.append(f"| {step} | {statistics.median(values):.2f} |")
    total = [sum(lap.seconds.values()) for lap in laps]
    rows.append(f"| **sum of the steps** | **{statistics.median(total):.2f}** |")
    return rows


def render(
    results: list[SizeResult],
    *,
    argv: list[str],
    started: dt.datetime,
    drop: bool,
    major: int,
    load: float,
    loads: list[float],
) -> str:
    lines = [
        START,
        "## Seed benchmark",
        "",
        f"Generated by `python bench/seed.py {shown_args(argv)}` on {started:%Y-%m-%d}. A pgbench "
        "database (`pgbench -i -s 68` is about 1 GiB, `-s 342` about 5 GiB) in a local server. "
        "Each round runs the methods, the first alternating from round to round, "
        + (
            "each with the pool trimmed (waiting for the discards of the copy removed before), "
            "then `sync; echo 3 > /proc/sys/vm/drop_caches` just before it: the database, the "
            "programs and Python's modules are all read from a cold cache"
            if drop
            else "with a warm page cache"
        )
        + ". **plain** is `pg_basebackup -D DIR -X stream -c fast` into the pool's filesystem "
        "(it fsyncs every file it wrote, its default) and then `sync`, timed together: a copy "
        "on disk. **seed** is the whole `pgoverlay base seed` process, from its exec to its "
        "exit: the interpreter's start, the checks, the copy, the verification, the preparation "
        "and lockdown, and the flush that makes the base durable. Seconds: the median (p90; "
        "min – max) over the rounds. The ratio is plain's median over the method's: at least "
        "0.95 is the target for the seed.",
        "",
        "| size | method | seconds | plain / method |",
        "|---|---|--:|--:|",
    ]
    for result in results:
        run, times = result.run, result.times
        plain = statistics.median(times["plain"])
        for method, label in METHODS.items():
            if method not in times:
                continue
            ratio = plain / statistics.median(times[method])
            lines.append(f"| {run.label} | {label} | {cell(times[method])} | {ratio:.2f} |")
    for result in results:
        if result.plain_parts:
            copies = [c for c, _ in result.plain_parts]
            syncs = [x for _, x in result.plain_parts]
            lines += [
                "",
                f"At {result.run.label}, plain's `pg_basebackup` took "
                f"{statistics.median(copies):.2f} s and its `sync` "
                f"{statistics.median(syncs):.2f} s (medians).",
            ]
    starts = [(r.run.label, r.startup) for r in results if r.startup]
    if starts:
        lines += [
            "",
            "Before its seed began, the process spent (median: its wall time less the `in N s` it "
            "prints, which runs from just before the seed to its end) "
            + ", ".join(f"{statistics.median(v):.2f} s at {label}" for label, v in starts)
            + ": the interpreter's start and imports, the settings, the pool.",
        ]
    for result in results:
        whose, laps = (
            ("the process's", result.proc_laps)
            if result.proc_laps
            else ("the function's", result.laps)
        )
        if not laps:
            continue
        lines += [
            "",
            f"Where {whose} time goes at {result.run.label} (median seconds per step over "
            f"{len(laps)} seeds; the flush of the copy runs in a thread from `verify` on, so the "
            "steps after the copy also wait for the disk):",
            "",
            "| step | seconds |",
            "|---|--:|",
            *breakdown(laps),
        ]
    during = (
        f" The one-minute load average after each run: median {statistics.median(loads):.1f}, "
        f"max {max(loads):.1f}."
        if loads
        else ""
    )
    lines += ["", machine_line(major, load) + during, END]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Benchmark seeding (run as root).")
    parser.add_argument("--sizes", default="1,5", help="database sizes in GiB (default: 1,5)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per size (default: 5)")
    parser.add_argument("--work", default="/var/tmp/pgoverlay-bench-seed", help="work directory")
    parser.add_argument("--keep", action="store_true", help="keep the pool and sources")
    parser.add_argument("--pool-size", default="40G", help="sparse pool image size")
    parser.add_argument("--no-drop-caches", action="store_true", help="keep the page cache warm")
    parser.add_argument("--no-report", action="store_true", help="print, do not write the report")
    parser.add_argument(
        "--process-laps",
        action="store_true",
        help="run the process with -vv and print its steps (a diagnosis: the logging is timed)",
    )
    parser.add_argument(
        "--laps", action="store_true", help="also time seed.seed() as a function, for its steps"
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="run each seed process under py-spy record (wall clock) and keep its stacks in DIR",
    )
    args = parser.parse_args(argv)
    gibs = sorted({float(x) for x in args.sizes.split(",") if x.strip()})
    if not gibs or args.rounds < 1:
        parser.error("need at least one size and one round")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally blocks run
    load = os.getloadavg()[0]
    bench = SeedBench(
        Path(args.work).resolve(),
        drop_caches=not args.no_drop_caches,
        pool_size=args.pool_size,
        process_laps=args.process_laps,
        methods=["plain", "process", *(["function"] if args.laps else [])],
        profile=Path(args.profile).resolve() if args.profile else None,
    )
    if bench.profile is not None:
        bench.profile.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC)
    results = []
    try:
        bench.open_pool()
        bench.sweep()
        for gib in gibs:
            run = SizeRun(gib=gib, scale=max(1, round(gib * SCALE_PER_GIB)))
            times = bench.seed_size(run, args.rounds)
            results.append(
                SizeResult(
                    run=run,
                    times=times,
                    laps=bench.laps,
                    startup=bench.startup,
                    plain_parts=bench.plain_parts,
                    proc_laps=bench.proc_laps,
                )
            )
            if bench.proc_laps:
                console.log(f"{run.label}: the process's steps (median seconds)")
                for row in breakdown(bench.proc_laps):
                    console.log(row)
        section = render(
            results,
            argv=argv,
            started=started,
            drop=bench.drop,
            major=bench.install.major,
            load=load,
            loads=bench.loads,
        )
        if not args.no_report:
            write_report(section, start=START, end=END)
        sys.stdout.write(section)
    finally:
        bench.sweep()
        if not args.keep:
            bench.remove_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
