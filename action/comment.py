"""The one sticky PR comment and the job summary, rendered from a Report. Pure: no I/O, no clock.

The comment starts with a hidden marker line so the Action can find it again, and stays under
GitHub's size limit whatever the report holds: the details blocks, the migration table and the
error excerpts are cut, with a note, when they would not fit. Every piece of user-controlled
text is escaped (``markdown.py``) so it cannot break the table, a ``<details>`` block or a code
fence, or hide the rest of the comment in an HTML comment.

A migration the workflow traced carries its insight: the table then shows its worst lock,
rewrites, bytes and verdict, and a ``<details>`` block per migration (``details.py``) its
statements and findings. The job summary holds the whole of it; the comment a bounded part.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from pgoverlay.action import markdown as md
from pgoverlay.action.details import (
    FEW,
    details,
    lock_cell,
    rewrites_cell,
    verdict_cell,
    volume_cell,
)
from pgoverlay.action.insight import blocking
from pgoverlay.action.report import BranchInfo, MigrationRun, Report, RunStatus
from pgoverlay.runner.units import format_bytes

__all__ = [
    "MAX_COMMENT",
    "MAX_SUMMARY",
    "format_bytes",
    "has_marker",
    "marker",
    "render_comment",
    "render_summary",
]

MAX_COMMENT = 65536  # GitHub's limit on a comment body (characters)
MAX_SUMMARY = 1024 * 1024  # GitHub's limit on one step's $GITHUB_STEP_SUMMARY (bytes)
MAX_ERRORS = 5  # error excerpts shown; the table still lists every failure
_MESSAGE = 1000  # characters kept of the one-line failure message
_MIN_EXCERPT = 200  # an error excerpt is never cut below this many characters

_VERDICT: dict[RunStatus, str] = {
    "ready": "Ready",
    "migration failed": "Migration failed",
    "failed": "Failed",
    "destroyed": "Destroyed",
    "not branched": "Not branched",
}
_HEADER = ["#### Migrations", "", "| File | Duration | Result |", "|---|--:|---|"]
_RICH_HEADER = [
    "#### Migrations",
    "",
    f"| Migration | Duration | Result | Worst lock | {blocking.HEADER} | Rewrites | Bytes "
    "| Verdict |",
    "|---|--:|---|---|---|---|---|---|",
]


def marker(repository: str, pr: int | None, branch: str) -> str:
    """The hidden first line of the comment, e.g. ``<!-- pgoverlay:branch o/r#12 pr-12 -->``."""
    where = md.token(repository) if pr is None else f"{md.token(repository)}#{pr}"
    return f"<!-- pgoverlay:branch {where} {md.token(branch)} -->"


def has_marker(body: str | None, mark: str) -> bool:
    """True when ``body`` starts with ``mark``: a marker quoted in a reply does not count."""
    return body is not None and body.startswith(mark)


def render_comment(report: Report) -> str:
    """The PR comment: the marker line, then the report; always under MAX_COMMENT characters."""
    mark = marker(report.repository, report.pr, _branch_name(report))
    return _render(
        report, head=mark + "\n", limit=MAX_COMMENT, size=len, see="the job summary", full=False
    )


def render_summary(report: Report) -> str:
    """The same report for $GITHUB_STEP_SUMMARY, without the marker, and with every statement,
    finding and note of the insights; under MAX_SUMMARY bytes."""
    return _render(report, head="", limit=MAX_SUMMARY, size=_utf8_len, see="the job log", full=True)


def _branch_name(report: Report) -> str:
    # Set even when creation failed, so a failure lands in the same sticky comment as the
    # later successful runs.
    return report.branch_name


