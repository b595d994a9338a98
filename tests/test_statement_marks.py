"""Statement marks and documented locks, pure: where a file is marked (and where not), what
the log reader trusts, and the modes Postgres documents for statements no event trigger sees.
The real apply path is in test_exact_locks."""

from __future__ import annotations

import json
from typing import Any

from test_insight_analysis import BEFORE, ITEMS, ORDERS, ORDERS_IDX, PID, T0, done, run

from pgoverlay.action import migrations
from pgoverlay.action.insight import documented, logparse, marks
from pgoverlay.runner.service.views import LockSpan, LogEntry

NONCE = "ab" * 16


def _marked(text: str, *, single: bool = True) -> marks.Marked:
    return marks.instrument(text, nonce=NONCE, single_transaction=single)


def test_a_mark_follows_each_statement_on_its_own_line() -> None:
    text = "CREATE TABLE a (x int);\nALTER TABLE a\n  ADD y int;  -- note\nSELECT 1; SELECT 2;\n"
    found = _marked(text)
    assert found.marked == {0, 1, 2, 3}
    assert found.text.splitlines() == [
        f"CREATE TABLE a (x int)\\; CALL pgoverlay_trace.statement_end('{NONCE}', 0);",
        "ALTER TABLE a",
        f"  ADD y int\\; CALL pgoverlay_trace.statement_end('{NONCE}', 1);  -- note",
        f"SELECT 1\\; CALL pgoverlay_trace.statement_end('{NONCE}', 2); "
        f"SELECT 2\\; CALL pgoverlay_trace.statement_end('{NONCE}', 3);",
    ]


def test_statements_a_mark_could_change_are_left_unmarked() -> None:
    text = (
        "BEGIN;\n"  # 0: transaction control
        "UPDATE t SET a = 1;\n"  # 1
        "COPY t FROM STDIN;\n"  # 2: its data follows
        "1;2\n"
        "\\.\n"
        "SELECT E'a\\'; b';\n"  # an escape string: psql and sqlparse may part
        "COMMIT;\n"
        "CREATE INDEX CONCURRENTLY i ON t (a);\n"
        "DO $$ BEGIN COMMIT; END $$;\n"
        "LOCK TABLE t;\n"
        "UPDATE t SET a = 2\n"  # the last, without its semicolon
    )
    statements = migrations.statements(text)
    found = _marked(text, single=False)
    marked_texts = [statements[i].text for i in sorted(found.marked)]
    assert marked_texts == ["UPDATE t SET a = 1;"]
    # Every line is where it was.
    assert len(found.text.splitlines()) == len(text.splitlines())
    assert found.text.splitlines()[3:] == text.splitlines()[3:]
    # Settings are not marked: SET TRANSACTION must come before any query, a call included.
    assert _marked(
        "SET search_path = a;\nSET TRANSACTION ISOLATION LEVEL SERIALIZABLE;\n"
    ).marked == (frozenset())
    # In one transaction, DO and LOCK may be marked: they run in a block anyway.
    single = _marked("DO $$ BEGIN NULL; END $$;\nLOCK TABLE t;\n", single=True)
    assert single.marked == {0, 1}


def test_a_file_psql_could_not_read_from_standard_input_is_not_marked() -> None:
    for command in ("\\ir other.sql", "\\! cat", "\\copy t from pstdin", "\\o | tee x"):
        text = f"UPDATE t SET a = 1;\n{command}\n"
        found = _marked(text)
        assert found.marked == frozenset() and "standard input" in found.reason, command
        assert found.text == text
    assert _marked("UPDATE t SET a = 1;\n\\i other.sql\n").marked == {0}


def test_a_long_file_is_marked_up_to_a_budget_and_says_so() -> None:
    text = "UPDATE t SET a = 1;\n" * (marks.MAX_MARKED + 3)
    found = _marked(text)
    assert found.marked == frozenset(range(marks.MAX_MARKED))
    assert f"only the first {marks.MAX_MARKED} of the file's" in found.reason
    assert _marked("UPDATE t SET a = 1;\n").reason == ""


