"""A migrate command's tool migrations as rows of the migrations table, under the command's own
row, and the tool's bookkeeping folded into one line. Pure: no I/O.

A tool migration with no statement of its own (one of the tool's, such as Django's content
types) gets no row: the bookkeeping line counts it.
"""

from __future__ import annotations

from pgoverlay.action import markdown as md
from pgoverlay.action.details import lock_cell, name_cell, verdict_cell
from pgoverlay.action.insight.model import Bookkeeping, MigrationInsight, ToolMigration
from pgoverlay.action.report import MigrationRun

__all__ = ["MAX_ROWS", "UNNAMED", "rows"]

MAX_ROWS = 40  # tool migrations listed under a command; the JSON report has them all
UNNAMED = "not in the ledger"  # statements no ledger row named (a migration that failed)


def rows(m: MigrationRun) -> list[str]:
    """One row per tool migration with statements of its own, then the bookkeeping's, in the
    four columns of the comment's migrations table (verdict, migration, locks, time); none when
    no ledger row named one."""
    i = m.insight
    if i is None or not i.parts:
        return []
    shown = [p for p in i.parts if p.statements]
    lines = [_row(p) for p in shown[:MAX_ROWS]]
    if len(shown) > MAX_ROWS:
        more = _count(len(shown) - MAX_ROWS, "more tool migration")
        lines.append(f"| | ↳ … {more} (in the JSON report, output `report-path`) | | |")
    book = _bookkeeping_cell(i, len(i.parts) - len(shown))
    if book:
        lines.append(f"| | ↳ bookkeeping: {book} | | {_time(i.bookkeeping.seconds)} |")
    return lines


def _row(p: ToolMigration) -> str:
    name = f"↳ {name_cell(p.name)}" if p.name else f"↳ {UNNAMED}"
    name += f" ({_count(len(p.statements), 'statement')})"
    cells = [verdict_cell(p.verdict), name, lock_cell(p.locks), _time(p.seconds)]
    return f"| {' | '.join(cells)} |"


def _time(seconds: float) -> str:
    return f"{seconds:.2f}\u00a0s"  # as the command's own row: a no-break space


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
