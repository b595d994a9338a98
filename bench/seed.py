#!/usr/bin/env python3
"""Seed benchmark: `pgoverlay base seed` (copy, verify, prepare) against a plain pg_basebackup.

    sudo .venv/bin/python bench/seed.py [--sizes 1,5] [--rounds 3] [--work DIR] [--keep]

For each size a pgbench database is built once (cached in the work dir, as bench/engine.py
does). Each round then runs, in an order that rotates from round to round, with the page cache
dropped before each (and the programs' files read back in): a plain `pg_basebackup -Fp -X
stream -c fast` of the same server into the pool's filesystem, `pgoverlay base seed` as a process,
and `seed.seed` as a function (whose laps give the step breakdown). Every copy and base is
removed, untimed, after it is measured. The Markdown report replaces the section between the
seed markers in docs/benchmarks.md. A measurement
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
    "plain": "plain `pg_basebackup -Fp -X stream -c fast`",
    "process": "`pgoverlay base seed NAME --from DSN` (a process)",
    "function": "`seed.seed()` (the function)",
}


class SeedBench(Bench):
    """The engine benchmark's plumbing (sources, pool, caches) with this benchmark's ports."""

    def __init__(
        self, work: Path, *, drop_caches: bool, pool_size: str, process_laps: bool = False
    ) -> None:
        super().__init__(work, drop_caches=drop_caches, pool_size=pool_size, creates=0)
        self.process_laps = process_laps  # run the process with -vv and read its laps
        self.proc_laps: list[Laps] = []
        self.settings = Settings(home=work / "pool-home", port_min=PORTS[0], port_max=PORTS[1])
        self.laps: list[Laps] = []
        self.startup: list[float] = []  # seconds a process spent before its seed began
        self.loads: list[float] = []  # the one-minute load average after each run

    def settle(self) -> None:
        """Before each timed run: trim the pool, which waits for the discards of the copy the
        previous run removed (XFS issues them in the background, and they would land on the
        next run, whichever method it is); then drop the page cache."""
        assert self.pool is not None
        discard.trim(self.pool.root)
        self.drop_caches()
        self.load_programs()

    def load_programs(self) -> None:
        """Read the programs back into the page cache, not the data: on a runner the tools are
        installed and used, and a seed is timed as its copy and work, not as Python's files
        read from a cold disk (which cost the process about 3 s here). Both methods get it."""
        if not self.drop:
            return
        imports = "import pgoverlay.cli, pgoverlay.cli.base, pgoverlay.runner.seed, psycopg"
        subprocess.run([sys.executable, "-P", "-c", imports], check=True, timeout=120)
        subprocess.run([self.install.tool("pg_basebackup"), "--version"], check=True, timeout=60)

    def dsn(self, srv: cluster.Running) -> str:
        return make_conninfo(
            host=os.fspath(srv.socket_dir), port=srv.port, user="postgres", dbname=DB
        )

    def plain(self, srv: cluster.Running, round_: int) -> float:
        """A plain pg_basebackup into the pool's filesystem, as the pool's Postgres user."""
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
        took = time.perf_counter() - start
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
        times: dict[str, list[float]] = {m: [] for m in METHODS}
        self.laps, self.startup, self.proc_laps = [], [], []
        with self.source(run, {}) as srv:
            order = list(METHODS)
            for r in range(rounds):
                for method in order[r % 3 :] + order[: r % 3]:
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
    results: list[tuple[SizeRun, dict[str, list[float]], list[Laps], list[float]]],
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
        "database (`pgbench -i -s 68` is about 1 GiB, `-s 342` about 5 GiB) in a local server; "
        "each round runs the three methods, in an order that rotates from round to round, "
        + (
            "with the pool trimmed (waiting for the discards of the copy removed before) and the "
            "page cache dropped before each run (then the programs' own files, Python's modules "
            "and `pg_basebackup`, read back in: the database is cold, the tools are not)"
            if drop
            else "with a warm page cache"
        )
        + ". Seconds: the median (p90; min – max) over the rounds. The ratio is the plain "
        "copy's median over the seed's: 1.0 means the seed, verification and preparation "
        "included, takes as long as the copy alone.",
        "",
        "| size | method | seconds | plain / seed |",
        "|---|---|--:|--:|",
    ]
    for run, times, _, _ in results:
        plain = statistics.median(times["plain"])
        for method, label in METHODS.items():
            ratio = plain / statistics.median(times[method])
            lines.append(f"| {run.label} | {label} | {cell(times[method])} | {ratio:.2f} |")
    starts = [(run.label, startup) for run, _, _, startup in results if startup]
    if starts:
        lines += [
            "",
            "Before its seed began, the process spent (median: its wall time less the `in N s` it "
            "prints, which runs from just before the seed to its end) "
            + ", ".join(f"{statistics.median(v):.2f} s at {label}" for label, v in starts)
            + ": the interpreter's start and imports, the settings, the pool.",
        ]
    for run, _, laps, _ in results:
        lines += [
            "",
            f"Where the function's time goes at {run.label} (median seconds per step over "
            f"{len(laps)} seeds):",
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
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size (default: 3)")
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
    )
    started = dt.datetime.now(dt.UTC)
    results = []
    try:
        bench.open_pool()
        bench.sweep()
        for gib in gibs:
            run = SizeRun(gib=gib, scale=max(1, round(gib * SCALE_PER_GIB)))
            times = bench.seed_size(run, args.rounds)
            results.append((run, times, bench.laps, bench.startup))
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
