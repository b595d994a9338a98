"""The schema diff: what a pull request's migrations did to the schema, read from the branch's
catalogs against its base's, on real branches of a base with one object of every kind, applied
as the Action applies SQL files (``migrations.apply_files`` with the insight observer)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import as_branch_role, extra_server, remove_base, source_dsn
from pgoverlay.action import comment, migrations, record
from pgoverlay.action.insight import jsonreport, schemadiff
from pgoverlay.action.insight.model import Thresholds
from pgoverlay.action.insight.observe import Observer
from pgoverlay.action.report import Report
from pgoverlay.runner import seed
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest, TraceRequest
from pgoverlay.runner.trace import schema

# One object of every kind the diff covers, some to be changed, some dropped, some untouched.
BASE_SQL = """
CREATE SCHEMA sales;
CREATE SCHEMA archive;
CREATE SCHEMA handed;
CREATE EXTENSION citext;
CREATE EXTENSION hstore;
CREATE EXTENSION pg_trgm VERSION '1.5';
CREATE TYPE status AS ENUM ('new', 'paid');
CREATE TYPE mood AS ENUM ('ok');
CREATE SEQUENCE invoice_no START 1000;
CREATE SEQUENCE old_seq;
CREATE TABLE orders (
    id int PRIMARY KEY,
    amount integer NOT NULL,
    note text,
    status status DEFAULT 'new',
    code text
);
CREATE INDEX orders_note_idx ON orders (note);
CREATE INDEX orders_code_idx ON orders (code);
ALTER TABLE orders ADD CONSTRAINT orders_amount_positive CHECK (amount > 0);
CREATE TABLE customers (id int PRIMARY KEY, name text);
ALTER TABLE customers ADD CONSTRAINT customers_id_positive CHECK (id > 0) NOT VALID;
CREATE TABLE gone (id int, label text);
CREATE INDEX gone_label ON gone (label);
CREATE TABLE events (id int, at date) PARTITION BY RANGE (at);
CREATE TABLE untouched (id int PRIMARY KEY, name text NOT NULL DEFAULT 'x');
CREATE INDEX untouched_name ON untouched (name);
CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
CREATE FUNCTION total(i int) RETURNS int LANGUAGE sql AS 'SELECT i';
CREATE FUNCTION gone_fn() RETURNS int LANGUAGE sql AS 'SELECT 1';
CREATE FUNCTION untouched_fn() RETURNS int LANGUAGE sql AS 'SELECT 2';
CREATE TRIGGER orders_touch BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION touch();
CREATE TRIGGER customers_audit AFTER INSERT ON customers FOR EACH ROW EXECUTE FUNCTION touch();
CREATE VIEW paid_orders AS SELECT id FROM orders WHERE status = 'paid';
CREATE VIEW old_view AS SELECT 1 AS one;
CREATE VIEW untouched_view AS SELECT id FROM untouched;
CREATE MATERIALIZED VIEW order_count AS SELECT count(*) AS n FROM orders;
CREATE MATERIALIZED VIEW stale AS SELECT 1 AS n;
CREATE MATERIALIZED VIEW order_sums AS SELECT 1 AS n;
GRANT SELECT ON orders TO PUBLIC;
GRANT SELECT ON events TO PUBLIC;
"""

# The pull request: every kind added, dropped and changed.
MIGRATION_SQL = """
CREATE SCHEMA billing;
DROP SCHEMA archive;
ALTER SCHEMA handed OWNER TO CURRENT_USER;
CREATE EXTENSION pgcrypto;
DROP EXTENSION hstore;
ALTER EXTENSION pg_trgm UPDATE TO '1.6';
CREATE TYPE billing.kind AS ENUM ('card');
ALTER TYPE status ADD VALUE 'refunded';
DROP TYPE mood;
CREATE SEQUENCE billing.ticket;
ALTER SEQUENCE invoice_no INCREMENT BY 5;
DROP SEQUENCE old_seq;
CREATE TABLE billing.refunds (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id int REFERENCES orders (id),
    amount integer NOT NULL
);
DROP TABLE gone;
CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
ALTER TABLE customers SET UNLOGGED;
ALTER TABLE orders ALTER COLUMN amount TYPE bigint;
ALTER TABLE orders ALTER COLUMN note SET DEFAULT 'none';
ALTER TABLE orders ALTER COLUMN note SET NOT NULL;
ALTER TABLE orders ADD COLUMN doubled bigint GENERATED ALWAYS AS (amount * 2) STORED;
ALTER TABLE orders ADD COLUMN label text COLLATE "C";
ALTER TABLE orders DROP COLUMN code;
CREATE INDEX orders_amount_idx ON orders (amount);
DROP INDEX orders_note_idx;
CREATE UNIQUE INDEX orders_note_idx ON orders (note);
ALTER TABLE orders DROP CONSTRAINT orders_amount_positive;
ALTER TABLE orders ADD CONSTRAINT orders_amount_small CHECK (amount < 1000000) NOT VALID;
ALTER TABLE customers ADD CONSTRAINT customers_name_key UNIQUE (name);
ALTER TABLE customers VALIDATE CONSTRAINT customers_id_positive;
ALTER TABLE orders DISABLE TRIGGER orders_touch;
DROP TRIGGER customers_audit ON customers;
CREATE TRIGGER customers_touch BEFORE UPDATE ON customers FOR EACH ROW EXECUTE FUNCTION touch();
CREATE OR REPLACE VIEW paid_orders AS SELECT id FROM orders WHERE status = 'paid' AND id > 0;
DROP VIEW old_view;
CREATE VIEW billing.refund_ids AS SELECT id FROM billing.refunds;
CREATE MATERIALIZED VIEW billing.refund_count AS SELECT count(*) AS n FROM billing.refunds;
DROP MATERIALIZED VIEW stale;
DROP MATERIALIZED VIEW order_sums;
CREATE MATERIALIZED VIEW order_sums AS SELECT 2 AS n;
CREATE OR REPLACE FUNCTION total(i int) RETURNS int LANGUAGE sql AS 'SELECT i + 1';
DROP FUNCTION gone_fn();
CREATE PROCEDURE billing.settle() LANGUAGE sql AS 'SELECT 1';
GRANT INSERT ON orders TO PUBLIC;
GRANT SELECT ON customers TO PUBLIC;
REVOKE SELECT ON events FROM PUBLIC;
"""

# (kind, name, change) of every change MIGRATION_SQL makes, and nothing else.
EXPECTED = {
    ("schema", "billing", "added"),
    ("schema", "archive", "dropped"),
    ("schema", "handed", "changed"),
    ("extension", "pgcrypto", "added"),
    ("extension", "hstore", "dropped"),
    ("extension", "pg_trgm", "changed"),
    ("enum", "billing.kind", "added"),
    ("enum", "public.status", "changed"),
    ("enum", "public.mood", "dropped"),
    ("sequence", "billing.ticket", "added"),
    ("sequence", "public.invoice_no", "changed"),
    ("sequence", "public.old_seq", "dropped"),
    ("table", "billing.refunds", "added"),
    ("table", "public.gone", "dropped"),
    ("table", "public.events_2026", "added"),
    ("table", "public.customers", "changed"),
    ("column", "public.orders.amount", "changed"),
    ("column", "public.orders.note", "changed"),
    ("column", "public.orders.doubled", "added"),
    ("column", "public.orders.label", "added"),
    ("column", "public.orders.code", "dropped"),
    ("constraint", "public.orders.orders_amount_positive", "dropped"),
    ("constraint", "public.orders.orders_amount_small", "added"),
    ("constraint", "public.customers.customers_name_key", "added"),
    ("constraint", "public.customers.customers_id_positive", "changed"),
    ("index", "public.orders_amount_idx", "added"),
    ("index", "public.orders_note_idx", "changed"),
    ("index", "public.orders_code_idx", "dropped"),
    ("trigger", "public.orders.orders_touch", "changed"),
    ("trigger", "public.customers.customers_touch", "added"),
    ("trigger", "public.customers.customers_audit", "dropped"),
    ("grant", "public.orders to PUBLIC", "changed"),
    ("grant", "public.customers to PUBLIC", "added"),
    ("grant", "public.events to PUBLIC", "dropped"),
    ("view", "public.paid_orders", "changed"),
    ("view", "public.old_view", "dropped"),
    ("view", "billing.refund_ids", "added"),
    ("materialized view", "billing.refund_count", "added"),
    ("materialized view", "public.stale", "dropped"),
    ("materialized view", "public.order_sums", "changed"),
    # made again by the branch's role: its owner, and so the owner's privileges, changed
    ("grant", "public.order_sums to kinds_owner", "dropped"),
    ("grant", "public.order_sums to pgoverlay", "added"),
    ("function", "public.total(i integer)", "changed"),
    ("function", "public.gone_fn()", "dropped"),
    ("function", "billing.settle()", "added"),
}


@pytest.fixture(scope="module")
def kinds(pool: Pool) -> Iterator[BaseVersion]:
    """A base with one object of every kind the diff covers."""
    with extra_server(pool, "schemadiff-source") as srv:
        with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
            conn.execute("CREATE ROLE kinds_owner")
            conn.execute("CREATE DATABASE kinds OWNER kinds_owner")
        with psycopg.connect(
            **srv.conninfo(user="postgres", dbname="kinds"), autocommit=True
        ) as conn:
            conn.execute("SET ROLE kinds_owner")
            conn.execute(BASE_SQL)
        base = seed.seed(pool, "kinds", source_dsn=source_dsn(srv, dbname="kinds"))
    yield base
    remove_base(pool, base)


def _observer(engine: LocalEngine, name: str, base: BaseVersion) -> Observer:
    return Observer(
        engine,
        name,
        repository=None,
        thresholds=Thresholds(),
        pg_major=base.pg_major or 15,
        max_seconds=600,
    )


def _apply(
    engine: LocalEngine, name: str, base: BaseVersion, repo: Path, files: dict[str, str]
) -> schemadiff.SchemaDiff:
    """``files`` applied to branch ``name`` as the Action applies SQL files, measured; the
    schema diff the observer kept."""
    folder = repo / "db"
    folder.mkdir(exist_ok=True)
    for file, text in files.items():
        (folder / file).write_text(text)
    with _observer(engine, name, base) as observer:
        runs = migrations.apply_files(
            migrations.RunOptions(target=engine.connection(name), timeout=300, watcher=observer),
            repo,
            [f"db/{file}" for file in files],
            psql=pgbin.for_major(base.pg_major or 15).tool("psql"),
            skip_recorded=True,
        )
    assert observer.problem == ""
    # a file the branch's ledger has is skipped, as on a re-run
    assert {r.status for r in runs} <= {"applied", "skipped"}, [r.error for r in runs]
    assert observer.schema_diff is not None
    return observer.schema_diff


def _changes(diff: schemadiff.SchemaDiff) -> dict[tuple[str, str, str], schemadiff.SchemaChange]:
    return {(c.kind, c.name, c.change): c for c in diff.changes}


def _attributes(change: schemadiff.SchemaChange) -> dict[str, tuple[str, str]]:
    return {a.name: (a.before, a.after) for a in change.attributes}


@pytest.fixture(scope="module")
def migrated(
    pool: Pool, kinds: BaseVersion, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalEngine, str, schemadiff.SchemaDiff, Path]]:
    engine = LocalEngine(pool)
    engine.create(CreateRequest(name="schemadiff-a", base=kinds.name))
    repo = tmp_path_factory.mktemp("schemadiff-repo")
    try:
        diff = _apply(engine, "schemadiff-a", kinds, repo, {"001_every_kind.sql": MIGRATION_SQL})
        yield engine, "schemadiff-a", diff, repo
    finally:
        engine.destroy("schemadiff-a")


def test_every_kind_added_dropped_and_changed_is_reported_and_nothing_else(
    migrated: tuple[LocalEngine, str, schemadiff.SchemaDiff, Path],
) -> None:
    _, _, diff, _ = migrated
    assert diff.notes == [] and diff.left_out == 0 and diff.base_taken_at > 0
    assert set(_changes(diff)) == EXPECTED
    counted = {(n.kind, n.change): n.count for n in diff.counts}
    assert sum(counted.values()) == len(EXPECTED)


def test_unchanged_objects_are_not_reported(
    migrated: tuple[LocalEngine, str, schemadiff.SchemaDiff, Path],
) -> None:
    _, _, diff, _ = migrated
    names = " ".join(f"{c.name} {c.table}" for c in diff.changes)
    for untouched in ("untouched", "order_count", "public.orders.id", "sales", "citext"):
        assert untouched not in names
    assert not any(
        c.kind == "column" and c.name.startswith("public.orders.status") for c in diff.changes
    )
    # nothing of pgoverlay's own: its ledger (written by the apply) and trace schemas
    assert "pgoverlay_ledger" not in names and "pgoverlay_trace" not in names


def test_each_changed_attribute_says_what_it_was_and_what_it_is(
    migrated: tuple[LocalEngine, str, schemadiff.SchemaDiff, Path],
) -> None:
    _, _, diff, _ = migrated
    found = _changes(diff)
    assert _attributes(found["column", "public.orders.amount", "changed"]) == {
        "type": ("integer", "bigint")
    }
    assert _attributes(found["column", "public.orders.note", "changed"]) == {
        "nullability": ("null", "not null"),
        "default": ("", "'none'::text"),
    }
    doubled = _attributes(found["column", "public.orders.doubled", "added"])
    assert doubled["generated"] == ("", "(amount * 2)")
    assert _attributes(found["column", "public.orders.label", "added"])["collation"] == (
        "",
        'pg_catalog."C"',
    )
    assert _attributes(found["table", "public.customers", "changed"]) == {
        "persistence": ("", "unlogged")
    }
    assert _attributes(found["index", "public.orders_note_idx", "changed"])["unique"] == (
        "",
        "unique",
    )
    assert _attributes(found["constraint", "public.orders.orders_amount_small", "added"])[
        "validation"
    ] == ("", "not valid")
    assert _attributes(found["trigger", "public.orders.orders_touch", "changed"]) == {
        "enabled": ("enabled", "disabled")
    }
    assert _attributes(found["grant", "public.orders to PUBLIC", "changed"]) == {
        "privileges": ("SELECT", "INSERT, SELECT")
    }
    assert set(_attributes(found["function", "public.total(i integer)", "changed"])) == {"body"}
    assert _attributes(found["extension", "pg_trgm", "changed"]) == {"version": ("1.5", "1.6")}
    assert _attributes(found["constraint", "public.customers.customers_id_positive", "changed"])[
        "validation"
    ] == ("not valid", "validated")
    assert _attributes(found["materialized view", "public.order_sums", "changed"]) == {
        "owner": ("kinds_owner", "pgoverlay"),
        "definition": ("SELECT 1 AS n;", "SELECT 2 AS n;"),
    }
    assert _attributes(found["enum", "public.status", "changed"]) == {
        "labels": ("'new', 'paid'", "'new', 'paid', 'refunded'")
    }
    assert (
        "increment 5"
        in _attributes(found["sequence", "public.invoice_no", "changed"])["options"][1]
    )
    partition = _attributes(found["table", "public.events_2026", "added"])
    assert partition["partition of"][1].startswith("public.events FOR VALUES FROM ('2026-01-01')")


def test_a_table_added_or_dropped_whole_carries_its_parts(
    migrated: tuple[LocalEngine, str, schemadiff.SchemaDiff, Path],
) -> None:
    _, _, diff, _ = migrated
    found = _changes(diff)
    refunds = _attributes(found["table", "billing.refunds", "added"])
    assert refunds["columns"][1].startswith("id bigint not null, order_id integer, amount integer")
    assert "FOREIGN KEY (order_id) REFERENCES public.orders(id)" in refunds["constraints"][1]
    gone = _attributes(found["table", "public.gone", "dropped"])
    assert gone["columns"] == ("id integer, label text", "")
    assert "gone_label" in gone["indexes"][0]
    # not listed again one by one
    assert not any(c.table in ("billing.refunds", "public.gone") for c in diff.changes)


def test_a_rerun_diffs_the_branch_against_the_base_not_the_previous_run(
    pool: Pool,
    kinds: BaseVersion,
    migrated: tuple[LocalEngine, str, schemadiff.SchemaDiff, Path],
) -> None:
    engine, name, _, repo = migrated
    again = _apply(
        engine,
        name,
        kinds,
        repo,
        {"001_every_kind.sql": MIGRATION_SQL, "002_more.sql": "ALTER TABLE orders ADD extra int;"},
    )
    assert set(_changes(again)) == EXPECTED | {("column", "public.orders.extra", "added")}
    assert [r for r in again.changes if r.name == "public.orders.amount"][0].attributes[0] == (
        schemadiff.SchemaAttribute(name="type", before="integer", after="bigint")
    )
    # A new branch of the same base version has no changes: the base's side was read in a
    # fresh branch, never in one where the pull request's SQL had run.
    engine.create(CreateRequest(name="schemadiff-b", base=kinds.name))
    try:
        engine.trace_begin("schemadiff-b", TraceRequest())
        fresh = engine.trace_end("schemadiff-b").schema_diff
        assert fresh is not None and fresh.changes == [] and fresh.notes == []
    finally:
        engine.destroy("schemadiff-b")


def test_the_bases_schema_is_kept_once_per_version_as_roots_alone(
    pool: Pool, kinds: BaseVersion, migrated: tuple[LocalEngine, str, schemadiff.SchemaDiff, Path]
) -> None:
    path = pool.schema_file(kinds.name, kinds.version)
    st = os.stat(path)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    kept = schema.load_base(path)
    assert kept is not None and "public.gone" in kept.objects["table"]
    assert "billing" not in kept.objects["schema"]


def test_a_branch_without_the_bases_schema_says_how_to_get_it(
    pool: Pool, kinds: BaseVersion, migrated: tuple[LocalEngine, str, schemadiff.SchemaDiff, Path]
) -> None:
    engine, name, _, _ = migrated
    path = pool.schema_file(kinds.name, kinds.version)
    kept = path.read_bytes()
    path.unlink()
    try:
        engine.trace_begin(name, TraceRequest())
        found = engine.trace_end(name).schema_diff
    finally:
        path.write_bytes(kept)
        os.chmod(path, 0o600)
    assert found is not None and found.changes == [] and found.base_taken_at == 0
    assert f"pgoverlay branch reset {name}" in found.notes[0]


# Objects named like what the engine's reads call, in public and in a schema named like the
# superuser: were any of them called, it would log who called it in public.hijack_calls.
HIJACK_TABLE = """
CREATE TABLE public.hijack_calls (who text, what text);
GRANT INSERT ON public.hijack_calls TO PUBLIC;
"""
HIJACK_SQL = """
CREATE FUNCTION {schema}.record_call(what text) RETURNS boolean LANGUAGE sql
    AS $$ INSERT INTO public.hijack_calls VALUES (current_user, what) RETURNING true $$;
