"""Migration insight's analysis: a trace's marks and log, built here, into exact insights;
squawk for real on small files; the lock conflict table and the rewrite reasons against a real
Postgres."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import extra_server
from pgoverlay.action import cells, details, migrations
from pgoverlay.action.insight import analyze as an
from pgoverlay.action.insight import ledgers, lint, locks, logparse, marks, rewrites, verdict
from pgoverlay.action.insight.model import (
    LockUse,
    MigrationInsight,
    Rewrite,
    RowWrites,
    Scan,
    StatementInsight,
    Thresholds,
    Verdict,
    Volume,
)
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.service.views import Layer, LockSpan, LogEntry, RelationState, TraceMark

T0 = 1_700_000_000.0
PID = 4242
ORDERS, ORDERS_IDX, ITEMS, LEDGER, NEW_IDX = 16384, 16390, 16400, 16500, 16600
MIB = 1024 * 1024
DEFAULTS = Thresholds()
QUEUE = (
    "it waits behind any running transaction on `public.orders`, and every {} waits behind it; "
    "set lock_timeout (e.g. SET lock_timeout = '2s') and retry"
)
READS = QUEUE.format("query on it")
WRITES = QUEUE.format("write to it")


def rel(oid: int, name: str, **kw: Any) -> RelationState:
    schema, _, bare = name.rpartition(".")
    fields: dict[str, Any] = {"kind": "r", "filenode": oid, "bytes": 0, **kw}
    return RelationState(oid=oid, schema_name=schema, name=bare, **fields)


BEFORE = {
    ORDERS: rel(ORDERS, "public.orders", bytes=412 * MIB, seq_scan=5, seq_tup_read=100),
    ORDERS_IDX: rel(ORDERS_IDX, "public.orders_pkey", kind="i", table_oid=ORDERS, bytes=MIB),
    ITEMS: rel(ITEMS, "public.items", bytes=8192, n_tup_ins=10),
    LEDGER: rel(LEDGER, "pgoverlay_ledger.migrations", n_tup_ins=3),
}


def mark(
    at: float,
    *,
    log: Sequence[LogEntry] = (),
    spans: Sequence[LockSpan] = (),
    relations: Sequence[RelationState] = (),
    **kw: Any,
) -> TraceMark:
    fields: dict[str, Any] = {
        "wal_lsn": 1000,
        "layer": Layer(logical_bytes=0, physical_bytes=4096),
        "interval": 0.05,
        "instrumented": True,
        **kw,
    }
    return TraceMark(at=at, relations=list(relations), locks=list(spans), log=list(log), **fields)


def done(end: float, ms: float, text: str, pid: int = PID) -> LogEntry:
    """A statement's duration line, written at its end."""
    return LogEntry(time=end, pid=pid, level="LOG", message=f"duration: {ms} ms  statement: {text}")


def ddl(at: float, tag: str, held: Sequence[tuple[int, str]], **kw: Any) -> LogEntry:
    event = {
        "event": "ddl",
        "tag": tag,
        "vxid": kw.get("vxid", "3/25"),
        "locks": [{"rel": r, "mode": m} for r, m in held],
        "scans": [_scan(*found) for found in kw.get("scans", [])],
    }
    message = "pgoverlay-trace " + json.dumps(event)
    return LogEntry(time=at, pid=kw.get("pid", PID), level="LOG", message=message)


def _scan(rel: int, scans: int, rows: int, *written: int) -> dict[str, int]:
    """One relation's counters in a trace line: scans, and, when given, rows written."""
    found = {"rel": rel, "seq_scan": scans, "seq_tup_read": rows}
    found.update(zip(("ins", "upd", "del"), written, strict=False))
    return found


def rewrite_event(at: float, oid: int, reason: int) -> LogEntry:
    payload = json.dumps({"event": "rewrite", "rel": oid, "reason": reason, "vxid": "3/25"})
    return LogEntry(time=at, pid=PID, level="LOG", message="pgoverlay-trace " + payload)


def run(
    log: Sequence[LogEntry],
    *,
    sql: str | None = None,
    after_relations: dict[int, RelationState] | None = None,
    spans: Sequence[LockSpan] = (),
    raws: Sequence[lint.Raw] = (),
    ignore: Sequence[int] = (),
    thresholds: Thresholds = DEFAULTS,
    marked: marks.Marked | None = None,
    **after_kw: Any,
) -> MigrationInsight:
    """Analyse one migration whose after mark holds ``log`` and ``spans``."""
    after_rel = dict(BEFORE) if after_relations is None else after_relations
    return an.analyze(
        before=mark(T0),
        after=mark(T0 + 60, log=log, spans=spans, **after_kw),
        relations_before=BEFORE,
        relations_after=after_rel,
        seconds=3.0,
        statements=migrations.statements(sql) if sql is not None else None,
        ignore_pids=set(ignore),
        lint=list(raws),
        thresholds=thresholds,
        marked=marked,
    )


# -- locks.py -------------------------------------------------------------------------------


def test_the_conflict_table_is_symmetric_and_gives_what_each_mode_blocks() -> None:
    for a in locks.MODES:
        for b in locks.MODES:
            assert locks.conflicts(a, b) == locks.conflicts(b, a), (a, b)
    assert {m: locks.blocks(m) for m in locks.MODES} == {
        "ACCESS SHARE": "ddl",
        "ROW SHARE": "ddl",
        "ROW EXCLUSIVE": "ddl",
        "SHARE UPDATE EXCLUSIVE": "ddl",
        "SHARE": "writes",
        "SHARE ROW EXCLUSIVE": "writes",
        "EXCLUSIVE": "writes",
        "ACCESS EXCLUSIVE": "reads and writes",
    }


def test_lock_mode_names_and_phrases() -> None:
    assert locks.sql_name("ShareUpdateExclusiveLock") == "SHARE UPDATE EXCLUSIVE"
    assert locks.sql_name("ACCESS SHARE") == "ACCESS SHARE"
    assert [locks.pg_name(m) for m in ("ROW SHARE", "AccessExclusiveLock")] == [
        "RowShareLock",
        "AccessExclusiveLock",
    ]
    with pytest.raises(ValueError, match="SIReadLock"):
        locks.sql_name("SIReadLock")
    assert locks.phrase("reads and writes", "public.orders") == (
        "blocks reads and writes of `public.orders`"
    )
    assert locks.phrase("writes", "public.orders") == "blocks writes of `public.orders`"
    assert locks.phrase("ddl", "public.orders") == "blocks other DDL only"


# -- logparse.py ----------------------------------------------------------------------------


def test_the_log_reads_back_as_statements_with_their_transaction_events_and_waits() -> None:
    wait = "process 4242 {} ShareLock on relation 16384 of database 5 after {} ms"
    parsed = logparse.parse(
        [
            done(T0 + 1.0, 0.5, "BEGIN"),
            LogEntry(time=T0 + 2.0, pid=PID, level="LOG", message=wait.format(
                "still waiting for", "1000.123")),
            ddl(T0 + 2.9, "CREATE INDEX", [(ORDERS, "ShareLock")]),
            done(T0 + 1.0, 1.0, "SELECT 1", pid=7),  # another backend in between
            LogEntry(time=T0 + 3.0, pid=PID, level="LOG", message=wait.format(
                "acquired", "2000.5")),
            done(T0 + 3.0, 2500.0, "CREATE INDEX ON orders (id)"),
            done(T0 + 3.5, 1.0, "COMMIT"),
            LogEntry(time=T0 + 4.0, pid=PID, level="ERROR", message="boom"),
            LogEntry(time=T0 + 4.0, pid=PID, level="STATEMENT", message="duration: 1 ms  x"),
            done(T0 + 5.0, 10.0, "SELECT 2"),
        ]
    )  # fmt: skip
    assert [(s.pid, s.text, s.block) for s in parsed.statements] == [
        (PID, "BEGIN", 0),
        (7, "SELECT 1", None),
        (PID, "CREATE INDEX ON orders (id)", 0),
        (PID, "COMMIT", 0),
        (PID, "SELECT 2", None),
    ]
    create = parsed.statements[2]
    assert (create.start, create.end, create.seconds) == (T0 + 0.5, T0 + 3.0, 2.5)
    assert create.transaction_end == T0 + 3.5
    assert parsed.statements[4].transaction_end == T0 + 5.0
    assert create.ddl == [
        logparse.DdlEvent("CREATE INDEX", "3/25", [logparse.HeldLock(ORDERS, "ShareLock")], [])
    ]
    assert create.waits == [logparse.LockWait(ORDERS, "ShareLock", 2.0005, True)]
    assert parsed.statements[0].ddl == [] and parsed.statements[0].waits == []


