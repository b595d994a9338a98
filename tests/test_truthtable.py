"""How the truth table turns Postgres's own readings into a truth (pure: no server): the kind
rule's order, what counts as a rewrite, and what is folded onto a table."""

from __future__ import annotations

import truthtable
from truthtable import Rel, Snapshot

T, T_PKEY, TOAST, TOAST_INDEX, REF = 16384, 16390, 16387, 16388, 16400


def catalog(**filenodes: int) -> Snapshot:
    """A table with a primary key and a TOAST table, and a second table ``ref``."""
    rels = [
        Rel(T, "s.t", "r", filenodes.get("t", T), 0),
        Rel(T_PKEY, "s.t_pkey", "i", filenodes.get("t_pkey", T_PKEY), T),
        Rel(TOAST, "pg_toast.pg_toast_16384", "t", filenodes.get("toast", TOAST), T),
        Rel(TOAST_INDEX, "pg_toast.pg_toast_16384_index", "i", TOAST_INDEX, TOAST),
        Rel(REF, "s.ref", "r", REF, 0),
    ]
    return {rel.oid: rel for rel in rels}


def judge(
    after: Snapshot,
    held: list[tuple[int, str]],
    *,
    scans: dict[int, int] | None = None,
    changed: dict[int, int] | None = None,
    passing: list[tuple[int, str]] | None = None,
) -> truthtable.Truth:
    return truthtable.judge(
        catalog(), after, held, passing or [], scans or {}, changed or {}, exact=True
    )


def test_a_toast_tables_new_file_is_a_rewrite_of_its_table() -> None:
    truth = judge(catalog(toast=99999), [(T, "ACCESS EXCLUSIVE")])
    assert truth.rewritten == {"s.t"}
    assert truth.kind == "rewrite"


def test_an_index_recreated_with_a_new_oid_is_a_rewrite_of_its_table() -> None:
    after = {oid: rel for oid, rel in catalog().items() if oid != T_PKEY}
    after[20000] = Rel(20000, "s.t_pkey", "i", 20000, T)
    truth = judge(after, [(T, "SHARE UPDATE EXCLUSIVE")])
    assert truth.rewritten == {"s.t"}


def test_a_dropped_index_is_no_rewrite() -> None:
    after = {oid: rel for oid, rel in catalog().items() if oid != T_PKEY}
    truth = judge(after, [(T, "ACCESS EXCLUSIVE"), (T_PKEY, "ACCESS EXCLUSIVE")])
    assert truth.rewritten == set()
    assert truth.kind == "blocks reads and writes"


def test_the_first_kind_that_applies_wins() -> None:
    assert judge(catalog(), [(T_PKEY, "ACCESS EXCLUSIVE")]).kind == "blocks reads and writes"
    assert judge(catalog(), [(REF, "SHARE ROW EXCLUSIVE")]).kind == "blocks writes"
    row_locks = judge(catalog(), [(T, "ROW EXCLUSIVE")], changed={T: 100})
    assert row_locks.kind == "row locks"
    assert judge(catalog(), [(T, "SHARE UPDATE EXCLUSIVE")]).kind == "safe online"


def test_a_lock_seen_only_while_the_statement_ran_counts_for_the_kind_not_the_held_set() -> None:
    truth = judge(
        catalog(), [(T, "SHARE UPDATE EXCLUSIVE")], passing=[(T_PKEY, "ACCESS EXCLUSIVE")]
    )
    assert truth.locks == {("s.t", "SHARE UPDATE EXCLUSIVE")}
    assert truth.passing == {("s.t_pkey", "ACCESS EXCLUSIVE")}
    assert truth.kind == "blocks reads and writes"
    assert truth.strongest() == {"s.t": "ACCESS EXCLUSIVE"}


def test_a_scan_counts_only_under_a_lock_on_the_table_that_blocks_writes() -> None:
    under_share = judge(catalog(), [(T, "SHARE"), (REF, "ACCESS SHARE")], scans={T: 1, REF: 1})
    assert under_share.scanned == {"s.t"}
    validating = judge(catalog(), [(T, "SHARE UPDATE EXCLUSIVE")], scans={T: 1})
    assert validating.scanned == set()


def test_relations_made_by_the_statement_do_not_count() -> None:
    after = {**catalog(), 30000: Rel(30000, "s.n", "r", 30000, 0)}
    truth = judge(after, [(30000, "ACCESS EXCLUSIVE")], changed={30000: 5})
    assert truth.locks == set()
    assert truth.kind == "safe online"


def test_pg_locks_mode_names_read_as_the_documentation_writes_them() -> None:
    assert truthtable.mode_name("ShareRowExclusiveLock") == "SHARE ROW EXCLUSIVE"
    assert truthtable.mode_name("AccessShareLock") == "ACCESS SHARE"