CREATE FUNCTION {schema}.format_type(oid, integer) RETURNS text LANGUAGE sql
    AS $$ SELECT CASE WHEN {schema}.record_call('format_type') THEN 'hijacked' END $$;
CREATE FUNCTION {schema}.quote_ident(name) RETURNS text LANGUAGE sql
    AS $$ SELECT CASE WHEN {schema}.record_call('quote_ident') THEN 'hijacked' END $$;
CREATE FUNCTION {schema}.pg_get_userbyid(oid) RETURNS name LANGUAGE sql
    AS $$ SELECT CASE WHEN {schema}.record_call('pg_get_userbyid') THEN 'hijacked'::name END $$;
CREATE FUNCTION {schema}.format(text, name, name) RETURNS text LANGUAGE sql
    AS $$ SELECT CASE WHEN {schema}.record_call('format') THEN 'hijacked' END $$;
CREATE FUNCTION {schema}.name_eq(name, text) RETURNS boolean LANGUAGE sql
    AS $$ SELECT {schema}.record_call('=') $$;
CREATE OPERATOR {schema}.= (LEFTARG = name, RIGHTARG = text, FUNCTION = {schema}.name_eq);
CREATE FUNCTION {schema}.text_match(name, text) RETURNS boolean LANGUAGE sql
    AS $$ SELECT {schema}.record_call('~') $$;