def test_the_logged_query_is_the_statement_without_its_call() -> None:
    logged = f"UPDATE t SET a = 1; CALL pgoverlay_trace.statement_end('{NONCE}', 4);"
    assert logparse.split_call(logged) == ("UPDATE t SET a = 1;", (NONCE, 4))
    assert logparse.split_call("UPDATE t SET a = 1;") == ("UPDATE t SET a = 1;", None)
    message = f"LINE 2:  nope; CALL pgoverlay_trace.statement_end('{NONCE}', 3);\n         ^"
    assert marks.scrub(message) == "LINE 2:  nope;\n         ^"


# -- what Postgres documents --------------------------------------------------------------


def test_documented_locks_of_statements_no_event_trigger_sees() -> None:
    def modes(text: str) -> list[tuple[int, str]]:
        return documented.locks(text, BEFORE)

    ae = "ACCESS EXCLUSIVE"
    assert modes("TRUNCATE orders, ONLY public.items RESTART IDENTITY") == [
        (ORDERS, ae),
        (ITEMS, ae),
    ]
    assert modes('truncate table "orders";') == [(ORDERS, ae)]
    assert modes("/* first */ -- then\n  TRUNCATE orders") == [(ORDERS, ae)]
    assert modes("LOCK orders IN SHARE ROW EXCLUSIVE MODE NOWAIT") == [
        (ORDERS, "SHARE ROW EXCLUSIVE")
    ]
    assert modes("LOCK TABLE items") == [(ITEMS, ae)]
    assert modes("CLUSTER VERBOSE orders USING orders_pkey") == [(ORDERS, ae)]
    assert modes("VACUUM (FULL, ANALYZE) orders (total), items") == [(ORDERS, ae), (ITEMS, ae)]
    assert modes("VACUUM FULL VERBOSE orders") == [(ORDERS, ae)]
    assert modes("VACUUM (FULL false) orders") == []
    assert modes("VACUUM ANALYZE orders") == []
    assert modes("REINDEX INDEX orders_pkey") == [(ORDERS, "SHARE"), (ORDERS_IDX, ae)]
    # a concurrent drop ends with ACCESS EXCLUSIVE on the index it removes (documented.DYING)
    assert modes("REINDEX TABLE CONCURRENTLY orders") == [
        (ORDERS, "SHARE UPDATE EXCLUSIVE"),
        (ORDERS_IDX, "SHARE UPDATE EXCLUSIVE"),
        (ORDERS_IDX, ae),
    ]
    assert modes("REINDEX (VERBOSE) TABLE orders") == [(ORDERS, "SHARE"), (ORDERS_IDX, ae)]
    assert modes("CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS o_t ON ONLY orders (t)") == [
        (ORDERS, "SHARE UPDATE EXCLUSIVE")
    ]
    assert modes("CREATE INDEX CONCURRENTLY ON orders USING btree (t)") == [
        (ORDERS, "SHARE UPDATE EXCLUSIVE")
    ]
    assert modes("DROP INDEX CONCURRENTLY IF EXISTS orders_pkey") == [
        (ORDERS, "SHARE UPDATE EXCLUSIVE"),
        (ORDERS_IDX, "SHARE UPDATE EXCLUSIVE"),
        (ORDERS_IDX, ae),
    ]
    # a data change: ROW EXCLUSIVE on its target and each of the target's indexes, read from
    # the statement's head alone
    rx = "ROW EXCLUSIVE"
    assert modes("UPDATE orders SET t = 1 WHERE t = 0") == [(ORDERS, rx), (ORDERS_IDX, rx)]
    assert modes("-- batch\nDELETE FROM public.orders WHERE t < 0") == [
        (ORDERS, rx),
        (ORDERS_IDX, rx),
    ]
    assert modes("insert into items values (1)") == [(ITEMS, rx)]
    assert modes("MERGE INTO ONLY orders USING items ON true WHEN MATCHED THEN DELETE") == [
        (ORDERS, rx),
        (ORDERS_IDX, rx),
    ]
    assert modes("INSERT INTO missing VALUES (1)") == []
    # Names that resolve to nothing, or to another schema's table, give nothing.
    assert modes("TRUNCATE other.orders") == []
    assert modes("TRUNCATE missing") == []
    assert modes("ALTER TABLE orders ADD x int") == []


# -- what the log reader trusts -----------------------------------------------------------


