"""The PR's SQL tries to become a superuser through production's event triggers, kept in the
base: code the PR can reach (a row trigger on a table production's DDL audit writes to, an
event-trigger function the application role owns, a helper found through a function's own
``search_path``) would run inside the engine's superuser session if the engine ran DDL in the
branch after the PR's SQL. Each attack drives a whole trace as the Action does (begin, the PR's
SQL, a mark, end, and a second run on the same branch), on both runtimes, and checks that the
branch role is no superuser and that no program ran.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql

from helpers import (
    RUNTIMES,
    as_branch_role,
    as_engine,
    branch_of,
    cli,
    extra_server,
    remove_base,
    source_dsn,
)
from pgoverlay.errors import BranchStartError, TraceError
from pgoverlay.runner import branch, trace
from pgoverlay.runner.branch import lifecycle
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.runtime.choose import runtime_for
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import TraceRequest
from pgoverlay.runner.trace import instrument

pytestmark = pytest.mark.slow

# Production's DDL tooling, as the source's superuser made it in database shop.
PRODUCTION = (
    # (a) a DDL audit: superuser-owned, SECURITY INVOKER, every name qualified, writing to a
    # table the application role owns.
    "CREATE TABLE public.ddl_audit (tag text NOT NULL, at timestamptz NOT NULL DEFAULT now())",
    "ALTER TABLE public.ddl_audit OWNER TO app_owner",
    """CREATE FUNCTION public.audit_ddl() RETURNS event_trigger LANGUAGE plpgsql
       SET search_path = pg_catalog AS $$
       BEGIN INSERT INTO public.ddl_audit (tag) VALUES (TG_TAG); END $$""",
    "CREATE EVENT TRIGGER audit_ddl ON ddl_command_end EXECUTE FUNCTION public.audit_ddl()",
    # (b) a schema-change hook whose function the application role owns.
    """CREATE FUNCTION public.schema_hook() RETURNS event_trigger LANGUAGE plpgsql AS $$
       BEGIN NULL; END $$""",
    "ALTER FUNCTION public.schema_hook() OWNER TO app_owner",
    "CREATE EVENT TRIGGER schema_hook ON ddl_command_start EXECUTE FUNCTION public.schema_hook()",
    # (c) a drop watcher, fired even under session_replication_role = replica, whose
    # superuser-owned function pins Postgres's default search_path and calls a helper by name:
    # "$user" comes first, so a schema named like the engine's superuser is searched first.
    """CREATE FUNCTION public.note_drop(tag text) RETURNS void LANGUAGE sql AS $$
       SELECT NULL::void $$""",
    """CREATE FUNCTION public.watch_drops() RETURNS event_trigger LANGUAGE plpgsql
       SET search_path = "$user", public AS $$
       BEGIN PERFORM note_drop(TG_TAG); END $$""",
    "CREATE EVENT TRIGGER watch_drops ON sql_drop EXECUTE FUNCTION public.watch_drops()",
    "ALTER EVENT TRIGGER watch_drops ENABLE ALWAYS",
)

# What the PR's code does once it runs as a superuser: make the branch role one, and run a
# program on the runner (its file lands in the branch's data directory, the server's cwd).
ESCALATE = """
    IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
        EXECUTE pg_catalog.format('ALTER ROLE %I SUPERUSER', '{user}');
        EXECUTE 'COPY (SELECT 1) TO PROGRAM ''cat > {marker}''';
    END IF;
"""


@pytest.fixture(scope="module")
def events_base(pool: Pool, env: dict[str, str]) -> Iterator[tuple[BaseVersion, str]]:
    """A base of its own, seeded through the command from a source that carries production's
    event triggers; removed afterwards whether the module's tests pass or fail."""
    with extra_server(pool, "et-source", options={"wal_level": "replica"}) as srv:
        with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
            conn.execute("CREATE ROLE app_owner NOLOGIN")
            conn.execute("CREATE DATABASE shop OWNER app_owner")
        with psycopg.connect(
            **srv.conninfo(user="postgres", dbname="shop"), autocommit=True
        ) as conn:
            for statement in PRODUCTION:
                conn.execute(statement)
            conn.execute("SET ROLE app_owner")
            conn.execute("CREATE TABLE public.orders (id int PRIMARY KEY, note text)")
            conn.execute("INSERT INTO public.orders SELECT g, 'o' FROM generate_series(1, 50) g")
        try:
            done = cli(
                ["base", "seed", "events", "--from", source_dsn(srv, dbname="shop")], env=env
            )
            assert done.returncode == 0, done.stderr
            base = pool.registry.latest_base("events")
            assert base is not None
            yield base, done.stdout + done.stderr
        finally:
            made = pool.registry.latest_base("events")
            if made is not None:
                remove_base(pool, made)


