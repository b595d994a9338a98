"""Exact locks for every statement: migration files applied through the real apply path
(``migrations.apply_files`` with psql, an ``Observer`` tracing a real branch), where statement
marks read each statement's locks from pg_locks; statements no mark can follow get what
Postgres documents for them; a base without the statement procedure falls back, saying so.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import as_engine
from pgoverlay.action import migrations
from pgoverlay.action.insight import marks
from pgoverlay.action.insight.model import MigrationInsight, Thresholds
from pgoverlay.action.insight.observe import Observer
from pgoverlay.action.report import MigrationRun
from pgoverlay.runner import proc
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest

pytestmark = pytest.mark.slow

ROUNDS = 4  # each statement's locks must be exact in every round


@pytest.fixture
def engine(pool: Pool, base: BaseVersion) -> Iterator[LocalEngine]:
    made = LocalEngine(pool)
    made.create(CreateRequest(name="exact-a", base=base.name))
    try:
        yield made
    finally:
        made.destroy("exact-a")


def _observer(engine: LocalEngine, base: BaseVersion) -> Observer:
    return Observer(
        engine,
        "exact-a",
        repository=None,
        thresholds=Thresholds(),
        pg_major=base.pg_major or 15,
        max_seconds=600,
    )


def _apply(
    engine: LocalEngine, base: BaseVersion, repo: Path, files: dict[str, str]
) -> tuple[dict[str, MigrationRun], Observer]:
    """Write ``files`` under ``repo``/db and apply them all, traced."""
    for name, text in files.items():
        path = repo / "db" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    with _observer(engine, base) as observer:
        runs = migrations.apply_files(
            migrations.RunOptions(
                target=engine.connection("exact-a"), timeout=300, watcher=observer
            ),
            repo,
            [f"db/{name}" for name in files],
            psql=pgbin.for_major(base.pg_major or 15).tool("psql"),
            skip_recorded=True,
        )
    assert observer.problem == ""
    return {Path(r.name).name: r for r in runs}, observer


def _insight(runs: dict[str, MigrationRun], name: str) -> MigrationInsight:
    run = runs[name]
    assert run.status == "applied", run.error
    assert run.insight is not None
    return run.insight


def _locks(insight: MigrationInsight) -> set[tuple[str, str, str]]:
    return {(u.relation, u.mode, u.source) for u in insight.locks}


def _setup(r: int) -> str:
    return f"""
        CREATE TABLE t{r} (id int PRIMARY KEY, v int);
        INSERT INTO t{r} SELECT g, g FROM generate_series(1, 2000) g;
        CREATE INDEX t{r}_v ON t{r} (v);
    """


def test_statements_no_event_trigger_sees_are_exact_in_every_run(
    engine: LocalEngine, base: BaseVersion, tmp_path: Path
) -> None:
    files: dict[str, str] = {}
    for r in range(ROUNDS):
        files |= {
            f"{r}_0_setup.sql": _setup(r),
            f"{r}_1_lock.sql": f"LOCK TABLE t{r} IN SHARE ROW EXCLUSIVE MODE;\n",
            f"{r}_2_update.sql": f"UPDATE t{r} SET v = v + 1 WHERE id = 1;\n",
            f"{r}_3_cluster.sql": f"CLUSTER t{r} USING t{r}_pkey;\n",
            f"{r}_4_reindex.sql": f"REINDEX INDEX t{r}_v;\n",
            f"{r}_5_truncate.sql": f"SET lock_timeout = '2s';\nTRUNCATE t{r};\n",
        }
    runs, _ = _apply(engine, base, tmp_path, files)
    for r in range(ROUNDS):
        t = f"public.t{r}"
        expected = {
            f"{r}_1_lock.sql": (t, "SHARE ROW EXCLUSIVE"),
            f"{r}_2_update.sql": (t, "ROW EXCLUSIVE"),
            f"{r}_3_cluster.sql": (t, "ACCESS EXCLUSIVE"),
            f"{r}_4_reindex.sql": (f"public.t{r}_v", "ACCESS EXCLUSIVE"),
            f"{r}_5_truncate.sql": (t, "ACCESS EXCLUSIVE"),
        }
        for name, (relation, mode) in expected.items():
            insight = _insight(runs, name)
            assert (relation, mode, "exact") in _locks(insight), (name, insight.locks)
            statement = insight.statements[-1]
            assert (relation, mode) in {(u.relation, u.mode) for u in statement.locks}
            # Every lock of a marked statement is exact, and no note says one was missed.
            assert {u.source for u in insight.locks} == {"exact"}, (name, insight.locks)
            assert not any("missing" in n or "missed" in n for n in insight.notes), insight.notes
        reindex = _insight(runs, f"{r}_4_reindex.sql")
        assert (t, "SHARE", "exact") in _locks(reindex)
        truncate = _insight(runs, f"{r}_5_truncate.sql")
        # The SET is not marked (settings take no lock): TRUNCATE's mark reads it.
        assert [s.lock_timeout for s in truncate.statements] == [None, 2.0]
        assert [s.lock_timeout for s in _insight(runs, f"{r}_2_update.sql").statements] == [0.0]


def test_a_lock_taken_outside_a_transaction_block_is_read_before_it_ends(
    engine: LocalEngine, base: BaseVersion, tmp_path: Path
) -> None:
    """A file that cannot run in one transaction runs each statement in its own: the mark is
    in the statement's own query, so it still sees what the statement took."""
    runs, _ = _apply(
        engine,
        base,
        tmp_path,
        {
            "0_setup.sql": _setup(0),
            "1_autocommit.sql": """
                UPDATE t0 SET v = 0 WHERE id = 2;
                CREATE INDEX CONCURRENTLY t0_cc ON t0 (v);
                BEGIN;
                LOCK TABLE t0 IN EXCLUSIVE MODE;
                COMMIT;
            """,
        },
    )
    insight = _insight(runs, "1_autocommit.sql")
    by_statement = [{(u.mode, u.source) for u in s.locks} for s in insight.statements]
    assert ("ROW EXCLUSIVE", "exact") in by_statement[0]
    assert ("SHARE UPDATE EXCLUSIVE", "inferred") in by_statement[1]
    # LOCK TABLE is left unmarked outside --single-transaction (see below): its mode is certain.
    assert ("EXCLUSIVE", "inferred") in by_statement[3]
    # Its own transaction: held for the statement alone, not to the end of the file.
    lock = next(u for u in insight.statements[0].locks if u.mode == "ROW EXCLUSIVE")
    assert insight.statements[0].seconds is not None
    assert lock.held_seconds <= insight.statements[0].seconds + 0.002


