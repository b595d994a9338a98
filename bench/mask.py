#!/usr/bin/env python3
"""Masking benchmark: what masking costs once (seed time) and per branch (create time, layer).

    sudo .venv/bin/python bench/mask.py [--rows 500000] [--creates 10] [--work DIR]

Builds a throwaway source with a customers table (email under a unique index, names, phones,
notes) and an orders table keyed by email, seeds it twice into a pool of its own (unmasked, and
masked with docs/examples/masking-rules.yml), then creates and destroys branches of the two bases
in turns. The Markdown table replaces the section between the mask markers in
docs/benchmarks.md. A measurement script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg
from engine_report import machine_line, remove_pool, write_report
from psycopg.conninfo import make_conninfo

from pgoverlay.runner import branch, proc, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
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
]
FILL = [
    "INSERT INTO customers SELECT g, 'user' || g || '@corp.example', 'Name ' || md5(g::text), "
    "'+1 555 ' || lpad((g %% 10000000)::text, 7, '0'), repeat(md5(g::text), 6), "
    "'T' || g, date '1950-01-01' + (g %% 20000) FROM generate_series(1, %(rows)s) g",
    "INSERT INTO orders SELECT g, 1 + g %% %(rows)s, 'user' || (1 + g %% %(rows)s) || "
    "'@corp.example', g || ' Main Street', g %% 1000 FROM generate_series(1, 2 * %(rows)s) g",
    "INSERT INTO sessions SELECT g, md5(g::text) FROM generate_series(1, %(rows)s / 10) g",
]


def build_source(work: Path, owner: proc.OsUser, install: pgbin.PgInstall, rows: int) -> Path:
    datadir = work / "src" / "data"
    if datadir.exists():
        return datadir
    datadir.parent.mkdir(parents=True)
    os.chown(datadir.parent, owner.uid, owner.gid)
    cluster.initdb(install, datadir, owner=owner)
    opts = {"fsync": "off", "wal_level": "replica", "max_wal_size": "4GB"}
    with (
        cluster.running(install, datadir, owner=owner, scratch=work / "tmp", options=opts) as srv,
        psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn,
    ):
        for statement in SCHEMA:
            conn.execute(statement.encode())
        for statement in FILL:
            conn.execute(statement.encode(), {"rows": rows})
        conn.execute("ANALYZE")
    return datadir


def main() -> int:
    parser = argparse.ArgumentParser(description="Benchmark masked bases (run as root).")
    parser.add_argument("--rows", type=int, default=500_000, help="customers (orders: twice)")
    parser.add_argument("--creates", type=int, default=10, help="creates per base")
    parser.add_argument("--work", default="/var/tmp/pgoverlay-bench-mask", help="work directory")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    work = Path(args.work)
    for path in (work, work / "tmp"):
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o755)
    settings = Settings(home=work / "pool-home", port_min=56200, port_max=56299)
    install = pgbin.newest(settings.pg_bindir)
    owner = proc.OsUser.lookup(settings.os_user)
    started = dt.datetime.now(dt.UTC)
    datadir = build_source(work, owner, install, args.rows)
    pool = poolmod.init(settings, size="20G")
    seeds: dict[str, float] = {}
    bases = {"unmasked": "mask-bench-plain", "masked": "mask-bench-masked"}
    creates: dict[str, list[float]] = {k: [] for k in bases}
    layers: dict[str, list[int]] = {k: [] for k in bases}
    try:
        with cluster.running(install, datadir, owner=owner, scratch=work / "tmp") as srv:
            dsn = make_conninfo(host=os.fspath(srv.socket_dir), port=srv.port, user="postgres")
            for kind, name in bases.items():
                t0 = time.monotonic()
                seed.seed(pool, name, source_dsn=dsn, mask=RULES if kind == "masked" else None)
                seeds[kind] = time.monotonic() - t0
        for i in range(args.creates):
            for kind, name in bases.items():
                t0 = time.monotonic()
                branch.create(pool, f"b{i}", base_name=name)
                creates[kind].append(time.monotonic() - t0)
                layers[kind].append(branch.layer_size(pool, f"b{i}").physical_bytes)
                branch.destroy(pool, f"b{i}")
        sizes = {k: pool.registry.latest_base(n).size_bytes for k, n in bases.items()}  # type: ignore[union-attr]
    finally:
        remove_pool(pool)

    def med(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} ({min(values):.3f} – {max(values):.3f})"

    rows = [
        f"| {kind} | {format_bytes(sizes[kind])} | {seeds[kind]:.1f} | {med(creates[kind])} | "
        f"{format_bytes(int(statistics.median(layers[kind])))} |"
        for kind in bases
    ]
    section = "\n".join(
        [
            START,
            "## Masking benchmark",
            "",
            f"Generated by `python bench/mask.py --rows {args.rows} --creates {args.creates}` on "
            f"{started:%Y-%m-%d}: {args.rows:,} customers, {2 * args.rows:,} orders keyed by "
            f"email, {args.rows // 10:,} sessions; masked with "
            "`docs/examples/masking-rules.yml`. Create is the median (min – max) over the "
            "creates, taken in turns; the layer is the branch's physical exclusive bytes right "
            "after create.",
            "",
            "| base | size | seed (s) | create (s) | layer after create |",
            "|---|--:|--:|--:|--:|",
            *rows,
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
