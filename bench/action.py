#!/usr/bin/env python3
"""The Action step's own cost under `act`: an older revision (before) and this checkout (after),
side by side in one run.

    sudo .venv/bin/python bench/action.py [--before main] [--runs 5] [--work DIR] [--no-report]

One pool (this checkout's CLI: `pool init`, `base seed NAME --demo --scale 1`, its engine
service), one fake GitHub API (tests/fakegithub.py), and two copies of the workflow of
tests/test_action_e2e.py, one running the Action of ``--before`` (a `git archive` of that
revision, in the work directory) and one this checkout's. Each copy first runs once untimed, to
fill its tool cache (the install step then finds pgoverlay installed, as on a warm runner);
then, ``--runs`` times, each copy runs `opened` (create the branch, apply one migration, write
the comment: the PR's comments are cleared before, so the comment is new) and `closed`
(destroy it, edit the comment), the two copies taking turns at going first.

act's log gives each step's time; the Action's own log line (`pgoverlay: timings: ...`) splits
the run step into its start (the interpreter and its imports), branch, migrations and comment.
The step's own cost is the run step's time less its branch and its migrations: what the Action
adds to the work it asks the engine for.

The Markdown section replaces the one between the action markers in docs/benchmarks.md. A
measurement script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from engine_report import REPORT, machine_line, write_report
from process import PR, REPO, RUNNER, TOKEN, ActScenario, Bench, quantiles

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- action:start -->", "<!-- action:end -->"
BASE = "actbench"
SIDES = ("before", "after")
KINDS = ("opened", "closed")
OWN = "own (run step - branch - migrations)"


class Side:
    """What ActScenario needs of a bench: the Action's checkout, and the pool's variables."""

    def __init__(self, checkout: Path, env: dict[str, str]) -> None:
        self.checkout, self.env = checkout, env


def export(rev: str, dest: Path) -> Path:
    """The checkout at ``rev`` (its committed files), for act to run as the Action."""
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", os.fspath(ROOT), "archive", "--format=tar", rev],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-C", os.fspath(dest), "-xf", "-"], input=archive, check=True)
    os.chmod(dest, 0o755)
    return dest


def measure(bench: Bench, before: Path, runs: int) -> dict[str, dict[str, list[float]]]:
    """``runs`` rounds of `opened` and `closed` per side; each value's samples by side."""
    from fakegithub import FakeGitHub
    from helpers import os_user

    user = os_user(RUNNER, groups=["pgoverlay"])
    found: dict[str, dict[str, list[float]]] = {side: {} for side in SIDES}
    roots = {
        side: Path(tempfile.mkdtemp(prefix=f"actbench-{side}-", dir="/var/tmp")) for side in SIDES
    }
    try:
        with FakeGitHub() as github:
            github.add_token(TOKEN, "github-actions[bot]", kind="installation")
            github.add_pull(REPO, PR, "0" * 40, "0" * 40)
            checkouts = {"before": before, "after": ROOT}
            scenarios = {
                side: ActScenario(roots[side], Side(checkouts[side], bench.env), github, user)  # type: ignore[arg-type]
                for side in SIDES
            }
            heads = {side: s.commit_migration() for side, s in scenarios.items()}

            def one(side: str) -> dict[str, float]:
                results: dict[str, float] = {}
                for kind in KINDS:
                    if kind == "opened":
                        with github.locked():
                            github.state.comments.clear()
                    for key, value in scenarios[side].act(kind, heads[side]).items():
                        results[f"{kind}: {key}"] = value
                return results

            for side in SIDES:  # fills each tool cache
                one(side)
            for i in range(runs):
                order = SIDES if i % 2 == 0 else SIDES[::-1]
                for side in order:
                    for key, value in one(side).items():
                        found[side].setdefault(key, []).append(value)
    finally:
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)
    return found


def table(found: dict[str, dict[str, list[float]]]) -> str:
    rows = [
        "| what | before: median | before: p90 | after: median | after: p90 | n |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    keys = list(dict.fromkeys([*found["before"], *found["after"]]))
    order = {k: i for i, k in enumerate(keys)}
    keys.sort(key=lambda k: (KINDS.index(k.split(":")[0]) if ":" in k else 9, order[k]))
    for key in keys:
        cells = []
        n = 0
        for side in SIDES:
            values = found[side].get(key)
            if not values:
                cells.append("- | -")
                continue
            q = quantiles(values)
            n = max(n, int(q["n"]))
            cells.append(f"{q['median'] * 1000:.0f} ms | {q['p90'] * 1000:.0f} ms")
        rows.append(f"| {key} | {' | '.join(cells)} | {n} |")
    return "\n".join(rows)


def render(result: dict[str, Any]) -> str:
    return f"""{START}
## The Action step's own cost (`bench/action.py`)

The composite Action under `act` (tests/test_action_e2e.py's workflow, the fake GitHub API,
`PGOVERLAY_RUNTIME=local`, a base of `base seed NAME --demo --scale 1`), before
({result["before"]}) and after (this checkout), the two taking turns in one run, with a warm
tool cache: `opened` creates the branch, applies one migration and writes a new comment;
`closed` destroys the branch and edits the comment. Steps' times are act's; the run step's
phases are the Action's own log line (`pgoverlay: timings:`; `start` is the interpreter's start
and its imports, up to the Action's first line of code). The step's own cost is the run step
less its branch and its migrations. Run {result["date"]}:

{table(result["found"])}

{result["machine"]}
{END}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="main", help="the revision measured as before")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/bench-action"))
    parser.add_argument("--no-report", action="store_true", help="leave docs/benchmarks.md")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rev = subprocess.run(
        ["git", "-C", os.fspath(ROOT), "rev-parse", "--short", args.before],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    args.work.mkdir(parents=True, exist_ok=True)
    os.chmod(args.work, 0o755)
    bench = Bench(ROOT, args.work / "pool-run")
    before = export(rev, args.work / f"before-{rev}")
    try:
        bench.work.mkdir(parents=True, exist_ok=True)
        os.chmod(bench.work, 0o755)
        bench.cli("pool", "init", "--size", "3G")
        bench.cli("base", "seed", BASE, "--demo", "--scale", "1")
        found = measure(bench, before, args.runs)
    finally:
        bench.teardown()
        shutil.rmtree(before, ignore_errors=True)
    from pgoverlay.runner.postgres import binaries as pgbin

    result = {
        "date": dt.date.today().isoformat(),
        "before": f"`{args.before}`, {rev}",
        "found": found,
        "machine": machine_line(pgbin.newest(None).major, load),
    }
    section = render(result)
    print(section)
    if not args.no_report:
        write_report(section, start=START, end=END)
        print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