CREATE OPERATOR {schema}.~ (LEFTARG = name, RIGHTARG = text, FUNCTION = {schema}.text_match);
"""


def test_reading_the_catalogs_runs_nothing_the_pull_request_defined(
    pool: Pool, kinds: BaseVersion, tmp_path: Path
) -> None:
    engine = LocalEngine(pool)
    engine.create(CreateRequest(name="schemadiff-hijack", base=kinds.name))
    try:
        b = pool.registry.branch("schemadiff-hijack")
        assert b is not None
        with as_branch_role(pool, b) as conn:
            conn.execute(HIJACK_TABLE)
            conn.execute(f'CREATE SCHEMA "{kinds.superuser}"')
            for where in ("public", f'"{kinds.superuser}"'):
                conn.execute(HIJACK_SQL.replace("{schema}", where))
        diff = _apply(engine, "schemadiff-hijack", kinds, tmp_path, {"001.sql": MIGRATION_SQL})
        with as_branch_role(pool, b) as conn:
            calls = conn.execute("SELECT who, what FROM public.hijack_calls").fetchall()
        assert calls == []
        # what the role defined is in the diff, as the catalogs hold it
        found = _changes(diff)
        assert ("function", "public.format_type(oid, integer)", "added") in found
        assert ("schema", f'"{kinds.superuser}"'.strip('"'), "added") in found or (
            "schema",
            f'"{kinds.superuser}"',
            "added",
        ) in found
        assert _attributes(found["column", "public.orders.amount", "changed"]) == {
            "type": ("integer", "bigint")
        }
        assert "hijacked" not in json.dumps([dataclasses.asdict(c) for c in diff.changes])
    finally:
        engine.destroy("schemadiff-hijack")


# -- the report: JSON, the record and the comment (pure) ------------------------------------


def _report(diff: schemadiff.SchemaDiff) -> Report:
    return Report(
        repository="acme/shop",
        pr=7,
        branch_name="acme-shop-pr-7",
        head_sha="0123456789abcdef",
        status="ready",
        branch=None,
        schema_diff=diff,
    )


def _sample(n: int = 3, *, left_out: int = 0) -> schemadiff.SchemaDiff:
    changes = [
        schemadiff.SchemaChange(
            kind="column",
            name=f"public.orders.c{i}",
            change="changed",
            table="public.orders",
            attributes=[schemadiff.SchemaAttribute(name="type", before="integer", after="bigint")],
        )
        for i in range(n)
    ]
    return schemadiff.SchemaDiff(
        base_taken_at=1.0,
        changes=changes,
        counts=[schemadiff.SchemaCount(kind="column", change="changed", count=n + left_out)],
        left_out=left_out,
    )


def test_the_json_report_holds_the_schema_diff_in_full_as_schema_version_2() -> None:
    diff = _sample(2)
    document = json.loads(jsonreport.dumps(_report(diff)))
    assert document["schema_version"] == 2
    assert document["schema_diff"]["changes"][1] == {
        "kind": "column",
        "name": "public.orders.c1",
        "change": "changed",
        "table": "public.orders",
        "attributes": [{"name": "type", "before": "integer", "after": "bigint"}],
    }


def test_the_record_reads_the_schema_diff_back_and_a_tight_limit_keeps_its_counts() -> None:
    report = _report(_sample(400))
    kept = record.PrRecord(head_sha=report.head_sha, status="ready", report=report)
    assert record.loads(record.dumps(kept)) == kept
    small = record.loads(record.dumps(kept, limit=8_000))
    assert small.report.schema_diff is not None
    assert small.report.schema_diff.changes == []
    assert small.report.schema_diff.left_out == 400
    assert small.report.schema_diff.counts == report.schema_diff.counts  # type: ignore[union-attr]


def test_the_comment_shows_the_changes_collapsed_under_their_counts() -> None:
    diff = schemadiff.SchemaDiff(
        base_taken_at=1.0,
        changes=[
            schemadiff.SchemaChange(
                kind="table",
                name="billing.refunds",
                change="added",
                attributes=[schemadiff.SchemaAttribute(name="columns", after="id bigint")],
            ),
            schemadiff.SchemaChange(
                kind="column",
                name="public.orders.amount",
                change="changed",
                table="public.orders",
                attributes=[
                    schemadiff.SchemaAttribute(name="type", before="integer", after="bigint")
                ],
            ),
            schemadiff.SchemaChange(
                kind="index",
                name="public.orders_amount_idx",
                change="added",
                table="public.orders",
                attributes=[
                    schemadiff.SchemaAttribute(
                        name="definition",
                        after="CREATE INDEX orders_amount_idx ON public.orders "
                        "USING btree (amount)",
                    )
                ],
            ),
        ],
        counts=[
            schemadiff.SchemaCount(kind="table", change="added", count=1),
            schemadiff.SchemaCount(kind="column", change="changed", count=1),
            schemadiff.SchemaCount(kind="index", change="added", count=1),
        ],
    )
    body = comment.render_comment(_report(diff))
    assert (
        "<details><summary>Schema changes: 1 table added, 1 column changed, 1 index added"
        "</summary>" in body
    )
    assert "- + table `billing.refunds`: `id bigint`" in body
    assert "- ~ column `public.orders.amount`: type `integer` → `bigint`" in body
    assert "- + index `public.orders_amount_idx` on `public.orders`: `btree (amount)`" in body


def test_a_long_diff_is_cut_in_the_comment_with_a_pointer_and_whole_in_the_summary() -> None:
    diff = _sample(schemadiff.FEW + 20, left_out=5)
    body = comment.render_comment(_report(diff))
    assert body.count("- ~ column `public.orders.c") == schemadiff.FEW
    assert "… 25 more changes in the job summary" in body
    summary = comment.render_summary(_report(diff))
    assert summary.count("- ~ column `public.orders.c") == schemadiff.FEW + 20
    assert "… 5 more changes in the JSON report, output `report-path`" in summary


def test_a_schema_of_more_views_than_the_lock_table_holds_is_read_and_its_diff_capped(
    pool: Pool, kinds: BaseVersion
) -> None:
    """pg_get_viewdef locks each view until its transaction ends: 10,000 views read in one
    would not fit a branch's lock table (max_locks_per_transaction times its connections)."""
    engine = LocalEngine(pool)
    engine.create(CreateRequest(name="schemadiff-views", base=kinds.name))
    try:
        b = pool.registry.branch("schemadiff-views")
        assert b is not None
        with as_branch_role(pool, b) as conn:
            conn.execute(
                "DO $$ BEGIN FOR i IN 1..10000 LOOP "
                "EXECUTE pg_catalog.format('CREATE VIEW many_%s AS SELECT %s AS n', i, i); "
                "COMMIT; END LOOP; END $$"
            )
        engine.trace_begin(b.name, TraceRequest())
        diff = engine.trace_end(b.name).schema_diff
    finally:
        engine.destroy("schemadiff-views")
    assert diff is not None and diff.notes == []
    assert len(diff.changes) == schema.MAX_CHANGES and diff.left_out == 10000 - schema.MAX_CHANGES
    assert [(n.kind, n.change, n.count) for n in diff.counts] == [("view", "added", 10000)]
    first = {a.name: a.after for a in diff.changes[0].attributes}
    assert first["definition"] == "SELECT 1 AS n;"