def _render(
    report: Report,
    *,
    head: str,
    limit: int,
    size: Callable[[str], int],
    see: str,
    full: bool,
) -> str:
    """The report under ``limit``: when it is too long, the ``<details>`` blocks go first (the
    most alarming verdicts kept longest), then table rows (failures kept longest), and the error
    excerpts are cut; each cut is said."""
    top = head + "\n\n".join(_top(report))
    if report.status == "destroyed":
        return top + "\n"
    runs = report.migrations
    rich = any(m.insight is not None for m in runs)
    rows = [_rich_row(m) if rich else _row(m) for m in runs]
    traced = [i for i, m in enumerate(runs) if m.insight is not None]
    # What a block cuts is in the summary; what the summary's blocks cut, in the JSON report.
    more = "the JSON report, output `report-path`" if full else see
    blocks = {i: details(runs[i], full=full, see=more) for i in traced}
    failed = [m for m in runs if m.status == "failed" and m.error.strip()]
    errors, hidden_errors = failed[:MAX_ERRORS], len(failed) - MAX_ERRORS

    def build(kept: list[str], omitted: int, cap: int | None, shown: dict[int, str]) -> str:
        parts = [top]
        if runs:
            header = _RICH_HEADER if rich else _HEADER
            table = "\n".join([*header, *kept])
            if omitted:
                table += f"\n\n… {_count(omitted, 'more migration')} not shown (see {see})"
            parts.append(table)
        elif report.status == "ready":
            parts.append("No migrations in this pull request.")
        parts += [shown[i] for i in sorted(shown)]
        if len(shown) < len(traced):
            hidden = len(traced) - len(shown)
            parts.append(f"… details of {_count(hidden, 'migration')} not shown (see {see})")
        parts += [_error(m, cap, see) for m in errors]
        if hidden_errors > 0:
            parts.append(f"… {_count(hidden_errors, 'more error')} not shown (see {see})")
        return "\n\n".join(parts) + "\n"

    body = build(rows, 0, None, blocks)
    if size(body) < limit:
        return body
    bare = build(rows, 0, None, {})
    if size(bare) < limit:
        return build(rows, 0, None, _fitting(runs, traced, blocks, limit - size(bare), size, more))
    # Too long: errors get at most a quarter of the room, the table what is left.
    cap = max(_MIN_EXCERPT, limit // 4 // max(1, len(errors)))
    budget = limit - 1 - size(build([], len(rows), cap, {}))
    while budget < 0 and cap > _MIN_EXCERPT:
        cap = max(_MIN_EXCERPT, cap // 2)
        budget = limit - 1 - size(build([], len(rows), cap, {}))
    # Failed rows first so the failure is never cut from the table, then the rest in order.
    order = [i for i, m in enumerate(runs) if m.status == "failed"]
    order += [i for i, m in enumerate(runs) if m.status != "failed"]
    kept: set[int] = set()
    for i in order:
        cost = size(rows[i]) + 1  # the row and its newline
        if cost > budget:
            break
        kept.add(i)
        budget -= cost
    return build([rows[i] for i in sorted(kept)], len(rows) - len(kept), cap, {})


def _fitting(
    runs: list[MigrationRun],
    traced: list[int],
    blocks: dict[int, str],
    room: int,
    size: Callable[[str], int],
    see: str,
) -> dict[int, str]:
    """The details blocks that fit in ``room``: the worst verdicts first, then in order; a block
    too big whole is tried with fewer rows."""
    rank = {"over": 0, "notice": 2, "safe": 3}

    def worst(i: int) -> tuple[int, int]:
        m = runs[i]
        level = rank[m.insight.verdict.level] if m.insight is not None else 3
        return (1 if m.status == "failed" and level > 1 else level, i)

    room -= 1  # the last newline
    shown: dict[int, str] = {}
    for i in sorted(traced, key=worst):
        for block in (blocks[i], details(runs[i], full=False, see=see, rows=FEW)):
            cost = size(block) + 2  # and the blank line before it
            if cost <= room:
                shown[i] = block
                room -= cost
                break
    return shown


def _top(report: Report) -> list[str]:
    """Status, where the branch is, how to reach it and what it came from: bounded in size."""
    b = report.branch
    parts = [f"### pgoverlay: **{_VERDICT[report.status]}**"]
    facts = []
    if b is not None and report.status != "destroyed":
        facts.append(f"Branch {md.code(b.name)}")
    if report.head_sha:
        facts.append(f"head {md.code(report.head_sha[:7])}")
    if b is not None and b.create_seconds is not None and report.status != "destroyed":
        facts.append(f"created in {b.create_seconds:.2f} s")
    line = ", ".join(facts)
    if report.run_url:
        line += f"{'. ' if line else ''}[Workflow run]({md.url(report.run_url)})"
    if line:
        parts.append(line)
    if report.status == "destroyed":
        merged = {
            True: "the pull request was merged",
            False: "the pull request was closed without merging",
            None: "whether the pull request was merged is unknown",
        }[report.merged]
        name = f"Branch {md.code(b.name)}" if b is not None else "The branch"
        parts.append(f"{name} was destroyed: {merged}.")
        parts.append(f"Final writable layer: {_layer(b)}.")
    if report.message:
        parts.append(md.prose(report.message, _MESSAGE, cell=False))
    if b is not None and report.status != "destroyed":
        parts.append(_details(b, report.password_hint))
    return parts


def _details(b: BranchInfo, hint: str) -> str:
    """How to connect, how big the writable layer is, what base the branch came from."""
    base = f"{md.code(b.base_name, cell=True)} version {b.base_version}"
    if b.base_seeded_at is not None:
        base += f", seeded {datetime.fromtimestamp(b.base_seeded_at, tz=UTC):%Y-%m-%d %H:%M} UTC"
    rows = [
        ("Host", md.code(b.host, cell=True)),
        ("Port", md.code(str(b.port), cell=True)),
        ("Database", md.code(b.database, cell=True)),
        ("User", md.code(b.user, cell=True)),
        ("Password", md.prose(hint, md.CELL, cell=True, redact=False) if hint else ""),
        ("Writable layer", _layer(b)),
        ("Base", base),
        ("Data", _masking(b)),
        ("Runtime", md.code(b.runtime, cell=True)),
    ]
    lines = ["| Connection | |", "|---|---|"]
    return "\n".join(lines + [f"| {key} | {value} |" for key, value in rows if value])


def _masking(b: BranchInfo) -> str:
    """Whether the base's personal data was masked, and by which rules (file and checksum)."""
    if b.base_masked is None:
        return ""
    if not b.base_masked:
        return "**not masked**: a copy of the source's data as it is"
    rules = md.code(b.base_mask_rules, cell=True)
    return f"masked by {rules} (sha256 {md.code(b.base_mask_sha256[:12], cell=True)})"


def _row(m: MigrationRun) -> str:
    return f"| {md.code(m.name, cell=True)} | {m.seconds:.2f} s | {_result(m)} |"


def _rich_row(m: MigrationRun) -> str:
    """The compact row: what the migration did to production, in one line."""
    i = m.insight
    if i is None:
        return f"| {md.code(m.name, cell=True)} | {m.seconds:.2f} s | {_result(m)} | | | | | |"
    cells = [lock_cell(i.locks), blocking.cell(i)]
    cells += [rewrites_cell(i.rewrites), volume_cell(i.volume)]
    cells.append(verdict_cell(i.verdict))
    return (
        f"| {md.code(m.name, cell=True)} | {m.seconds:.2f} s | {_result(m)} | {' | '.join(cells)} |"
    )


def _result(m: MigrationRun) -> str:
    return "**failed**" if m.status == "failed" else m.status


def _error(m: MigrationRun, cap: int | None, see: str) -> str:
    where = m.file or m.name
    if m.file and m.line is not None:
        where = f"{m.file}:{m.line}"
    return f"#### Error in {md.code(where)}\n\n{md.fence(_excerpt(m.error, cap, see))}"


def _excerpt(text: str, cap: int | None, see: str) -> str:
    """The error text, redacted; past ``cap`` characters keep its start and its end."""
    text = md.hide_secrets(text.replace("\r\n", "\n").replace("\r", "\n")).strip("\n")
    if cap is None or len(text) <= cap:
        return text
    head = cap * 2 // 3
    tail = cap - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n… {cut:,} characters not shown (see {see}) …\n{text[-tail:]}"


def _layer(b: BranchInfo | None) -> str:
    if b is None:
        return "unknown"
    logical, physical = format_bytes(b.layer_logical_bytes), format_bytes(b.layer_physical_bytes)
    return f"{logical} logical, {physical} physical"


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
