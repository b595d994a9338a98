"""What one migration rewrote and scanned, and the rows it wrote (``analyze``). Pure."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence

from pgoverlay.action.insight import locks, logparse
from pgoverlay.action.insight.heldlocks import stronger
from pgoverlay.action.insight.model import LockUse, Rewrite, RowWrites, Scan, Volume
from pgoverlay.action.insight.verdict import RECREATED, REWRITE_REASONS, WITH_TABLE
from pgoverlay.action.insight.work import SCANNED_KINDS, Analysis, Scanned
from pgoverlay.runner.names import LEDGER_SCHEMA
from pgoverlay.runner.service.views import RelationState, TraceMark


def rewrite_reasons(bits: int) -> list[str]:
    """Postgres's AT_REWRITE_* bits of a table_rewrite event, in words."""
    return [name for bit, name in REWRITE_REASONS if bits & bit]


def find_rewrites(
    work: Analysis,
    logged: Sequence[logparse.Statement],
    index_of: Mapping[int, int],
    uses: Sequence[LockUse],
) -> list[Rewrite]:
    """Relations whose filenode changed, with the reasons and statement of the rewrite events
    that named them or their table (else the statement that held ACCESS EXCLUSIVE on them)."""
    changed = {
        oid: (old, new)
        for oid, new in work.after.items()
        if (old := work.before.get(oid)) is not None
        and not work.ledger(old)
        and old.filenode
        and new.filenode
        and old.filenode != new.filenode
    }
    events: dict[int, list[tuple[int | None, int]]] = defaultdict(list)
    for position, stmt in enumerate(logged):
        for event in stmt.rewrites:
            events[event.relation].append((index_of.get(position), event.reason))
    found: list[Rewrite] = []
    for oid, (old, new) in changed.items():
        table = new.table_oid
        named = events[oid] or (events[table] if table is not None else [])
        statement = named[0][0] if named else _exclusive_holder(work, uses, oid, table)
        reasons: list[str] = []
        for index, bits in events[oid]:
            if index == statement:
                reasons += [r for r in rewrite_reasons(bits) if r not in reasons]
        if table is not None and table in changed:
            reasons.append(WITH_TABLE)
        found.append(_rewrite(work, oid, old, new, reasons, statement, table=work.owner(oid)))
        found += _later_rewrites(found[-1], named, with_table=WITH_TABLE in reasons)
    found += _recreated(work, uses, events, rewritten={o for o in changed})
    return sorted(found, key=lambda r: (-r.bytes_after, r.relation, r.statement or 0))


def _recreated(
    work: Analysis,
    uses: Sequence[LockUse],
    events: Mapping[int, Sequence[tuple[int | None, int]]],
    *,
    rewritten: Collection[int],
) -> list[Rewrite]:
    """Indexes and TOAST tables of tables that existed before, dropped and made again by the
    migration under the same name: ``ALTER COLUMN ... TYPE`` creates its column's indexes
    again with new OIDs (a rewrite of the index), and a table's rewrite gives it a new TOAST
    table (and TOAST index) renamed as the old one was. One whose storage was kept (a
    binary-coercible type change, such as varchar widening, keeps its index's relfilenode) was
    not built again and is not one."""
    dropped: dict[tuple[str, str, int], RelationState] = {
        (old.schema_name, old.name, work.owner(oid)): old
        for oid, old in work.before.items()
        if oid not in work.after
        and old.kind in ("i", "I", "t")
        and old.table_oid is not None
        and old.schema_name != LEDGER_SCHEMA
    }
    found: list[Rewrite] = []
    for oid, new in work.after.items():
        old = dropped.get((new.schema_name, new.name, work.owner(oid)))
        if oid in work.before or old is None or new.filenode == old.filenode:
            continue
        table = work.owner(old.oid)
        named = events.get(table, [])
        statement = named[0][0] if named else _exclusive_holder(work, uses, table, None)
        toast = old.kind == "t" or work.owner(old.table_oid or 0) != old.table_oid
        reasons = [WITH_TABLE] if toast else [RECREATED]
        if not toast and table in rewritten:
            reasons.append(WITH_TABLE)
        found.append(_rewrite(work, oid, old, new, reasons, statement, table=table))
    return found


