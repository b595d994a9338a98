"""The evidence a migration's insight gives is the migration's own, and reaches what it locks: on
a real branch, through the real apply path (psql, the trace, the Observer, the probe).

- rows another client writes to a table while the migration runs are not the migration's;
- a migration's row locks away from the table's first row stop the probe's writes;
- a statement that names only an index or a materialized view is probed on what it locks;
- a migrate command's probe watches the tables the command locks, not the largest ones.

Each migration that blocks holds its locks for 2 s or more (``pg_sleep`` in its transaction),
so a probe four times a second sees it however loaded the machine; the assertions are on what
was blocked, never on how long a probe took.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from helpers import as_engine, extra_server, remove_base, source_dsn
from pgoverlay.action import migrations
from pgoverlay.action.insight import probe
from pgoverlay.action.insight.model import MigrationInsight, TableBlocking, Thresholds
from pgoverlay.action.insight.observe import Observer
from pgoverlay.action.report import MigrationRun
from pgoverlay.runner import branch as branches
from pgoverlay.runner import seed
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest

ROWS = 20_000
T = "public.t"
TV = "public.tv"


@pytest.fixture(scope="module")
def base(pool: Pool) -> Iterator[BaseVersion]:
    """A base whose `t` has 20,000 rows in id order, an index, a check not yet validated and a
    materialized view of it, beside a larger table no migration here touches (`decoy`)."""
    with extra_server(pool, "evidence-source", options={"wal_level": "replica"}) as srv:
        with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
            conn.execute("CREATE ROLE evidence_owner")
            conn.execute("CREATE DATABASE evidence OWNER evidence_owner")
        with psycopg.connect(
            **srv.conninfo(user="postgres", dbname="evidence"), autocommit=True
        ) as conn:
            conn.execute("SET ROLE evidence_owner")
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v int NOT NULL)")
            conn.execute("INSERT INTO t SELECT g, g FROM generate_series(1, %s) g", (ROWS,))
            conn.execute("CREATE INDEX t_v ON t (v)")
            conn.execute("ALTER TABLE t ADD CONSTRAINT t_v_positive CHECK (v > 0) NOT VALID")
            conn.execute("CREATE MATERIALIZED VIEW tv AS SELECT id, v FROM t WHERE id <= 1000")
            conn.execute("CREATE TABLE decoy (id bigint, pad text)")
            conn.execute(
                "INSERT INTO decoy SELECT g, repeat('x', 200) FROM generate_series(1, %s) g",
                (ROWS,),
            )
            conn.execute("VACUUM ANALYZE")
        found = seed.seed(pool, "evidence", source_dsn=source_dsn(srv, dbname="evidence"))
    yield found
    remove_base(pool, found)


@contextlib.contextmanager
def other_client(pool: Pool, base: BaseVersion, name: str, writes: str) -> Iterator[None]:
    """Another client of branch ``name`` (a session of another role, as a preview app's) runs
    ``writes`` again and again while the block runs; it must have written rows."""
    stop = threading.Event()
    written: list[int] = []
    other = as_engine(pool, branches.get(pool, name), base)

    def write() -> None:
        with other:
            while not stop.is_set():
                written.append(other.execute(writes).rowcount)
                stop.wait(0.05)  # a client's pace, not a timing assertion

    writer = threading.Thread(target=write, name="other-client", daemon=True)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join(30)
    assert sum(written) > 0, "the other client wrote nothing: the test proves nothing"


def apply(
    pool: Pool,
    base: BaseVersion,
    repo: Path,
    name: str,
    files: dict[str, str],
    *,
    writes: str | None = None,
) -> dict[str, MigrationRun]:
    """``files`` applied in order on a fresh branch, measured and probed: name -> its run.
    With ``writes``, another client runs that statement again and again from before the first
    migration to after the last (``other_client``)."""
    (repo / "db").mkdir(parents=True)
    for file, text in files.items():
        (repo / "db" / file).write_text(text)
    engine = LocalEngine(pool)
    engine.create(CreateRequest(name=name, base=base.name))
    try:
        with contextlib.ExitStack() as stack:
            if writes is not None:
                stack.enter_context(other_client(pool, base, name, writes))
            target = engine.connection(name)
            with Observer(
                engine, name, repository=None, thresholds=Thresholds(),
                pg_major=base.pg_major or 15, max_seconds=600,
                probing=probe.Options(target=target),
            ) as observer:  # fmt: skip
                runs = migrations.apply_files(
                    migrations.RunOptions(target=target, timeout=300, watcher=observer),
                    repo,
                    migrations.all_files(repo, "db"),
                    psql=pgbin.for_major(base.pg_major or 15).tool("psql"),
                    skip_recorded=True,
                )
            assert observer.problem == ""
    finally:
        engine.destroy(name)
    return {Path(r.name).name: r for r in runs}


def measured(runs: dict[str, MigrationRun], file: str) -> MigrationInsight:
    run = runs[file]
    assert run.status == "applied", run.error
    assert run.insight is not None
    return run.insight


def probed(runs: dict[str, MigrationRun], file: str, relation: str) -> TableBlocking:
    found = {b.relation: b for b in measured(runs, file).blocking}
    assert relation in found, (file, measured(runs, file).notes)
    return found[relation]


# -- rows another session writes meanwhile are not the migration's -------------------------

QUIET = {
    "001_index_concurrently.sql": "CREATE INDEX CONCURRENTLY t_v_again ON t (v);\n",
    "002_validate.sql": (
        "ALTER TABLE t VALIDATE CONSTRAINT t_v_positive;\nSELECT pg_sleep(1.5);\n"
    ),
    "003_update_five.sql": "UPDATE t SET v = v WHERE id BETWEEN 5001 AND 5005;\n",
}


@pytest.mark.slow
def test_rows_another_client_writes_meanwhile_are_not_counted_as_the_migrations(
    pool: Pool, base: BaseVersion, tmp_path: Path
) -> None:
    runs = apply(
        pool, base, tmp_path, "evidence-rows", QUIET,
        writes="UPDATE t SET v = v WHERE id BETWEEN 100 AND 161",
    )  # fmt: skip
    for file in ("001_index_concurrently.sql", "002_validate.sql"):
        found = measured(runs, file)
        assert found.row_writes == [], (file, found.row_writes)
        assert found.volume.rows_updated == 0, (file, found.volume)
        assert found.verdict.kind == "safe online", (file, found.verdict)
    update = measured(runs, "003_update_five.sql")
    assert [(w.relation, w.rows_updated) for w in update.row_writes] == [(T, 5)]
    assert update.verdict.text.startswith("updates 5 rows of `public.t`"), update.verdict


@pytest.mark.slow
def test_a_migrate_commands_rows_are_its_own_too(
    pool: Pool, base: BaseVersion, tmp_path: Path
) -> None:
    psql = pgbin.for_major(base.pg_major or 15).tool("psql")
    engine = LocalEngine(pool)
    engine.create(CreateRequest(name="evidence-command-rows", base=base.name))
    try:
        target = engine.connection("evidence-command-rows")
        writes = "UPDATE t SET v = v WHERE id BETWEEN 100 AND 161"
        with (
            other_client(pool, base, "evidence-command-rows", writes),
            Observer(
                engine, "evidence-command-rows", repository=None, thresholds=Thresholds(),
                pg_major=base.pg_major or 15, max_seconds=600,
            ) as observer,
        ):  # fmt: skip
            run = migrations.run_command(
                migrations.RunOptions(target=target, timeout=300, watcher=observer),
                f"{psql} -X -q -v ON_ERROR_STOP=1 "
                "-c 'CREATE INDEX CONCURRENTLY t_v_command ON t (v)' "
                "-c 'ALTER TABLE t VALIDATE CONSTRAINT t_v_positive' -c 'SELECT pg_sleep(1)'",
                cwd=tmp_path,
            )
    finally:
        engine.destroy("evidence-command-rows")
    assert run.status == "applied", run.error
    assert run.insight is not None
    assert run.insight.row_writes == [], run.insight.row_writes
    assert run.insight.verdict.kind == "safe online", run.insight.verdict


# -- row locks away from the table's first rows; indexes and materialized views ------------

REACH = {
    "001_delete_a_tenth.sql": "DELETE FROM t WHERE id % 10 = 0;\nSELECT pg_sleep(2);\n",
    "002_reindex.sql": "REINDEX INDEX t_v;\nSELECT pg_sleep(2);\n",
    "003_refresh.sql": "REFRESH MATERIALIZED VIEW tv;\nSELECT pg_sleep(2);\n",
    "004_drop_index.sql": "DROP INDEX t_v;\nSELECT pg_sleep(2);\n",
}


@pytest.fixture(scope="module")
def reach(
    pool: Pool, base: BaseVersion, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, MigrationRun]:
    return apply(pool, base, tmp_path_factory.mktemp("evidence-reach"), "evidence-reach", REACH)


@pytest.mark.slow
def test_row_locks_on_one_row_in_ten_stop_the_probes_writes(
    reach: dict[str, MigrationRun],
) -> None:
    b = probed(reach, "001_delete_a_tenth.sql", T)
    assert b.writes_blocked > 0.5 and b.writes_worst > 0.5, b
    assert b.reads > 0 and b.reads_blocked == 0, b


@pytest.mark.slow
def test_a_statement_naming_only_an_index_probes_its_table(
    reach: dict[str, MigrationRun],
) -> None:
    for file in ("002_reindex.sql", "004_drop_index.sql"):
        b = probed(reach, file, T)
        # ACCESS EXCLUSIVE on the index: a query on the table waits to plan, a write too
        assert b.reads_blocked > 0.5 and b.writes_blocked > 0.5, (file, b)


@pytest.mark.slow
def test_refreshing_a_materialized_view_probes_its_reads(reach: dict[str, MigrationRun]) -> None:
    b = probed(reach, "003_refresh.sql", TV)
    assert b.reads_blocked > 0.5 and b.reads_worst > 0.5, b
    assert b.writes == 0, b  # a materialized view's rows are never written by a client


# -- a migrate command's probe follows its locks ------------------------------------------


@pytest.mark.slow
def test_a_migrate_command_probes_the_tables_it_locks_not_the_largest(
    pool: Pool, base: BaseVersion, tmp_path: Path
) -> None:
    psql = pgbin.for_major(base.pg_major or 15).tool("psql")
    engine = LocalEngine(pool)
    engine.create(CreateRequest(name="evidence-command", base=base.name))
    try:
        target = engine.connection("evidence-command")
        with Observer(
            engine, "evidence-command", repository=None, thresholds=Thresholds(),
            pg_major=base.pg_major or 15, max_seconds=600, probing=probe.Options(target=target),
        ) as observer:  # fmt: skip
            run = migrations.run_command(
                migrations.RunOptions(target=target, timeout=300, watcher=observer),
                f"{psql} -X -q -v ON_ERROR_STOP=1 --single-transaction "
                "-c 'REINDEX INDEX t_v' -c 'REFRESH MATERIALIZED VIEW tv' "
                "-c 'SELECT pg_sleep(3)'",
                cwd=tmp_path,
            )
            quiet = migrations.run_command(
                migrations.RunOptions(target=target, timeout=300, watcher=observer),
                f"{psql} -X -q -v ON_ERROR_STOP=1 -c 'SELECT pg_sleep(1)'",
                cwd=tmp_path,
            )
    finally:
        engine.destroy("evidence-command")
    # a command that locks no table is probed on none, and says so
    assert quiet.insight is not None and quiet.insight.blocking == []
    assert [n for n in quiet.insight.notes if "nothing was probed" in n], quiet.insight.notes
    assert run.status == "applied", run.error
    assert run.insight is not None
    found = {b.relation: b for b in run.insight.blocking}
    # `decoy`, the largest table, is not locked and not probed; `t` through its index is
    assert set(found) == {T, TV}, (found, run.insight.notes)
    assert found[T].reads_blocked > 0.5 and found[T].writes_blocked > 0.5, found[T]
    assert found[TV].reads_blocked > 0.5, found[TV]
