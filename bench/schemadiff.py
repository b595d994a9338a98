#!/usr/bin/env python3
"""Schema diff benchmark: what reading a large schema and diffing it costs.

    sudo .venv/bin/python bench/schemadiff.py [--tables 2000] [--rounds 5] [--work DIR]

Starts a throwaway Postgres (as the OS user `postgres`) and builds a schema of --tables
tables, each with 8 columns (a default, a NOT NULL, a varchar(n), a numeric(p,s)), a primary
key, a second index, a CHECK constraint, a foreign key to the table before it, and a grant;
one table in ten has a trigger, one in twenty a view over it, one in five a function. Then:

- read: ``schema.take`` on the whole database (median of --rounds), and the size of the kept
  snapshot (``schema.dumps``);
- diff: a migration that changes one table in twenty (a column's type, a default, an index
  added, a constraint dropped) against the snapshot before it; the diff's time and its
  JSON size in the report.

The Markdown replaces the section between the schemadiff markers in docs/benchmarks.md. A
measurement script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from engine_report import machine_line, write_report

from pgoverlay.action.insight import schemadiff
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.proc import OsUser
from pgoverlay.runner.trace import schema

START, END = "<!-- schemadiff:start -->", "<!-- schemadiff:end -->"


def build(conn: psycopg.Connection[Any], tables: int) -> None:
    conn.execute("CREATE ROLE reader")
    conn.execute(
        "CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$"
    )
    for i in range(tables):
        with conn.transaction():
            conn.execute(
                f"CREATE TABLE t{i} (id bigint PRIMARY KEY, parent bigint, "
                f"name varchar(80) NOT NULL, amount numeric(12,2) DEFAULT 0, "
                f"created timestamptz NOT NULL DEFAULT now(), state text DEFAULT 'new', "
                f"flags int[], note text, CHECK (amount >= 0))"
            )
            conn.execute(f"CREATE INDEX t{i}_name ON t{i} (name)")
            if i:
                conn.execute(f"ALTER TABLE t{i} ADD FOREIGN KEY (parent) REFERENCES t{i - 1} (id)")
            conn.execute(f"GRANT SELECT ON t{i} TO reader")
            if i % 10 == 0:
                conn.execute(
                    f"CREATE TRIGGER t{i}_touch BEFORE UPDATE ON t{i} "
                    "FOR EACH ROW EXECUTE FUNCTION touch()"
                )
            if i % 20 == 0:
                conn.execute(f"CREATE VIEW v{i} AS SELECT id, name FROM t{i} WHERE amount > 0")
            if i % 5 == 0:
                conn.execute(
                    f"CREATE FUNCTION f{i}(x bigint) RETURNS bigint LANGUAGE sql "
                    f"AS 'SELECT count(*) FROM t{i} WHERE id > x'"
                )


def migrate(conn: psycopg.Connection[Any], tables: int) -> int:
    changed = 0
    for i in range(0, tables, 20):
        conn.execute(f"ALTER TABLE t{i} ALTER COLUMN note TYPE varchar(500)")
        conn.execute(f"ALTER TABLE t{i} ALTER COLUMN state SET DEFAULT 'open'")
        conn.execute(f"CREATE INDEX t{i}_created ON t{i} (created)")
        conn.execute(f"ALTER TABLE t{i} DROP CONSTRAINT t{i}_amount_check")
        changed += 4
    return changed


def timed(rounds: int, what: Any) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        result = what()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    owner = OsUser.lookup("postgres")
    install = pgbin.newest()
    work = Path(tempfile.mkdtemp(prefix="pgoverlay-schemadiff-", dir=args.work or "/var/tmp"))
    load = os.getloadavg()[0]
    try:
        os.chown(work, owner.uid, owner.gid)
        cluster.initdb(install, work / "data", owner=owner)
        with cluster.running(
            install, work / "data", owner=owner, scratch=work, options={"fsync": "off"}
        ) as srv:
            info = srv.conninfo(user="postgres")
            options = "-c search_path=pg_catalog,pg_temp"
            with psycopg.connect(**info, autocommit=True) as conn:
                conn.execute("SET search_path = public")
                started = time.perf_counter()
                build(conn, args.tables)
                built = time.perf_counter() - started
            with psycopg.connect(**info, autocommit=True, options=options) as conn:
                read, base = timed(args.rounds, lambda: schema.take(conn))
            objects = sum(len(v) for v in base.objects.values())
            kept = len(schema.dumps(base).encode())
            with psycopg.connect(**info, autocommit=True) as conn:
                conn.execute("SET search_path = public")
                changes = migrate(conn, args.tables)
            with psycopg.connect(**info, autocommit=True, options=options) as conn:
                reread, now = timed(args.rounds, lambda: schema.take(conn))
            compared, diff = timed(args.rounds, lambda: schema.diff(base, now))
            report = schemadiff.of_view(diff)
            size = len(json.dumps(dataclasses.asdict(report)).encode())
            block = schemadiff.markdown(report, full=False, see="the job summary")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    listed = len(diff.changes)
    lines = [
        START,
        "## Schema diff",
        "",
        f"A schema of {args.tables:,} tables ({objects:,} objects: columns, indexes, "
        f"constraints, triggers, grants, views, functions; built in {built:.0f} s), read with "
        f"`schema.take` and diffed after a migration that makes {changes} changes to "
        f"{args.tables // 20} tables. Medians of {args.rounds} rounds.",
        "",
        "| Step | Time | Size |",
        "|---|--:|--:|",
        f"| read the base's schema | {read * 1000:.0f} ms | snapshot kept: "
        f"{kept / 1024**2:.1f} MiB |",
        f"| read the branch's schema after the migration | {reread * 1000:.0f} ms | |",
        f"| diff | {compared * 1000:.0f} ms | {listed} changes listed, {diff.left_out} "
        f"counted only; `schema_diff` in the JSON report: {size / 1024:.0f} KiB |",
        f"| comment block | | {len(block):,} characters |",
        "",
        machine_line(install.major, load),
        END,
    ]
    write_report("\n".join(lines) + "\n", start=START, end=END)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
