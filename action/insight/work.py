"""The state of one migration's analysis (``analyze``): the branch's relations before and
after it, and the locks and scans attributed to each statement so far. Plain data."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from pgoverlay.action.insight import ledgers, locks
from pgoverlay.action.insight.model import LockSource
from pgoverlay.runner.names import LEDGER_SCHEMA
from pgoverlay.runner.service.views import RelationState

KINDS = {
    "r": "table",
    "p": "partitioned table",
    "i": "index",
    "I": "partitioned index",
    "m": "materialized view",
    "S": "sequence",
    "t": "TOAST table",
    "v": "view",
    "f": "foreign table",
    "c": "composite type",
}

Relations = Mapping[int, RelationState]


@dataclass
class Hold:
    held: float = 0.0
    waited: float = 0.0
    source: LockSource = "sampled"


# How well a lock is known, worst first: an entry is as good as its best source.
_SOURCE_RANK: dict[LockSource, int] = {"sampled": 0, "inferred": 1, "exact": 2}


@dataclass
class Scanned:
    scans: int = 0
    rows: int = 0
    under: str = ""


class Analysis:
    """The state of one analysis: relation lookups and what was attributed to whom."""

    def __init__(self, before: Relations, after: Relations, *, command: bool = False) -> None:
        self.before = before
        self.after = after
        self.command = command  # a migrate command's: the tool's own tables are its bookkeeping
        self.holds: dict[tuple[int | None, int, str], Hold] = defaultdict(Hold)
        self.scanned: dict[tuple[int | None, int], Scanned] = defaultdict(Scanned)
        # Indexes a concurrent drop removed: their last lock decides nothing (``documented``).
        self.dying: set[int] = set()
        # Rows each of the migration's transactions wrote, by its own counters (the last read
        # of a transaction is its whole): (vxid, relation) -> (inserted, updated, deleted).
        self.written: dict[tuple[str, int], tuple[int, int, int]] = {}
        # Whether a read lacked them (a base prepared before the trace read them): the tables'
        # own counters are then the only count.
        self.uncounted = False
        # Each table's whole size before the migration: itself, its TOAST and their indexes.
        self.whole: dict[int, int] = defaultdict(int)
        for oid, rel in before.items():
            self.whole[self.owner(oid)] += rel.bytes

    def state(self, oid: int) -> RelationState | None:
        return self.before.get(oid) or self.after.get(oid)

    def counts(self, oid: int) -> bool:
        """Whether a relation is one production has: it existed before, outside the ledger."""
        rel = self.before.get(oid)
        return rel is not None and not self.ledger(rel)

    def ledger(self, rel: RelationState) -> bool:
        """Whether a relation is bookkeeping: pgoverlay's ledger, or a migration tool's (a
        tool's table, or an index or TOAST table of one: ``alembic_version_pkc``)."""
        if rel.schema_name == LEDGER_SCHEMA:
            return True
        if not self.command:
            return False
        table = self.state(rel.table_oid) if rel.table_oid is not None else None
        return ledgers.is_tool_table(rel.name) or (
            table is not None and ledgers.is_tool_table(table.name)
        )

    def name(self, oid: int) -> str:
        rel = self.state(oid)
        return f"{rel.schema_name}.{rel.name}" if rel else str(oid)

    def owner(self, oid: int) -> int:
        """The table a relation belongs to: an index's table, a TOAST table's table, the table
        of a TOAST table's index; itself for anything else."""
        for _ in range(2):
            rel = self.state(oid)
            if rel is None or rel.kind not in ("i", "I", "t") or rel.table_oid is None:
                break
            oid = rel.table_oid
        return oid

    def kind(self, oid: int) -> str:
        rel = self.state(oid)
        return KINDS.get(rel.kind, rel.kind) if rel else "relation"

    def hold(
        self, index: int | None, oid: int, mode: str, held: float, source: LockSource = "sampled"
    ) -> None:
        entry = self.holds[(index, oid, locks.sql_name(mode))]
        entry.held = max(entry.held, tenth_ms(held))
        entry.source = _better(entry.source, source)

    def wait(
        self,
        index: int | None,
        oid: int,
        mode: str,
        waited: float,
        source: LockSource = "sampled",
    ) -> None:
        entry = self.holds[(index, oid, locks.sql_name(mode))]
        entry.waited = max(entry.waited, tenth_ms(waited))
        entry.source = _better(entry.source, source)


def _better(a: LockSource, b: LockSource) -> LockSource:
    return a if _SOURCE_RANK[a] >= _SOURCE_RANK[b] else b


# What a full scan reads: a table or a materialized view (an index is read by an index scan).
SCANNED_KINDS = frozenset({KINDS["r"], KINDS["m"]})


def tenth_ms(seconds: float) -> float:
    """A difference of two epoch times, rid of the float noise of their size (the log's times
    have millisecond precision, the samples' far less)."""
    return round(seconds, 4)
