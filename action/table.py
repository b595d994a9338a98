"""The migrations table of a report, declared once: its columns, and a row per migration with
the rows of a migrate command's tool migrations under it. The PR comment and the job summary
render it as Markdown (``markdown_header``, ``markdown_row``), the branch page as HTML
(``html_table``), both from the same columns and the same cells (``cells.py``). Pure.

A new column is one more ``Column`` in ``RICH``: its header, alignment, its cell in a migration's
row (most read the migration's insight: ``insight_cell``) and, if it has one, in the rows of a
migrate command's tool migrations (``parts.py``); the comment, the job summary and the page all
show it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pgoverlay.action import cells
from pgoverlay.action.cells import Cell, Code, Prose, Strong
from pgoverlay.action.details import lock_cell, name_cell, verdict_cell
from pgoverlay.action.insight import blocking
from pgoverlay.action.insight.model import MigrationInsight
from pgoverlay.action.parts import Sub, subs
from pgoverlay.action.report import MigrationRun

__all__ = [
    "PLAIN",
    "RICH",
    "Column",
    "columns_for",
    "html_table",
    "insight_cell",
    "markdown_header",
    "markdown_row",
]


def _blank(_: Sub) -> Cell:
    return ()


@dataclass(frozen=True)
class Column:
    """A column of the migrations table, declared once: its header, its alignment, its cell in
    a migration's row, its cell in the rows of a migrate command's tool migrations under it
    (blank unless given), and its cell where the table is as wide as its reader's window (the
    branch page; the same cell unless given)."""

    header: str
    align: str  # the Markdown delimiter row's cell: "---" or "--:"
    cell: Callable[[MigrationRun], Cell]
    part: Callable[[Sub], Cell] = _blank
    wide: Callable[[MigrationRun], Cell] | None = None

    def page_cell(self, m: MigrationRun) -> Cell:
        return (self.wide or self.cell)(m)


def insight_cell(cell: Callable[[MigrationInsight], Cell]) -> Callable[[MigrationRun], Cell]:
    """A cell read from a migration's insight: blank for a migration without one."""
    return lambda m: cell(m.insight) if m.insight is not None else ()


def _seconds(seconds: float) -> Cell:
    return (f"{seconds:.2f}\u00a0s",)  # a no-break space: the column is as narrow as "0.41 s"


def _time(m: MigrationRun) -> Cell:
    return _seconds(m.seconds)


def _part_time(s: Sub) -> Cell:
    return _seconds(s.seconds) if s.seconds is not None else ()


def _result(m: MigrationRun) -> Cell:
    return (Strong("failed"),) if m.status == "failed" else (m.status,)


def _verdict(m: MigrationRun) -> Cell:
    """The verdict of a traced migration that ran; else what became of it."""
    if m.insight is None or m.status == "failed":
        return _result(m)
    return verdict_cell(m.insight.verdict)


def _verdict_said(m: MigrationRun) -> Cell:
    """The verdict in its own words (the page has room for them)."""
    if m.insight is None or m.status == "failed":
        return _result(m)
    said = m.insight.verdict
    return (Strong(said.level), ": ", Prose(said.text, 500))


def _part_verdict(s: Sub) -> Cell:
    return verdict_cell(s.migration.verdict) if s.migration is not None else ()


def _name(m: MigrationRun) -> Cell:
    return name_cell(m.name)


def _whole_name(m: MigrationRun) -> Cell:
    return (Code(m.name),)


def _part_locks(s: Sub) -> Cell:
    return lock_cell(s.migration.locks) if s.migration is not None else ()


# Without insight (``insight: false``); with it, the verdict first and what a migration did in
# its block below the table.
PLAIN: tuple[Column, ...] = (
    Column("File", "---", _name, wide=_whole_name),
    Column("Duration", "--:", _time),
    Column("Result", "---", _result),
)
RICH: tuple[Column, ...] = (
    Column("Verdict", "---", _verdict, part=_part_verdict, wide=_verdict_said),
    Column("Migration", "---", _name, part=lambda s: s.name, wide=_whole_name),
    Column("Locks", "---", insight_cell(lambda i: lock_cell(i.locks)), part=_part_locks),
    # how long the probe's reads and writes waited on the worst table (live traffic)
    Column("Blocked", "---", insight_cell(blocking.cell)),
    Column("Time", "--:", _time, part=_part_time),
)


def columns_for(runs: Sequence[MigrationRun]) -> tuple[Column, ...]:
    """RICH when a migration was traced, else PLAIN."""
    return RICH if any(m.insight is not None for m in runs) else PLAIN


def markdown_header(columns: Sequence[Column]) -> list[str]:
    return [
        f"| {' | '.join(c.header for c in columns)} |",
        f"|{'|'.join(c.align for c in columns)}|",
    ]


def markdown_row(m: MigrationRun, columns: Sequence[Column]) -> str:
    """A migration's row, and under it the rows of a migrate command's tool migrations (a
    blank cell where a column has none for them)."""
    row = f"| {' | '.join(cells.markdown(c.cell(m)) for c in columns)} |"
    under = [[cells.markdown(c.part(sub)) for c in columns] for sub in subs(m)]
    return "\n".join(
        [row, *("|" + "|".join(f" {x} " if x else " " for x in u) + "|" for u in under)]
    )


def html_table(runs: Sequence[MigrationRun]) -> str:
    """The same table for the branch page: a ``<table>`` whose every cell is escaped."""
    columns = columns_for(runs)
    head = "".join(f"<th>{cells.html((c.header,))}</th>" for c in columns)
    rows = []
    for m in runs:
        rows.append(_html_row([c.page_cell(m) for c in columns], columns))
        rows += [_html_row([c.part(sub) for c in columns], columns) for sub in subs(m)]
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _html_row(row: Sequence[Cell], columns: Sequence[Column]) -> str:
    tds = []
    for c, cell in zip(columns, row, strict=True):
        number = ' class="time"' if c.align == "--:" else ""  # a duration: on one line
        tds.append(f"<td{number}>{cells.html(cell)}</td>")
    return f"<tr>{''.join(tds)}</tr>"
