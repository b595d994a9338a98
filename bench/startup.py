#!/usr/bin/env python3
"""Start-up of two installed CLIs side by side: `pgoverlay --help` and `branch list`.

    sudo .venv/bin/python bench/startup.py --before PREFIX_A --after PREFIX_B [--runs 20]
        [--work DIR] [--ports 58950-58999]

Each PREFIX is an install of scripts/install.sh (``PREFIX/venv/bin/pgoverlay``), so the
commands are timed as users run them. The ``--after`` CLI makes one pool in ``--work`` (`pool
init`, which starts its engine service; `base seed --demo --scale 1`; one branch), and both
CLIs list that pool. Each round runs every command once per CLI, which of the two goes first
alternating, so noise on a shared machine hits both alike. A wall time is
``time.perf_counter()`` around ``subprocess.run`` of the whole process, from ``/``. Prints the
medians (and p90) as a Markdown table; a measurement script, it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from process import service_pids

from pgoverlay.runner.polling import wait_for

COMMANDS = {"--help": ["--help"], "branch list": ["branch", "list"]}
BASE, BRANCH = "startbench", "startbench-b"


def run(cli: Path, args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run([os.fspath(cli), *args], env=env, capture_output=True, cwd="/")
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{cli} {' '.join(args)} failed:\n{done.stderr.decode()[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/pgoverlay-startup-bench"))
    parser.add_argument("--ports", default="58950-58999")
    args = parser.parse_args()
    low, high = args.ports.split("-")
    home = args.work / "pool"
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
        "PGOVERLAY_HOME": os.fspath(home),
        "PGOVERLAY_RUNTIME": "local",
        "PGOVERLAY_PORT_MIN": low,
        "PGOVERLAY_PORT_MAX": high,
    }
    clis = {
        "before": args.before / "venv/bin/pgoverlay",
        "after": args.after / "venv/bin/pgoverlay",
    }
    args.work.mkdir(parents=True, exist_ok=True)
    os.chmod(args.work, 0o755)
    maker = clis["after"]
    try:
        run(maker, ["pool", "init", "--size", "2G"], env)
        run(maker, ["base", "seed", BASE, "--demo", "--scale", "1"], env)
        run(maker, ["branch", "create", BRANCH], env)
        times: dict[tuple[str, str], list[float]] = {}
        for each in clis.values():  # a first run of each writes its bytecode caches
            for argv in COMMANDS.values():
                run(each, argv, env)
        for round_ in range(args.runs):
            order = list(clis.items()) if round_ % 2 == 0 else list(clis.items())[::-1]
            for command, argv in COMMANDS.items():
                for label, cli in order:
                    times.setdefault((command, label), []).append(run(cli, argv, env))
    finally:
        for pid in service_pids(home):
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not service_pids(home), timeout=60, what="the engine service to exit")
        done = subprocess.run(
            [os.fspath(maker), "pool", "rm", "--yes"], env=env, capture_output=True, cwd="/"
        )
        if done.returncode != 0:
            print(f"pool rm failed, {home} is left:\n{done.stderr.decode()}", file=sys.stderr)
    print("| command | before (median, p90) | after (median, p90) | change | n |")
    print("|---|---|---|---|---|")
    for command in COMMANDS:
        cells = []
        for label in clis:
            found = sorted(times[(command, label)])
            p90 = found[min(len(found) - 1, round(0.9 * (len(found) - 1)))]
            cells.append((statistics.median(found), p90))
        change = (cells[1][0] / cells[0][0] - 1) * 100
        print(
            f"| `pgoverlay {command}` | {cells[0][0] * 1000:.1f} ms ({cells[0][1] * 1000:.1f}) "
            f"| {cells[1][0] * 1000:.1f} ms ({cells[1][1] * 1000:.1f}) | {change:+.1f} % "
            f"| {args.runs} |"
        )


if __name__ == "__main__":
    main()