@pytest.fixture(scope="module", params=RUNTIMES)
def runtime_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def target(pool: Pool, events_base: tuple[BaseVersion, str], runtime_name: str) -> Iterator[Branch]:
    """A fresh branch of the events base, as a pull request gets one."""
    base, _ = events_base
    name = f"et-{runtime_name}-{uuid.uuid4().hex[:6]}"
    with branch_of(pool, base, name=name, runtime=runtime_name) as made:
        try:
            yield made
        finally:
            trace.discard(pool, made.name)


@dataclass(frozen=True)
class Outcome:
    role_is_superuser: bool
    program_ran: bool
    instrumented: list[bool]


def _traced_runs(pool: Pool, b: Branch, base: BaseVersion, pr_sql: str, marker: str) -> Outcome:
    """Two runs of the Action's trace on branch ``b``: the PR's SQL in the first, plain DDL in
    the second (a re-run on the same branch); the trace opened and closed around each."""
    engine = LocalEngine(pool)
    instrumented = []
    for migration in (pr_sql, "CREATE TABLE public.second_run (id int)"):
        first = engine.trace_begin(b.name, TraceRequest())
        with as_branch_role(pool, b) as role:
            role.execute(migration)
        mark = engine.trace_mark(b.name)
        last = engine.trace_end(b.name)
        instrumented += [first.instrumented, mark.instrumented, last.instrumented]
    with as_engine(pool, b, base) as su:
        row = su.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (b.user,)).fetchone()
    upper = branch.layout(pool, b.name).upper
    return Outcome(
        role_is_superuser=row == (True,),
        program_ran=(upper / marker).exists(),
        instrumented=instrumented,
    )


def _marker() -> str:
    return f"pgoverlay-pwned-{uuid.uuid4().hex[:8]}"


def test_a_row_trigger_on_productions_ddl_audit_table_never_runs_as_the_engine(
    pool: Pool, events_base: tuple[BaseVersion, str], target: Branch
) -> None:
    base, _ = events_base
    marker = _marker()
    pr_sql = f"""
        CREATE FUNCTION public.on_audit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {ESCALATE.format(user=target.user, marker=marker)} RETURN NEW; END $$;
        CREATE TRIGGER on_audit AFTER INSERT ON public.ddl_audit
            FOR EACH ROW EXECUTE FUNCTION public.on_audit();
        ALTER TABLE public.ddl_audit ENABLE ALWAYS TRIGGER on_audit;
        CREATE INDEX orders_note ON public.orders (note);
    """
    outcome = _traced_runs(pool, target, base, pr_sql, marker)
    assert not outcome.role_is_superuser
    assert not outcome.program_ran
    assert all(outcome.instrumented)


def test_an_event_trigger_function_the_pr_replaces_never_runs_as_the_engine(
    pool: Pool, events_base: tuple[BaseVersion, str], target: Branch
) -> None:
    base, _ = events_base
    marker = _marker()
    pr_sql = f"""
        CREATE OR REPLACE FUNCTION public.schema_hook() RETURNS event_trigger
            LANGUAGE plpgsql AS $$
        BEGIN {ESCALATE.format(user=target.user, marker=marker)} END $$;
        ALTER TABLE public.orders ADD COLUMN shipped boolean;
    """
    outcome = _traced_runs(pool, target, base, pr_sql, marker)
    assert not outcome.role_is_superuser
    assert not outcome.program_ran
    assert all(outcome.instrumented)