def test_the_comment_block_stays_within_its_room_however_long_the_values() -> None:
    long = "x" * schema.MAX_VALUE
    changes = [
        schemadiff.SchemaChange(
            kind="function",
            name=f"public.f{i}(" + "integer, " * 40 + "integer)",
            change="changed",
            attributes=[
                schemadiff.SchemaAttribute(name=n, before=long, after=long + "y")
                for n in ("returns", "language", "properties", "settings", "owner", "kind")
            ],
        )
        for i in range(schemadiff.FEW)
    ]
    diff = schemadiff.SchemaDiff(
        base_taken_at=1.0,
        changes=changes,
        counts=[schemadiff.SchemaCount(kind="function", change="changed", count=len(changes))],
    )
    block = schemadiff.markdown(diff, full=False, see="the job summary")
    assert len(block) <= schemadiff.ROOM[False] + 500
    assert "more changes in the job summary" in block and "and 3 more" in block
    assert len(schemadiff.markdown(diff, full=True, see="x")) > len(block)


def test_a_schema_past_the_object_limit_is_not_compared_and_says_so(
    pool: Pool, kinds: BaseVersion
) -> None:
    from pgoverlay.runner import trace

    engine = LocalEngine(pool)
    engine.create(CreateRequest(name="schemadiff-limit", base=kinds.name))
    try:
        b = pool.registry.branch("schemadiff-limit")
        assert b is not None
        with trace.target(pool, b).connect() as conn:
            whole, cut = schema.take(conn), schema.take(conn, limit=3)
    finally:
        engine.destroy("schemadiff-limit")
    assert whole.notes == ()
    assert "more than 3 objects of kind column" in " ".join(cut.notes)
    kept = schema.loads(schema.dumps(cut))
    assert kept is not None and kept.notes == cut.notes
    diff = schema.diff(kept, whole)
    assert diff.changes == [] and diff.counts == [] and list(diff.notes) == list(cut.notes)


def test_the_bases_schema_is_read_before_anyone_can_log_in_to_the_branch(
    pool: Pool, kinds: BaseVersion, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reset branch keeps its password, which the pull request knows: were the base's
    schema read after it is set, the PR could race the read with its own DDL and change what
    every other branch of the base is compared with."""
    from pgoverlay.runner import branch

    engine = LocalEngine(pool)
    engine.create(CreateRequest(name="schemadiff-login", base=kinds.name))
    try:
        b = pool.registry.branch("schemadiff-login")
        assert b is not None
        tried: list[str] = []
        read = schema.keep_base

        def watched(path: Path, connect: Any) -> bool:
            try:
                with psycopg.connect(
                    **branch.connection(pool, b).connect_kwargs(), connect_timeout=10
                ):
                    tried.append("the branch's role logged in")
            except psycopg.OperationalError as err:
                tried.append(str(err))
            return read(path, connect)

        monkeypatch.setattr(schema, "keep_base", watched)
        engine.reset("schemadiff-login")
        assert len(tried) == 1 and "password authentication failed" in tried[0], tried
        with as_branch_role(pool, b) as conn:  # and afterwards it can
            conn.execute("SELECT 1")
    finally:
        engine.destroy("schemadiff-login")