def _later_rewrites(
    first: Rewrite, named: Sequence[tuple[int | None, int]], *, with_table: bool
) -> list[Rewrite]:
    """The same relation rewritten again by later statements of the migration (two ALTERs of
    one table): one entry for each, with that statement's own reasons. Sizes are the
    migration's: the trace measures them before and after it, not between statements."""
    by_statement: dict[int, list[str]] = {}
    for index, bits in named:
        if index is None or index == first.statement:
            continue
        own = by_statement.setdefault(index, [])
        if first.kind == "table" or not with_table:
            own += [r for r in rewrite_reasons(bits) if r not in own]
    return [
        dataclasses.replace(
            first, reasons=[*reasons, *([WITH_TABLE] if with_table else [])], statement=index
        )
        for index, reasons in by_statement.items()
    ]


def _rewrite(
    work: Analysis,
    oid: int,
    old: RelationState,
    new: RelationState,
    reasons: list[str],
    statement: int | None,
    *,
    table: int,
) -> Rewrite:
    """Relation ``oid`` rewritten from ``old`` to ``new`` (sizes), counted on ``table``."""
    return Rewrite(
        relation=work.name(oid),
        kind=work.kind(oid),
        reasons=reasons,
        bytes_before=old.bytes,
        bytes_after=new.bytes,
        statement=statement,
        table=work.name(table),
        table_bytes=work.whole[table],
    )


def first_per_relation(rewrites: Sequence[Rewrite]) -> list[Rewrite]:
    """One entry per relation for the migration, with every statement's reasons."""
    merged: dict[str, Rewrite] = {}
    for r in sorted(rewrites, key=lambda r: r.statement if r.statement is not None else -1):
        known = merged.get(r.relation)
        if known is None:
            merged[r.relation] = r
        else:
            reasons = [*known.reasons, *(x for x in r.reasons if x not in known.reasons)]
            merged[r.relation] = dataclasses.replace(known, reasons=reasons)
    return sorted(merged.values(), key=lambda r: (-r.bytes_after, r.relation))


def _exclusive_holder(
    work: Analysis, uses: Sequence[LockUse], oid: int, table: int | None
) -> int | None:
    """The first statement that held ACCESS EXCLUSIVE on the relation or its table."""
    names = {work.name(oid)} | ({work.name(table)} if table is not None else set())
    holders = [
        u.statement
        for u in uses
        if u.relation in names and u.mode == "ACCESS EXCLUSIVE" and u.statement is not None
    ]
    return min(holders, default=None)


def statement_scans(work: Analysis, index: int) -> list[Scan]:
    return sorted(
        (
            Scan(work.name(oid), s.scans, s.rows, s.under, index)
            for (i, oid), s in work.scanned.items()
            if i == index
        ),
        key=lambda s: (-s.rows_read, s.relation),
    )