def test_a_statement_that_needs_a_transaction_block_still_fails_outside_one(
    engine: LocalEngine, base: BaseVersion, tmp_path: Path
) -> None:
    """A mark must not make a file pass that fails on its own: LOCK TABLE outside a block."""
    runs, _ = _apply(
        engine,
        base,
        tmp_path,
        {
            "0_setup.sql": _setup(0),
            "1_lock.sql": "CREATE INDEX CONCURRENTLY t0_cc ON t0 (v);\nLOCK TABLE t0;\n",
        },
    )
    failed = runs["1_lock.sql"]
    assert failed.status == "failed"
    assert "LOCK TABLE can only be used in transaction blocks" in failed.error
    assert failed.line == 2


def test_set_transaction_after_another_setting_still_applies(
    engine: LocalEngine, base: BaseVersion, tmp_path: Path
) -> None:
    """SET TRANSACTION must come before any query of its transaction: a mark after the SET
    before it would be one."""
    runs, _ = _apply(
        engine,
        base,
        tmp_path,
        {
            "0_setup.sql": _setup(0),
            "1_serializable.sql": "SET search_path = public;\n"
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE;\n"
            "UPDATE t0 SET v = 3 WHERE id = 3;\n",
        },
    )
    insight = _insight(runs, "1_serializable.sql")
    assert ("public.t0", "ROW EXCLUSIVE", "exact") in _locks(insight)