def test_the_extended_protocol_counts_execute_with_its_parse_and_bind() -> None:
    def phase(end: float, ms: float, what: str) -> LogEntry:
        return LogEntry(
            time=end,
            pid=PID,
            level="LOG",
            message=f"duration: {ms} ms  {what}: ALTER TABLE orders ADD x int",
        )

    parsed = logparse.parse(
        [
            phase(T0 + 1.0, 2.0, "parse <unnamed>"),
            phase(T0 + 1.01, 3.0, "bind <unnamed>"),
            rewrite_event(T0 + 1.5, ORDERS, 4),
            phase(T0 + 2.0, 500.0, "execute <unnamed>"),
            phase(T0 + 3.0, 1.0, "execute S_1/C_2"),
            LogEntry(time=T0 + 4, pid=PID, level="LOG", message="pgoverlay-trace {oops"),
            ddl(T0 + 4.0, "CREATE TABLE", []),
        ]
    )  # fmt: skip
    first, second = parsed.statements
    assert first.text == "ALTER TABLE orders ADD x int"
    assert first.seconds == pytest.approx(0.505)
    assert first.start == pytest.approx(T0 + 0.998)
    assert first.rewrites == [logparse.RewriteEvent(ORDERS, 4, "3/25")]
    assert second.seconds == pytest.approx(0.001) and second.rewrites == []
    assert (parsed.malformed, parsed.orphans) == (1, 1)


def test_ignored_pids_leave_no_statement() -> None:
    parsed = logparse.parse([done(T0, 1.0, "SELECT 1", pid=99)], ignore_pids={99})
    assert parsed.statements == []


# -- analyze.py -----------------------------------------------------------------------------

# psql --single-transaction: BEGIN, the file's statements, COMMIT.
SQL = """-- add an index, then a column
CREATE INDEX orders_total ON orders (total);

ALTER TABLE orders
    ADD COLUMN note text;  -- trailing comment
"""


def single_transaction_log() -> list[LogEntry]:
    return [
        done(T0 + 1.0, 1.0, "BEGIN"),
        ddl(T0 + 3.0, "CREATE INDEX", [(ORDERS, "ShareLock"), (NEW_IDX, "AccessExclusiveLock")]),
        done(T0 + 3.0, 2000.0, "CREATE INDEX orders_total ON orders (total);"),
        ddl(
            T0 + 3.5,
            "ALTER TABLE",
            [(ORDERS, "ShareLock"), (ORDERS, "AccessExclusiveLock"), (LEDGER, "ShareLock")],
        ),
        done(T0 + 3.5, 5.0, "ALTER TABLE orders\n    ADD COLUMN note text;"),
        done(T0 + 4.0, 2.0, "COMMIT"),
    ]


def test_event_locks_are_held_from_their_statement_to_commit() -> None:
    insight = run(single_transaction_log(), sql=SQL)
    share = LockUse("public.orders", "table", "SHARE", "writes", 2.0 + 1.0, 0.0, 0, 412 * MIB,
                    "public.orders", 413 * MIB, source="exact")  # fmt: skip
    exclusive = LockUse(
        "public.orders", "table", "ACCESS EXCLUSIVE", "reads and writes", 0.505, 0.0, 1, 412 * MIB,
        "public.orders", 413 * MIB, source="exact",
    )  # fmt: skip
    assert insight.locks == [exclusive, share]
    # The second statement ran under the first one's SHARE too: it lists it, with its hold;
    # the migration's lock stays the first statement's.
    assert [(s.index, s.line, s.seconds, s.locks) for s in insight.statements] == [
        (0, 2, 2.0, [share]),
        (1, 4, 0.005, [exclusive, dataclasses.replace(share, statement=1)]),
    ]
    assert (
        insight.statements[1].text
        == "ALTER TABLE orders\n    ADD COLUMN note text;  -- trailing comment"
    )
    assert insight.notes == []
    assert insight.verdict == Verdict(
        "notice",
        "takes ACCESS EXCLUSIVE on `public.orders` (413.0 MiB) for 505 ms: "
        "the lock is held until COMMIT: run slow statements in a transaction of their own; "
        + READS,
        "blocks reads and writes",
    )


def test_outside_a_transaction_block_a_lock_ends_with_its_statement() -> None:
    log = single_transaction_log()[1:3]
    insight = run(log, sql=SQL)
    assert [(x.mode, x.held_seconds) for x in insight.locks] == [("SHARE", 2.0)]
    assert insight.verdict == Verdict(
        "notice",
        "takes SHARE on `public.orders` (413.0 MiB) for 2.0 s: consider CREATE INDEX "
        "CONCURRENTLY; " + WRITES,
        "blocks writes",
    )
    assert insight.notes == ["1 statement of the file not seen in the server log (first at line 4)"]


def test_sampled_spans_go_to_the_statement_running_then_and_the_longer_hold_wins() -> None:
    def span(
        first: float,
        last: float,
        mode: str,
        granted: bool = True,
        oid: int = ORDERS,
        pid: int = PID,
    ) -> LockSpan:
        return LockSpan(
            pid=pid,
            relation=oid,
            mode=mode,
            granted=granted,
            first=first,
            last=last,
            query_start=None,
            query="",
        )

    log = [
        done(T0 + 1.0, 1.0, "BEGIN"),
        ddl(T0 + 3.0, "CREATE INDEX", [(ORDERS, "ShareLock")]),
        done(T0 + 3.0, 2000.0, "CREATE INDEX orders_total ON orders (total);"),
        ddl(T0 + 3.5, "ALTER TABLE", [(ORDERS, "AccessExclusiveLock")]),
        done(T0 + 3.5, 500.0, "ALTER TABLE orders ADD COLUMN note text;"),
        done(T0 + 4.0, 2.0, "COMMIT"),
    ]
    spans = [
        span(T0 + 1.2, T0 + 3.9, "ShareLock"),  # 2.7 s, shorter than the event's 3.0 s
        span(T0 + 3.0, T0 + 3.45, "AccessExclusiveLock", granted=False),  # ALTER waited
        span(T0 + 3.46, T0 + 3.99, "AccessExclusiveLock"),  # 0.53 s, the event says 1.0 s
        span(T0 + 3.2, T0 + 3.99, "ExclusiveLock", oid=ITEMS),  # only sampling saw it
        span(T0 + 3.999, T0 + 4.0, "RowExclusiveLock"),  # during COMMIT: no file statement
        span(T0, T0 + 1, "ExclusiveLock", oid=ITEMS, pid=77),  # an ignored pid
    ]  # fmt: skip
    insight = run(log, sql=SQL, spans=spans, ignore=[77])
    got = [(x.relation, x.mode, x.held_seconds, x.waited_seconds, x.statement)
           for x in insight.locks]  # fmt: skip
    # worst table first, each table's locks together
    assert got == [
        ("public.orders", "ACCESS EXCLUSIVE", 0.55, 0.45, 1),  # held once granted
        ("public.orders", "SHARE", 3.0, 0.0, 0),
        ("public.orders", "ROW EXCLUSIVE", 0.001, 0.0, None),
        ("public.items", "EXCLUSIVE", 0.79, 0.0, 1),
    ]
    assert insight.notes == ["locks seen by sampling pg_locks are timed to 50 ms"]


