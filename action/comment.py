"""The one sticky PR comment and the job summary, rendered from a Report. Pure: no I/O, no clock.

The comment starts with a hidden marker line so the Action can find it again, and stays under
GitHub's size limit whatever the report holds: the details blocks, the migration table and the
error excerpts are cut, with a note, when they would not fit. Every piece of user-controlled
text is escaped (``markdown.py``) so it cannot break the table, a ``<details>`` block or a code
fence, or hide the rest of the comment in an HTML comment.

It reads top down, most important first: the status, the run's verdict in words (``lead.py``),
the migrations table, the errors, the schema diff, a ``<details>`` block per traced migration
(``details.py``), then the way in (the branch's page and the front door: never a password) and
the branch's base. The table is short enough for GitHub's comment width
(tests/test_comment_layout.py checks it in Chromium): with insight, the verdict, the name, the
locks one line per table, and the time; what else a migration did is in its block. The job
summary holds the whole of it; the comment a bounded part.

The migrations table is ``table.py``'s (the branch page shows the same): a new column is one
more ``Column`` there. A new section under the table is one more part in ``_render``'s
``build``, rendered by a function of the module that measures it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from pgoverlay.action import markdown as md
from pgoverlay.action.details import FEW, details
from pgoverlay.action.insight import schemadiff
from pgoverlay.action.lead import lead
from pgoverlay.action.report import BranchInfo, MigrationRun, Report, result
from pgoverlay.action.table import columns_for, markdown_header, markdown_row
from pgoverlay.action.wayin import YOUR_LOGIN, WayIn
from pgoverlay.runner.door import dsn
from pgoverlay.runner.units import format_bytes, idle_rule

__all__ = [
    "ERROR_COLUMNS",
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
# Characters of a line in an error's code block: GitHub's comment holds about 104 of its
# monospace (774 px less the block's padding, 7.1 px a character at 85 % of 14 px).
ERROR_COLUMNS = 100

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
    columns = columns_for(runs)
    rows = [markdown_row(m, columns) for m in runs]
    branch = _branch(report)
    traced = [i for i, m in enumerate(runs) if m.insight is not None]
    # What a block cuts is in the summary; what the summary's blocks cut, in the JSON report.
    more = "the JSON report, output `report-path`" if full else see
    blocks = {i: details(runs[i], full=full, see=more) for i in traced}
    schema = schemadiff.markdown(report.schema_diff, full=full, see=more)
    failed = [m for m in runs if m.status == "failed" and m.error.strip()]
    errors, hidden_errors = failed[:MAX_ERRORS], len(failed) - MAX_ERRORS

    def build(kept: list[str], omitted: int, cap: int | None, shown: dict[int, str]) -> str:
        parts = [top]
        if runs:
            table = "\n".join(["#### Migrations", "", *markdown_header(columns), *kept])
            if omitted:
                table += f"\n\n… {_count(omitted, 'more migration')} not shown (see {see})"
            parts.append(table)
        elif report.status == "ready":
            parts.append("No migrations in this pull request.")
        parts += [_error(m, cap, see) for m in errors]
        if hidden_errors > 0:
            parts.append(f"… {_count(hidden_errors, 'more error')} not shown (see {see})")
        if schema:
            parts.append(schema)
        # Each migration's evidence before how to connect: the tables would push it below
        # the fold.
        parts += [shown[i] for i in sorted(shown)]
        if len(shown) < len(traced):
            hidden = len(traced) - len(shown)
            parts.append(f"… details of {_count(hidden, 'migration')} not shown (see {see})")
        parts += branch
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
    """Status, the run's verdict in words, why it failed, where the branch is: bounded."""
    b = report.branch
    parts = [f"### pgoverlay: **{result(report.status)}**"]
    if report.status != "destroyed" and report.migrations:
        parts.append(lead(report.migrations))
    gone = report.status == "destroyed"
    if report.message and not gone:
        parts.append(md.prose(report.message, _MESSAGE, cell=False))
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
        # A branch its pull request no longer wants says why; a close, how it closed.
        why = md.prose(report.message, _MESSAGE, cell=False) if report.message else merged
        parts.append(f"{name} was destroyed: {why}.")
        parts.append(f"Final writable layer: {_layer(b)}.")
    return parts


def _branch(report: Report) -> list[str]:
    """How to connect, then what the branch holds: its writable layer and its base."""
    b = report.branch
    if b is None or report.status == "destroyed":
        return []
    base = f"{md.code(b.base_name, cell=True)} version {b.base_version}"
    if b.base_seeded_at is not None:
        base += f", seeded {datetime.fromtimestamp(b.base_seeded_at, tz=UTC):%Y-%m-%d %H:%M} UTC"
    holds = [
        ("Writable layer", _layer(b)),
        ("Base", base),
        ("Data", _masking(b)),
        ("Runtime", md.code(b.runtime, cell=True)),
    ]
    if b.suspend_after is not None:
        holds.append(("When idle", idle_rule(b.suspend_after)))
    way = report.way_in
    connection = [_pairs("Connection", _way_in(way))] if way is not None else []
    return [*connection, _pairs("Branch", holds)]


def _way_in(way: WayIn) -> list[tuple[str, str]]:
    """The way in, for whoever reads the comment: the branch's page, where a reader signs in
    with GitHub and gets a password of their own, and the front door's address as that reader.
    Never a password: a public repository's comments are readable by anyone."""
    return [
        ("Page", f"[Open the branch page]({md.url(way.page)}): sign in with GitHub"),
        ("URL", md.code(way.url(YOUR_LOGIN), cell=True)),
        ("Host", md.code(way.host, cell=True)),
        ("Port", md.code(str(way.port), cell=True)),
        ("Database", md.code(way.database, cell=True)),
        ("User", "your GitHub login"),
        ("Password", "get your password on the branch page"),
        *(
            [
                (
                    "Certificate",
                    f"save [the door's own]({md.url(way.certificate)}) as "
                    f"{md.code(dsn.CERT_DOWNLOAD, cell=True)} where you run your client "
                    "(the branch page shows its fingerprint)",
                )
            ]
            if way.certificate
            else []
        ),
    ]


def _pairs(title: str, rows: list[tuple[str, str]]) -> str:
    lines = [f"| {title} | |", "|---|---|"]
    return "\n".join(lines + [f"| {key} | {value} |" for key, value in rows if value])


def _masking(b: BranchInfo) -> str:
    """Whether the base's personal data was masked, and by which rules (file and checksum)."""
    if b.base_masked is None:
        return ""
    if not b.base_masked:
        return "**not masked**: a copy of the source's data as it is"
    rules = md.code(b.base_mask_rules, cell=True)
    return f"masked by {rules} (sha256 {md.code(b.base_mask_sha256[:12], cell=True)})"


def _error(m: MigrationRun, cap: int | None, see: str) -> str:
    where = m.file or m.name
    if m.file and m.line is not None:
        where = f"{m.file}:{m.line}"
    return f"#### Error in {md.code(where)}\n\n{md.fence(_folded(_excerpt(m.error, cap, see)))}"


def _folded(text: str) -> str:
    """Lines longer than ERROR_COLUMNS broken into pieces that long: a code block on GitHub
    does not wrap, it scrolls, and what is past the comment's edge goes unread. Nothing is lost:
    the pieces joined are the line."""
    return "\n".join(
        line[i : i + ERROR_COLUMNS]
        for line in text.split("\n")
        for i in range(0, max(len(line), 1), ERROR_COLUMNS)
    )


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