def test_a_marked_file_prints_what_the_file_prints(
    engine: LocalEngine, base: BaseVersion, tmp_path: Path
) -> None:
    """The calls print nothing: psql's output of the marked file is the file's own."""
    text = (
        "CREATE TABLE o1 (id int PRIMARY KEY, v text);\n"
        "INSERT INTO o1 VALUES (1, 'a'), (2, 'b') RETURNING id;\n"
        "SELECT v FROM o1 ORDER BY id;\n"
        "\\echo between\n"
        "UPDATE o1 SET v = 'c' WHERE id = 1;\n"
        "DO $$ BEGIN RAISE NOTICE 'said'; END $$;\n"
        "SELECT count(*) AS n FROM o1;\n"
    )
    marked = marks.instrument(text, nonce=marks.new_nonce(), single_transaction=True)
    assert marked.marked == {0, 1, 2, 4, 5}  # the \\echo glues to the UPDATE: left unmarked
    (tmp_path / "f.sql").write_text(text)
    psql = pgbin.for_major(base.pg_major or 15).tool("psql")
    env = engine.connection("exact-a").libpq_env()
    argv: list[str | Path] = [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction"]
    plain = proc.run([*argv, "-f", "f.sql"], env=env, cwd=tmp_path, timeout=60)
    with engine_connection(engine) as conn:
        conn.execute("DROP TABLE o1")
    got = proc.run([*argv, "-f", "-"], env=env, cwd=tmp_path, timeout=60, input_text=marked.text)
    assert got.stdout == plain.stdout and "between" in plain.stdout and "(2 rows)" in plain.stdout
    assert got.stderr.replace("<stdin>", "f.sql") == plain.stderr
    assert "said" in plain.stderr


def test_error_lines_stay_the_files_own_with_the_marks(
    engine: LocalEngine, base: BaseVersion, tmp_path: Path
) -> None:
    runs, _ = _apply(
        engine,
        base,
        tmp_path,
        {
            "0_ok.sql": "CREATE TABLE e1 (a int);\n",
            "1_bad.sql": """
                -- a comment
                INSERT INTO e1 VALUES (1);

                INSERT INTO e1
                  SELECT a FROM
                    nope;
                INSERT INTO e1 VALUES (2);
            """,
        },
    )
    bad = runs["1_bad.sql"]
    assert bad.status == "failed"
    assert (bad.file, bad.line) == ("db/1_bad.sql", 6)
    assert 'relation "nope" does not exist' in bad.error
    assert "statement_end" not in bad.error


def test_a_mark_the_pull_request_forges_is_left_out(
    engine: LocalEngine, base: BaseVersion, tmp_path: Path
) -> None:
    forged_call = (
        "DO $$ BEGIN CALL pgoverlay_trace.statement_end("
        "'00112233445566778899aabbccddeeff', 3); END $$;"
    )
    forged_line = (
        "DO $$ BEGIN RAISE LOG 'pgoverlay-trace %', "
        """'{"event": "statement", "nonce": "x", "statement": 3, "vxid": "1/1", """
        """"locks": [], "scans": [], "at": 0, "lock_timeout_ms": 0}'; END $$;"""
    )
    runs, _ = _apply(
        engine,
        base,
        tmp_path,
        {
            "0_setup.sql": _setup(0),
            "1_forge.sql": f"{forged_call}\n{forged_line}\nSELECT 1;\nLOCK TABLE t0;\n",
        },
    )
    insight = _insight(runs, "1_forge.sql")
    assert ("public.t0", "ACCESS EXCLUSIVE", "exact") in _locks(insight)
    assert [(u.mode, u.source) for u in insight.statements[3].locks] == [
        ("ACCESS EXCLUSIVE", "exact")
    ]
    notes = " ".join(insight.notes)
    assert "1 statement mark not made by the engine for this migration" in notes
    assert "logged by the branch's role itself" in notes


def test_copy_from_stdin_and_an_included_file_still_apply(
    engine: LocalEngine, base: BaseVersion, tmp_path: Path
) -> None:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "extra.sql").write_text("INSERT INTO c1 VALUES (3, 'q;r');\n")
    copy = "UPDATE c1 SET b = 'w' WHERE a = 0;\nCOPY c1 FROM STDIN;\n1\tx;y\n2\tz\n\\.\n"
    runs, _ = _apply(
        engine,
        base,
        tmp_path,
        {
            "0_setup.sql": "CREATE TABLE c1 (a int, b text);\nINSERT INTO c1 VALUES (0, 'v');\n",
            "1_copy.sql": copy + "\\i inc/extra.sql\nSELECT 1;\n",
        },
    )
    insight = _insight(runs, "1_copy.sql")
    assert ("public.c1", "ROW EXCLUSIVE", "exact") in _locks(insight)
    with engine_connection(engine) as conn:
        rows = conn.execute("SELECT a, b FROM c1 ORDER BY a").fetchall()
    assert rows == [(0, "w"), (1, "x;y"), (2, "z"), (3, "q;r")]


def engine_connection(engine: LocalEngine) -> psycopg.Connection[Any]:
    """The branch's role, as the pull request's SQL runs."""
    return psycopg.connect(**engine.connection("exact-a").connect_kwargs(), autocommit=True)


def test_create_index_concurrently_is_held_for_its_whole_statement(
    engine: LocalEngine, base: BaseVersion, tmp_path: Path
) -> None:
    runs, _ = _apply(
        engine,
        base,
        tmp_path,
        {
            "0_big.sql": """
                CREATE TABLE big (id int, v int);
                INSERT INTO big SELECT g, g % 1000 FROM generate_series(1, 1500000) g;
            """,
            "1_cic.sql": "CREATE INDEX CONCURRENTLY big_v ON big (v);\n",
        },
    )
    insight = _insight(runs, "1_cic.sql")
    statement = insight.statements[0]
    assert statement.seconds is not None and statement.seconds > 0.2
    lock = next(u for u in insight.locks if u.mode == "SHARE UPDATE EXCLUSIVE")
    assert (lock.relation, lock.source) == ("public.big", "inferred")
    assert lock.held_seconds == pytest.approx(statement.seconds, abs=0.002)


