#!/usr/bin/env python3
"""Migration insight benchmark: what measuring costs a migration, and what it reports next to
a linter's findings for the same migrations.

    sudo .venv/bin/python bench/insight.py [--rows 2500000] [--rounds 5] [--work DIR]

Builds a throwaway source from tests/fixtures/insight/shop.sql (`orders`: --rows rows, about
100 bytes each), seeds it into a pool of its own, then:

- overhead: each of a few of the fixture migrations runs on a fresh branch untraced (as with
  `insight: false`, when no probe starts either), traced, and traced with the probe
  (``action/insight/probe.py``) on the tables it names, in turns (the order rotates every
  round); the table gives the medians of psql's wall time, the probe's cost on the migration
  against the trace alone (target: 5 % or less), and what the marks and the probe's start
  cost around it;
- side by side: every fixture migration applied in order on one traced branch; for each, what
  squawk (PyPI squawk-cli) says and what the trace measured. eugene is not on PyPI and
  crates.io is not reachable from these machines, so it has no column.

The Markdown replaces the section between the insight markers in docs/benchmarks.md. A
measurement script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from common import BULK_LOAD, build_source
from engine_report import machine_line, remove_pool, write_report
from psycopg.conninfo import make_conninfo

from pgoverlay.action import cells, migrations
from pgoverlay.action.insight import blocking, probe
from pgoverlay.action.insight.model import MigrationInsight, Thresholds
from pgoverlay.action.insight.observe import Observer
from pgoverlay.action.report import MigrationRun
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner import proc, seed
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.units import format_bytes

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "insight"
START, END = "<!-- insight:start -->", "<!-- insight:end -->"
BASE = "insight-bench"
OVERHEAD = [
    "002_type_bigint.sql",
    "006_index.sql",
    "007_index_concurrently.sql",
    "008_set_not_null.sql",
]


class Watch:
    """An Observer that also times its marks and the opening of its trace."""

    def __init__(self, observer: Observer) -> None:
        self.observer = observer
        self.mark_seconds: list[float] = []
        self.start_seconds = 0.0
        self.probe_seconds: list[float] = []  # starting the probe, before each migration

    def start(self) -> None:
        t0 = time.monotonic()
        self.observer.start()
        self.start_seconds += time.monotonic() - t0

    def marked(self, text: str, *, single_transaction: bool) -> str | None:
        return self.observer.marked(text, single_transaction=single_transaction)

    def starting(self, *, text: str | None) -> None:
        t0 = time.monotonic()
        self.observer.starting(text=text)
        self.probe_seconds.append(time.monotonic() - t0)

    def measure(self, **kwargs: object) -> MigrationInsight | None:
        t0 = time.monotonic()
        found = self.observer.measure(**kwargs)  # type: ignore[arg-type]
        self.mark_seconds.append(time.monotonic() - t0)
        return found


def shop(install: pgbin.PgInstall, rows: int) -> Callable[[cluster.Running], None]:
    """The shop database of tests/fixtures/insight/shop.sql, ``rows`` large."""

    def fill(srv: cluster.Running) -> None:
        env = {"PGHOST": os.fspath(srv.socket_dir), "PGPORT": str(srv.port), "PGUSER": "postgres"}
        psql: list[str | Path] = [install.tool("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1"]
        # The application's tables belong to an owner role, as in production, not to the
        # superuser: the branch's role can then alter them.
        proc.run(
            [*psql, "-c", "CREATE ROLE shop_owner", "-c", "CREATE DATABASE shop OWNER shop_owner"],
            env=env,
            timeout=60,
        )
        proc.run(
            [*psql, "-v", f"rows={rows}", "-c", "SET ROLE shop_owner", "-f", FIXTURES / "shop.sql"],
            env={**env, "PGDATABASE": "shop"},
            timeout=3600,
        )

    return fill


Mode = Literal["untraced", "traced", "probed"]
MODES: tuple[Mode, ...] = ("untraced", "traced", "probed")


def apply(
    engine: LocalEngine, pool: Pool, name: str, repo: Path, files: list[str], *, mode: Mode
) -> tuple[list[MigrationRun], Watch | None, float]:
    """Apply ``files`` on a fresh branch ``name``; the runs, the watch (marks' and the probe's
    start seconds) and the trace's begin + end seconds."""
    engine.create(CreateRequest(name=name, base=BASE))
    install = pgbin.newest(pool.settings.pg_bindir)
    try:
        target = engine.connection(name)
        if mode == "untraced":
            runs = migrations.apply_files(
                migrations.RunOptions(target=target, timeout=3600),
                repo,
                files,
                psql=install.tool("psql"),
                skip_recorded=True,
            )
            return runs, None, 0.0
        observer = Observer(
            engine,
            name,
            repository=None,
            thresholds=Thresholds(),
            pg_major=install.major,
            max_seconds=3600,
            probing=probe.Options(target=target) if mode == "probed" else None,
        )
        watch = Watch(observer)
        try:
            runs = migrations.apply_files(
                migrations.RunOptions(target=target, timeout=3600, watcher=watch),
                repo,
                files,
                psql=install.tool("psql"),
                skip_recorded=True,
            )
        finally:
            t0 = time.monotonic()
            observer.__exit__(None, None, None)
            opened = watch.start_seconds + time.monotonic() - t0
        if observer.problem:
            raise SystemExit(f"the trace failed: {observer.problem}")
        return runs, watch, opened
    finally:
        engine.destroy(name)


