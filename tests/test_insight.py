"""Migration insight on a real branch of a base whose `orders` table is a few hundred MB: the
migrations Postgres documents (tests/fixtures/insight/README.md), applied as SQL files and
through Alembic as a migrate command, give the lock modes, rewrites and scans Postgres says
they do, measured.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from selenium import webdriver
from test_comment import report
from test_comment_layout import assert_fits, chromium, look

from helpers import extra_server, remove_base, source_dsn
from pgoverlay.action import migrations
from pgoverlay.action.comment import render_comment
from pgoverlay.action.insight.locks import strongest
from pgoverlay.action.insight.model import MigrationInsight, StatementInsight, Thresholds
from pgoverlay.action.insight.observe import Observer
from pgoverlay.action.report import MigrationRun
from pgoverlay.runner import proc, seed
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures" / "insight"
# 2.5 million rows make `orders` about 250 MB: a rewrite takes seconds, not milliseconds.
ROWS = int(os.environ.get("PGOVERLAY_INSIGHT_ROWS", "2500000"))
ORDERS = "public.orders"


@pytest.fixture(scope="module")
def shop(pool: Pool) -> Iterator[BaseVersion]:
    """A base seeded from a source whose `orders` table is a few hundred MB."""
    with extra_server(pool, "insight-source", options={"wal_level": "replica"}) as srv:
        with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
            conn.execute("CREATE ROLE shop_owner")
            conn.execute("CREATE DATABASE shop OWNER shop_owner")
        psql = pgbin.newest().tool("psql")
        info = srv.conninfo(user="postgres", dbname="shop")
        proc.run(
            [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", f"rows={ROWS}", "-c",
             "SET ROLE shop_owner", "-f", FIXTURES / "shop.sql"],
            env={"PGHOST": str(info["host"]), "PGPORT": str(info["port"]),
                 "PGUSER": "postgres", "PGDATABASE": "shop"},
            timeout=600,
        )  # fmt: skip
        base = seed.seed(pool, "shop", source_dsn=source_dsn(srv, dbname="shop"))
    yield base
    remove_base(pool, base)


def _engine_branch(pool: Pool, shop: BaseVersion, name: str) -> tuple[LocalEngine, str]:
    engine = LocalEngine(pool)
    engine.create(CreateRequest(name=name, base=shop.name))
    return engine, name


def _observer(engine: LocalEngine, name: str, shop: BaseVersion) -> Observer:
    return Observer(
        engine,
        name,
        repository=None,
        thresholds=Thresholds(max_blocking_lock=5.0, max_rewrite=1024**3),
        pg_major=shop.pg_major or 15,
        max_seconds=3600,
    )


@pytest.fixture(scope="module")
def sql_runs(
    pool: Pool, shop: BaseVersion, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, MigrationRun]:
    """Every fixture migration applied as a SQL file, measured: file name -> its run."""
    repo = tmp_path_factory.mktemp("insight-repo")
    shutil.copytree(FIXTURES / "migrations", repo / "db")
    engine, name = _engine_branch(pool, shop, "insight-sql")
    try:
        with _observer(engine, name, shop) as observer:
            runs = migrations.apply_files(
                migrations.RunOptions(
                    target=engine.connection(name), timeout=600, watcher=observer
                ),
                repo,
                migrations.all_files(repo, "db"),
                psql=pgbin.for_major(shop.pg_major or 15).tool("psql"),
                skip_recorded=True,
            )
        assert observer.problem == ""
    finally:
        engine.destroy(name)
    return {Path(r.name).name: r for r in runs}


def insight_of(runs: dict[str, MigrationRun], file: str) -> MigrationInsight:
    run = runs[file]
    assert run.status == "applied", run.error
    assert run.insight is not None, f"{file} was not measured"
    return run.insight


def modes_on(insight: MigrationInsight, relation: str) -> set[str]:
    return {lock.mode for lock in insight.locks if lock.relation == relation}


# file -> table -> the strongest lock mode Postgres documents for it
DOCUMENTED_LOCKS = {
    "001_volatile_default.sql": {ORDERS: "ACCESS EXCLUSIVE"},
    "002_type_bigint.sql": {ORDERS: "ACCESS EXCLUSIVE"},
    "003_small_type_bigint.sql": {"public.orders_small": "ACCESS EXCLUSIVE"},
    "004_constant_default.sql": {ORDERS: "ACCESS EXCLUSIVE"},
    "005_varchar_to_text.sql": {ORDERS: "ACCESS EXCLUSIVE"},
    "006_index.sql": {ORDERS: "SHARE"},
    "007_index_concurrently.sql": {ORDERS: "SHARE UPDATE EXCLUSIVE"},
    "008_set_not_null.sql": {ORDERS: "ACCESS EXCLUSIVE"},
    "009_fk_not_valid.sql": {
        ORDERS: "SHARE ROW EXCLUSIVE",
        "public.customers": "SHARE ROW EXCLUSIVE",
    },
    "010_validate.sql": {ORDERS: "SHARE UPDATE EXCLUSIVE", "public.customers": "ROW SHARE"},
}


@pytest.mark.parametrize("file", sorted(DOCUMENTED_LOCKS))
def test_each_migration_takes_the_lock_postgres_documents(
    sql_runs: dict[str, MigrationRun], file: str
) -> None:
    insight = insight_of(sql_runs, file)
    for table, mode in DOCUMENTED_LOCKS[file].items():
        assert strongest(modes_on(insight, table)) == mode, (table, insight.locks)
    untouched = {"public.orders_small"} if "small" not in file else {ORDERS}
    for table in untouched:
        assert modes_on(insight, table) == set(), (table, insight.locks)


def test_what_a_lock_blocks_is_said_in_production_terms(
    sql_runs: dict[str, MigrationRun],
) -> None:
    blocks = {
        (file, lock.mode): lock.blocks
        for file in DOCUMENTED_LOCKS
        for lock in insight_of(sql_runs, file).locks
        if lock.relation == ORDERS
    }
    assert blocks[("002_type_bigint.sql", "ACCESS EXCLUSIVE")] == "reads and writes"
    assert blocks[("006_index.sql", "SHARE")] == "writes"
    assert blocks[("007_index_concurrently.sql", "SHARE UPDATE EXCLUSIVE")] == "ddl"


def rewritten(insight: MigrationInsight) -> dict[str, list[str]]:
    return {r.relation: r.reasons for r in insight.rewrites if r.kind == "table"}


def test_rewrites_are_measured_with_postgres_reasons(sql_runs: dict[str, MigrationRun]) -> None:
    volatile = insight_of(sql_runs, "001_volatile_default.sql")
    assert rewritten(volatile) == {ORDERS: ["volatile default"]}
    typed = insight_of(sql_runs, "002_type_bigint.sql")
    assert rewritten(typed) == {ORDERS: ["column type change"]}
    (rewrite,) = [r for r in typed.rewrites if r.relation == ORDERS]
    assert rewrite.bytes_before > 100 * 1024**2 and rewrite.bytes_after > 100 * 1024**2
    # The table's indexes are rebuilt with it.
    assert "public.orders_pkey" in {r.relation for r in typed.rewrites if r.kind == "index"}
    for file in ("004_constant_default.sql", "005_varchar_to_text.sql", "006_index.sql",
                 "007_index_concurrently.sql", "008_set_not_null.sql", "009_fk_not_valid.sql",
                 "010_validate.sql"):  # fmt: skip
        assert rewritten(insight_of(sql_runs, file)) == {}, file


def test_the_large_rewrite_is_reported_longer_than_the_same_on_a_small_table(
    sql_runs: dict[str, MigrationRun],
) -> None:
    large = insight_of(sql_runs, "002_type_bigint.sql")
    small = insight_of(sql_runs, "003_small_type_bigint.sql")
    (large_statement,) = large.statements
    (small_statement,) = small.statements
    assert large_statement.seconds is not None and small_statement.seconds is not None
    assert large_statement.seconds > small_statement.seconds
    held = {lock.relation: lock.held_seconds for lock in large.locks + small.locks}
    assert held[ORDERS] > held["public.orders_small"]


def scanned(insight: MigrationInsight) -> dict[str, str]:
    return {s.relation: s.under for s in insight.scans}


def test_scans_under_a_lock_that_blocks_writes_are_flagged(
    sql_runs: dict[str, MigrationRun],
) -> None:
    assert scanned(insight_of(sql_runs, "008_set_not_null.sql")) == {ORDERS: "ACCESS EXCLUSIVE"}
    assert scanned(insight_of(sql_runs, "006_index.sql")) == {ORDERS: "SHARE"}
    # NOT VALID skips the scan; VALIDATE scans under a lock that lets writes through.
    assert scanned(insight_of(sql_runs, "009_fk_not_valid.sql")) == {}
    assert scanned(insight_of(sql_runs, "010_validate.sql")) == {}


def test_volume_counts_the_rewrite(sql_runs: dict[str, MigrationRun]) -> None:
    typed = insight_of(sql_runs, "002_type_bigint.sql")
    (rewrite,) = [r for r in typed.rewrites if r.relation == ORDERS]
    assert typed.volume.wal_bytes > rewrite.bytes_after // 2
    assert typed.volume.layer_bytes > rewrite.bytes_after // 2
    cheap = insight_of(sql_runs, "004_constant_default.sql")
    assert cheap.volume.layer_bytes < rewrite.bytes_after // 10


def findings(insight: MigrationInsight, rule: str) -> list[str]:
    return [f.status for f in insight.findings if f.rule == rule]


def test_squawk_findings_are_checked_against_the_measurement(
    sql_runs: dict[str, MigrationRun],
) -> None:
    # squawk warns of a rewrite for every type change; Postgres rewrites for int -> bigint but
    # not for varchar -> text.
    assert findings(insight_of(sql_runs, "002_type_bigint.sql"), "changing-column-type") == [
        "confirmed"
    ]
    assert findings(insight_of(sql_runs, "005_varchar_to_text.sql"), "changing-column-type") == [
        "not observed"
    ]
    index = insight_of(sql_runs, "006_index.sql")
    assert findings(index, "require-concurrent-index-creation") == ["confirmed"]


def test_verdicts_name_what_blocks_production(sql_runs: dict[str, MigrationRun]) -> None:
    index = insight_of(sql_runs, "006_index.sql").verdict
    assert index.kind == "blocks writes"  # "over" too when the build outlasts 5 s
    assert index.text.startswith("takes SHARE on `public.orders` (")
    assert "CREATE INDEX CONCURRENTLY" in index.text
    # NOT VALID holds its locks for an instant, but they block writes to both tables: in
    # production each waits in the lock queue. Always the same kind, never "over".
    fk = insight_of(sql_runs, "009_fk_not_valid.sql").verdict
    assert (fk.kind, fk.level) == ("blocks writes", "notice")
    assert fk.text.startswith("takes SHARE ROW EXCLUSIVE on `public.")
    assert fk.text.endswith("set lock_timeout (e.g. SET lock_timeout = '2s') and retry")
    typed = insight_of(sql_runs, "002_type_bigint.sql").verdict
    assert typed.kind == "rewrite" and typed.text.startswith("rewrites `public.orders` (")
    validate = insight_of(sql_runs, "010_validate.sql").verdict
    assert (validate.kind, validate.level) == ("safe online", "safe")


def test_alembic_as_a_migrate_command_gives_the_same_locks_and_rewrites(
    pool: Pool, shop: BaseVersion, tmp_path: Path
) -> None:
    engine, name = _engine_branch(pool, shop, "insight-alembic")
    project = tmp_path / "project"
    shutil.copytree(FIXTURES / "alembic", project)
    try:
        with _observer(engine, name, shop) as observer:
            run = migrations.run_command(
                migrations.RunOptions(
                    target=engine.connection(name), timeout=600, watcher=observer
                ),
                f"{sys.executable} -m alembic -c alembic.ini upgrade head",
                cwd=project,
            )
    finally:
        engine.destroy(name)
    assert run.status == "applied", run.error
    insight = run.insight
    assert insight is not None

    def statement(fragment: str) -> StatementInsight:
        (found,) = [s for s in insight.statements if fragment in s.text]
        return found

    def modes(fragment: str) -> set[str]:
        return {lock.mode for lock in statement(fragment).locks if lock.relation == ORDERS}

    def reasons(fragment: str) -> list[str]:
        return [r for w in statement(fragment).rewrites if w.relation == ORDERS for r in w.reasons]

    # Alembic runs its revisions in one transaction: a statement also runs under the locks the
    # ones before it took (listed with it), so each holds at least the mode Postgres documents.
    assert "ACCESS EXCLUSIVE" in modes("ADD COLUMN token")
    assert "ACCESS EXCLUSIVE" in modes("TYPE BIGINT")
    assert "SHARE" in modes("CREATE INDEX orders_created_at")
    # CONCURRENTLY runs outside the transaction, alone: exactly its own mode.
    assert strongest(modes("CREATE INDEX CONCURRENTLY")) == "SHARE UPDATE EXCLUSIVE"
    assert strongest(modes("SET NOT NULL")) == "ACCESS EXCLUSIVE"
    assert "SHARE ROW EXCLUSIVE" in modes("NOT VALID")
    assert "SHARE UPDATE EXCLUSIVE" in modes("VALIDATE CONSTRAINT")
    assert reasons("ADD COLUMN token") == ["volatile default"]
    assert reasons("TYPE BIGINT") == ["column type change"]
    (rewrite,) = [r for r in insight.rewrites if r.relation == ORDERS]
    assert sorted(rewrite.reasons) == ["column type change", "volatile default"]
    # The migration's worst lock is the first statement's ACCESS EXCLUSIVE, held to COMMIT.
    assert insight.locks[0].mode == "ACCESS EXCLUSIVE" and insight.locks[0].relation == ORDERS


def test_every_migration_was_fully_observed(sql_runs: dict[str, MigrationRun]) -> None:
    """The trace's own limits are the only notes: the instrumentation stayed, the log was read
    whole, every statement was matched, and no session outlived its migration."""
    for file in DOCUMENTED_LOCKS:
        insight = insight_of(sql_runs, file)
        # (the sampling note appears where a sampled lock counted)
        assert set(insight.notes) <= {"locks seen by sampling pg_locks are timed to 50 ms"}, (
            file,
            insight.notes,
        )
        assert [s.seconds is not None for s in insight.statements] == [True], file


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


def test_the_comment_on_these_measured_runs_fits_githubs_width(
    sql_runs: dict[str, MigrationRun], browser: webdriver.Chrome, tmp_path: Path
) -> None:
    """The comment a reviewer gets for these ten migrations, as measured (a type change and a
    volatile default rewriting `orders`, each index, constraint and default), laid out at
    GitHub's comment width (tests/test_comment_layout.py)."""
    body = render_comment(report(migrations=[sql_runs[f] for f in sorted(sql_runs)]))
    over = sum(1 for r in sql_runs.values() if r.insight and r.insight.verdict.level == "over")
    lead = f"{over} migration{'' if over == 1 else 's'} over a threshold" if over else "applied"
    assert_fits(look(browser, body, tmp_path, "measured"), lead)
