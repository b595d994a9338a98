"""Verdicts on a real branch: the same statements applied to a small and a larger table whose
TOAST table is several times the size of its heap (a wide text column), as SQL files, traced.

Each statement must get the same kind at both sizes; a type change is reported on the table,
with the size of all of it, never on its TOAST table; the index it builds again is counted as a
rewrite; a brief lock that blocks reads is reported, with the lock queue; squawk's
require-lock-timeout is confirmed only where no lock_timeout was in force.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from helpers import extra_server, remove_base, source_dsn
from pgoverlay.action import cells, details, migrations
from pgoverlay.action.insight import locks
from pgoverlay.action.insight.model import MigrationInsight, Thresholds
from pgoverlay.action.insight.observe import Observer
from pgoverlay.action.report import MigrationRun
from pgoverlay.runner import seed
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest

pytestmark = pytest.mark.slow

# Rows of each table: each row carries ~3 kB of incompressible text, stored in TOAST.
SIZES = {"small": 60, "large": 6000}

SETUP = """
CREATE TABLE {t} (id int PRIMARY KEY, n int NOT NULL, label varchar(100), body text);
CREATE INDEX {t}_label ON {t} (label);
INSERT INTO {t}
SELECT g, g, 'label ' || g,
       (SELECT string_agg(md5(g::text || ':' || i), '') FROM generate_series(1, 100) i)
  FROM generate_series(1, {rows}) g;
