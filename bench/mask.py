#!/usr/bin/env python3
"""Masking benchmark: what masking costs once (seed time, pool space) and per branch (create
time, layer), beside the peer people would use instead, pg_anon (dump with masking, restore).

    sudo .venv/bin/python bench/mask.py [--rows 1700000] [--rounds 3] [--creates 5] [--work DIR]
        [--pg-anon PATH]

Builds a throwaway source (cached in the work directory) with a customers table (email under a
unique index, names, phones, notes), an orders table keyed by email, sessions and an audit log;
1.7 M customers make a database of about 1.1 GiB. Each round seeds it unmasked and masked with
docs/examples/masking-rules.yml into a pool of its own, and runs the peer, pg_anon (`pip install
pg-anon==1.12.0`; its `pg_anon` on PATH or given by --pg-anon): `pg_anon dump` of the same
database with a dictionary that masks the same columns (bench/peer_anon.py), then `pg_anon
restore` into an empty database of a second local server. The three take turns at going first,
with a warm page cache (the source stays up, and what one run read the next reads again). While
each seed runs, a thread samples the pool filesystem's used space every 0.2 s: the peak above
what was used before the seed is the seed's peak space. Then it creates and destroys
branches of the two bases in turns. The Markdown report replaces the section between the mask
markers in docs/benchmarks.md. A measurement script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import sys
import threading
import time
from functools import partial
from pathlib import Path

import peer_anon
import psycopg
from common import BULK_LOAD, build_source
from engine_report import machine_line, remove_pool, write_report
from psycopg.conninfo import make_conninfo

from pgoverlay.runner import branch, proc, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.mask import Step
from pgoverlay.runner.mask import rules as maskrules
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.seed import space
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.units import format_bytes

RULES = Path(__file__).resolve().parent.parent / "docs" / "examples" / "masking-rules.yml"
START, END = "<!-- mask:start -->", "<!-- mask:end -->"
SCHEMA = [
    "CREATE TABLE customers (id bigint PRIMARY KEY, email text NOT NULL UNIQUE, "
    "full_name text NOT NULL, phone text, notes text, tax_id text, born date)",
    "CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, "
    "customer_email text NOT NULL REFERENCES customers (email), shipping_address text, "
    "amount numeric NOT NULL)",
    "CREATE TABLE sessions (id bigint PRIMARY KEY, token text NOT NULL)",
    "CREATE TABLE audit_log (id bigint PRIMARY KEY, detail text NOT NULL)",
]
FILL = [
    "INSERT INTO customers SELECT g, 'user' || g || '@corp.example', 'Name ' || md5(g::text), "
    "'+1 555 ' || lpad((g %% 10000000)::text, 7, '0'), repeat(md5(g::text), 6), "
    "'T' || g, date '1950-01-01' + (g %% 20000) FROM generate_series(1, %(rows)s) g",
    "INSERT INTO orders SELECT g, 1 + g %% %(rows)s, 'user' || (1 + g %% %(rows)s) || "
    "'@corp.example', g || ' Main Street', g %% 1000 FROM generate_series(1, 2 * %(rows)s) g",
    "INSERT INTO sessions SELECT g, md5(g::text) FROM generate_series(1, %(rows)s / 10) g",
    "INSERT INTO audit_log SELECT g, CASE WHEN g %% 2 = 0 THEN 'login of user' || g || "
    "'@corp.example' ELSE 'nightly job ' || g END FROM generate_series(1, %(rows)s / 10) g",
]


def fill(srv: cluster.Running, rows: int) -> None:
    with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
        for statement in SCHEMA:
            conn.execute(statement.encode())
        for statement in FILL:
            conn.execute(statement.encode(), {"rows": rows})
        conn.execute("ANALYZE")


class Peak:
    """The most the pool's filesystem had in use above ``base`` while it ran, sampled, and the
    one-minute load average, sampled alike."""

    def __init__(self, root: Path) -> None:
        self.root, self.base, self.peak = root, 0, 0
        self.loads: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def used(self) -> int:
        usage = shutil.disk_usage(self.root)
        return usage.total - usage.free

    def __enter__(self) -> Peak:
        self.base = self.peak = self.used()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self.used())
            self.loads.append(os.getloadavg()[0])

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.used())

    @property
    def above(self) -> int:
        return self.peak - self.base


def main() -> int:
    parser = argparse.ArgumentParser(description="Benchmark masked bases (run as root).")
    parser.add_argument("--rows", type=int, default=1_700_000, help="customers (orders: twice)")
    parser.add_argument("--rounds", type=int, default=3, help="seeds of each kind, taking turns")
    parser.add_argument("--creates", type=int, default=5, help="creates per base")
    parser.add_argument("--work", default="/var/tmp/pgoverlay-bench-mask", help="work directory")
    parser.add_argument("--no-report", action="store_true", help="print, do not write the report")
    parser.add_argument("--pg-anon", help="the pg_anon command (default: pg_anon on PATH)")
    args = parser.parse_args()
    anon_command = peer_anon.find(args.pg_anon)
    if anon_command is None:
        parser.error(
            "pg_anon is not installed: `python3 -m venv /opt/pg-anon && /opt/pg-anon/bin/pip "
            f"install pg-anon=={peer_anon.VERSION}`, then pass --pg-anon /opt/pg-anon/bin/pg_anon"
        )
    load = os.getloadavg()[0]
    work = Path(args.work)
    for path in (work, work / "tmp"):
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o755)
    settings = Settings(home=work / "pool-home", port_min=56200, port_max=56299)
    install = pgbin.newest(settings.pg_bindir)
    owner = proc.OsUser.lookup(settings.os_user)
    started = dt.datetime.now(dt.UTC)
    datadir = build_source(work, owner, install, partial(fill, rows=args.rows), options=BULK_LOAD)
    anon_datadir = work / "anon-target" / "data"
    if not anon_datadir.exists():
        anon_datadir.parent.mkdir(parents=True)
        os.chown(anon_datadir.parent, owner.uid, owner.gid)
        cluster.initdb(install, anon_datadir, owner=owner)
    anon_seconds: list[tuple[float, float]] = []
    pool = poolmod.init(settings, size="20G")
    rules = maskrules.load(RULES)
    bases = {"unmasked": "mask-bench-plain", "masked": "mask-bench-masked"}
    seeds: dict[str, list[float]] = {k: [] for k in bases}
    peaks: dict[str, list[int]] = {k: [] for k in bases}
    loads: list[float] = []
    steps: list[Step] = []
    creates: dict[str, list[float]] = {k: [] for k in bases}
    layers: dict[str, list[int]] = {k: [] for k in bases}
    try:
        with (
            cluster.running(install, datadir, owner=owner, scratch=work / "tmp") as srv,
            cluster.running(install, anon_datadir, owner=owner, scratch=work / "tmp") as target,
        ):
            anon = peer_anon.PgAnon(
                anon_command, work=work, install=install, owner=owner, source=srv, target=target
            )
            anon.init()
            dsn = make_conninfo(
                host=os.fspath(srv.socket_dir), port=srv.port, user="postgres", dbname="postgres"
            )
            with psycopg.connect(dsn) as conn:
                row = conn.execute("SELECT pg_database_size('postgres')").fetchone()
                database = int(row[0]) if row else 0
                sizes = space.measure(conn, rules.rules)
            assert sizes is not None
            estimate = space.estimate(sizes, rules.rules)
            order = [*bases, "pg_anon"]
            for r in range(args.rounds):
                turn = r % len(order)
                for kind in order[turn:] + order[:turn]:
                    if kind == "pg_anon":
                        dumped, restored = anon.run(r)
                        anon_seconds.append((dumped, restored))
                        sys.stderr.write(
                            f"round {r + 1}/{args.rounds}: pg_anon dump {dumped:.1f} s, "
                            f"restore {restored:.1f} s\n"
                        )
                        continue
                    name = bases[kind]
                    for old in pool.registry.bases(name):
                        seed.remove_version(pool, name, old.version)
                    done: list[Step] = []

                    def finished(step: Step, done: list[Step] = done) -> None:
                        if step.seconds is not None:
                            done.append(step)

                    with Peak(pool.root) as peak:
                        t0 = time.monotonic()
                        seed.seed(
                            pool,
                            name,
                            source_dsn=dsn,
                            mask=RULES if kind == "masked" else None,
                            mask_progress=finished,
                        )
                        took = time.monotonic() - t0
                    seeds[kind].append(took)
                    peaks[kind].append(peak.above)
                    loads += peak.loads
                    steps = done if kind == "masked" else steps
                    busy = statistics.mean(peak.loads or [0.0])
                    sys.stderr.write(
                        f"round {r + 1}/{args.rounds}: {kind} {took:.1f} s, "
                        f"peak {format_bytes(peak.above)}, load {busy:.1f}\n"
                    )
        for i in range(args.creates):
            for kind, name in bases.items():
                t0 = time.monotonic()
                branch.create(pool, f"b{i}", base_name=name)
                creates[kind].append(time.monotonic() - t0)
                layers[kind].append(branch.layer_size(pool, f"b{i}").physical_bytes)
                branch.destroy(pool, f"b{i}")
        kept = {k: pool.registry.latest_base(n) for k, n in bases.items()}
        base_sizes = {k: b.size_bytes if b else 0 for k, b in kept.items()}
    finally:
        remove_pool(pool)
    section = render(
        args=args,
        started=started,
        database=database,
        seeds=seeds,
        peaks=peaks,
        estimate=estimate,
        steps=steps,
        creates=creates,
        layers=layers,
        sizes=base_sizes,
        machine=machine_line(install.major, load),
        loads=loads,
        anon=anon_seconds,
        anon_version=peer_anon.version(anon_command),
    )
    if not args.no_report:
        write_report(section, start=START, end=END)
    sys.stdout.write(section)
    return 0


def med(values: list[float], digits: int = 3) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:.{digits}f} ({low:.{digits}f} – {high:.{digits}f})"


def step_row(step: Step) -> str:
    size = format_bytes(step.size_bytes) if step.size_bytes else "–"
    return f"| {step.what} | {step.how or '–'} | {size} | {step.seconds or 0:.1f} |"


def render(
    *,
    args: argparse.Namespace,
    started: dt.datetime,
    database: int,
    seeds: dict[str, list[float]],
    peaks: dict[str, list[int]],
    estimate: space.Estimate,
    steps: list[Step],
    creates: dict[str, list[float]],
    layers: dict[str, list[int]],
    sizes: dict[str, int],
    machine: str,
    loads: list[float],
    anon: list[tuple[float, float]],
    anon_version: str,
) -> str:
    masked = statistics.median(seeds["masked"])
    ratio = masked / statistics.median(seeds["unmasked"])
    peak_ratio = max(peaks["masked"]) / database
    anon_total = [d + r for d, r in anon]
    rows = [
        f"| {kind} | {format_bytes(sizes[kind])} | {med(seeds[kind], 1)} | "
        f"{format_bytes(max(peaks[kind]))} ({max(peaks[kind]) / database:.2f}×) | "
        f"{med(creates[kind])} | {format_bytes(int(statistics.median(layers[kind])))} |"
        for kind in seeds
    ]
    rows.append(
        f"| pg_anon {anon_version}: dump with masking, then restore | – | "
        f"{med(anon_total, 1)} | – | – | – |"
    )
    command = f"python bench/mask.py --rows {args.rows} --rounds {args.rounds}"
    intro = (
        f"Generated by `{command} --creates {args.creates}` on {started:%Y-%m-%d}: "
        f"{args.rows:,} customers, {2 * args.rows:,} orders keyed by email, "
        f"{args.rows // 10:,} sessions, a database of {format_bytes(database)}; masked with "
        "`docs/examples/masking-rules.yml`. Each round seeds the source unmasked and masked and"
        " runs pg_anon (`pg_anon dump` with a dictionary masking the same columns, see "
        "bench/peer_anon.py, then `pg_anon restore` into an empty database of a second local "
        "server; `pg_anon init` put its functions, schema anon_funcs, in the source once, "
        "untimed, and the seeds copy them too), the three taking turns at going first, with a "
        "warm page cache. Seed is the median (min – max) over the rounds; peak space is the "
        "most the pool's filesystem held above what it held before the seed (sampled every 0.2 "
        "s; the largest over the rounds), and in brackets that over the database's size. Create"
        " is the median (min – max) over the creates, taken in turns; the layer is the branch's"
        " physical exclusive bytes right after create."
    )
    anon_median = statistics.median(anon_total)
    verdict = (
        f"Masked seed against pg_anon in the same run: **{anon_median / masked:.2f}×** "
        f"(pg_anon's median over the masked seed's; target: at least 1.0: pg_anon's dump "
        f"{statistics.median([d for d, _ in anon]):.1f} s and restore "
        f"{statistics.median([r for _, r in anon]):.1f} s, medians). Peak space **"
        f"{peak_ratio:.2f}×** the database (target: at most 2×). Against the unmasked seed: "
        f"{ratio:.1f}× (no target: one backend rewrites the largest table, and Postgres has no "
        "parallel rewrite). Before copying, the "
        f"seed estimated it needs {format_bytes(estimate.total)} "
        f"({estimate.total / database:.2f}× the database; the costliest table: "
        f"{estimate.peak_table})."
    )
    during = (
        f" The one-minute load average sampled during the seeds: mean "
        f"{statistics.mean(loads):.1f}, max {max(loads):.1f}."
        if loads
        else ""
    )
    lines = [
        START,
        "## Masking benchmark",
        "",
        intro,
        "",
        "| base | size | seed (s) | peak space | create (s) | layer after create |",
        "|---|--:|--:|--:|--:|--:|",
        *rows,
        "",
        verdict,
        "",
        "The masked seed's masking steps (the last round):",
        "",
        "| step | how | size | seconds |",
        "|---|---|--:|--:|",
        *map(step_row, steps),
        "",
        machine + during,
        END,
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