def _mark_entry(at: float, statement: int, held: list[tuple[int, str]], **kw: Any) -> LogEntry:
    event = {
        "event": "statement",
        "nonce": kw.get("nonce", NONCE),
        "statement": statement,
        "vxid": kw.get("vxid", "3/25"),
        "at": at,
        "lock_timeout_ms": kw.get("lock_timeout_ms", 0),
        "locks": [{"rel": r, "mode": m} for r, m in held],
        "scans": [],
    }
    return LogEntry(
        time=at, pid=kw.get("pid", PID), level="LOG", message="pgoverlay-trace " + json.dumps(event)
    )


def _call(text: str, index: int, nonce: str = NONCE) -> str:
    return f"{text} CALL pgoverlay_trace.statement_end('{nonce}', {index});"


SQL = "UPDATE orders SET total = 0 WHERE id = 1;\nTRUNCATE items;\n"


def _analyse(log: list[LogEntry], **kw: Any) -> Any:
    marked = marks.instrument(SQL, nonce=NONCE, single_transaction=True)
    return run(log, sql=SQL, marked=marked, **kw)


def test_marks_give_each_statement_its_exact_locks_and_lock_timeout() -> None:
    log = [
        done(T0 + 1.0, 1.0, "BEGIN"),
        _mark_entry(T0 + 1.2, 0, [(ORDERS, "RowExclusiveLock")], lock_timeout_ms=1500),
        done(T0 + 1.2, 200.0, _call("UPDATE orders SET total = 0 WHERE id = 1;", 0)),
        _mark_entry(T0 + 1.3, 1, [(ORDERS, "RowExclusiveLock"), (ITEMS, "AccessExclusiveLock")]),
        done(T0 + 1.3, 100.0, _call("TRUNCATE items;", 1)),
        done(T0 + 2.0, 1.0, "COMMIT"),
    ]
    insight = _analyse(log)
    got = {(u.relation, u.mode, u.source, u.statement, u.held_seconds) for u in insight.locks}
    assert got == {
        ("public.orders", "ROW EXCLUSIVE", "exact", 0, 1.0),
        ("public.items", "ACCESS EXCLUSIVE", "exact", 1, 0.8),
    }
    assert [s.lock_timeout for s in insight.statements] == [1.5, 0.0]
    assert insight.notes == []


def test_a_mark_with_another_nonce_or_claimed_twice_is_left_out() -> None:
    other = "cd" * 16
    log = [
        done(T0 + 1.0, 1.0, "BEGIN"),
        # The role's own call, inside its statement, with a nonce it guessed: ignored.
        _mark_entry(T0 + 1.1, 1, [], nonce=other),
        _mark_entry(T0 + 1.2, 0, [(ORDERS, "RowExclusiveLock")]),
        done(T0 + 1.2, 200.0, _call("UPDATE orders SET total = 0 WHERE id = 1;", 0)),
        # A query that claims statement 1 twice (it read the nonce): both claims are void.
        _mark_entry(T0 + 1.25, 1, []),
        done(T0 + 1.25, 10.0, _call("SELECT 1;", 1)),
        _mark_entry(T0 + 1.3, 1, [(ITEMS, "AccessExclusiveLock")]),
        done(T0 + 1.3, 50.0, _call("TRUNCATE items;", 1)),
        done(T0 + 2.0, 1.0, "COMMIT"),
    ]
    insight = _analyse(log)
    got = {(u.relation, u.mode, u.source) for u in insight.locks}
    # Statement 0 is exact; TRUNCATE's lock is not taken from a void mark, but it is not lost:
    # Postgres documents its mode.
    assert got == {
        ("public.orders", "ROW EXCLUSIVE", "exact"),
        ("public.items", "ACCESS EXCLUSIVE", "inferred"),
    }
    assert insight.statements[1].lock_timeout is None
    notes = " ".join(insight.notes)
    assert "1 statement mark not made by the engine for this migration" in notes
    assert "the mark of statement 2 came from more than one query" in notes