"""

# name -> (statements with {t} for the table, the kind the verdict must give)
MIGRATIONS = {
    "01_type_bigint": ("ALTER TABLE {t} ALTER COLUMN id TYPE bigint;", "rewrite"),
    "02_constant_default": (
        "ALTER TABLE {t} ADD COLUMN flag boolean NOT NULL DEFAULT false;",
        "blocks reads and writes",
    ),
    "03_with_lock_timeout": (
        "SET lock_timeout = '2s';\nALTER TABLE {t} ADD COLUMN extra text;",
        "blocks reads and writes",
    ),
    "04_index": ("CREATE INDEX {t}_n ON {t} (n);", "blocks writes"),
    # binary-coercible: the label index is created again with its old storage: no rewrite
    "05_widen_varchar": (
        "ALTER TABLE {t} ALTER COLUMN label TYPE varchar(200);",
        "blocks reads and writes",
    ),
    "06_update_rows": ("UPDATE {t} SET n = n + 1 WHERE id <= 10;", "row locks"),
    "07_index_concurrently": ("CREATE INDEX CONCURRENTLY {t}_n2 ON {t} (n);", "safe online"),
    # squawk does not see this lock_timeout, the check does
    "08_set_config_lock_timeout": (
        "SELECT set_config('lock_timeout', '3s', false);\nALTER TABLE {t} ADD COLUMN more int;",
        "blocks reads and writes",
    ),
}


@pytest.fixture(scope="module")
def wide(pool: Pool) -> Iterator[BaseVersion]:
    """A base with one table per size, each with a TOAST table far larger than its heap."""
    with extra_server(pool, "verdict-source", options={"wal_level": "replica"}) as srv:
        with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
            conn.execute("CREATE ROLE wide_owner")
            conn.execute("CREATE DATABASE wide OWNER wide_owner")
        with psycopg.connect(**srv.conninfo(user="postgres", dbname="wide")) as conn:
            conn.execute("SET ROLE wide_owner")
            for size, rows in SIZES.items():
                conn.execute(SETUP.format(t=f"wide_{size}", rows=rows))
        base = seed.seed(pool, "wide", source_dsn=source_dsn(srv, dbname="wide"))
    yield base
    remove_base(pool, base)


@pytest.fixture(scope="module")
def runs(
    pool: Pool, wide: BaseVersion, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], MigrationRun]:
    """Every migration applied to both tables, in one branch: (name, size) -> its run."""
    repo = tmp_path_factory.mktemp("verdict-repo")
    folder = repo / "db"
    folder.mkdir()
    for size in SIZES:
        for name, (sql, _) in MIGRATIONS.items():
            (folder / f"{name}_{size}.sql").write_text(sql.format(t=f"wide_{size}") + "\n")
    engine = LocalEngine(pool)
    engine.create(CreateRequest(name="verdicts", base=wide.name))
    try:
        with Observer(
            engine,
            "verdicts",
            repository=None,
            thresholds=Thresholds(),
            pg_major=wide.pg_major or 15,
            max_seconds=600,
        ) as observer:
            applied = migrations.apply_files(
                migrations.RunOptions(
                    target=engine.connection("verdicts"), timeout=600, watcher=observer
                ),
                repo,
                migrations.all_files(repo, "db"),
                psql=pgbin.for_major(wide.pg_major or 15).tool("psql"),
                skip_recorded=True,
            )
        assert observer.problem == ""
    finally:
        engine.destroy("verdicts")
    found = {}
    for run in applied:
        stem = Path(run.name).stem
        name, _, size = stem.rpartition("_")
        found[(name, size)] = run
    return found


def insight(runs: dict[tuple[str, str], MigrationRun], name: str, size: str) -> MigrationInsight:
    run = runs[(name, size)]
    assert run.status == "applied", run.error
    assert run.insight is not None, f"{name} on {size} was not measured"
    return run.insight


@pytest.mark.parametrize("name", sorted(MIGRATIONS))
def test_the_same_statement_gets_the_same_kind_at_both_sizes(
    runs: dict[tuple[str, str], MigrationRun], name: str
) -> None:
    kinds = {size: insight(runs, name, size).verdict.kind for size in SIZES}
    assert kinds == {size: MIGRATIONS[name][1] for size in SIZES}, {
        size: insight(runs, name, size).verdict for size in SIZES
    }


@pytest.mark.parametrize("size", sorted(SIZES))
def test_a_type_change_is_reported_on_its_table_with_all_of_its_size_never_its_toast(
    runs: dict[tuple[str, str], MigrationRun], size: str
) -> None:
    table = f"public.wide_{size}"
    typed = insight(runs, "01_type_bigint", size)
    toast = [u for u in typed.locks if u.kind == "TOAST table"]
    assert toast and {u.table for u in toast} == {table}, typed.locks
    (heap,) = [u for u in typed.locks if u.relation == table and u.mode == "ACCESS EXCLUSIVE"]
    assert typed.locks[0] == heap
    assert heap.table_bytes > heap.bytes + toast[0].bytes  # its TOAST and indexes counted
    assert toast[0].bytes > heap.bytes  # the TOAST table is the bigger part
    assert typed.verdict.text.startswith(f"rewrites `{table}` (")
    # the rewrite gave the table a new TOAST table (new oid, the old name): it is counted
    (new_toast,) = [r for r in typed.rewrites if r.kind == "TOAST table"]
    assert new_toast.table == table and new_toast.bytes_after > heap.bytes
    assert "pg_toast" not in typed.verdict.text and "(0 B)" not in typed.verdict.text
    assert "add a new column and backfill it in batches" in typed.verdict.text
    cell = cells.markdown(details.lock_cell(typed.locks))
    assert cell.startswith(f"ACCESS EXCLUSIVE on `{table}`, its ") and "and TOAST:" in cell
    assert "pg_toast" not in cell


@pytest.mark.parametrize("size", sorted(SIZES))
def test_the_primary_key_built_again_by_a_type_change_counts_as_a_rewrite(
    runs: dict[tuple[str, str], MigrationRun], size: str
) -> None:
    table = f"public.wide_{size}"
    typed = insight(runs, "01_type_bigint", size)
    rebuilt = {r.relation: r for r in typed.rewrites if "re-created" in r.reasons}
    assert set(rebuilt) == {f"{table}_pkey"}, typed.rewrites
    assert rebuilt[f"{table}_pkey"].table == table and rebuilt[f"{table}_pkey"].bytes_after > 0
    assert typed.statements[0].rewrites and all(
        r.statement == 0 for r in typed.statements[0].rewrites
    )
    # varchar(100) -> varchar(200) keeps the label index's storage: nothing was rebuilt
    widened = insight(runs, "05_widen_varchar", size)
    assert widened.rewrites == []
    assert widened.verdict.text.startswith(f"takes ACCESS EXCLUSIVE on `{table}` (")
    assert cells.markdown(details.lock_cell(widened.locks)).startswith(
        f"ACCESS EXCLUSIVE on `{table}`, its index: "
    )


@pytest.mark.parametrize("size", sorted(SIZES))
def test_a_constant_default_blocks_reads_with_the_lock_queue_and_lint_confirms_no_timeout(
    runs: dict[tuple[str, str], MigrationRun], size: str
) -> None:
    table = f"public.wide_{size}"
    added = insight(runs, "02_constant_default", size)
    assert added.rewrites == []
    assert added.verdict.level == "notice"
    assert added.verdict.text.startswith(f"takes ACCESS EXCLUSIVE on `{table}`")
    assert f"it waits behind any running transaction on `{table}`, and every query" in (
        added.verdict.text
    )
    assert added.verdict.text.endswith("set lock_timeout (e.g. SET lock_timeout = '2s') and retry")
    statuses = {f.rule: f.status for f in added.findings}
    assert statuses["require-lock-timeout"] == "confirmed", added.findings

    bounded = insight(runs, "03_with_lock_timeout", size)
    statuses = {f.rule: f.status for f in bounded.findings}
    assert statuses.get("require-lock-timeout", "not observed") == "not observed"
    configured = insight(runs, "08_set_config_lock_timeout", size)
    (finding,) = [f for f in configured.findings if f.rule == "require-lock-timeout"]
    assert (finding.status, finding.evidence) == (
        "not observed", f"lock_timeout was 3.0 s when it took ACCESS EXCLUSIVE on `{table}`"
    )  # fmt: skip
    assert bounded.verdict.text.endswith(
        "lock_timeout (2.0 s) bounds that wait: retry when it expires"
    )


@pytest.mark.parametrize("size", sorted(SIZES))
def test_updated_rows_are_row_locks_and_a_concurrent_index_is_safe(
    runs: dict[tuple[str, str], MigrationRun], size: str
) -> None:
    table = f"public.wide_{size}"
    updated = insight(runs, "06_update_rows", size)
    assert [(w.relation, w.rows_updated) for w in updated.row_writes] == [(table, 10)]
    assert updated.verdict.text.startswith(f"updates 10 rows of `{table}`")
    concurrent = insight(runs, "07_index_concurrently", size)
    assert concurrent.verdict.level == "safe"
    assert all(u.blocks == "ddl" for u in concurrent.locks)
    assert {t.table for t in locks.per_table(concurrent.locks)} <= {table}
