"""A migrate command's tool migrations as rows of the migrations table, under the command's own
row, and the tool's bookkeeping folded into one line. Pure: no I/O.

A tool migration with no statement of its own (one of the tool's, such as Django's content
types) gets no row: the bookkeeping line counts it. Each row's cells are the table's columns'
own (``table.Column.part``): a column is declared once, for both kinds of row.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgoverlay.action.cells import Cell, Code, Prose
from pgoverlay.action.details import name_cell
from pgoverlay.action.insight.model import Bookkeeping, MigrationInsight, ToolMigration
from pgoverlay.action.report import MigrationRun

__all__ = ["MAX_ROWS", "UNNAMED", "Sub", "subs"]

MAX_ROWS = 40  # tool migrations listed under a command; the JSON report has them all
UNNAMED = "not in the ledger"  # statements no ledger row named (a migration that failed)


@dataclass(frozen=True)
class Sub:
    """A row under a migrate command's own: one tool migration, or a line that stands for those
    not listed or for the tool's bookkeeping (``migration`` None)."""

    name: Cell  # the migration column's cell: "↳ `shop.0002_fill` (3 statements)"
    seconds: float | None = None
    migration: ToolMigration | None = None


def subs(m: MigrationRun) -> list[Sub]:
    """One row per tool migration with statements of its own, then the bookkeeping's; none
    when no ledger row named one."""
    i = m.insight
    if i is None or not i.parts:
        return []
    shown = [p for p in i.parts if p.statements]
    found = [_sub(p) for p in shown[:MAX_ROWS]]
    if len(shown) > MAX_ROWS:
        more = _count(len(shown) - MAX_ROWS, "more tool migration")
        found.append(Sub((f"↳ … {more} (in the JSON report, output ", Code("report-path"), ")")))
    book = _bookkeeping_cell(i, len(i.parts) - len(shown))
    if book:
        found.append(Sub(("↳ bookkeeping: ", *book), seconds=i.bookkeeping.seconds))
    return found


def _sub(p: ToolMigration) -> Sub:
    name: Cell = ("↳ ", *name_cell(p.name)) if p.name else (f"↳ {UNNAMED}",)
    return Sub(
        (*name, f" ({_count(len(p.statements), 'statement')})"), seconds=p.seconds, migration=p
    )


def _bookkeeping_cell(i: MigrationInsight, quiet: int) -> Cell:
    b = i.bookkeeping
    said = []
    if b.statements:
        said.append(_count(b.statements, "statement") + _whose(b))
    if quiet:
        own = "its" if quiet == 1 else "their"
        said.append(f"{_count(quiet, 'tool migration')} with no statement of {own} own")
    return (Prose("; ".join(said)),) if said else ()


def _whose(b: Bookkeeping) -> str:
    return f" ({', '.join(b.tools)})" if b.tools else ""


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
