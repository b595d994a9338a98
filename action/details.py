"""A traced migration's insight as markdown: the cells of its row in the migrations table, and
its ``<details>`` block (per-statement table, squawk's findings, notes). Pure: no I/O.

The block's first line is raw HTML (``<details><summary>…</summary>``), whose text is
entity-escaped; what follows a blank line is markdown, escaped by ``markdown.py``, and no line
of it starts with ``<``, so nothing a pull request writes can end the block early or open one.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgoverlay.action import markdown as md
from pgoverlay.action.insight import blocking
from pgoverlay.action.insight.locks import severity
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
from pgoverlay.action.report import MigrationRun
from pgoverlay.runner.units import format_bytes

__all__ = ["FEW", "details", "lock_cell", "rewrites_cell", "verdict_cell", "volume_cell"]

FEW = 20  # rows of each table in a block cut to fit
COMMENT_ROWS = 50  # rows of each table in the PR comment's blocks (the summary has them all)
COMMENT_NOTES = 10
_STATEMENT = 160  # characters of a statement shown in the comment
_FULL_STATEMENT = 500  # the most the insight keeps of one
_JOINED = 600  # characters of one cell listing several locks, rewrites or scans
_BLOCKS: dict[Blocks, str] = {
    "reads and writes": "blocks reads and writes",
    "writes": "blocks writes",
    "ddl": "blocks other DDL only",
}
_LEVEL = {"over": "**over**: ", "notice": "notice: ", "safe": ""}


def details(m: MigrationRun, *, full: bool, see: str, rows: int | None = None) -> str:
    """The ``<details>`` block of a traced migration (``""`` for one without insight). ``full``
    (the job summary): every statement, finding and note, the migration's own lists of locks,
    rewrites and scans, and the sampler's resolution; else at most COMMENT_ROWS of each table.
    ``rows`` cuts each table shorter still; a cut says to ``see`` where the rest is."""
    i = m.insight
    if i is None:
        return ""
    cap = rows if rows is not None else None if full else COMMENT_ROWS
    name = md.html_text(m.name, md.CELL)
    level = {"over": "over: ", "notice": "notice: ", "safe": ""}[i.verdict.level]
    verdict = md.html_text(level + i.verdict.text, md.CELL)
    opened = " open" if i.verdict.level == "over" else ""
    parts = [f"<details{opened}><summary><code>{name}</code>: {verdict}</summary>"]
    parts.append(_statements(i.statements, cap, full=full, see=see))
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


def lock_cell(locks: Sequence[LockUse]) -> str:
    """The worst lock: what it blocks first, then how long: "SHARE on `public.orders`: blocks
    writes, 2.3 s"; "none" without one."""
    if not locks:
        return "none"
    return _lock(max(locks, key=lambda u: (severity(u.blocks), u.held_seconds)))


def rewrites_cell(rewrites: Sequence[Rewrite]) -> str:
    """How many tables and indexes were rewritten, and the bytes they were rewritten to."""
    if not rewrites:
        return "none"
    return f"{len(rewrites):,} ({format_bytes(sum(r.bytes_after for r in rewrites))})"


def volume_cell(v: Volume) -> str:
    """What the migration wrote: the writable layer's growth, then WAL."""
    return f"{format_bytes(v.layer_bytes)} layer; {format_bytes(v.wal_bytes)} WAL"


def verdict_cell(v: Verdict) -> str:
    return _LEVEL[v.level] + md.prose(v.text, md.CELL, cell=True)


def _lock(u: LockUse) -> str:
    text = f"{md.prose(u.mode, 40, cell=True)} on {md.code(u.relation, cell=True)}: "
    text += f"{_BLOCKS[u.blocks]}, {_duration(u.held_seconds)}"
    if u.waited_seconds > 0:
        text += f" (waited {_duration(u.waited_seconds)})"
    return text


def _rewrite(r: Rewrite) -> str:
    text = f"{md.code(r.relation, cell=True)} {format_bytes(r.bytes_before)} → "
    text += format_bytes(r.bytes_after)
    if r.reasons:
        text += f" ({md.prose(', '.join(r.reasons), md.CELL, cell=True)})"
    return text


def _scan(s: Scan) -> str:
    scans = f"{s.scans:,} scan{'' if s.scans == 1 else 's'}"
    rows = f"{s.rows_read:,} row{'' if s.rows_read == 1 else 's'}"
    return f"{md.code(s.relation, cell=True)}: {scans}, {rows} under {md.code(s.under, cell=True)}"


def _statements(
    statements: Sequence[StatementInsight], cap: int | None, *, full: bool, see: str
) -> str:
    """One row per statement: where it is, what it is, how long it ran, what it did."""
    if not statements:
        return "No per-statement detail."
    width = _FULL_STATEMENT if full else _STATEMENT
    lines = [
        "| Line | Statement | Duration | Locks | Rewrites | Scans |",
        "|--:|---|--:|---|---|---|",
    ]
    for s in statements[:cap]:
        cells = [
            str(s.line) if s.line is not None else "",
            md.code(s.text, cell=True, limit=width),
            _duration(s.seconds) if s.seconds is not None else "not logged",
            _joined([_lock(u) for u in s.locks]),
            _joined([_rewrite(r) for r in s.rewrites]),
            _joined([_scan(x) for x in s.scans]),
        ]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines) + _more(len(statements), cap, "statement", see)


def _findings(findings: Sequence[Finding], cap: int | None, *, full: bool, see: str) -> str:
    """squawk's findings, each marked with what the trace made of it."""
    head = "| Rule | Line | Status | Evidence |" + (" Message |" if full else "")
    lines = [head, "|---|--:|---|---|" + ("---|" if full else "")]
    for f in findings[:cap]:
        status = f"**{f.status}**" if f.status == "confirmed" else f.status
        cells = [md.code(f.rule, cell=True), str(f.line), status]
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
        ("Rewrites", [_rewrite(r) for r in i.rewrites]),
        ("Scans under a lock", [_scan(s) for s in i.scans]),
    ):
        if items:
            parts.append(f"{title}:\n\n" + "\n".join(f"- {item}" for item in items))
    return parts


def _joined(items: list[str]) -> str:
    """Items of one cell, ``; ``-separated, cut with a count when they grow past _JOINED."""
    shown: list[str] = []
    used = 0
    for item in items:
        if shown and used + len(item) > _JOINED:
            return "; ".join(shown) + f"; and {len(items) - len(shown):,} more"
        shown.append(item)
        used += len(item) + 2
    return "; ".join(shown)


def _more(total: int, cap: int | None, noun: str, see: str) -> str:
    if cap is None or total <= cap:
        return ""
    hidden = total - cap
    return f"\n\n… {hidden:,} more {noun}{'' if hidden == 1 else 's'} not shown (see {see})"


def _duration(seconds: float) -> str:
    """ "12 ms" below a second, "2.3 s" from one up."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f} s"