def migration_scans(work: Analysis, migration_locks: Sequence[LockUse]) -> list[Scan]:
    """Per table, the larger of the statements' scans and the table's own counters' delta,
    on tables that had a lock blocking writes in the window."""
    under: dict[int, str] = {}
    by_name = {work.name(oid): oid for oid in work.before}
    for use in migration_locks:
        oid = by_name.get(use.relation)
        if oid is not None and locks.covers(use.blocks, "writes"):
            under[oid] = stronger(under.get(oid, ""), use.mode)
    totals: dict[int, Scanned] = defaultdict(Scanned)
    statements: dict[int, set[int | None]] = defaultdict(set)
    for (index, oid), s in work.scanned.items():
        totals[oid].scans += s.scans
        totals[oid].rows += s.rows
        totals[oid].under = stronger(totals[oid].under, s.under)
        statements[oid].add(index)
    found: list[Scan] = []
    for oid in set(under) | set(totals):
        if work.kind(oid) not in SCANNED_KINDS:
            continue
        old, new = work.before.get(oid), work.after.get(oid)
        scans, rows = totals[oid].scans, totals[oid].rows
        if old is not None and new is not None and oid in under:
            scans = max(scans, new.seq_scan - old.seq_scan)
            rows = max(rows, new.seq_tup_read - old.seq_tup_read)
        if scans <= 0:
            continue
        who = statements[oid]
        found.append(
            Scan(
                relation=work.name(oid),
                scans=scans,
                rows_read=rows,
                under=stronger(totals[oid].under, under.get(oid, "")),
                statement=next(iter(who)) if len(who) == 1 else None,
            )
        )
    return sorted(found, key=lambda s: (-s.rows_read, s.relation))


def rows_written(work: Analysis, *, instrumented: bool) -> dict[int, tuple[int, int, int]]:
    """Rows the migration inserted, updated and deleted, per table (not the ledger's).

    What its transactions' own counters say (read exactly, with its locks, at each statement
    mark and DDL event), so another session's writes to the same table meanwhile (a preview
    app, a reviewer) are never counted as the migration's. A table's own counters (the
    statistics views' delta over the migration, which count every session's writes) stand in
    only where no transaction counter could see the writes: a table the migration created
    (nobody else knew it), one it held ``ROW EXCLUSIVE`` on through a statement no mark or
    event read (a data change in a migrate command, whose mode is inferred or sampled), and
    every table when the trace read no counters (no event triggers, or a base prepared
    before they were read)."""
    exact: dict[int, tuple[int, int, int]] = {}
    for (_, oid), (ins, upd, dele) in work.written.items():
        known = exact.get(oid, (0, 0, 0))
        exact[oid] = (known[0] + ins, known[1] + upd, known[2] + dele)
    unread = {
        oid
        for (index, oid, mode), hold in work.holds.items()
        if mode == "ROW EXCLUSIVE" and hold.source != "exact"
        and (index is not None or work.command)
    }  # fmt: skip
    whole = work.uncounted or not instrumented
    found: dict[int, tuple[int, int, int]] = {}
    for oid, rel in work.after.items():
        if rel.kind != "r" or work.ledger(rel):
            continue
        prior = work.before.get(oid)
        if whole or prior is None or oid in unread:
            counted = (
                max(0, rel.n_tup_ins - (prior.n_tup_ins if prior else 0)),
                max(0, rel.n_tup_upd - (prior.n_tup_upd if prior else 0)),
                max(0, rel.n_tup_del - (prior.n_tup_del if prior else 0)),
            )
        else:
            counted = exact.get(oid, (0, 0, 0))
        if any(counted):
            found[oid] = counted
    return found


def row_writes(work: Analysis, rows: Mapping[int, tuple[int, int, int]]) -> list[RowWrites]:
    """Tables that existed before the migration (not the ledger) whose rows it updated or
    deleted, most rows first."""
    found = [
        RowWrites(work.name(oid), upd, dele, work.whole[oid])
        for oid, (_, upd, dele) in rows.items()
        if (upd or dele) and work.counts(oid)
    ]
    return sorted(found, key=lambda w: (-(w.rows_updated + w.rows_deleted), w.relation))


def volume(before: TraceMark, after: TraceMark, rows: Mapping[int, tuple[int, int, int]]) -> Volume:
    """Rows the migration wrote to tables (``rows_written``), WAL written, the layer's growth."""
    return Volume(
        rows_inserted=sum(r[0] for r in rows.values()),
        rows_updated=sum(r[1] for r in rows.values()),
        rows_deleted=sum(r[2] for r in rows.values()),
        wal_bytes=max(0, after.wal_lsn - before.wal_lsn),
        layer_bytes=after.layer.physical_bytes - before.layer.physical_bytes,
    )
