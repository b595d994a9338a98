"""A traced migration's insight as markdown: the cells of its row in the migrations table, and
its ``<details>`` block (what it did, one item per statement, squawk's findings, notes). Pure.

The block's first line is raw HTML (``<details><summary>…</summary>``), whose text is
entity-escaped; what follows a blank line is markdown, escaped by ``markdown.py``, and no line
of it starts with ``<``, so nothing a pull request writes can end the block early or open one.

Everything here must fit GitHub's comment width (tests/test_comment_layout.py renders it in
Chromium): a table cell never holds a name longer than ``NAME`` characters, and what a statement
did is a list, which wraps, rather than table cells, which do not.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgoverlay.action import markdown as md
from pgoverlay.action.cells import BREAK, Cell, Code, Piece, Prose, Strong
from pgoverlay.action.insight import blocking
from pgoverlay.action.insight.locks import TableLock, per_table
from pgoverlay.action.insight.model import (
    Blocks,
    Finding,
    LockUse,
    MigrationInsight,
    Rewrite,
    Scan,
    StatementInsight,
    Verdict,
    Volume,
)
from pgoverlay.action.insight.verdict import WITH_TABLE
from pgoverlay.action.report import MigrationRun
from pgoverlay.runner.units import format_bytes

__all__ = [
    "FEW",
    "NAME",
    "TableLock",
    "details",
    "lock_cell",
    "name_cell",
    "per_table",
    "verdict_cell",
]

FEW = 20  # rows of each table in a block cut to fit
COMMENT_ROWS = 50  # rows of each table in the PR comment's blocks (the summary has them all)
COMMENT_NOTES = 10
# Characters of a file name and of a relation name in a migrations table cell: a code span's
# longest word is the least a column can shrink to, and two such columns, the verdict, the
# probe's and the time must fit GitHub's comment width (774 px: about 108 characters of code).
NAME = 36
RELATION = 32
CELL_TABLES = 3  # tables listed in a migration's lock cell; the rest are counted
_STATEMENT = 160  # characters of a statement shown in the comment
_FULL_STATEMENT = 500  # the most the insight keeps of one
_ITEMS = 10  # rewrites or scans listed under one statement
_BLOCKS: dict[Blocks, str] = {
    "reads and writes": "blocks reads and writes",
    "writes": "blocks writes",
    "ddl": "blocks other DDL only",
}


def details(m: MigrationRun, *, full: bool, see: str, rows: int | None = None) -> str:
    """The ``<details>`` block of a traced migration (``""`` for one without insight): what it
    did as a whole, then one item per statement, squawk's findings and the notes. ``full`` (the
    job summary): every statement, finding and note, the migration's own lists of locks,
    rewrites and scans, and the sampler's resolution; else at most COMMENT_ROWS of each list.
    ``rows`` cuts each list shorter still; a cut says to ``see`` where the rest is."""
    i = m.insight
    if i is None:
        return ""
    cap = rows if rows is not None else None if full else COMMENT_ROWS
    name = md.html_text(m.name, md.CELL)
    verdict = md.html_text(_summary(m, i), md.CELL)
    opened = " open" if i.verdict.level == "over" else ""
    parts = [f"<details{opened}><summary><code>{name}</code>: {verdict}</summary>"]
    parts.append(_outcome(m, i))
    own = [s for s in i.statements if not s.bookkeeping]
    parts.append(_statements(own, cap, full=full, see=see) + _bookkeeping(i))
    if i.findings:
        parts.append(_findings(i.findings, cap, full=full, see=see))
    probed = blocking.lines(i)
    if probed:
        parts.append("Probed on live traffic:\n\n" + "\n".join(f"- {line}" for line in probed))
    if full:
        parts += _whole(i)
    notes = i.notes if full else i.notes[:COMMENT_NOTES]
    if notes:
        more = len(i.notes) - len(notes)
        lines = [f"- {md.prose(n, 500, cell=False)}" for n in notes]
        lines += [f"- … {more:,} more notes (see {see})"] if more else []
        parts.append("Notes:\n\n" + "\n".join(lines))
    parts.append("</details>")
    return "\n\n".join(p for p in parts if p)


def _summary(m: MigrationRun, i: MigrationInsight) -> str:
    """The verdict after the migration's name; a migration that failed says so first, and
    is never called safe: what it did before its error, if that was more than nothing."""
    level = {"over": "over: ", "notice": "notice: ", "safe": ""}[i.verdict.level]
    if m.status != "failed":
        return level + i.verdict.text
    if i.verdict.kind == "safe online":
        return "failed (its error is above)"
    return f"failed (its error is above); before it failed: {level}{i.verdict.text}"


def name_cell(name: str) -> Cell:
    """A migration's name in a table cell: at most NAME characters. A long path loses its
    folders first (``…/0042_orders_status_index.sql``), then its middle."""
    if len(name) > NAME and "/" in name and not any(c.isspace() for c in name):
        name = "…/" + name.rsplit("/", 1)[1]
    return (Code(md.middle(name, NAME)),)


def lock_cell(locks: Sequence[LockUse]) -> Cell:
    """One line per table, the worst first: "ACCESS EXCLUSIVE on `public.t`, its 2 indexes and
    TOAST: 5.9 s"; at most CELL_TABLES lines and a count of the rest; "none" without a lock."""
    tables = per_table(locks)
    if not tables:
        return ("none",)
    lines = [_table_lock_cell(t) for t in tables[:CELL_TABLES]]
    if len(tables) > CELL_TABLES:
        lines.append((f"and {len(tables) - CELL_TABLES:,} more tables",))
    joined: list[Piece] = []
    for line in lines:
        joined += [BREAK, *line] if joined else line
    return tuple(joined)