def test_lock_waits_from_the_log_and_in_command_mode_the_logged_statements_are_the_statements() -> (
    None
):
    log = [
        done(T0 + 1.0, 1.0, "BEGIN"),
        LogEntry(time=T0 + 2.5, pid=PID, level="LOG", message="process 4242 acquired "
                 "AccessExclusiveLock on relation 16384 of database 5 after 1500.0 ms"),
        ddl(T0 + 2.5, "LOCK TABLE", [(ORDERS, "AccessExclusiveLock")]),
        done(T0 + 2.5, 1500.0, "LOCK TABLE orders"),
        done(T0 + 2.7, 1.0, "UPDATE items SET n = 1"),
        done(T0 + 3.0, 1.0, "COMMIT"),
    ]  # fmt: skip
    insight = run(log)
    assert [(s.index, s.line, s.text, s.seconds) for s in insight.statements] == [
        (0, None, "LOCK TABLE orders", 1.5),
        (1, None, "UPDATE items SET n = 1", 0.001),
    ]
    lock, update = insight.locks
    # waited 1.5 s for it, then held it 0.5 s, to the COMMIT: the hold is not the wait
    assert (lock.mode, lock.held_seconds, lock.waited_seconds, lock.statement) == (
        "ACCESS EXCLUSIVE", 0.5, 1.5, 0
    )  # fmt: skip
    assert cells.markdown(details.lock_cell(insight.locks)).startswith(
        "ACCESS EXCLUSIVE on `public.orders`: waited 1.5 s, then held 500 ms"
    )
    # the UPDATE's documented mode on its target, from its start to the COMMIT
    assert (update.relation, update.mode, update.statement, update.source) == (
        "public.items", "ROW EXCLUSIVE", 1, "inferred"
    )  # fmt: skip
    assert update.held_seconds == pytest.approx(0.301)


def test_rewrites_come_from_filenodes_with_the_events_reasons() -> None:
    after = {
        **BEFORE,
        ORDERS: rel(ORDERS, "public.orders", filenode=90001, bytes=500 * MIB),
        ORDERS_IDX: rel(ORDERS_IDX, "public.orders_pkey", kind="i", table_oid=ORDERS,
                        filenode=90002, bytes=2 * MIB),
        ITEMS: rel(ITEMS, "public.items", filenode=0),  # no storage now: not a rewrite
        LEDGER: rel(LEDGER, "pgoverlay_ledger.migrations", filenode=90003),
    }  # fmt: skip
    log = [
        done(T0 + 1.0, 1.0, "BEGIN"),
        rewrite_event(T0 + 2.0, ORDERS, 4 | 2),
        ddl(T0 + 5.0, "ALTER TABLE", [(ORDERS, "AccessExclusiveLock")]),
        done(T0 + 5.0, 4000.0, "ALTER TABLE orders ALTER total TYPE bigint"),
        done(T0 + 5.5, 1.0, "COMMIT"),
    ]
    insight = run(log, after_relations=after)
    assert insight.rewrites == [
        Rewrite("public.orders", "table", ["volatile default", "column type change"],
                412 * MIB, 500 * MIB, 0, "public.orders", 413 * MIB),
        Rewrite("public.orders_pkey", "index", ["rebuilt with its table"], MIB, 2 * MIB, 0,
                "public.orders", 413 * MIB),
    ]  # fmt: skip
    assert insight.statements[0].rewrites == insight.rewrites
    assert insight.verdict == Verdict(
        "notice",
        "rewrites `public.orders` (413.0 MiB; volatile default, column type change) under "
        "ACCESS EXCLUSIVE for 4.5 s: add a new column and backfill it in batches instead of "
        "changing the type in place; " + READS,
        "rewrite",
    )
    # the rewrite wrote 502 MiB (the table and its index): over a 501 MiB threshold
    assert run(
        log, after_relations=after, thresholds=Thresholds(max_rewrite=501 * MIB)
    ).verdict == (dataclasses.replace(insight.verdict, level="over"))
    assert rewrites.rewrite_reasons(1 | 8) == ["SET LOGGED/UNLOGGED", "access method"]


def test_a_rewrite_without_an_event_goes_to_the_statement_that_held_access_exclusive() -> None:
    after = {**BEFORE, ITEMS: rel(ITEMS, "public.items", filenode=777, bytes=4096)}
    log = [
        ddl(T0 + 1.0, "VACUUM", [(ITEMS, "AccessExclusiveLock")]),
        done(T0 + 1.0, 20.0, "VACUUM FULL items"),
    ]
    insight = run(log, after_relations=after)
    assert insight.rewrites == [
        Rewrite("public.items", "table", [], 8192, 4096, 0, "public.items", 8192)
    ]
    assert insight.verdict == Verdict(
        "notice",
        "rewrites `public.items` (8.0 KiB) under ACCESS EXCLUSIVE for 20 ms: VACUUM FULL and "
        "CLUSTER rewrite under ACCESS EXCLUSIVE: use pg_repack or pg_squeeze on a live table; "
        + READS.replace("public.orders", "public.items"),
        "rewrite",
    )


def test_scans_under_a_write_blocking_lock_per_statement_and_per_migration() -> None:
    after = {
        **BEFORE,
        ORDERS: rel(ORDERS, "public.orders", bytes=412 * MIB, seq_scan=9, seq_tup_read=9100),
        ITEMS: rel(ITEMS, "public.items", bytes=8192, n_tup_ins=15, n_tup_upd=4, n_tup_del=1,
                   seq_scan=50),
    }  # fmt: skip
    log = [
        done(T0 + 1.0, 1.0, "BEGIN"),
        # an UPDATE scanned items first: its counters count, but items is not write-locked
        ddl(T0 + 2.0, "ALTER TABLE", [(ORDERS, "AccessExclusiveLock")],
            scans=[(ORDERS, 1, 3000), (ITEMS, 2, 20)]),
        done(T0 + 2.0, 900.0, "ALTER TABLE orders ALTER total SET NOT NULL"),
        ddl(T0 + 3.0, "ALTER TABLE", [(ORDERS, "AccessExclusiveLock")],
            scans=[(ORDERS, 2, 6000), (ITEMS, 2, 20)]),
        done(T0 + 3.0, 900.0, "ALTER TABLE orders ADD CHECK (total > 0)"),
        done(T0 + 3.1, 1.0, "COMMIT"),
    ]  # fmt: skip
    insight = run(log, after_relations=after, wal_lsn=1000 + 5 * MIB,
                  layer=Layer(logical_bytes=0, physical_bytes=4096 + MIB))  # fmt: skip
    assert [s.scans for s in insight.statements] == [
        [Scan("public.orders", 1, 3000, "ACCESS EXCLUSIVE", 0)],
        [Scan("public.orders", 1, 3000, "ACCESS EXCLUSIVE", 1)],
    ]
    # the table's own counters saw 4 scans and 9000 rows: more than the events (2, 6000)
    assert insight.scans == [Scan("public.orders", 4, 9000, "ACCESS EXCLUSIVE", None)]
    assert insight.volume == Volume(5, 4, 1, 5 * MIB, MIB)
    assert insight.verdict.text == (
        "takes ACCESS EXCLUSIVE on `public.orders` (413.0 MiB) for 2.0 s: add a CHECK (... IS "
        "NOT NULL) NOT VALID constraint, VALIDATE it, then SET NOT NULL: it skips the scan; "
        + READS
    )
    # items had rows updated and deleted: listed, though the lock decides the kind
    assert insight.row_writes == [RowWrites("public.items", 4, 1, 8192)]
    assert insight.verdict.kind == "blocks reads and writes"


def test_relations_the_migration_created_or_the_ledger_take_no_part() -> None:
    after = {
        **BEFORE,
        NEW_IDX: rel(NEW_IDX, "public.fresh", n_tup_ins=1000, seq_scan=3),
        LEDGER: rel(LEDGER, "pgoverlay_ledger.migrations", n_tup_ins=4),
    }
    log = [
        ddl(T0 + 1.0, "CREATE TABLE", [(NEW_IDX, "AccessExclusiveLock")],
            scans=[(NEW_IDX, 3, 10)]),
        done(T0 + 1.0, 300.0, "CREATE TABLE fresh AS SELECT generate_series(1, 1000)"),
        done(T0 + 1.2, 200.0, "INSERT INTO pgoverlay_ledger.migrations VALUES (1)", pid=55),
    ]  # fmt: skip
    insight = run(log, after_relations=after, ignore=[55])
    assert (insight.locks, insight.scans, insight.rewrites) == ([], [], [])
    assert insight.volume.rows_inserted == 1000
    assert [s.text for s in insight.statements] == [
        "CREATE TABLE fresh AS SELECT generate_series(1, 1000)"
    ]
    assert insight.verdict == Verdict("safe", "safe online")