def test_a_base_without_the_statement_procedure_falls_back_with_a_note(
    pool: Pool, engine: LocalEngine, base: BaseVersion, tmp_path: Path
) -> None:
    b = pool.registry.branch("exact-a")
    assert b is not None
    with as_engine(pool, b, base) as conn:
        conn.execute("DROP PROCEDURE pgoverlay_trace.statement_end(text, integer)")
    runs, _ = _apply(
        engine,
        base,
        tmp_path,
        {"0_setup.sql": _setup(0), "1_truncate.sql": "TRUNCATE t0;\n"},
    )
    insight = _insight(runs, "1_truncate.sql")
    assert any("prepared before statement marks existed" in n for n in insight.notes)
    # TRUNCATE's mode is certain from the statement: inferred, not missed.
    assert ("public.t0", "ACCESS EXCLUSIVE", "inferred") in _locks(insight)


def test_command_mode_infers_the_statements_no_event_trigger_sees(
    engine: LocalEngine, base: BaseVersion, tmp_path: Path
) -> None:
    runs, _ = _apply(engine, base, tmp_path, {"0_setup.sql": _setup(0)})
    psql = pgbin.for_major(base.pg_major or 15).tool("psql")
    statements = [
        "TRUNCATE t0",
        "BEGIN",
        "LOCK TABLE t0 IN SHARE MODE",
        "COMMIT",
        "CLUSTER t0 USING t0_pkey",
        "REINDEX TABLE t0",
        "VACUUM FULL t0",
        "CREATE INDEX CONCURRENTLY t0_cc ON t0 (v)",
        "DROP INDEX CONCURRENTLY t0_cc",
    ]
    command = f"{psql} -X -q -v ON_ERROR_STOP=1 " + " ".join(f"-c '{s}'" for s in statements)
    for _ in range(ROUNDS):
        with _observer(engine, base) as observer:
            run = migrations.run_command(
                migrations.RunOptions(
                    target=engine.connection("exact-a"), timeout=120, watcher=observer
                ),
                command,
                cwd=tmp_path,
            )
        assert run.status == "applied", run.error
        assert run.insight is not None
        # Per statement: the migration's list keeps the longest hold per relation and mode,
        # which may be another statement's (TRUNCATE takes SHARE on its table too, sampled).
        texts = [s.text for s in run.insight.statements]
        documented = {
            "TRUNCATE t0": {("public.t0", "ACCESS EXCLUSIVE")},
            "LOCK TABLE t0 IN SHARE MODE": {("public.t0", "SHARE")},
            "CLUSTER t0 USING t0_pkey": {("public.t0", "ACCESS EXCLUSIVE")},
            # REINDEX TABLE: SHARE on the table, each index under ACCESS EXCLUSIVE.
            "REINDEX TABLE t0": {
                ("public.t0", "SHARE"),
                ("public.t0_pkey", "ACCESS EXCLUSIVE"),
                ("public.t0_v", "ACCESS EXCLUSIVE"),
            },
            "VACUUM FULL t0": {("public.t0", "ACCESS EXCLUSIVE")},
        }
        for text, expected in documented.items():
            statement = run.insight.statements[texts.index(text)]
            got = {(u.relation, u.mode) for u in statement.locks if u.source == "inferred"}
            assert expected <= got, (text, statement.locks)
        # CONCURRENTLY: its lock for the whole statement, every internal transaction of it.
        cic = run.insight.statements[texts.index(statements[-2])]
        on_t0 = [u for u in cic.locks if u.relation == "public.t0"]
        assert len(on_t0) == 1, on_t0
        (held,) = on_t0
        assert (held.mode, held.source) == ("SHARE UPDATE EXCLUSIVE", "inferred")
        assert cic.seconds is not None
        assert held.held_seconds == pytest.approx(cic.seconds, abs=0.002)
        for s in statements:
            if s in ("BEGIN", "COMMIT"):
                continue
            at = texts.index(s)
            assert run.insight.statements[at].locks, s


def test_a_data_migration_of_one_long_insert_is_applied_and_measured(
    engine: LocalEngine, base: BaseVersion, tmp_path: Path
) -> None:
    """A seed-data file whose INSERT is more than 10,000 tokens long (sqlparse's grouping limit,
    which splitting and reading statements must not go through) applies, marked and measured."""
    values = ",\n".join(f"({n}, 'row {n}')" for n in range(1, 3001))
    runs, _ = _apply(
        engine,
        base,
        tmp_path,
        {
            "0_setup.sql": "CREATE TABLE seeded (id int PRIMARY KEY, label text);\n",
            "1_seed.sql": f"-- the seed data\nINSERT INTO seeded VALUES\n{values};\nSELECT 1;\n",
        },
    )
    insight = _insight(runs, "1_seed.sql")
    assert ("public.seeded", "ROW EXCLUSIVE", "exact") in _locks(insight)
    assert insight.volume.rows_inserted == 3000
    with engine_connection(engine) as conn:
        assert conn.execute("SELECT count(*) FROM seeded").fetchone() == (3000,)
