"""The engine's migration trace: event triggers, sampled lock spans, log entries and snapshots
of a real branch, seen as the branch's role would try to dodge or fake them."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import as_branch_role, as_engine, branch_of
from pgoverlay.errors import TraceError
from pgoverlay.runner import branch, trace
from pgoverlay.runner.branch import access
from pgoverlay.runner.branch.conf import LOG_OPTIONS
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.service import wire
from pgoverlay.runner.service.client import RemoteEngine
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import TraceRequest
from pgoverlay.runner.service.views import STAT_COUNTERS, LogEntry, RelationState, TraceMark
from pgoverlay.runner.trace import instrument, logfile
from pgoverlay.runner.trace.sampler import Spans

# -- pure: the log's entries and the lock spans ---------------------------------------------

LOG = (
    "2026-11-30 22:58:01.123 UTC [100] app@app LOG:  duration: 0.051 ms  statement: SELECT 1\n"
    "2026-11-30 22:58:01.200 UTC [7] LOG:  checkpoint starting: time\n"
    "2026-11-30 22:58:01.300 UTC [101] postgres@app LOG:  statement: ALTER ROLE x\n"
    '2026-11-30 22:58:02.000 UTC [100] app@app ERROR:  relation "t" does not exist at\n'
    "\tcharacter 15\n"
    "2026-11-30 22:58:02.000 UTC [100] app@app STATEMENT:  SELECT * FROM\n"
    "\tt\n"
)


def test_the_log_keeps_the_roles_entries_with_their_continuation_lines() -> None:
    entries = logfile.parse(LOG, user="app", database="app")
    assert [(e.pid, e.level) for e in entries] == [(100, "LOG"), (100, "ERROR"), (100, "STATEMENT")]
    assert entries[1].message == 'relation "t" does not exist at\ncharacter 15'
    assert entries[2].message == "SELECT * FROM\nt"
    assert entries[0].time == datetime(2026, 11, 30, 22, 58, 1, 123000, tzinfo=UTC).timestamp()


def _entry(pid: int, level: str, message: str) -> LogEntry:
    return LogEntry(time=0.0, pid=pid, level=level, message=message)


def test_a_trace_line_without_the_trace_functions_context_is_left_out() -> None:
    ours = f"PL/pgSQL function {instrument.SCHEMA}.trace_ddl() line 33 at RAISE"
    entries = [
        _entry(1, "LOG", 'pgoverlay-trace {"event": "ddl"}'),
        _entry(1, "CONTEXT", ours),
        _entry(2, "LOG", 'pgoverlay-trace {"event": "ddl", "forged": true}'),
        _entry(2, "CONTEXT", "PL/pgSQL function inline_code_block line 1 at RAISE"),
        _entry(3, "LOG", 'pgoverlay-trace {"forged": true}'),
        _entry(
            3,
            "CONTEXT",
            f"PL/pgSQL function {instrument.SCHEMA}.trace_ddl(integer) line 1 at RAISE",
        ),
    ]
    kept, forged = logfile.drop_forged(entries)
    assert kept == entries[:2] and forged == 2


def test_consecutive_sightings_of_a_lock_in_one_transaction_fold_into_one_span() -> None:
    spans = Spans()
    row = (10, 16500, "ShareLock", True, "3/7", 99.0, "LOCK TABLE t IN SHARE MODE")
    spans.add(100.0, [row])
    spans.add(100.05, [row, (11, 16500, "RowExclusiveLock", False, "4/2", 100.0, "INSERT")])
    spans.add(100.10, [row])
    spans.add(100.15, [(10, 16500, "ShareLock", True, "3/8", 100.12, "CREATE INDEX")])
    spans.add(100.20, [])
    taken = spans.take()
    assert [(s.pid, s.first, s.last, s.granted) for s in taken] == [
        (10, 100.0, 100.10, True),
        (11, 100.05, 100.05, False),
        (10, 100.15, 100.15, True),
    ]
    assert spans.take() == []


# -- a real branch ------------------------------------------------------------------------


@pytest.fixture
def traced(pool: Pool, base: BaseVersion) -> Iterator[Branch]:
    b = branch.create(pool, "trace-a", base_name=base.name, runtime="local")
    try:
        yield b
    finally:
        trace.discard(pool, b.name)
        branch.destroy(pool, b.name)


def _events(mark: TraceMark) -> list[dict[str, Any]]:
    prefix = instrument.PREFIX
    return [json.loads(e.message[len(prefix) :]) for e in mark.log if e.message.startswith(prefix)]


def _oid(conn: psycopg.Connection[Any], name: str) -> int:
    row = conn.execute("SELECT %s::regclass::oid", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def test_the_branch_runs_with_the_log_settings_the_trace_reads(
    pool: Pool, base: BaseVersion, runtime: str
) -> None:
    with branch_of(pool, base, name=f"trace-{runtime}", runtime=runtime) as b:
        with as_engine(pool, b, base) as conn:
            for setting, value in LOG_OPTIONS.items():
                row = conn.execute(
                    "SELECT setting, source FROM pg_settings WHERE name = %s", (setting,)
                ).fetchone()
                assert row == (value, "command line"), setting
        with as_branch_role(pool, b) as conn:
            conn.execute("SELECT 'seen in the log' WHERE false")
        logged = logfile.parse(
            branch.layout(pool, b.name).log_file.read_text(), user=b.user, database=b.database
        )
        assert logged == []  # not traced: the role's statements are not logged


def test_the_schema_diff_reads_a_branch_of_either_runtime_against_its_base(
    pool: Pool, base: BaseVersion, runtime: str
) -> None:
    with branch_of(pool, base, name=f"trace-schema-{runtime}", runtime=runtime) as b:
        assert pool.schema_file(base.name, base.version).is_file()
        engine = LocalEngine(pool)
        engine.trace_begin(b.name, TraceRequest())
        with as_branch_role(pool, b) as conn:
            conn.execute("ALTER TABLE accounts ADD COLUMN note text DEFAULT 'none'")
            conn.execute("CREATE INDEX accounts_note ON accounts (note)")
        diff = engine.trace_end(b.name).schema_diff
    assert diff is not None and diff.notes == []
    found = {(c.kind, c.name, c.change): c for c in diff.changes}
    assert set(found) == {
        ("column", "public.accounts.note", "added"),
        ("index", "public.accounts_note", "added"),
    }
    attributes = {
        a.name: a.after for a in found["column", "public.accounts.note", "added"].attributes
    }
    assert attributes == {"type": "text", "nullability": "null", "default": "'none'::text"}


def test_create_index_is_logged_with_its_share_lock_and_the_scan_it_made(
    pool: Pool, base: BaseVersion, traced: Branch
) -> None:
    engine = LocalEngine(pool)
    first = engine.trace_begin(traced.name, TraceRequest())
    assert first.instrumented and first.relations and first.log == []
    assert {r.name for r in first.relations} >= {"accounts", "accounts_owner", "accounts_pkey"}
    with as_branch_role(pool, traced) as conn:
        conn.execute("CREATE INDEX accounts_balance ON accounts (balance)")
        accounts = _oid(conn, "accounts")
        index = _oid(conn, "accounts_balance")
    mark = engine.trace_mark(traced.name)
    ddl = [e for e in _events(mark) if e["event"] == "ddl"]
    assert [e["tag"] for e in ddl] == ["CREATE INDEX"], mark.log
    assert {"rel": accounts, "mode": "ShareLock"} in ddl[0]["locks"]
    assert re.fullmatch(r"\d+/\d+", ddl[0]["vxid"])
    scans = {s["rel"]: s for s in ddl[0]["scans"]}
    # A parallel build's workers read part of the table: their counters are their own.
    assert scans[accounts]["seq_scan"] == 1 and 0 < scans[accounts]["seq_tup_read"] <= 200000
    assert index in {r.oid for r in mark.relations}
    assert any(e.level == "LOG" and "CREATE INDEX accounts_balance" in e.message for e in mark.log)
    engine.trace_end(traced.name)


def test_a_column_type_change_is_a_rewrite_with_its_reason_and_a_new_filenode(
    pool: Pool, base: BaseVersion, traced: Branch
) -> None:
    engine = LocalEngine(pool)
    first = engine.trace_begin(traced.name, TraceRequest())
    with as_branch_role(pool, traced) as conn:
        accounts = _oid(conn, "accounts")
        conn.execute("ALTER TABLE accounts ALTER COLUMN id TYPE bigint")
    mark = engine.trace_end(traced.name)
    rewrites = [e for e in _events(mark) if e["event"] == "rewrite"]
    # AT_REWRITE_COLUMN_REWRITE (0x04), Postgres's commands/event_trigger.h
    assert [(e["rel"], e["reason"]) for e in rewrites] == [(accounts, 4)]
    before = {r.oid: r for r in first.relations}[accounts]
    after = {r.oid: r for r in mark.relations}[accounts]
    assert after.filenode != before.filenode
    assert mark.wal_lsn > first.wal_lsn
    # the old index storage went with the rewrite, the rebuilt ones are new
    assert mark.dropped or any(
        r.oid not in {f.oid for f in first.relations} for r in mark.relations
    )


def test_a_held_lock_is_sampled_as_one_span_of_its_length(
    pool: Pool, base: BaseVersion, traced: Branch
) -> None:
    engine = LocalEngine(pool)
    engine.trace_begin(traced.name, TraceRequest(interval=0.05))
    with as_branch_role(pool, traced) as conn:
        accounts = _oid(conn, "accounts")
        started = time.monotonic()
        with conn.transaction():
            conn.execute("LOCK TABLE accounts IN SHARE MODE")
            conn.execute("SELECT pg_sleep(0.5)")
        took = time.monotonic() - started
        # The next transaction takes the same lock at once: a span of its own.
        conn.execute("CREATE INDEX accounts_next ON accounts (balance)")
    mark = engine.trace_end(traced.name)
    spans = [s for s in mark.locks if s.relation == accounts and s.mode == "ShareLock"]
    held = [s for s in spans if "CREATE INDEX" not in s.query]
    assert len(held) == 1, mark.locks
    length = held[0].last - held[0].first
    assert 0.3 <= length <= took + mark.interval
    assert held[0].granted and ("pg_sleep" in held[0].query or "LOCK" in held[0].query)


def _switched_on(conn: psycopg.Connection[Any], user: str) -> list[str]:
    """What of the trace is switched on in the branch: enabled event triggers (any), and the
    role's settings."""
    found = [
        f"event trigger {r[0]}"
        for r in conn.execute(
            "SELECT evtname FROM pg_event_trigger WHERE evtenabled <> 'D' ORDER BY 1"
        )
    ]
    found += [
        f"setting {r[0]}"
        for r in conn.execute(
            "SELECT unnest(setconfig) FROM pg_db_role_setting s JOIN pg_roles r "
            "ON r.oid = s.setrole WHERE r.rolname = %s",
            (user,),
        )
    ]
    return found