def test_a_migration_tools_ledger_sequence_is_bookkeeping_not_a_lock_of_the_migration() -> None:
    seq, table = 16700, 16701
    before = {
        **BEFORE,
        seq: rel(seq, "public.django_migrations_id_seq", kind="S"),
        table: rel(table, "public.django_migrations"),
    }
    log = [
        done(T0 + 1.0, 200.0, "ALTER TABLE orders ADD COLUMN note text"),
        done(T0 + 1.3, 2.0, "INSERT INTO django_migrations (app, name, applied) "
             "VALUES ('shop', '0002_note', now()) RETURNING id"),
    ]  # fmt: skip
    # Django's insert of its ledger row: the sampler saw its lock on the row id's sequence
    spans = [
        LockSpan(pid=PID, relation=seq, mode="RowExclusiveLock", granted=True, first=T0 + 1.25,
                 last=T0 + 1.35, query_start=None, query=""),
        LockSpan(pid=PID, relation=ORDERS, mode="AccessExclusiveLock", granted=True,
                 first=T0 + 0.85, last=T0 + 1.0, query_start=None, query=""),
    ]  # fmt: skip
    insight = an.analyze(
        before=mark(T0), after=mark(T0 + 60, log=log, spans=spans), relations_before=before,
        relations_after=before, seconds=3.0, statements=None, ignore_pids=set(), lint=[],
        thresholds=DEFAULTS,
    )  # fmt: skip
    assert {u.relation for u in insight.locks} == {"public.orders"}, insight.locks
    assert ledgers.is_tool_table("django_migrations_id_seq")
    assert not ledgers.is_tool_table("orders_id_seq") and not ledgers.is_tool_table("_seq")


def test_statements_are_matched_by_order_and_text_and_strays_are_noted() -> None:
    sql = "SELECT 1;\n\n/* two */ SELECT   2;\nSELECT 3;\n"
    log = [
        done(T0 + 1.0, 1.0, "BEGIN"),
        done(T0 + 1.1, 1.0, "SELECT 1;"),
        done(T0 + 1.2, 7.0, "SET search_path = x"),
        done(T0 + 1.3, 2.0, "SELECT 2;"),
        done(T0 + 1.4, 3.0, "SELECT 3"),
        done(T0 + 1.5, 1.0, "COMMIT"),
    ]
    insight = run(log, sql=sql)
    assert [(s.line, s.seconds) for s in insight.statements] == [
        (1, 0.001),
        (3, 0.002),
        (4, 0.003),
    ]
    assert insight.notes == [
        "1 logged statement matched no statement of the file (first: `SET search_path = x`)"
    ]


def test_notes_say_what_was_not_measured() -> None:
    insight = run([], sql="SELECT 1;", instrumented=False, log_truncated=True,
                  notes=["pg_locks sampling stopped"])  # fmt: skip
    assert insight.notes == [
        "pg_locks sampling stopped",
        "the trace's event triggers were not in place: locks come from sampling alone, and "
        "rewrite reasons and per-statement scans are unknown",
        "the server log of this migration was larger than is kept: it was cut",
        "the server log had no entries for this migration: statement times are unknown",
    ]
    assert insight.statements[0].seconds is None
    noise = [LogEntry(time=T0, pid=PID, level="LOG", message="checkpoint starting: time")]
    assert run(noise, sql="SELECT 1;").notes == [
        "the server log had no statement durations for this migration "
        "(log_min_duration_statement must be 0)"
    ]


def test_the_book_follows_relations_across_marks() -> None:
    book = an.Book(mark(T0, relations=list(BEFORE.values())))
    changed = rel(ITEMS, "public.items", bytes=1)
    before, after = book.advance(mark(T0 + 1, relations=[changed], dropped=[LEDGER]))
    assert before == BEFORE
    assert after == {ORDERS: BEFORE[ORDERS], ORDERS_IDX: BEFORE[ORDERS_IDX], ITEMS: changed}
    again_before, again_after = book.advance(mark(T0 + 2))
    assert again_before == again_after == after


# -- verdict.py -----------------------------------------------------------------------------


def insight_with(
    lock_list: Sequence[LockUse] = (),
    rewrites: Sequence[Rewrite] = (),
    texts: Sequence[str] = ("CREATE INDEX i ON orders (total)",),
) -> MigrationInsight:
    stmts = [StatementInsight(i, i + 1, t, 1.0) for i, t in enumerate(texts)]
    return MigrationInsight(
        seconds=1.0, locks=list(lock_list), rewrites=list(rewrites), scans=[], volume=Volume(),
        statements=stmts, findings=[], verdict=Verdict("safe", ""), interval=0.05,
    )  # fmt: skip


def test_verdict_levels_and_advice() -> None:
    share = LockUse("public.orders", "table", "SHARE", "writes", 2.3, statement=0,
                    bytes=412 * MIB)  # fmt: skip
    tight = Thresholds(max_blocking_lock=1.0, max_rewrite=MIB)
    assert verdict.decide(insight_with([share]), tight) == Verdict(
        "over",
        "takes SHARE on `public.orders` (412.0 MiB) for 2.3 s: consider CREATE INDEX "
        "CONCURRENTLY; " + WRITES,
        "blocks writes",
    )
    assert verdict.decide(insight_with([share]), Thresholds()).level == "notice"
    ddl_only = dataclasses.replace(share, mode="SHARE UPDATE EXCLUSIVE", blocks="ddl",
                                   held_seconds=60.0)  # fmt: skip
    assert verdict.decide(insight_with([ddl_only]), tight) == Verdict(
        "safe", "safe online", "safe online"
    )
    big = Rewrite("public.orders", "table", [], 412 * MIB, 2 * MIB, statement=0)
    fk = "ALTER TABLE orders ADD CONSTRAINT fk FOREIGN KEY (c) REFERENCES c (id)"
    brief = dataclasses.replace(share, held_seconds=0.05)
    assert verdict.decide(insight_with([brief], [big], texts=[fk]), tight) == Verdict(
        "over",
        "rewrites `public.orders` (412.0 MiB) under SHARE for 50 ms: add the constraint NOT "
        "VALID, then VALIDATE CONSTRAINT in its own transaction; " + WRITES,
        "rewrite",
    )
    unique = "ALTER TABLE orders ADD UNIQUE (code)"
    assert "; build a unique index CONCURRENTLY, then ADD CONSTRAINT ... USING INDEX; " in (
        verdict.decide(insight_with([share], texts=[unique]), tight).text.replace(": ", "; ", 1)
    )
    refresh = "REFRESH MATERIALIZED VIEW totals"
    assert ": consider REFRESH MATERIALIZED VIEW CONCURRENTLY (it needs a unique index); " in (
        verdict.decide(insight_with([share], texts=[refresh]), tight).text
    )
    assert verdict.decide(insight_with([share], texts=["LOCK orders"]), tight).text == (
        "takes SHARE on `public.orders` (412.0 MiB) for 2.3 s: the lock is held until "
        "COMMIT: run slow statements in a transaction of their own; " + WRITES
    )