def paired(these: list[float], those: list[float]) -> str:
    """The median of the rounds' ratios ``these[i] / those[i]``, as a difference."""
    ratio = statistics.median(a / b for a, b in zip(these, those, strict=True))
    return f"{(ratio - 1) * 100:+.1f} %"


def worst_lock(insight: MigrationInsight) -> str:
    blocking = [lock for lock in insight.locks if lock.blocks != "ddl"] or insight.locks
    if not blocking:
        return "none seen"
    lock = max(blocking, key=lambda x: x.held_seconds)
    return f"{lock.mode} on `{lock.relation}` ({lock.blocks}), {lock.held_seconds:.2f} s"


def rewrites(insight: MigrationInsight) -> str:
    tables = [r for r in insight.rewrites if r.kind == "table"]
    if not tables:
        return "none"
    return "; ".join(
        f"`{r.relation}` {format_bytes(r.bytes_before)} → {format_bytes(r.bytes_after)}"
        f" ({', '.join(r.reasons) or 'no reason given'})"
        for r in tables
    )


def lint_cell(insight: MigrationInsight) -> str:
    found = [f for f in insight.findings if f.status != "not measurable"]
    if not found:
        return "no lock or rewrite warning"
    return "; ".join(f"`{f.rule}`: **{f.status}**" for f in found)


def squawk_cell(insight: MigrationInsight) -> str:
    rules = sorted({f.rule for f in insight.findings})
    return ", ".join(f"`{r}`" for r in rules) or "nothing"