def test_a_helper_found_through_an_enable_always_triggers_own_search_path_never_runs_as_the_engine(
    pool: Pool, events_base: tuple[BaseVersion, str], target: Branch
) -> None:
    base, _ = events_base
    marker = _marker()
    # A schema named like the engine's superuser leads "$user", public in its session.
    pr_sql = f"""
        CREATE SCHEMA {base.superuser};
        CREATE FUNCTION {base.superuser}.note_drop(tag text) RETURNS void
            LANGUAGE plpgsql AS $$
        BEGIN {ESCALATE.format(user=target.user, marker=marker)} END $$;
        GRANT USAGE ON SCHEMA {base.superuser} TO PUBLIC;
        DROP TABLE IF EXISTS public.nothing_here;
    """
    outcome = _traced_runs(pool, target, base, pr_sql, marker)
    assert not outcome.role_is_superuser
    assert not outcome.program_ran
    assert all(outcome.instrumented)


def test_the_seed_disables_and_lists_productions_event_triggers(
    pool: Pool, env: dict[str, str], events_base: tuple[BaseVersion, str]
) -> None:
    base, output = events_base
    expected = [
        "database shop: event trigger audit_ddl (ddl_command_end, public.audit_ddl()) disabled",
        "database shop: event trigger schema_hook (ddl_command_start, public.schema_hook()) "
        "disabled",
        "database shop: event trigger watch_drops (sql_drop, public.watch_drops()) disabled",
    ]
    for note in expected:
        assert f"neutralised in the base: {note}" in output, note
        assert note in base.neutralised_notes, note
    listed = json.loads(cli(["base", "list", "--json"], env=env).stdout)
    assert set(expected) <= set(next(b for b in listed if b["name"] == "events")["neutralised"])
    table = cli(["base", "list"], env={**env, "COLUMNS": "400"}).stdout
    assert f"events v{base.version} neutralised: {expected[0]}" in table


def _enabled_triggers(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    return [
        (str(name), str(state))
        for name, state in conn.execute(
            "SELECT evtname, evtenabled FROM pg_event_trigger ORDER BY 1"
        ).fetchall()
    ]


def test_the_trace_refuses_to_begin_beside_an_event_trigger_it_did_not_make(
    pool: Pool, events_base: tuple[BaseVersion, str], target: Branch
) -> None:
    base, _ = events_base
    with as_engine(pool, target, base) as su:  # as a base prepared before the lockdown did
        su.execute("ALTER EVENT TRIGGER audit_ddl ENABLE")
    engine = LocalEngine(pool)
    with pytest.raises(TraceError) as refused:
        engine.trace_begin(target.name, TraceRequest())
    message = str(refused.value)
    assert "audit_ddl" in message and "public.audit_ddl()" in message
    assert f"pgoverlay base seed {base.name} --refresh" in message
    with as_engine(pool, target, base) as su:
        states = dict(_enabled_triggers(su))
    # Nothing was switched on; production's trigger is as it was.
    assert states["audit_ddl"] == "O"
    assert {states[t] for t in instrument.TRIGGERS} == {"D"}


def test_a_restarted_branch_whose_login_role_is_gone_is_refused_not_remade_with_ddl(
    pool: Pool, events_base: tuple[BaseVersion, str]
) -> None:
    """After a reboot, PR code has run in the branch: its login role is given its password
    again (an ALTER ROLE), never made again with the ledger schema's DDL."""
    base, _ = events_base
    with branch_of(pool, base, name="et-restart", runtime="local") as b:
        with as_engine(pool, b, base) as su:
            su.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(b.user)))
            su.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(b.user)))
        lay = branch.layout(pool, b.name)
        rt = runtime_for(pool, base, b.runtime)
        rt.stop(lay)
        rt.detach(lay)
        with pytest.raises(BranchStartError, match=f"branch reset {b.name}"):
            lifecycle.restart(pool, b)
        with as_engine(pool, b, base) as su:
            made = su.execute(
                "SELECT (SELECT count(*) FROM pg_roles WHERE rolname = %s), "
                "(SELECT count(*) FROM pg_namespace WHERE nspname = 'pgoverlay_ledger')",
                (b.user,),
            ).fetchone()
        assert made == (0, 0)