@pytest.mark.parametrize(
    ("text", "advice"),
    [
        ("VACUUM (VERBOSE, FULL) orders", "VACUUM FULL and CLUSTER rewrite under ACCESS"),
        ("vacuum full orders", "VACUUM FULL and CLUSTER rewrite under ACCESS"),
        ("ALTER TABLE orders ADD COLUMN customer int REFERENCES customers (id)",
         "add the column without REFERENCES, then the foreign key NOT VALID"),
        ('ALTER TABLE orders ADD CONSTRAINT "my fk" FOREIGN KEY (c) REFERENCES c (id)',
         "add the constraint NOT VALID, then VALIDATE CONSTRAINT"),
        ("ALTER TABLE orders DETACH PARTITION orders_2023",
         "consider DETACH PARTITION ... CONCURRENTLY"),
        ("ALTER TABLE orders ATTACH PARTITION orders_2025 FOR VALUES IN (2025)",
         "first add a CHECK constraint matching the partition bound"),
        ("TRUNCATE orders", "TRUNCATE takes ACCESS EXCLUSIVE: to empty a busy table, DELETE"),
        ("ALTER TABLE orders SET TABLESPACE fast", "SET TABLESPACE copies the table"),
    ],
)  # fmt: skip
def test_the_advice_fits_the_statement(text: str, advice: str) -> None:
    lock = LockUse("public.orders", "table", "ACCESS EXCLUSIVE", "reads and writes", 0.01,
                   statement=0)  # fmt: skip
    found = verdict.decide(insight_with([lock], texts=[text]), DEFAULTS).text
    assert f"for 10 ms: {advice}" in found


def test_a_stored_generated_column_and_truncate_get_their_own_words_not_the_reasons() -> None:
    lock = LockUse("public.orders", "table", "ACCESS EXCLUSIVE", "reads and writes", 0.01,
                   statement=0)  # fmt: skip
    rewrite = Rewrite("public.orders", "table", ["volatile default"], 10, 10, statement=0)
    generated = (
        "ALTER TABLE orders ADD COLUMN cents bigint GENERATED ALWAYS AS (total * 100) STORED"
    )
    found = verdict.decide(insight_with([lock], [rewrite], texts=[generated]), DEFAULTS).text
    assert found.startswith(
        "rewrites `public.orders` (10 B; volatile default) under ACCESS EXCLUSIVE for 10 ms: a "
        "stored generated column rewrites the table: add a plain column, fill it in batches"
    )
    emptied = dataclasses.replace(rewrite, reasons=[])
    emptying = verdict.decide(insight_with([lock], [emptied], texts=["TRUNCATE orders"]), DEFAULTS)
    assert (emptying.kind, emptying.text.split(":")[0]) == (
        "rewrite", "empties `public.orders` (10 B) under ACCESS EXCLUSIVE for 10 ms"
    )  # fmt: skip


def test_not_valid_and_detach_concurrently_get_no_advice_but_the_lock_queue() -> None:
    for text in (
        "ALTER TABLE orders ADD CONSTRAINT fk FOREIGN KEY (c) REFERENCES c (id) NOT VALID",
        "ALTER TABLE orders DETACH PARTITION orders_2023 CONCURRENTLY",
        "ALTER TABLE orders ADD COLUMN flag boolean DEFAULT false",
    ):
        lock = LockUse("public.orders", "table", "SHARE ROW EXCLUSIVE", "writes", 0.004,
                       statement=0)  # fmt: skip
        found = verdict.decide(insight_with([lock], texts=[text]), DEFAULTS)
        assert found.text == "takes SHARE ROW EXCLUSIVE on `public.orders` for 4 ms: " + WRITES


def test_a_foreign_keys_other_table_is_named_with_the_worst() -> None:
    def lock(table: str, held: float) -> LockUse:
        return LockUse(table, "table", "SHARE ROW EXCLUSIVE", "writes", held, statement=0)

    fk = "ALTER TABLE orders ADD CONSTRAINT fk FOREIGN KEY (c) REFERENCES customers (id) NOT VALID"
    both = [lock("public.orders", 0.004), lock("public.customers", 0.003)]
    assert verdict.decide(insight_with(both, texts=[fk]), DEFAULTS).text == (
        "takes SHARE ROW EXCLUSIVE on `public.orders` for 4 ms (and SHARE ROW EXCLUSIVE on "
        "`public.customers`): " + WRITES
    )


def test_a_foreign_keys_verdict_names_the_table_it_scans_not_the_smaller_one() -> None:
    # Both tables locked alike for as long; `orders` (208 MiB) is scanned to validate the key:
    # its writes stop for the scan, whatever the names' order or a sample's rounding.
    fk = "ALTER TABLE orders ADD CONSTRAINT fk FOREIGN KEY (c) REFERENCES accounts (id)"
    orders = LockUse("public.orders", "table", "SHARE ROW EXCLUSIVE", "writes", 0.310,
                     statement=0, table_bytes=208 * MIB)  # fmt: skip
    accounts = LockUse("public.accounts", "table", "SHARE ROW EXCLUSIVE", "writes", 0.312,
                       statement=0, table_bytes=64 * 1024)  # fmt: skip
    scanned = dataclasses.replace(
        insight_with([orders, accounts], texts=[fk]),
        scans=[Scan("public.orders", 1, 4_000_000, "SHARE ROW EXCLUSIVE", 0)],
    )
    text = verdict.decide(scanned, DEFAULTS).text
    assert text.startswith("takes SHARE ROW EXCLUSIVE on `public.orders` (208.0 MiB)"), text
    assert "(and SHARE ROW EXCLUSIVE on `public.accounts`)" in text
    # without a scan seen, the larger table
    unscanned = insight_with([accounts, orders], texts=[fk])
    assert "on `public.orders` (208.0 MiB)" in verdict.decide(unscanned, DEFAULTS).text


def rows_insight(**kw: Any) -> MigrationInsight:
    return dataclasses.replace(insight_with(texts=["UPDATE orders SET total = 0"]), **kw)


def test_each_kind_is_the_first_rule_that_applies_and_never_depends_on_size_or_time() -> None:
    rewrite = Rewrite("public.orders", "table", ["column type change"], 10, 10, statement=0)
    reads = LockUse("public.orders", "table", "ACCESS EXCLUSIVE", "reads and writes", 0.001,
                    statement=0)  # fmt: skip
    writes = dataclasses.replace(reads, mode="SHARE", blocks="writes")
    ddl_only = dataclasses.replace(reads, mode="SHARE UPDATE EXCLUSIVE", blocks="ddl")
    rows = [RowWrites("public.orders", 3, 0, 100)]
    sequence = dataclasses.replace(reads, relation="public.orders_id_seq", kind="sequence")
    cases = [
        (insight_with([reads, writes], [rewrite]), "rewrite"),
        (rows_insight(locks=[writes, reads], row_writes=rows), "blocks reads and writes"),
        (rows_insight(locks=[writes, ddl_only], row_writes=rows), "blocks writes"),
        (rows_insight(locks=[ddl_only], row_writes=rows), "row locks"),
        (insight_with([ddl_only, sequence]), "safe online"),
    ]
    for insight, kind in cases:
        assert verdict.kind_of(insight) == kind
        for held, size in ((0.001, 10), (0.099, 10**6), (0.101, 10**9), (3600.0, 10**12)):
            scaled = dataclasses.replace(
                insight,
                locks=[
                    dataclasses.replace(u, held_seconds=held, bytes=size) for u in insight.locks
                ],
                rewrites=[dataclasses.replace(r, bytes_after=size) for r in insight.rewrites],
            )
            found = verdict.decide(scaled, Thresholds())
            assert found.kind == kind, (kind, held, size)
            blocking = kind != "row locks" and (
                held > 5.0 and kind != "safe online" or size > 1024**3 and kind == "rewrite"
            )
            expected = "over" if blocking else "safe" if kind == "safe online" else "notice"
            assert found.level == expected, (kind, held, size, found)
    assert [k.name for k in verdict.KINDS] == [
        "rewrite", "blocks reads and writes", "blocks writes", "row locks", "safe online"
    ]  # fmt: skip


def test_a_concurrent_drops_last_lock_on_its_dead_index_decides_nothing() -> None:
    """DROP INDEX CONCURRENTLY ends with ACCESS EXCLUSIVE on an index no query uses any more:
    it is in the report, not in the verdict or the comment's lock lines."""
    table = LockUse("public.orders", "table", "SHARE UPDATE EXCLUSIVE", "ddl", 2.0,
                    statement=0, table="public.orders")  # fmt: skip
    dying = LockUse("public.orders_t_idx", "index", "ACCESS EXCLUSIVE", "reads and writes", 0.0,
                    statement=0, table="public.orders", dying=True)  # fmt: skip
    insight = insight_with([table, dying])
    assert verdict.decide(insight, Thresholds()) == Verdict("safe", "safe online")
    assert [(t.table, t.mode) for t in locks.per_table(insight.locks)] == [
        ("public.orders", "SHARE UPDATE EXCLUSIVE")
    ]
    alive = dataclasses.replace(dying, dying=False)
    assert verdict.kind_of(insight_with([table, alive])) == "blocks reads and writes"