def _trace_objects(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """The trace's functions and event triggers, with their owners."""
    return [
        (str(kind), str(owner))
        for kind, owner in conn.execute(
            """SELECT 'function ' || p.proname, r.rolname FROM pg_proc p
                 JOIN pg_roles r ON r.oid = p.proowner
                 JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s
               UNION ALL
               SELECT 'event trigger ' || e.evtname, r.rolname FROM pg_event_trigger e
                 JOIN pg_roles r ON r.oid = e.evtowner WHERE e.evtname LIKE 'pgoverlay%%'
               ORDER BY 1""",
            (instrument.SCHEMA,),
        )
    ]


def test_the_trace_objects_are_the_bases_made_at_prepare_and_switched_off(
    pool: Pool, base: BaseVersion, traced: Branch
) -> None:
    with as_engine(pool, traced, base) as conn:
        assert _trace_objects(conn) == [
            ("event trigger pgoverlay_trace_ddl", base.superuser),
            ("event trigger pgoverlay_trace_rewrite", base.superuser),
            ("function statement_end", base.superuser),
            ("function trace_ddl", base.superuser),
            ("function trace_rewrite", base.superuser),
        ]
        assert _switched_on(conn, traced.user) == []
        # The statement procedure is what the branch's role may call, and all it may use.
        assert conn.execute(
            "SELECT has_function_privilege(%s, %s, 'EXECUTE'), "
            "has_schema_privilege(%s, %s, 'USAGE'), has_schema_privilege(%s, %s, 'CREATE')",
            (traced.user, f"{instrument.SCHEMA}.statement_end(text, integer)",
             traced.user, instrument.SCHEMA, traced.user, instrument.SCHEMA),
        ).fetchone() == (True, True, False)  # fmt: skip
        found = instrument.installed(conn, enabled=False)
        assert found is not None and found.statement_end is not None
        owner = conn.execute(
            "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = %s",
            (instrument.SCHEMA,),
        ).fetchone()
        assert owner == (base.superuser,)


def test_end_switches_the_triggers_off_and_resets_the_role_settings(
    pool: Pool, base: BaseVersion, traced: Branch
) -> None:
    engine = LocalEngine(pool)
    engine.trace_begin(traced.name, TraceRequest())
    with as_engine(pool, traced, base) as conn:
        before = _trace_objects(conn)
        assert _switched_on(conn, traced.user) == [
            "event trigger pgoverlay_trace_ddl",
            "event trigger pgoverlay_trace_rewrite",
            "setting log_min_duration_statement=0",
            "setting log_lock_waits=on",
        ]
    engine.trace_end(traced.name)
    with as_engine(pool, traced, base) as conn:
        assert _switched_on(conn, traced.user) == []
        assert _trace_objects(conn) == before  # switched off, never dropped
    with pytest.raises(TraceError, match="no open trace"):
        engine.trace_mark(traced.name)


# Fails any DDL that fires an event trigger, in whatever session runs it.
CANARY = """
CREATE SCHEMA canary;
CREATE FUNCTION canary.fired() RETURNS event_trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'an event trigger fired (%) in a session of %', TG_EVENT, current_user;
END $$;
CREATE EVENT TRIGGER canary_start ON ddl_command_start EXECUTE FUNCTION canary.fired();
CREATE EVENT TRIGGER canary_end ON ddl_command_end EXECUTE FUNCTION canary.fired();
CREATE EVENT TRIGGER canary_drop ON sql_drop EXECUTE FUNCTION canary.fired();
CREATE EVENT TRIGGER canary_rewrite ON table_rewrite EXECUTE FUNCTION canary.fired();
ALTER EVENT TRIGGER canary_start ENABLE ALWAYS;
ALTER EVENT TRIGGER canary_end ENABLE ALWAYS;
ALTER EVENT TRIGGER canary_drop ENABLE ALWAYS;
ALTER EVENT TRIGGER canary_rewrite ENABLE ALWAYS;
"""


def test_what_the_engine_runs_in_a_branch_fires_no_event_trigger(
    pool: Pool, base: BaseVersion, traced: Branch
) -> None:
    """Every statement the engine's superuser runs in a branch once PR code could have run:
    the trace's switches, its marks' reads, its lock samples, the schema diff's catalog reads
    and a password's ALTER ROLE, with event triggers that fail whatever fires them."""
    from pgoverlay.runner.postgres import roles
    from pgoverlay.runner.trace import sampler, schema, snapshot

    t = trace.target(pool, traced)
    with t.connect() as conn:
        conn.execute(CANARY)
        with pytest.raises(psycopg.errors.RaiseException, match="an event trigger fired"):
            conn.execute("CREATE TABLE public.canary_works (id int)")
        with conn.transaction():
            instrument.switch_on(conn, user=t.user, database=t.database)
        assert instrument.installed(conn) is not None
        taken = snapshot.take(conn)
        assert taken.relations
        snapshot.wait_for_exits(conn, user=t.user, since=taken.at)
        conn.execute(sampler.SAMPLE, {"user": t.user, "chars": 100}).fetchall()
        assert "public.canary_works" not in schema.take(conn).objects["table"]
        roles.set_password(
            conn,
            user=t.user,
            secret=roles.scram_verifier(traced.password),
            superuser=False,
            flush=False,
        )
        instrument.disable(conn, user=t.user, database=t.database)
        assert instrument.installed(conn, enabled=False) is not None
        assert instrument.installed(conn) is None


def test_a_base_without_the_trace_objects_is_refused_with_the_fix(
    pool: Pool, base: BaseVersion, traced: Branch
) -> None:
    with as_engine(pool, traced, base) as conn:  # as a base an older release prepared
        conn.execute(f"DROP SCHEMA {instrument.SCHEMA} CASCADE")
    with pytest.raises(TraceError) as refused:
        LocalEngine(pool).trace_begin(traced.name, TraceRequest())
    assert f"pgoverlay base seed {base.name} --refresh" in str(refused.value)
    with as_engine(pool, traced, base) as conn:  # nothing was made late, nor switched on
        assert _trace_objects(conn) == []
        assert _switched_on(conn, traced.user) == []


def test_the_role_cannot_replace_disable_or_silence_the_trace(
    pool: Pool, base: BaseVersion, traced: Branch
) -> None:
    engine = LocalEngine(pool)
    engine.trace_begin(traced.name, TraceRequest())
    db, schema = traced.database, instrument.SCHEMA
    attempts = [
        f"CREATE OR REPLACE FUNCTION {schema}.trace_ddl() RETURNS event_trigger "
        "LANGUAGE plpgsql AS 'BEGIN END'",
        f"CREATE FUNCTION {schema}.trace_ddl(int) RETURNS int LANGUAGE sql AS 'SELECT 1'",
        f"ALTER FUNCTION {schema}.trace_ddl() SECURITY DEFINER",
        f"DROP FUNCTION {schema}.trace_rewrite()",
        f"CREATE OR REPLACE PROCEDURE {schema}.statement_end(text, int) "
        "LANGUAGE plpgsql AS 'BEGIN END'",
        f"ALTER PROCEDURE {schema}.statement_end(text, int) SECURITY DEFINER",
        f"ALTER PROCEDURE {schema}.statement_end(text, int) SET search_path = public",
        f"DROP PROCEDURE {schema}.statement_end(text, int)",
        f"CREATE PROCEDURE {schema}.statement_end(text, bigint) LANGUAGE sql AS ''",
        f"DROP SCHEMA {schema} CASCADE",
        f"ALTER SCHEMA {schema} RENAME TO elsewhere",
        "ALTER EVENT TRIGGER pgoverlay_trace_ddl DISABLE",
        "DROP EVENT TRIGGER pgoverlay_trace_rewrite",
        "SET log_min_duration_statement = -1",
        "SET log_lock_waits = off",
        "SET session_replication_role = replica",
        f'ALTER ROLE CURRENT_USER IN DATABASE "{db}" RESET log_min_duration_statement',
        f'ALTER ROLE CURRENT_USER IN DATABASE "{db}" SET log_min_duration_statement = -1',
    ]
    with as_branch_role(pool, traced) as conn:
        for attempt in attempts:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(attempt)
        conn.execute(f'ALTER ROLE CURRENT_USER IN DATABASE "{db}" RESET ALL')
        conn.execute(
            "DO $$BEGIN RAISE LOG 'pgoverlay-trace %', "
            """'{"event":"ddl","tag":"DROP TABLE","locks":[],"scans":[]}'; END$$"""
        )
    with as_branch_role(pool, traced) as conn:
        assert conn.execute("SHOW log_min_duration_statement").fetchone() == ("0",)
        conn.execute("CREATE TABLE still_seen (id int)")
    mark = engine.trace_end(traced.name)
    assert mark.instrumented and mark.statement_marks
    assert [e["tag"] for e in _events(mark)] == ["CREATE TABLE"]
    assert any("left out" in n for n in mark.notes)


def test_dropping_the_ledger_schema_leaves_the_trace_in_place(
    pool: Pool, base: BaseVersion, traced: Branch
) -> None:
    engine = LocalEngine(pool)
    engine.trace_begin(traced.name, TraceRequest())
    with as_branch_role(pool, traced) as conn:
        conn.execute("DROP SCHEMA pgoverlay_ledger CASCADE")
        conn.execute("CREATE TABLE after_the_drop (id int)")
    mark = engine.trace_end(traced.name)
    assert mark.instrumented
    assert [e["tag"] for e in _events(mark)] == ["DROP SCHEMA", "CREATE TABLE"]


PLANT = """
CREATE FUNCTION {schema}.pg_backend_pid() RETURNS int LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.planted_ran VALUES (current_user); RETURN 1; END $$;
CREATE FUNCTION {schema}.pg_event_trigger_table_rewrite_oid() RETURNS oid LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.planted_ran VALUES (current_user); RETURN 1; END $$;
CREATE FUNCTION {schema}.jsonb_build_object(text, text, text, text, text, text, text,
    text, text, text) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.planted_ran VALUES (current_user); RETURN '{{}}'; END $$;
CREATE VIEW {schema}.pg_locks AS SELECT * FROM pg_catalog.pg_locks WHERE false;
"""


def test_ddl_with_the_triggers_runs_no_function_the_role_planted(
    pool: Pool, base: BaseVersion, traced: Branch
) -> None:
    engine = LocalEngine(pool)
    engine.trace_begin(traced.name, TraceRequest())
    with as_branch_role(pool, traced) as role:
        role.execute("CREATE TABLE public.planted_ran (who text)")
        role.execute("GRANT ALL ON public.planted_ran TO PUBLIC")
        role.execute(PLANT.format(schema="public"))
        role.execute("SET search_path = pg_temp, public, pg_catalog")
        role.execute(PLANT.format(schema="pg_temp"))
        role.execute("CREATE INDEX accounts_planted ON public.accounts (balance)")
        role.execute("ALTER TABLE public.accounts ALTER COLUMN id TYPE bigint")
        accounts = _oid(role, "public.accounts")
    with as_engine(pool, traced, base) as su:
        su.execute("SET search_path = public, pg_catalog")
        su.execute("CREATE TABLE su_made (id int)")
        su.execute("ALTER TABLE su_made ALTER COLUMN id TYPE bigint")
        assert su.execute("SELECT who FROM public.planted_ran").fetchall() == []
    mark = engine.trace_end(traced.name)
    events = _events(mark)
    index = next(e for e in events if e.get("tag") == "CREATE INDEX")
    assert {"rel": accounts, "mode": "ShareLock"} in index["locks"]
    assert [e["rel"] for e in events if e["event"] == "rewrite"] == [accounts]


def test_the_password_never_reaches_the_log(pool: Pool, base: BaseVersion, traced: Branch) -> None:
    engine = LocalEngine(pool)
    engine.trace_begin(traced.name, TraceRequest())
    with as_branch_role(pool, traced) as conn:
        conn.execute("SELECT 1")
    access.give_login(pool, base, traced, None)  # the engine sets the password while traced
    with as_branch_role(pool, traced) as conn:
        conn.execute("SELECT 2")
    log_file = branch.layout(pool, traced.name).log_file
    before_reset = log_file.read_text()
    assert "statement: SELECT 2" in before_reset  # the role's statements are logged
    engine.reset(traced.name)
    with pytest.raises(TraceError):
        engine.trace_mark(traced.name)
    for text in (before_reset, log_file.read_text()):
        assert traced.password not in text
        assert "SCRAM-SHA-256$" not in text


def test_the_trace_through_the_service_and_its_client(
    pool: Pool, base: BaseVersion, traced: Branch, service: Path
) -> None:
    remote = RemoteEngine(service)
    with pytest.raises(TraceError, match="no open trace"):
        remote.trace_mark(traced.name)
    first = remote.trace_begin(traced.name, TraceRequest(interval=0.02))
    assert first.interval == 0.02 and first.instrumented
    with as_branch_role(pool, traced) as conn:
        conn.execute("CREATE TABLE by_http (id int)")
    mark = remote.trace_mark(traced.name)
    assert [e["tag"] for e in _events(mark)] == ["CREATE TABLE"]
    assert "by_http" in {r.name for r in mark.relations}
    last = remote.trace_end(traced.name)
    assert last.instrumented
    assert last.schema_diff is not None  # the schema diff comes with the end, read back whole
    changed = [(c.kind, c.name, c.change) for c in last.schema_diff.changes]
    assert changed == [("table", "public.by_http", "added")]
    assert {a.name: a.after for a in last.schema_diff.changes[0].attributes}["columns"] == (
        "id integer"
    )
    with as_engine(pool, traced, base) as conn:
        assert _switched_on(conn, traced.user) == []


def test_the_trace_ends_itself_after_max_seconds(
    pool: Pool, base: BaseVersion, traced: Branch
) -> None:
    engine = LocalEngine(pool)
    engine.trace_begin(traced.name, TraceRequest(max_seconds=0.3))
    with as_engine(pool, traced, base) as conn:
        wait_for(
            lambda: _switched_on(conn, traced.user) == [],
            timeout=30,
            what="the trace to switch its instrumentation off",
        )
    mark = engine.trace_end(traced.name)
    assert not mark.instrumented
    assert any("max_seconds" in n for n in mark.notes)


def test_each_counter_a_snapshot_reads_is_a_relation_states_field_with_a_default() -> None:
    """A counter is named once (``views.STAT_COUNTERS``): the snapshot's SQL reads it into the
    field of its name, which an older engine does not send."""
    fields = wire.fields(RelationState)
    assert {counter: fields[counter] for counter in STAT_COUNTERS} == {
        counter: (int, True) for counter in STAT_COUNTERS
    }
