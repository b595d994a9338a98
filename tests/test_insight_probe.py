"""Blocking measured on live traffic: while each migration runs, probe queries on the tables it
names say how long reads and writes were really kept waiting (``action/insight/probe.py``), and
the queue simulation how long reads queue behind it while a long transaction runs.

The pure parts (which tables, what the samples say, the comment's words) are tested without a
server; the rest on a real branch through the real apply path (psql, the trace, the Observer).
Each migration holds its lock for 2 s (``pg_sleep`` in its own transaction), so a probe four
times a second sees it however loaded the machine; the assertions are on what was blocked
(reads or writes) and on bounds that hold under load, never on how long a probe took.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from helpers import extra_server, remove_base, source_dsn
from pgoverlay.action import cells, migrations
from pgoverlay.action.event import Event
from pgoverlay.action.insight import blocking, jsonreport, probe
from pgoverlay.action.insight.blocking import Sample, Table
from pgoverlay.action.insight.model import MigrationInsight, TableBlocking, Thresholds, Verdict
from pgoverlay.action.insight.model import Volume as VolumeModel
from pgoverlay.action.insight.observe import Observer
from pgoverlay.action.report import MigrationRun
from pgoverlay.action.request import PrRequest
from pgoverlay.action.workflow import _Migrations
from pgoverlay.errors import RequestError
from pgoverlay.runner import seed
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest
from pgoverlay.runner.settings import Settings
from pgoverlay.webhook.settings import RepoSettings

ROWS = 200_000
T = "public.t"

# -- which tables ---------------------------------------------------------------------------


def table(schema: str, name: str, pages: int = 1, *, oid: int = 0) -> Table:
    return Table(oid or hash((schema, name)) & 0xFFFF, schema, name, pages, True, True)


TABLES = [
    table("public", "orders", 900),
    table("public", "Mixed Case", 5),
    table("audit", "orders", 50),
    table("public", "lines", 300),
    table("public", "tiny", 1),
    table("pgoverlay_ledger", "migrations", 1),
]


def test_names_are_folded_as_postgres_folds_them_and_strings_and_comments_are_not_names() -> None:
    text = """
        -- ALTER TABLE commented_out
        ALTER TABLE Public.ORDERS ADD COLUMN note text DEFAULT 'lines';
        UPDATE "Mixed Case" SET x = 1; /* tiny */
    """
    names = blocking.names_in(text)
    assert ("public", "orders") in names
    assert (None, "Mixed Case") in names
    assert (None, "commented_out") not in names
    assert (None, "lines") not in names and (None, "tiny") not in names


def test_a_file_probes_the_existing_tables_it_names_through_the_search_path() -> None:
    text = 'ALTER TABLE orders ADD COLUMN a int; UPDATE "Mixed Case" SET a = 1; DROP TABLE gone;'
    chosen = blocking.choose(TABLES, text=text, search_path=["public"], limit=5)
    assert [t.relation for t in chosen] == ["public.orders", "public.Mixed Case"]
    # a schema-qualified name reaches a schema off the path; the path's order decides the rest
    chosen = blocking.choose(
        TABLES, text="ALTER TABLE audit.orders ADD a int", search_path=["public"], limit=5
    )
    assert [t.relation for t in chosen] == ["audit.orders"]
    chosen = blocking.choose(
        TABLES, text="ALTER TABLE orders", search_path=["audit", "public"], limit=5
    )
    assert [t.relation for t in chosen] == ["audit.orders"]


def test_a_file_that_sets_the_search_path_probes_a_name_in_every_schema() -> None:
    text = "SET search_path = audit; ALTER TABLE orders ADD a int;"
    chosen = blocking.choose(TABLES, text=text, search_path=["public"], limit=5)
    assert {t.relation for t in chosen} == {"public.orders", "audit.orders"}


def test_a_migrate_commands_locked_tables_are_probed_largest_first_but_never_pgoverlays_own() -> (
    None
):
    chosen = blocking.choose(TABLES, text=None, search_path=["public"], limit=3)
    assert [t.relation for t in chosen] == ["public.orders", "public.lines", "audit.orders"]
    everything = blocking.choose(TABLES, text=None, search_path=["public"], limit=100)
    assert "pgoverlay_ledger.migrations" not in {t.relation for t in everything}
    # nor a migration tool's own tables, however large: they are its bookkeeping
    ledgers = [table("public", "django_migrations", 5000), table("app", "alembic_version", 9000)]
    chosen = blocking.choose([*TABLES, *ledgers], text=None, search_path=["public"], limit=3)
    assert [t.relation for t in chosen] == ["public.orders", "public.lines", "audit.orders"]
    # a SQL file that names one probes it: it is the user's table there
    named = blocking.choose(
        ledgers, text="UPDATE django_migrations SET x = 1", search_path=["public"], limit=5
    )
    assert [t.relation for t in named] == ["public.django_migrations"]


def test_a_file_that_names_only_an_index_probes_its_table() -> None:
    orders = TABLES[0]
    indexes = [("orders_pkey", orders.oid), ("gone_idx", 1)]
    for text in ("DROP INDEX orders_pkey", "REINDEX INDEX CONCURRENTLY public.orders_pkey"):
        chosen = blocking.choose(
            TABLES, text=text, search_path=["public"], limit=5, indexes=indexes
        )
        assert [t.relation for t in chosen] == ["public.orders"], text
    chosen = blocking.choose(
        TABLES, text="DROP INDEX audit.orders_pkey", search_path=["public"], limit=5,
        indexes=indexes,
    )  # fmt: skip
    assert chosen == []  # the index is public's: audit has none of that name


def test_a_write_probe_locks_rows_spread_over_the_table() -> None:
    assert probe.spread_pages(0) == list(range(probe.PAGES))
    assert probe.spread_pages(800) == [0, 100, 200, 300, 400, 500, 600, 700]
    # never past the table's first 1 GiB file, which the layer holds once a row of it is locked
    assert max(probe.spread_pages(10_000_000)) < 131072
    tids = [f"({page},{offset})" for page in (0, 100) for offset in range(1, 30)]
    kept = probe.probe_rows(tids)
    assert len(kept) == 2 * probe.ROWS_PER_PAGE
    assert kept[: probe.ROWS_PER_PAGE] == [f"(0,{o})" for o in range(1, probe.ROWS_PER_PAGE + 1)]


def test_the_probe_leaves_connections_free_for_the_migration() -> None:
    # a branch's default: 30 connections, 3 kept for superusers, a few in use
    assert blocking.tables_within(free=23, role_limit=-1, role_used=2, holder=False) == 6
    assert blocking.tables_within(free=23, role_limit=-1, role_used=2, holder=True) == 5
    # a role production limited to 16 connections, 2 of them in use: 14 - 10 - 1 = 3 sessions
    assert blocking.tables_within(free=23, role_limit=16, role_used=2, holder=False) == 1
    assert blocking.tables_within(free=8, role_limit=-1, role_used=2, holder=False) == 0


# -- what the samples say -------------------------------------------------------------------


def test_a_run_of_blocked_probes_is_one_wait_and_an_answered_probe_ends_it() -> None:
    reads = [
        Sample(0.0, 0.01, False),
        Sample(0.25, 0.65, True),  # timed out at its lock_timeout, asked again at once
        Sample(0.65, 1.05, True),
        Sample(1.05, 1.30, True),  # waited, then answered
        Sample(1.55, 1.56, False),
        Sample(1.80, 1.90, True),
    ]
    found = blocking.summarise(T, reads, [], window=None)
    assert found.reads_blocked == pytest.approx(0.4 + 0.4 + 0.25 + 0.1)
    assert found.reads_worst == pytest.approx(1.05)  # 0.25 to 1.30
    assert (found.writes_blocked, found.writes_worst, found.reads, found.writes) == (0, 0, 6, 0)
    assert found.reads_queued is None


def test_the_queue_is_the_longest_run_of_blocked_reads_during_the_long_transaction() -> None:
    reads = [
        Sample(0.0, 0.4, True),
        Sample(0.4, 0.5, False),
        Sample(1.0, 3.0, True),
        Sample(3.0, 3.2, False),
    ]
    assert blocking.summarise(T, reads, [], window=(0.8, 2.0)).reads_queued == pytest.approx(2.0)
    assert blocking.summarise(T, reads, [], window=(3.5, 4.0)).reads_queued == 0.0


def test_a_probe_is_blocked_when_it_timed_out_or_was_seen_waiting_on_a_lock() -> None:
    runs = [(0.0, 0.01, False), (0.25, 0.45, False), (0.5, 0.9, True), (1.0, 1.2, False)]
    samples = blocking.classify(runs, sightings=[0.3, 1.5])
    assert [s.blocked for s in samples] == [False, True, True, False]


def insight(*found: TableBlocking, long_transaction: float = 0.0) -> MigrationInsight:
    return MigrationInsight(
        seconds=1.0, locks=[], rewrites=[], scans=[], volume=VolumeModel(), statements=[],
        findings=[], verdict=Verdict("safe", "safe online"), interval=0.05,
        blocking=list(found), long_transaction=long_transaction,
    )  # fmt: skip


def test_the_comment_cell_names_the_table_whose_probes_waited_longest() -> None:
    found = insight(
        TableBlocking("public.a", reads_worst=0.2, reads_blocked=0.2, reads=4, writes=4),
        TableBlocking("public.b", writes_worst=2.34, writes_blocked=2.4, reads=9, writes=9),
    )
    assert cells.markdown(blocking.cell(found)) == "writes 2.3 s on `public.b`"
    assert (
        cells.markdown(blocking.cell(insight(TableBlocking("public.a", reads=3, writes=3))))
        == "none"
    )
    assert cells.markdown(blocking.cell(insight())) == "not probed"


def test_the_details_say_how_long_reads_queue_behind_the_migration() -> None:
    found = insight(
        TableBlocking("public.t", reads_blocked=30.4, reads_worst=30.4, reads=60, writes=0,
                      reads_queued=30.4),
        long_transaction=30.0,
    )  # fmt: skip
    assert blocking.lines(found) == [
        "`public.t`: reads waited 30.4 s in all, 30.4 s at most; writes never waited; 60 reads "
        "and no writes (the role may not update it) probed",
        "reads on `public.t` queue for 30.4 s behind this migration while a 30.0 s transaction "
        "runs",
    ]


def test_the_json_report_holds_each_tables_blocking_under_schema_version_2() -> None:
    from test_comment import report

    found = insight(
        TableBlocking("public.t", writes_blocked=2.2, writes_worst=2.2, reads=10, writes=8,
                      reads_queued=3.1),
        long_transaction=3.0,
    )  # fmt: skip
    doc = jsonreport.document(report(migrations=[MigrationRun("db/1.sql", "applied", 2.5,
                                                               insight=found)]))  # fmt: skip
    assert doc["schema_version"] == 2
    (run,) = doc["migrations"]
    assert run["insight"]["long_transaction"] == 3.0
    assert run["insight"]["blocking"] == [
        {"relation": "public.t", "reads_blocked": 0.0, "reads_worst": 0.0, "writes_blocked": 2.2,
         "writes_worst": 2.2, "reads": 10, "writes": 8, "reads_queued": 3.1}
    ]  # fmt: skip


def test_assume_long_transaction_reads_a_duration_and_is_off_when_empty() -> None:
    assert PrRequest().long_transaction() == 0.0
    assert PrRequest(assume_long_transaction="").long_transaction() == 0.0
    assert PrRequest(assume_long_transaction="30s").long_transaction() == 30.0
    assert PrRequest(assume_long_transaction="2m").long_transaction() == 120.0
    with pytest.raises(RequestError, match="longer than 3600 s"):
        PrRequest(assume_long_transaction="2h")
    with pytest.raises(RequestError, match="cannot read duration 'soon'"):
        PrRequest(assume_long_transaction="soon")
    repo = RepoSettings.model_validate({"assume_long_transaction": "45s"})
    assert repo.request().long_transaction() == 45.0


# -- on a real branch -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(pool: Pool) -> Iterator[BaseVersion]:
    """A base whose `t` has 200,000 rows, owned by an application role as in production."""
    with extra_server(pool, "probe-source", options={"wal_level": "replica"}) as srv:
        with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
            conn.execute("CREATE ROLE probe_owner")
            conn.execute("CREATE DATABASE probe OWNER probe_owner")
        with psycopg.connect(
            **srv.conninfo(user="postgres", dbname="probe"), autocommit=True
        ) as conn:
            conn.execute("SET ROLE probe_owner")
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v int NOT NULL)")
            conn.execute("INSERT INTO t SELECT g, g FROM generate_series(1, %s) g", (ROWS,))
            conn.execute("CREATE TABLE bystander (id int PRIMARY KEY)")
            conn.execute("VACUUM ANALYZE t")
        found = seed.seed(pool, "probe", source_dsn=source_dsn(srv, dbname="probe"))
    yield found
    remove_base(pool, found)


def apply(
    pool: Pool,
    base: BaseVersion,
    repo: Path,
    name: str,
    files: dict[str, str],
    *,
    long_transaction: float = 0.0,
) -> dict[str, MigrationRun]:
    """``files`` applied in order on a fresh branch, measured and probed: name -> its run."""
    (repo / "db").mkdir(parents=True)
    for file, text in files.items():
        (repo / "db" / file).write_text(text)
    engine = LocalEngine(pool)
    engine.create(CreateRequest(name=name, base=base.name))
    try:
        target = engine.connection(name)
        options = probe.Options(target=target, long_transaction=long_transaction)
        with Observer(
            engine, name, repository=None, thresholds=Thresholds(), pg_major=base.pg_major or 15,
            max_seconds=600, probing=options,
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


HELD = {
    "001_add_column.sql": "ALTER TABLE t ADD COLUMN a int;\nSELECT pg_sleep(2);\n",
    "002_update_every_row.sql": "UPDATE t SET v = v + 1;\nSELECT pg_sleep(2);\n",
    "003_index.sql": "CREATE INDEX t_v ON t (v);\nSELECT pg_sleep(2);\n",
    "004_index_concurrently.sql": "CREATE INDEX CONCURRENTLY t_v2 ON t (v);\nSELECT pg_sleep(2);\n",
    # 002 left no live row in t's first pages: the write probe finds one further on
    "005_update_again.sql": "UPDATE t SET v = v - 1;\nSELECT pg_sleep(2);\n",
}


@pytest.fixture(scope="module")
def held(
    pool: Pool, base: BaseVersion, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, MigrationRun]:
    return apply(pool, base, tmp_path_factory.mktemp("probe-held"), "probe-held", HELD)


def probed(runs: dict[str, MigrationRun], file: str) -> tuple[MigrationInsight, TableBlocking]:
    run = runs[file]
    assert run.status == "applied", run.error
    assert run.insight is not None
    assert [b.relation for b in run.insight.blocking] == [T], run.insight.notes
    return run.insight, run.insight.blocking[0]


@pytest.mark.slow
def test_an_access_exclusive_lock_blocks_the_probes_reads_and_writes(
    held: dict[str, MigrationRun],
) -> None:
    _, b = probed(held, "001_add_column.sql")
    assert b.reads_blocked > 0.5 and b.writes_blocked > 0.5, b
    assert b.reads_worst > 0.5 and b.writes_worst > 0.5, b


@pytest.mark.slow
def test_an_update_of_every_row_blocks_writes_by_its_row_locks_and_reads_not_at_all(
    held: dict[str, MigrationRun],
) -> None:
    for file in ("002_update_every_row.sql", "005_update_again.sql"):
        found, b = probed(held, file)
        assert b.writes_blocked > 0.5 and b.writes_worst > 0.5, (file, b)
        assert b.reads > 0 and b.reads_blocked == 0 and b.reads_worst == 0, (file, b)
        # the table lock it takes blocks no write: the row locks did
        assert {lock.blocks for lock in found.locks if lock.relation == T} <= {"ddl"}


@pytest.mark.slow
def test_a_plain_index_build_blocks_the_probes_writes_and_not_their_reads(
    held: dict[str, MigrationRun],
) -> None:
    _, b = probed(held, "003_index.sql")
    assert b.writes_blocked > 0.5, b
    assert b.reads > 0 and b.reads_blocked == 0, b


@pytest.mark.slow
def test_an_index_built_concurrently_blocks_neither(held: dict[str, MigrationRun]) -> None:
    _, b = probed(held, "004_index_concurrently.sql")
    assert b.reads > 0 and b.writes > 0, b
    assert b.reads_blocked == 0 and b.writes_blocked == 0, b


@pytest.mark.slow
def test_the_probes_sessions_are_not_the_migrations_statements_or_locks(
    held: dict[str, MigrationRun],
) -> None:
    for file, text in HELD.items():
        found, _ = probed(held, file)
        assert len(found.statements) == len(migrations.statements(text))
        assert all(s.seconds is not None for s in found.statements), file
        assert not [n for n in found.notes if "matched no statement" in n], found.notes
    index, _ = probed(held, "003_index.sql")
    # the write probes asked for ROW EXCLUSIVE (and waited for it); the migration did not
    assert {lock.mode for lock in index.locks if lock.relation == T} == {"SHARE"}
    concurrent, _ = probed(held, "004_index_concurrently.sql")
    assert "ROW EXCLUSIVE" not in {lock.mode for lock in concurrent.locks}
    assert not [s for s in concurrent.scans if s.relation == T and s.under != "SHARE"]


@pytest.mark.slow
def test_reads_queue_behind_an_instant_alter_while_a_long_transaction_runs(
    pool: Pool, base: BaseVersion, tmp_path: Path
) -> None:
    runs = apply(
        pool,
        base,
        tmp_path,
        "probe-queue",
        {
            "001_add_column.sql": "ALTER TABLE t ADD COLUMN q int;\n",
            "002_update_some.sql": "UPDATE t SET v = v WHERE id < 100;\n",
        },
        long_transaction=3.0,
    )
    alter, b = probed(runs, "001_add_column.sql")
    assert alter.long_transaction == 3.0
    # the ALTER waited for the transaction, and every read waited for the ALTER
    assert b.reads_queued is not None and b.reads_queued > 1.0, b
    assert b.reads_queued <= alter.seconds + 1.0, (b, alter.seconds)
    line = blocking.lines(alter)[1]
    assert line.startswith("reads on `public.t` queue for ") and line.endswith(
        "behind this migration while a 3.0 s transaction runs"
    )
    # a lock that does not conflict with the reader makes no queue
    _, quiet = probed(runs, "002_update_some.sql")
    assert quiet.reads_queued == 0.0 and quiet.reads_blocked == 0, quiet


def migrate(
    settings: Settings, engine: LocalEngine, name: str, repo: Path, folder: str, *, insight: bool
) -> list[MigrationRun]:
    event = Event(
        kind="sync", repository="acme/shop", pr=1, head_sha="0" * 40, base_sha=None, merged=None,
        from_fork=False, draft=False, ref_name="", action="synchronize",
    )  # fmt: skip
    inputs = PrRequest(migrations=folder, migrations_select="all", insight=insight)
    options = migrations.RunOptions(
        target=engine.connection(name), timeout=settings.command_timeout, request=inputs
    )
    runs, _, _ = _Migrations(
        options=options, settings=settings, major=15, event=event, repo_dir=repo,
        echo=lambda _: None, changed=None, fork_commands=False,
    ).apply(engine, name)  # fmt: skip
    return runs


@pytest.mark.slow
def test_with_insight_off_no_probe_starts(
    pool: Pool, base: BaseVersion, settings: Settings, tmp_path: Path
) -> None:
    count = (
        "UPDATE t SET v = v WHERE id = 1;\n"
        "CREATE TABLE {name} AS SELECT count(*) AS n FROM pg_catalog.pg_stat_activity\n"
        " WHERE application_name = 'pgoverlay-probe';\n"
    )
    for folder, name in (("off", "seen_off"), ("on", "seen_on")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "001_count.sql").write_text(count.format(name=name))
    engine = LocalEngine(pool)
    engine.create(CreateRequest(name="probe-off", base=base.name))
    try:
        (off,) = migrate(settings, engine, "probe-off", tmp_path, "off", insight=False)
        (on,) = migrate(settings, engine, "probe-off", tmp_path, "on", insight=True)
        assert off.status == on.status == "applied", (off.error, on.error)
        assert off.insight is None and on.insight is not None
        with psycopg.connect(**engine.connection("probe-off").connect_kwargs()) as conn:
            seen_off = conn.execute("SELECT n FROM seen_off").fetchone()
            seen_on = conn.execute("SELECT n FROM seen_on").fetchone()
    finally:
        engine.destroy("probe-off")
    assert seen_off == (0,)
    assert seen_on is not None and seen_on[0] >= 3  # the monitor and two probes of `t`


# -- what a migration can make the probe do --------------------------------------------------

HOSTILE = {
    # Row locks held, then a stronger lock asked for with a short lock_timeout: the write
    # probes wait on the row locks holding ROW EXCLUSIVE, never long enough to fail the ALTER.
    "001_update_then_alter.sql": (
        "UPDATE t SET v = v + 1;\n"
        "SELECT pg_sleep(1);\n"
        "SET LOCAL lock_timeout = '200ms';\n"
        "ALTER TABLE t ADD COLUMN z int;\n"
    ),
    "002_end_the_probes.sql": (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity\n"
        " WHERE application_name = 'pgoverlay-probe' AND pid <> pg_backend_pid();\n"
        "UPDATE t SET v = v WHERE id = 1;\n"
        "SELECT pg_sleep(1);\n"  # the probes ask again, and find their sessions gone
    ),
    # A row security policy that switches the probe's timeouts off on its first call and
    # sleeps on every later one: the monitor cancels the stalled probe queries.
    "003_stall_the_probes.sql": (
        "BEGIN;\n"
        "CREATE FUNCTION public.stall() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$\n"
        "BEGIN\n"
        "  IF pg_catalog.current_setting('stall.armed', true) IS NULL THEN\n"
        "    PERFORM pg_catalog.set_config('stall.armed', 'yes', false);\n"
        "    PERFORM pg_catalog.set_config('statement_timeout', '0', false);\n"
        "    PERFORM pg_catalog.set_config('lock_timeout', '0', false);\n"
        "    RETURN true;\n"
        "  END IF;\n"
        "  PERFORM pg_catalog.pg_sleep(600);\n"
        "  RETURN true;\n"
        "END $$;\n"
        "ALTER TABLE t ENABLE ROW LEVEL SECURITY;\n"
        "ALTER TABLE t FORCE ROW LEVEL SECURITY;\n"
        "CREATE POLICY stall ON t USING (public.stall());\n"
        "COMMIT;\n"
        "SELECT pg_sleep(4);\n"
    ),
}


@pytest.mark.slow
def test_a_migration_cannot_make_the_probe_fail_it_hang_or_leave_a_session(
    pool: Pool, base: BaseVersion, tmp_path: Path
) -> None:
    runs = apply(pool, base, tmp_path, "probe-hostile", HOSTILE)
    for file in HOSTILE:
        assert runs[file].status == "applied", (file, runs[file].error)
    probed(runs, "001_update_then_alter.sql")
    ended = runs["002_end_the_probes.sql"].insight
    assert ended is not None
    assert [n for n in ended.notes if "probe" in n and "stopped" in n], ended.notes
    stalled = runs["003_stall_the_probes.sql"].insight
    assert stalled is not None
    assert [n for n in stalled.notes if "outlived its statement_timeout" in n], stalled.notes
    assert not [n for n in stalled.notes if "did not end" in n], stalled.notes


@pytest.mark.slow
def test_a_migrate_command_probes_the_tables_it_locks_as_it_locks_them(
    pool: Pool, base: BaseVersion, tmp_path: Path
) -> None:
    psql = pgbin.for_major(base.pg_major or 15).tool("psql")
    engine = LocalEngine(pool)
    engine.create(CreateRequest(name="probe-command", base=base.name))
    try:
        target = engine.connection("probe-command")
        with Observer(
            engine, "probe-command", repository=None, thresholds=Thresholds(),
            pg_major=base.pg_major or 15, max_seconds=600, probing=probe.Options(target=target),
        ) as observer:  # fmt: skip
            run = migrations.run_command(
                migrations.RunOptions(target=target, timeout=300, watcher=observer),
                f"{psql} -X -q -v ON_ERROR_STOP=1 --single-transaction -c 'SELECT pg_sleep(1.5)' "
                "-c 'LOCK TABLE bystander IN SHARE MODE' -c 'SELECT pg_sleep(3)'",
                cwd=tmp_path,
            )
    finally:
        engine.destroy("probe-command")
    assert run.status == "applied", run.error
    assert run.insight is not None
    found = {b.relation: b for b in run.insight.blocking}
    # `t`, the largest, is not locked and not probed; `bystander` once the command locked it
    assert set(found) == {"public.bystander"}, run.insight.notes
    late = found["public.bystander"]
    assert late.writes_blocked > 0.5 and late.reads_blocked == 0, late
    assert not [
        s for s in run.insight.statements if "pgoverlay-probe" in s.text or "ctid" in s.text
    ]