def test_the_docs_state_every_kind_in_order_and_the_thresholds() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "insight.md").read_text()
    section = doc.split("## Verdicts", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| `")]
    assert rows == [f"`{k.name}`" for k in verdict.KINDS]
    assert f"`max-blocking-lock` (default\n  {Thresholds().max_blocking_lock:.0f} s)" in section
    assert "`max-rewrite` (default 1 GiB)" in section and Thresholds().max_rewrite == 1024**3


def test_row_locks_say_how_many_rows_stay_locked_and_to_batch() -> None:
    rows = [RowWrites("public.orders", 2_000_000, 0, 412 * MIB), RowWrites("public.items", 1, 1)]
    assert verdict.decide(rows_insight(row_writes=rows), DEFAULTS) == Verdict(
        "notice",
        "updates 2,000,000 rows of `public.orders` (412.0 MiB): each row stays locked against "
        "other writers until COMMIT; update or delete in batches of a few thousand rows, each "
        "batch in its own transaction",
        "row locks",
    )


def test_a_lock_timeout_in_force_bounds_the_queue_and_the_verdict_says_so() -> None:
    lock = LockUse("public.orders", "table", "ACCESS EXCLUSIVE", "reads and writes", 0.01,
                   statement=1)  # fmt: skip
    texts = ["SET lock_timeout = '2s'", "ALTER TABLE orders ADD COLUMN c int"]
    bounded = verdict.decide(insight_with([lock], texts=texts), DEFAULTS).text
    assert bounded == (
        "takes ACCESS EXCLUSIVE on `public.orders` for 10 ms: it waits behind any running "
        "transaction on `public.orders`, and every query on it waits behind it; lock_timeout "
        "(2.0 s) bounds that wait: retry when it expires"
    )
    # what the trace measured wins over the text
    traced = insight_with([lock], texts=texts)
    measured = [dataclasses.replace(s, lock_timeout=0.0) for s in traced.statements]
    assert verdict.decide(dataclasses.replace(traced, statements=measured), DEFAULTS).text == (
        "takes ACCESS EXCLUSIVE on `public.orders` for 10 ms: " + READS
    )


def statements_of(*texts: str) -> list[StatementInsight]:
    return [StatementInsight(i, i + 1, t, 0.001) for i, t in enumerate(texts)]


@pytest.mark.parametrize(
    ("before", "seconds"),
    [
        ([], 0.0),
        (["SET lock_timeout = '2s'"], 2.0),
        (["SET lock_timeout TO 1500"], 1.5),
        (["/* bounded */ SET SESSION lock_timeout = '1min';"], 60.0),
        (["set lock_timeout='250ms'", "RESET lock_timeout"], 0.0),
        (["SET lock_timeout = '2s'", "SET lock_timeout TO DEFAULT"], 0.0),
        (["BEGIN", "SET LOCAL lock_timeout = '3s'"], 3.0),
        (["SET lock_timeout = '1s'", "BEGIN", "SET LOCAL lock_timeout = '3s'", "COMMIT"], 1.0),
        (["BEGIN", "SET LOCAL lock_timeout = '3s'", "ROLLBACK TO SAVEPOINT s"], 3.0),
        (["SELECT set_config('lock_timeout', '4s', false)"], 4.0),
        (["SELECT pg_catalog.set_config('lock_timeout', '4s', true)", "COMMIT"], 0.0),
        (["SET statement_timeout = '5s'"], 0.0),
        (["SET lock_timeout = 'soon'"], 0.0),
    ],
)
def test_the_lock_timeout_in_force_is_read_from_the_statements_before(
    before: list[str], seconds: float
) -> None:
    stmts = statements_of(*before, "ALTER TABLE orders ADD COLUMN c int")
    assert locks.timeout_in_force(stmts, len(before)) == pytest.approx(seconds)


def test_table_locks_fold_a_tables_indexes_and_toast_onto_one_line() -> None:
    def use(relation: str, kind: str, mode: str, held: float, table: str = "public.t") -> LockUse:
        return LockUse(relation, kind, mode, locks.blocks(mode), held, statement=0,
                       table=table, table_bytes=181 * MIB)  # fmt: skip

    folded = locks.per_table(
        [
            use("pg_toast.pg_toast_16391", "TOAST table", "ACCESS EXCLUSIVE", 5.9),
            use("public.t_pkey", "index", "ACCESS EXCLUSIVE", 5.9),
            use("public.t", "table", "ACCESS EXCLUSIVE", 5.9),
            use("public.t_c", "index", "ACCESS EXCLUSIVE", 5.9),
            use("pg_toast.pg_toast_16391_index", "index", "ACCESS EXCLUSIVE", 5.9,
                table="public.t"),
            use("public.u", "table", "SHARE", 9.0, table="public.u"),
            use("public.u_i", "index", "ACCESS EXCLUSIVE", 0.2, table="public.u"),
        ]
    )  # fmt: skip
    assert [t.line() for t in folded] == [
        "ACCESS EXCLUSIVE on `public.t`, its 3 indexes and TOAST: 5.9 s",
        "ACCESS EXCLUSIVE on `public.u`, its index: 200 ms",
    ]
    assert (folded[0].table_bytes, folded[0].blocks) == (181 * MIB, "reads and writes")
    only_index = locks.per_table([use("public.t_c", "index", "ACCESS EXCLUSIVE", 0.5)])
    assert only_index[0].line() == "ACCESS EXCLUSIVE on an index of `public.t`: 500 ms"


# -- lint.py --------------------------------------------------------------------------------


def test_squawk_reads_the_text_with_lines_from_one_and_ignores_a_config_in_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".squawk.toml").write_text('excluded_rules = ["changing-column-type"]\n')
    monkeypatch.chdir(tmp_path)
    sql = "-- widen the note\nALTER TABLE notes ALTER COLUMN note TYPE text;\n"
    result = lint.run(sql, pg_version=15, in_transaction=True)
    assert result.reason == ""
    assert ("changing-column-type", 2, 2) in [(r.rule, r.line, r.line_end) for r in result.findings]
    # checked NOT VALID then VALIDATE in one transaction blocks reads: squawk says so only
    # when told that the file runs in one
    pair = "ALTER TABLE t ADD CONSTRAINT c CHECK (a > 0) NOT VALID;\n"
    pair += "ALTER TABLE t VALIDATE CONSTRAINT c;\n"
    inside = lint.run(pair, pg_version=15, in_transaction=True).findings
    outside = lint.run(pair, pg_version=15, in_transaction=False).findings
    assert ("constraint-missing-not-valid", 2) in [(r.rule, r.line) for r in inside]
    assert "constraint-missing-not-valid" not in {r.rule for r in outside}


def test_squawk_missing_or_garbled_gives_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    assert lint.parse("not json", returncode=2, stderr="error: boom\n") == lint.Lint(
        [], "squawk's output was not its JSON report: error: boom"
    )
    monkeypatch.setattr(lint, "squawk_binary", lambda: None)
    assert lint.run("SELECT 1;", pg_version=15, in_transaction=False) == lint.Lint(
        [], "squawk is not installed (pip install squawk-cli)"
    )


NOTES = BEFORE | {ITEMS: rel(ITEMS, "public.notes", bytes=8192)}


def test_a_varchar_to_text_change_is_not_observed_without_a_measured_rewrite() -> None:
    sql = "-- widen the note\nALTER TABLE notes ALTER COLUMN note TYPE text;\n"
    raws = lint.run(sql, pg_version=15, in_transaction=True).findings
    log = [
        ddl(T0 + 1.0, "ALTER TABLE", [(ITEMS, "AccessExclusiveLock")]),
        done(T0 + 1.0, 3.0, "ALTER TABLE notes ALTER COLUMN note TYPE text;"),
    ]
    insight = an.analyze(
        before=mark(T0), after=mark(T0 + 9, log=log), relations_before=NOTES,
        relations_after=NOTES, seconds=0.1, statements=migrations.statements(sql),
        ignore_pids=(), lint=raws, thresholds=Thresholds(),
    )  # fmt: skip
    by_rule = {f.rule: f for f in insight.findings}
    found = by_rule["changing-column-type"]
    assert (found.line, found.status, found.evidence, found.statement) == (
        2, "not observed", "no rewrite of `public.notes`", 0
    )  # fmt: skip
    timeout = by_rule["require-lock-timeout"]
    assert (timeout.status, timeout.evidence) == (
        "confirmed",
        "held ACCESS EXCLUSIVE on `public.notes` for 3 ms with no lock_timeout in force "
        "(none set before it in the file)",
    )


def test_lint_findings_are_confirmed_by_what_the_statement_did() -> None:
    def measured(held: float, rewrites: Sequence[Rewrite] = ()) -> list[StatementInsight]:
        lock = LockUse("public.orders", "table", "SHARE", "writes", held, statement=0)
        return [StatementInsight(0, 1, "CREATE INDEX i ON orders (total)", held, [lock],
                                 list(rewrites))]  # fmt: skip

    file_statements = migrations.statements("CREATE INDEX i ON orders (total);\n")
    index_rule = lint.Raw("require-concurrent-index-creation", "blocks writes", 1, 1)
    unique_rule = lint.Raw("disallowed-unique-constraint", "blocks reads", 1, 1)
    type_rule = lint.Raw("changing-column-type", "rewrite", 1, 1)
    outside = lint.Raw("require-concurrent-index-creation", "blocks writes", 7, 7)

    def check(raw: lint.Raw, stmts: list[StatementInsight]) -> tuple[str, str]:
        (found,) = lint.check([raw], file_statements=file_statements, measured=stmts)
        return found.status, found.evidence

    assert check(index_rule, measured(2.3)) == (
        "confirmed", "held SHARE on `public.orders` for 2.3 s"
    )  # fmt: skip
    # however briefly: in production it waits in the lock queue
    assert check(index_rule, measured(0.003)) == (
        "confirmed", "held SHARE on `public.orders` for 3 ms"
    )  # fmt: skip
    assert check(unique_rule, measured(2.3)) == (
        "not observed", "no lock that blocks reads and writes was taken"
    )  # fmt: skip
    rewrite = Rewrite("public.orders", "table", ["column type change"], 1, 1, 0)
    assert check(type_rule, measured(0.003, [rewrite])) == ("confirmed", "rewrote `public.orders`")
    assert check(outside, measured(2.3)) == (
        "not measurable", "the finding's line is in no statement"
    )  # fmt: skip
    assert check(index_rule, [dataclasses.replace(measured(2.3)[0], seconds=None)]) == (
        "not measurable", "the statement was not seen in the server log"
    )  # fmt: skip


def test_require_lock_timeout_is_confirmed_only_for_a_blocking_lock_without_a_timeout() -> None:
    sql = "SET lock_timeout = '2s';\nALTER TABLE orders ADD COLUMN c int;\n"
    file_statements = migrations.statements(sql)
    rule = lint.Raw("require-lock-timeout", "missing lock_timeout", 2, 2)

    def status(texts: Sequence[str], mode: str, **kw: Any) -> tuple[str, str]:
        lock = LockUse("public.orders", "table", mode, locks.blocks(mode), 0.002, statement=1,
                       table="public.orders")  # fmt: skip
        stmts = [StatementInsight(i, i + 1, t, 0.001) for i, t in enumerate(texts)]
        stmts[1] = dataclasses.replace(stmts[1], locks=[lock], **kw)
        (found,) = lint.check([rule], file_statements=file_statements, measured=stmts)
        return found.status, found.evidence

    alter = "ALTER TABLE orders ADD COLUMN c int"
    assert status(["SELECT 1", alter], "ACCESS EXCLUSIVE") == (
        "confirmed",
        "held ACCESS EXCLUSIVE on `public.orders` for 2 ms with no lock_timeout in force "
        "(none set before it in the file)",
    )
    assert status(["SET lock_timeout = '2s'", alter], "ACCESS EXCLUSIVE") == (
        "not observed", "lock_timeout was 2.0 s when it took ACCESS EXCLUSIVE on `public.orders`"
    )  # fmt: skip
    assert status(["SELECT 1", alter], "SHARE UPDATE EXCLUSIVE") == (
        "not observed", "no lock that blocks writes was taken"
    )  # fmt: skip
    # what the trace measured (a role's or database's setting included) wins over the text
    assert status(["SELECT 1", alter], "SHARE", lock_timeout=5.0)[0] == "not observed"
    assert status(["SET lock_timeout = '2s'", alter], "SHARE", lock_timeout=0.0) == (
        "confirmed", "held SHARE on `public.orders` for 2 ms with no lock_timeout in force"
    )  # fmt: skip


TOAST, TOAST_IDX = 16395, 16396
WIDE = BEFORE | {
    TOAST: rel(TOAST, "pg_toast.pg_toast_16384", kind="t", table_oid=ORDERS, bytes=900 * MIB),
    TOAST_IDX: rel(TOAST_IDX, "pg_toast.pg_toast_16384_index", kind="i", table_oid=TOAST,
                   bytes=10 * MIB),
}  # fmt: skip


def test_a_toast_or_index_lock_is_reported_on_its_table_with_the_whole_size() -> None:
    """Equal holds on the table, its index and its TOAST table: the table is named, with the
    size of all of it (the old tie-break by name named ``pg_toast.*``, at ``0 B``)."""
    every = [ORDERS, ORDERS_IDX, TOAST, TOAST_IDX]
    after = {oid: r.replace(filenode=r.filenode + 1) if oid in every else r
             for oid, r in WIDE.items()}  # fmt: skip
    log = [
        done(T0 + 1.0, 1.0, "BEGIN"),
        rewrite_event(T0 + 2.0, ORDERS, 4),
        ddl(T0 + 7.0, "ALTER TABLE", [(oid, "AccessExclusiveLock") for oid in sorted(every)]),
        done(T0 + 7.0, 5900.0, "ALTER TABLE orders ALTER id TYPE bigint"),
        done(T0 + 7.0, 0.5, "COMMIT"),
    ]
    insight = an.analyze(
        before=mark(T0), after=mark(T0 + 9, log=log), relations_before=WIDE,
        relations_after=after, seconds=6.0, statements=None, ignore_pids=(), lint=[],
        thresholds=Thresholds(max_blocking_lock=5.0),
    )  # fmt: skip
    whole = (412 + 1 + 900 + 10) * MIB
    assert [(u.relation, u.table, u.table_bytes) for u in insight.locks] == [
        ("public.orders", "public.orders", whole),
        ("pg_toast.pg_toast_16384", "public.orders", whole),
        ("pg_toast.pg_toast_16384_index", "public.orders", whole),
        ("public.orders_pkey", "public.orders", whole),
    ]
    assert insight.statements[0].locks[0].relation == "public.orders"
    assert {r.table for r in insight.rewrites} == {"public.orders"}
    # a sample that saw the TOAST table's lock a little longer does not put it first
    longer = LockSpan(pid=PID, relation=TOAST, mode="AccessExclusiveLock", granted=True,
                      first=T0 + 1.0, last=T0 + 7.2, query_start=None, query="")  # fmt: skip
    sampled = an.analyze(
        before=mark(T0), after=mark(T0 + 9, log=log, spans=[longer]), relations_before=WIDE,
        relations_after=after, seconds=6.0, statements=None, ignore_pids=(), lint=[],
        thresholds=Thresholds(max_blocking_lock=5.0),
    )  # fmt: skip
    assert [u.relation for u in sampled.locks][:2] == ["public.orders", "pg_toast.pg_toast_16384"]
    assert sampled.verdict.text.startswith("rewrites `public.orders` (1.29 GiB")
    assert insight.verdict == Verdict(
        "over",
        "rewrites `public.orders` (1.29 GiB; column type change) under ACCESS EXCLUSIVE for "
        "5.9 s: add a new column and backfill it in batches instead of changing the type in "
        "place; " + READS,
        "rewrite",
    )
    assert [t.line() for t in locks.per_table(insight.locks)] == [
        "ACCESS EXCLUSIVE on `public.orders`, its 2 indexes and TOAST: 5.9 s"
    ]


def test_an_index_built_again_under_its_name_is_a_rewrite_of_its_table() -> None:
    """ALTER COLUMN ... TYPE drops the column's index and creates it again, same name, new
    oid: a rewrite. A binary-coercible change keeps the old storage: not one."""
    rebuilt = rel(NEW_IDX, "public.orders_pkey", kind="i", table_oid=ORDERS, bytes=3 * MIB)
    after = {oid: r for oid, r in BEFORE.items() if oid != ORDERS_IDX} | {NEW_IDX: rebuilt}
    log = [
        ddl(T0 + 2.0, "ALTER TABLE", [(ORDERS, "AccessExclusiveLock")]),
        done(T0 + 2.0, 40.0, "ALTER TABLE orders ALTER id TYPE bigint"),
    ]
    insight = run(log, after_relations=after)
    assert insight.rewrites == [
        Rewrite("public.orders_pkey", "index", ["re-created"], MIB, 3 * MIB, 0,
                "public.orders", 413 * MIB),
    ]  # fmt: skip
    assert insight.statements[0].rewrites == insight.rewrites
    assert insight.verdict.kind == "rewrite"
    assert insight.verdict.text.startswith(
        "rewrites `public.orders` (413.0 MiB; its indexes built again) under ACCESS EXCLUSIVE"
    )
    kept = {**after, NEW_IDX: rebuilt.replace(filenode=ORDERS_IDX)}
    reused = run(log, after_relations=kept)
    assert (reused.rewrites, reused.verdict.kind) == ([], "blocks reads and writes")


def test_rows_updated_in_a_table_that_existed_before_are_row_locks() -> None:
    after = {
        **BEFORE,
        ITEMS: rel(ITEMS, "public.items", bytes=8192, n_tup_upd=7, n_tup_del=2),
        NEW_IDX: rel(NEW_IDX, "public.fresh", n_tup_ins=5, n_tup_upd=5),
        LEDGER: rel(LEDGER, "pgoverlay_ledger.migrations", n_tup_upd=1),
    }
    log = [done(T0 + 1.0, 30.0, "UPDATE items SET n = n + 1")]
    insight = run(log, after_relations=after)
    assert insight.row_writes == [RowWrites("public.items", 7, 2, 8192)]
    assert (insight.verdict.level, insight.verdict.kind) == ("notice", "row locks")
    assert insight.verdict.text.startswith("updates 7 rows and deletes 2 rows of `public.items`")


def counted(rel: int, *, updated: int = 0, deleted: int = 0, inserted: int = 0) -> tuple[int, ...]:
    """A transaction's own counters of ``rel``, as the trace's functions log them."""
    return (rel, 0, 0, inserted, updated, deleted)


def test_rows_are_the_migrations_own_not_what_other_sessions_wrote_meanwhile() -> None:
    # A preview app updated 62 rows of `orders` while the migration validated a constraint
    # (its DDL event read its transaction's own counters: nothing written) and updated 5
    # rows of `items` (its mark read 5): the tables' counters say 62 and 67.
    after = {
        **BEFORE,
        ORDERS: rel(ORDERS, "public.orders", bytes=412 * MIB, seq_scan=6, seq_tup_read=200,
                    n_tup_upd=62),
        ITEMS: rel(ITEMS, "public.items", bytes=8192, n_tup_ins=10, n_tup_upd=67),
    }  # fmt: skip
    log = [
        ddl(T0 + 1.0, "ALTER TABLE", [(ORDERS, "ShareUpdateExclusiveLock")],
            scans=[counted(ORDERS)]),
        done(T0 + 1.0, 30.0, "ALTER TABLE orders VALIDATE CONSTRAINT orders_positive"),
        ddl(T0 + 2.0, "ALTER TABLE", [(ITEMS, "AccessExclusiveLock"), (ITEMS, "RowExclusiveLock")],
            scans=[counted(ITEMS, updated=5)], vxid="3/26"),
        done(T0 + 2.0, 30.0, "ALTER TABLE items ADD COLUMN note text"),
    ]  # fmt: skip
    insight = run(log, after_relations=after)
    assert insight.row_writes == [RowWrites("public.items", 5, 0, 8192)]
    assert insight.volume.rows_updated == 5
    alone = run(log[:2], after_relations=after)
    assert alone.row_writes == [] and alone.volume.rows_updated == 0
    assert alone.verdict.kind != "row locks", alone.verdict


# -- against a real Postgres ----------------------------------------------------------------


@pytest.fixture(scope="module")
def server_dsn(pool: Pool) -> Iterator[str]:
    with extra_server(pool, "insight") as srv:
        yield psycopg.conninfo.make_conninfo(**srv.conninfo(user="postgres"))


def test_the_conflict_table_is_postgres_own(server_dsn: str) -> None:
    with (
        psycopg.connect(server_dsn, autocommit=True) as holder,
        psycopg.connect(server_dsn, autocommit=True) as asker,
    ):
        holder.execute("CREATE TABLE IF NOT EXISTS conflicts (a int)")
        seen: dict[tuple[str, str], bool] = {}
        for held in locks.MODES:
            for asked in locks.MODES:
                holder.execute("BEGIN")
                holder.execute(f"LOCK TABLE conflicts IN {held} MODE")
                asker.execute("BEGIN")
                try:
                    asker.execute(f"LOCK TABLE conflicts IN {asked} MODE NOWAIT")
                    seen[(held, asked)] = False
                except psycopg.errors.LockNotAvailable:
                    seen[(held, asked)] = True
                asker.execute("ROLLBACK")
                holder.execute("ROLLBACK")
    assert seen == {(a, b): locks.conflicts(a, b) for a in locks.MODES for b in locks.MODES}


def test_rewrite_reason_bits_are_postgres_own(server_dsn: str) -> None:
    """The table_rewrite event's reasons for each kind of rewrite; varchar -> text has none."""
    setup = """
        CREATE TABLE reasons (n serial, reason int);
        CREATE FUNCTION note_rewrite() RETURNS event_trigger LANGUAGE plpgsql AS $$
        BEGIN INSERT INTO reasons (reason) VALUES (pg_event_trigger_table_rewrite_reason());
        END $$;
        CREATE EVENT TRIGGER note_rewrite ON table_rewrite EXECUTE FUNCTION note_rewrite();
        CREATE ACCESS METHOD heap2 TYPE TABLE HANDLER heap_tableam_handler;
        CREATE TABLE t (a int, note varchar(20));
        INSERT INTO t SELECT g, 'x' FROM generate_series(1, 100) g;
    """
    changes = [
        "ALTER TABLE t ALTER note TYPE text",
        "ALTER TABLE t ALTER a TYPE bigint",
        "ALTER TABLE t ADD b float8 DEFAULT random()",
        "ALTER TABLE t SET UNLOGGED",
        "ALTER TABLE t SET ACCESS METHOD heap2",
        # a stored generated column is a "volatile default" to Postgres (verdict.py's
        # _TEXT_FIRST gives it its own advice)
        "ALTER TABLE t ADD c bigint GENERATED ALWAYS AS (a * 2) STORED",
    ]
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE rewrites")
    with psycopg.connect(server_dsn, dbname="rewrites", autocommit=True) as conn:
        conn.execute(setup)
        for change in changes:
            conn.execute(change)
        rows = conn.execute("SELECT reason FROM reasons ORDER BY n").fetchall()
    assert [rewrites.rewrite_reasons(r) for (r,) in rows] == [
        ["column type change"],
        ["volatile default"],
        ["SET LOGGED/UNLOGGED"],
        ["access method"],
        ["volatile default"],
    ]
