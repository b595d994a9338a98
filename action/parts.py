"""A migrate command's tool migrations as rows of the migrations table, under the command's own
row, and the tool's bookkeeping folded into one line. Pure: no I/O.

A tool migration with no statement of its own (one of the tool's, such as Django's content
types) gets no row: the bookkeeping line counts it. Each row's cells are the table's columns'
own (``comment.Column.part``): a column is declared once, for both kinds of row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pgoverlay.action import markdown as md
from pgoverlay.action.details import name_cell
from pgoverlay.action.insight.model import Bookkeeping, MigrationInsight, ToolMigration
from pgoverlay.action.report import MigrationRun

__all__ = ["MAX_ROWS", "UNNAMED", "Sub", "rows"]

MAX_ROWS = 40  # tool migrations listed under a command; the JSON report has them all
UNNAMED = "not in the ledger"  # statements no ledger row named (a migration that failed)


@dataclass(frozen=True)
class Sub:
    """A row under a migrate command's own: one tool migration, or a line that stands for those
    not listed or for the tool's bookkeeping (``migration`` None)."""

    name: str  # the migration column's cell, markdown: "↳ `shop.0002_fill` (3 statements)"
    seconds: float | None = None
    migration: ToolMigration | None = None


class Column(Protocol):
    @property
    def part(self) -> Callable[[Sub], str]: ...


def rows(m: MigrationRun, columns: Sequence[Column]) -> list[str]:
    """One row per tool migration with statements of its own, then the bookkeeping's, a cell
    per column of the comment's migrations table (each column's ``part``); none when no ledger
    row named one."""
    return [_row([c.part(sub) for c in columns]) for sub in _subs(m)]


def _row(cells: list[str]) -> str:
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def _subs(m: MigrationRun) -> list[Sub]:
    i = m.insight
    if i is None or not i.parts:
        return []
    shown = [p for p in i.parts if p.statements]
    found = [_sub(p) for p in shown[:MAX_ROWS]]
    if len(shown) > MAX_ROWS:
        more = _count(len(shown) - MAX_ROWS, "more tool migration")
        found.append(Sub(f"↳ … {more} (in the JSON report, output `report-path`)"))
    book = _bookkeeping_cell(i, len(i.parts) - len(shown))
    if book:
        found.append(Sub(f"↳ bookkeeping: {book}", seconds=i.bookkeeping.seconds))
    return found


def _sub(p: ToolMigration) -> Sub:
    name = f"↳ {name_cell(p.name)}" if p.name else f"↳ {UNNAMED}"
    name += f" ({_count(len(p.statements), 'statement')})"
    return Sub(name, seconds=p.seconds, migration=p)


def _bookkeeping_cell(i: MigrationInsight, quiet: int) -> str:
    b = i.bookkeeping
    said = []
    if b.statements:
        said.append(_count(b.statements, "statement") + _whose(b))
    if quiet:
        own = "its" if quiet == 1 else "their"
        said.append(f"{_count(quiet, 'tool migration')} with no statement of {own} own")
    return md.prose("; ".join(said), md.CELL, cell=True) if said else ""


def _whose(b: Bookkeeping) -> str:
    return f" ({', '.join(b.tools)})" if b.tools else ""


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