def _table_lock_cell(t: TableLock) -> Cell:
    """A table's line in a lock cell: ``_table_lock``'s, its name cut to RELATION."""
    before, _, after = t.what(lambda _: "\x00").partition("\x00")  # it names the table once
    return (before, Code(md.middle(t.table, RELATION)), after + _lock_held(t))


def _rewritten(rewrites: Sequence[Rewrite]) -> str:
    """How many tables and indexes were rewritten, and the bytes they were rewritten to."""
    if not rewrites:
        return "none"
    return f"{len(rewrites):,} ({format_bytes(sum(r.bytes_after for r in rewrites))})"


def _wrote(v: Volume) -> str:
    """What the migration wrote: the writable layer's growth, then WAL."""
    return f"{format_bytes(v.layer_bytes)} layer; {format_bytes(v.wal_bytes)} WAL"


def verdict_cell(v: Verdict) -> Cell:
    """The verdict in a word or two: its level and its kind (``Verdict.kind``): "**over**:
    rewrite", "notice: blocks writes", "safe online"."""
    kind = v.kind
    if v.level == "safe":
        return ("safe\u00a0online",)  # a no-break space: two words, one line
    level: Cell = (Strong("over"),) if v.level == "over" else (v.level,)
    return (*level, ": ", Prose(kind, 40)) if kind else level


def _outcome(m: MigrationRun, i: MigrationInsight) -> str:
    """What the migration did as a whole, under its summary: the columns the table leaves out."""
    locks = [_table_lock(t) for t in per_table(i.locks)]
    lines = [
        f"- {m.status.capitalize()} in {m.seconds:.2f} s; rewrites: {_rewritten(i.rewrites)}; "
        f"wrote {_wrote(i.volume)}",
        f"- Locks: {'; '.join(locks[:_ITEMS]) or 'none'}"
        + (f"; and {len(locks) - _ITEMS:,} more tables" if len(locks) > _ITEMS else ""),
    ]
    return "\n".join(lines)


def _table_lock(t: TableLock) -> str:
    """ "ACCESS EXCLUSIVE on `public.t`, its 2 indexes and TOAST: 5.9 s", and with a wait for
    it, "...: waited 3 ms, then held 5.9 s"."""
    return t.what(lambda name: md.code(name)) + _lock_held(t)


def _lock_held(t: TableLock) -> str:
    """What follows a table's lock: how long it was held (after its wait)."""
    text = f": {_held(t.held_seconds, t.waited_seconds)}"
    if t.sampled:
        text += " (sampled)"  # seen by pg_locks sampling: timed to its interval, may be missed
    return text


def _lock(u: LockUse) -> str:
    text = f"{md.prose(u.mode, 40, cell=False)} on {md.code(u.relation)}: "
    text += f"{_BLOCKS[u.blocks]}, {_held(u.held_seconds, u.waited_seconds)}"
    if u.source == "sampled":
        text += " (sampled)"  # seen by pg_locks sampling: timed to its interval, may be missed
    return text


def _rewrite(r: Rewrite) -> str:
    text = f"{md.code(r.relation)} {format_bytes(r.bytes_before)} → "
    text += format_bytes(r.bytes_after)
    if r.reasons:
        text += f" ({md.prose(', '.join(r.reasons), md.CELL, cell=False)})"
    return text


def _rewrite_lines(rewrites: Sequence[Rewrite]) -> list[str]:
    """One line per rewritten table: its TOAST table and indexes rebuilt with it (and for no
    other reason) are folded onto its line ("`public.t` 150.0 MiB → 181.0 MiB (column type
    change), with its TOAST table and 2 indexes: 43.0 MiB → 43.0 MiB"), not a line each."""
    rewritten = {r.relation for r in rewrites}
    parts: dict[str, list[Rewrite]] = {}
    heads: list[Rewrite] = []
    for r in rewrites:
        if r.reasons == [WITH_TABLE] and r.table in rewritten and r.table != r.relation:
            parts.setdefault(r.table, []).append(r)
        else:
            heads.append(r)
    lines = []
    for r in heads:
        text = _rewrite(r)
        folded = parts.get(r.relation, [])
        if folded:
            indexes = sum(1 for p in folded if p.kind != "TOAST table")
            what = ["its TOAST table"] if len(folded) > indexes else []
            what += [f"{indexes} index{'' if indexes == 1 else 'es'}"] if indexes else []
            before = format_bytes(sum(p.bytes_before for p in folded))
            after = format_bytes(sum(p.bytes_after for p in folded))
            text += f", with {' and '.join(what)}: {before} → {after}"
        lines.append(text)
    return lines