def test_a_lock_one_statement_held_across_its_transactions_is_one_span() -> None:
    """The sampler folds per transaction; CREATE INDEX CONCURRENTLY's session lock is seen in
    three: the analysis joins the pieces of one statement into its whole span."""

    def span(first: float, last: float) -> LockSpan:
        return LockSpan(
            pid=PID,
            relation=ORDERS,
            mode="ShareUpdateExclusiveLock",
            granted=True,
            first=first,
            last=last,
            query_start=None,
            query="",
        )

    log = [done(T0 + 3.0, 2000.0, "CREATE INDEX CONCURRENTLY o_t ON some_other_table (t)")]
    spans = [span(T0 + 1.02, T0 + 1.5), span(T0 + 1.55, T0 + 2.4), span(T0 + 2.45, T0 + 2.98)]
    insight = run(log, spans=spans)
    (lock,) = insight.locks
    assert (lock.mode, lock.source, lock.held_seconds) == (
        "SHARE UPDATE EXCLUSIVE",
        "sampled",
        1.96,
    )


def test_notes_say_where_a_lock_may_have_been_missed() -> None:
    rewritten = {**BEFORE, ITEMS: BEFORE[ITEMS].replace(filenode=99999)}
    # a data change no documented mode covers (an INSERT's is: ROW EXCLUSIVE on its target)
    change = "DO $$ BEGIN INSERT INTO items VALUES (1); END $$"
    log = [done(T0 + 1.0, 3.0, change), done(T0 + 2.0, 3.0, "SELECT 1")]
    insight = run(log, after_relations=rewritten)
    notes = " ".join(insight.notes)
    assert "1 statement whose locks were only sampled ran for less than" in notes
    assert f"`{change}`" in notes
    assert "`public.items` rewritten with no lock seen on its table" in notes


def test_an_unmarked_statement_gives_its_locks_to_the_next_mark_held_from_its_own_start() -> None:
    sql = "COPY items FROM STDIN;\n1\n\\.\nUPDATE orders SET total = 0;\n"
    marked = marks.instrument(sql, nonce=NONCE, single_transaction=True)
    assert marked.marked == {1}
    log = [
        done(T0 + 1.0, 1.0, "BEGIN"),
        done(T0 + 1.5, 500.0, "COPY items FROM STDIN;"),
        _mark_entry(T0 + 2.0, 1, [(ITEMS, "RowExclusiveLock"), (ORDERS, "RowExclusiveLock")]),
        done(T0 + 2.0, 500.0, _call("UPDATE orders SET total = 0;", 1)),
        done(T0 + 3.0, 1.0, "COMMIT"),
    ]
    insight = run(log, sql=sql, marked=marked)
    got = {(u.relation, u.statement, u.held_seconds, u.source) for u in insight.locks}
    assert got == {("public.items", 1, 2.0, "exact"), ("public.orders", 1, 2.0, "exact")}


def test_statements_postgres_refuses_in_a_transaction_block_keep_the_file_out_of_one() -> None:
    for statement in (
        "ALTER TABLE p DETACH PARTITION p1 CONCURRENTLY;",
        "REINDEX SCHEMA public;",
        "CLUSTER;",
        "VACUUM orders;",
        "CREATE INDEX CONCURRENTLY i ON t (a);",
    ):
        assert migrations.needs_no_transaction(f"SELECT 1;\n{statement}\n"), statement
    for statement in (
        "CLUSTER orders;",
        "REINDEX TABLE orders;",
        "ALTER TABLE p DETACH PARTITION p1;",
    ):
        assert not migrations.needs_no_transaction(f"SELECT 1;\n{statement}\n"), statement


def test_a_sample_of_a_lock_postgres_documents_adds_no_second_entry() -> None:
    """A sampled sighting of an inferred lock before its statement's logged start (the log's
    end is written a moment after the statement ends, later on a busy server, and cut to the
    millisecond) goes to the statement before: it must not stand beside the inferred lock,
    nor replace it for being longer."""
    log = [
        done(T0 + 1.0, 1.0, "BEGIN"),
        done(T0 + 1.1, 5.0, "LOCK TABLE orders IN SHARE MODE"),
        done(T0 + 1.5, 1.0, "COMMIT"),
    ]
    sighting = LockSpan(
        pid=PID,
        relation=ORDERS,
        mode="ShareLock",
        granted=True,
        first=T0 + 1.08,
        last=T0 + 1.5,
        query_start=None,
        query="",
    )
    insight = run(log, spans=[sighting])
    assert [(u.mode, u.source, u.statement, u.held_seconds) for u in insight.locks] == [
        ("SHARE", "inferred", 0, 0.405)
    ]