def main() -> int:
    parser = argparse.ArgumentParser(description="Benchmark migration insight (run as root).")
    parser.add_argument("--rows", type=int, default=2_500_000, help="rows of orders")
    parser.add_argument("--rounds", type=int, default=5, help="runs per migration and mode")
    parser.add_argument("--work", default="/var/tmp/pgoverlay-bench-insight", help="work dir")
    parser.add_argument("--ports", default="56300-56399", help="the branches' ports, FIRST-LAST")
    args = parser.parse_args()
    port_min, port_max = (int(p) for p in args.ports.split("-", 1))
    load = os.getloadavg()[0]
    work = Path(args.work)
    for path in (work, work / "tmp", work / "repo"):
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o755)
    repo = work / "repo"
    shutil.rmtree(repo / "db", ignore_errors=True)
    shutil.copytree(FIXTURES / "migrations", repo / "db")
    settings = Settings(
        home=work / "pool-home", port_min=port_min, port_max=port_max, runtime="local"
    )
    install = pgbin.newest(settings.pg_bindir)
    owner = proc.OsUser.lookup(settings.os_user)
    started = dt.datetime.now(dt.UTC)
    datadir = build_source(work, owner, install, shop(install, args.rows), options=BULK_LOAD)
    pool = poolmod.init(settings, size="20G")
    engine = LocalEngine(pool)
    seconds: dict[Mode, dict[str, list[float]]] = {m: {f: [] for f in OVERHEAD} for m in MODES}
    marks: list[float] = []
    opened: list[float] = []
    starts: list[float] = []
    try:
        with cluster.running(install, datadir, owner=owner, scratch=work / "tmp") as srv:
            dsn = make_conninfo(
                host=os.fspath(srv.socket_dir), port=srv.port, user="postgres", dbname="shop"
            )
            seed.seed(pool, BASE, source_dsn=dsn)
        size = pool.registry.latest_base(BASE).size_bytes  # type: ignore[union-attr]
        for i in range(args.rounds):
            for file in OVERHEAD:
                for mode in MODES[i % 3 :] + MODES[: i % 3]:
                    runs, watch, trace_seconds = apply(
                        engine, pool, f"ov{i}", repo, [f"db/{file}"], mode=mode
                    )
                    (run,) = runs
                    if run.status != "applied":
                        raise SystemExit(f"{file} failed: {run.error}")
                    seconds[mode][file].append(run.seconds)
                    if watch is not None:
                        marks += watch.mark_seconds
                        opened.append(trace_seconds)
                    if watch is not None and mode == "probed":
                        starts += watch.probe_seconds
        all_files = migrations.all_files(repo, "db")
        side, _, _ = apply(engine, pool, "side", repo, all_files, mode="probed")
    finally:
        remove_pool(pool)

    overhead_rows = []
    for file in OVERHEAD:
        a, b, c = (statistics.median(seconds[m][file]) for m in MODES)
        # Each round's three runs follow each other: their ratios cancel the load of the
        # moment, which a ratio of medians taken across rounds does not.
        trace = paired(seconds["traced"][file], seconds["untraced"][file])
        probed = paired(seconds["probed"][file], seconds["traced"][file])
        overhead_rows.append(f"| `{file}` | {a:.3f} | {b:.3f} | {c:.3f} | {trace} | {probed} |")
    side_rows = []
    for run in side:
        if run.insight is None:
            side_rows.append(f"| `{Path(run.name).name}` | {run.status} | | | | | |")
            continue
        found = run.insight
        verdict = found.verdict.text.replace("|", "\\|")
        side_rows.append(
            f"| `{Path(run.name).name}` | {squawk_cell(found)} | {worst_lock(found)} | "
            f"{cells.markdown(blocking.cell(found))} | {rewrites(found)} | {lint_cell(found)} | "
            f"{verdict} |"
        )
    section = "\n".join(
        [
            START,
            "## Migration insight",
            "",
            f"Generated by `python bench/insight.py --rows {args.rows} --rounds {args.rounds}` "
            f"on {started:%Y-%m-%d}: a base of {format_bytes(size)} whose `orders` table has "
            f"{args.rows:,} rows (`tests/fixtures/insight/shop.sql`).",
            "",
            "### What measuring costs",
            "",
            "Each migration on a fresh branch untraced (`insight: false`: no trace, no probe), "
            "traced, and traced with the probe on the tables it names, in turns (the order "
            "rotates every round); psql's wall time, median of "
            f"{args.rounds} runs each. The trace samples pg_locks every 50 ms and logs every "
            "statement of the branch's role; the probe runs a read and a write on each table "
            "4 times a second. The last two columns are the median of the rounds' ratios "
            "(each round runs the three one after the other): the trace against no "
            "measuring, and the probe's cost on the migration against the trace alone "
            "(target: 5 % or less).",
            "",
            "| migration | untraced (s) | traced (s) | traced + probe (s) | trace | probe |",
            "|---|--:|--:|--:|--:|--:|",
            *overhead_rows,
            "",
            f"Beyond the migration itself, a mark (snapshot, log, samples, analysis and squawk) "
            f"took {statistics.median(marks):.3f} s median, opening plus closing a trace "
            f"{statistics.median(opened):.3f} s median, and starting the probe (its sessions, "
            f"before the migration starts) {statistics.median(starts):.3f} s median.",
            "",
            "### Side by side with a linter",
            "",
            "Every fixture migration in order on one traced and probed branch. squawk "
            "(squawk-cli, the rules it reports for the file); what the trace and the probe "
            "measured; each squawk warning "
            "about a lock, a scan or a rewrite, checked against the measurement. eugene "
            "(kaaveland/eugene) installs from crates.io or GitHub releases only, neither "
            "reachable here, so it has no column.",
            "",
            "| migration | squawk reports | worst lock, held | blocked (probed) | "
            "table rewrites | squawk, checked | verdict |",
            "|---|---|---|---|---|---|---|",
            *side_rows,
            "",
            machine_line(install.major, load),
            END,
        ]
    )
    write_report(section + "\n", start=START, end=END)
    sys.stdout.write(section + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