def _scan(s: Scan) -> str:
    scans = f"{s.scans:,} scan{'' if s.scans == 1 else 's'}"
    rows = f"{s.rows_read:,} row{'' if s.rows_read == 1 else 's'}"
    return f"{md.code(s.relation)}: {scans}, {rows} under {md.code(s.under)}"


def _statements(
    statements: Sequence[StatementInsight], cap: int | None, *, full: bool, see: str
) -> str:
    """One item per statement: where it is, how long it ran, the statement, then what it did
    (its locks one line per table, what it rewrote, what it scanned under a lock)."""
    if not statements:
        return "No per-statement detail."
    width = _FULL_STATEMENT if full else _STATEMENT
    items = []
    for s in statements[:cap]:
        where = [f"line {s.line}"] if s.line is not None else []
        where.append(_duration(s.seconds) if s.seconds is not None else "not logged")
        did = [_table_lock(t) for t in per_table(s.locks)]
        rewrites = _rewrite_lines(s.rewrites)
        did += [f"rewrote {r}" for r in rewrites[:_ITEMS]]
        did += [f"scanned {_scan(x)}" for x in s.scans[:_ITEMS]]
        hidden = max(0, len(rewrites) - _ITEMS) + max(0, len(s.scans) - _ITEMS)
        did += [f"and {hidden:,} more rewrites or scans"] if hidden else []
        head = f"- {md.code(s.text, limit=width)} ({', '.join(where)})"
        items.append("\n".join([head, *(f"  - {d}" for d in did)]))
    return "Statements:\n\n" + "\n".join(items) + _more(len(statements), cap, "statement", see)


def _bookkeeping(i: MigrationInsight) -> str:
    """The line that stands for the migrate command's bookkeeping left out of the table."""
    b = i.bookkeeping
    if not b.statements:
        return ""
    whose = f" ({md.prose(', '.join(b.tools), md.CELL, cell=False)})" if b.tools else ""
    count = f"{b.statements:,} statement{'' if b.statements == 1 else 's'}"
    return (
        f"\n\nBookkeeping{whose}: {count}, "
        f"{_duration(b.seconds)}, not listed (session set-up, catalog lookups, the tool's own "
        "tables; their locks on those tables are not the migration's)."
    )


def _findings(findings: Sequence[Finding], cap: int | None, *, full: bool, see: str) -> str:
    """squawk's findings, each marked with what the trace made of it."""
    head = "| Rule | Line | Status | Evidence |" + (" Message |" if full else "")
    lines = [head, "|---|--:|---|---|" + ("---|" if full else "")]
    for f in findings[:cap]:
        status = f"**{f.status}**" if f.status == "confirmed" else f.status
        cells = [md.code(md.middle(f.rule, NAME), cell=True), str(f.line), status]
        cells.append(md.prose(f.evidence, md.CELL, cell=True))
        if full:
            cells.append(md.prose(f.message, 500, cell=True))
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines) + _more(len(findings), cap, "finding", see)


def _whole(i: MigrationInsight) -> list[str]:
    """What only the job summary shows: the migration's own lists, volume and resolution."""
    v = i.volume
    parts = [
        f"Ran {_duration(i.seconds)}. Rows: {v.rows_inserted:,} inserted, {v.rows_updated:,} "
        f"updated, {v.rows_deleted:,} deleted; WAL {format_bytes(v.wal_bytes)}; writable layer "
        f"{format_bytes(v.layer_bytes)}. Locks were sampled every {_duration(i.interval)}: a "
        "shorter hold may be missed."
    ]
    for title, items in (
        ("Locks", [_lock(u) for u in i.locks]),
        ("Rewrites", _rewrite_lines(i.rewrites)),
        ("Scans under a lock", [_scan(s) for s in i.scans]),
    ):
        if items:
            parts.append(f"{title}:\n\n" + "\n".join(f"- {item}" for item in items))
    return parts


def _more(total: int, cap: int | None, noun: str, see: str) -> str:
    if cap is None or total <= cap:
        return ""
    hidden = total - cap
    return f"\n\n… {hidden:,} more {noun}{'' if hidden == 1 else 's'} not shown (see {see})"


def _held(held: float, waited: float) -> str:
    """A lock's hold, after its wait when it waited: the two are apart."""
    if waited > 0:
        return f"waited {_duration(waited)}, then held {_duration(held)}"
    return _duration(held)


def _duration(seconds: float) -> str:
    """ "12 ms" below a second, "2.3 s" from one up."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f} s"
