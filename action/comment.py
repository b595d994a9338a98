"""The one sticky PR comment and the job summary, rendered from a Report. Pure: no I/O, no clock.

The comment starts with a hidden marker line so the Action can find it again, and stays under
GitHub's size limit whatever the report holds: the migration table and the error excerpts are
cut, with a note, when they would not fit. Every piece of user-controlled text is escaped so it
cannot break the table, close a code fence or hide the rest of the comment in an HTML comment.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from urllib.parse import quote

from pgoverlay.action.report import BranchInfo, MigrationRun, Report, RunStatus
from pgoverlay.runner.branch.sizes import format_bytes

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
_CELL = 200  # characters kept of one table cell or one value
_MESSAGE = 1000  # characters kept of the one-line failure message
_MIN_EXCERPT = 200  # an error excerpt is never cut below this many characters

_VERDICT: dict[RunStatus, str] = {
    "ready": "Ready",
    "migration failed": "Migration failed",
    "failed": "Failed",
    "destroyed": "Destroyed",
    "not branched": "Not branched",
}
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&])")
_SECRET = re.compile(r"(?i)\b(password|passwd|pwd)(\s*[=:]\s*)('[^']*'|\"[^\"]*\"|[^\s,;]+)")
_URL_SECRET = re.compile(r"(://[^:/@\s]+:)[^@\s]+@")


def marker(repository: str, pr: int | None, branch: str) -> str:
    """The hidden first line of the comment, e.g. ``<!-- pgoverlay:branch o/r#12 pr-12 -->``."""
    where = _token(repository) if pr is None else f"{_token(repository)}#{pr}"
    return f"<!-- pgoverlay:branch {where} {_token(branch)} -->"


def has_marker(body: str | None, mark: str) -> bool:
    """True when ``body`` starts with ``mark``: a marker quoted in a reply does not count."""
    return body is not None and body.startswith(mark)


def render_comment(report: Report) -> str:
    """The PR comment: the marker line, then the report; always under MAX_COMMENT characters."""
    mark = marker(report.repository, report.pr, _branch_name(report))
    return _render(report, head=mark + "\n", limit=MAX_COMMENT, size=len, see="the job summary")


def render_summary(report: Report) -> str:
    """The same report for $GITHUB_STEP_SUMMARY, without the marker; under MAX_SUMMARY bytes."""
    return _render(report, head="", limit=MAX_SUMMARY, size=_utf8_len, see="the job log")


def _token(text: str) -> str:
    # Only characters that cannot end the HTML comment (no ">", no "!", no spaces).
    return re.sub(r"[^A-Za-z0-9._/-]", "_", text[:_CELL]) or "_"


def _branch_name(report: Report) -> str:
    # Set even when creation failed, so a failure lands in the same sticky comment as the
    # later successful runs.
    return report.branch_name


def _render(report: Report, *, head: str, limit: int, size: Callable[[str], int], see: str) -> str:
    top = head + "\n\n".join(_top(report))
    if report.status == "destroyed":
        return top + "\n"
    runs = report.migrations
    rows = [_row(m) for m in runs]
    failed = [m for m in runs if m.status == "failed" and m.error.strip()]
    errors, hidden_errors = failed[:MAX_ERRORS], len(failed) - MAX_ERRORS

    def build(kept: list[str], omitted: int, cap: int | None) -> str:
        parts = [top]
        if runs:
            header = ["#### Migrations", "", "| File | Duration | Result |", "|---|--:|---|"]
            table = "\n".join([*header, *kept])
            if omitted:
                table += f"\n\n… {_count(omitted, 'more migration')} not shown (see {see})"
            parts.append(table)
        elif report.status == "ready":
            parts.append("No migrations in this pull request.")
        parts += [_error(m, cap, see) for m in errors]
        if hidden_errors > 0:
            parts.append(f"… {_count(hidden_errors, 'more error')} not shown (see {see})")
        return "\n\n".join(parts) + "\n"

    body = build(rows, 0, None)
    if size(body) < limit:
        return body
    # Too long: errors get at most a quarter of the room, the table what is left.
    cap = max(_MIN_EXCERPT, limit // 4 // max(1, len(errors)))
    budget = limit - 1 - size(build([], len(rows), cap))
    while budget < 0 and cap > _MIN_EXCERPT:
        cap = max(_MIN_EXCERPT, cap // 2)
        budget = limit - 1 - size(build([], len(rows), cap))
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
    return build([rows[i] for i in sorted(kept)], len(rows) - len(kept), cap)


def _top(report: Report) -> list[str]:
    """Status, where the branch is, how to reach it and what it came from: bounded in size."""
    b = report.branch
    parts = [f"### pgoverlay: **{_VERDICT[report.status]}**"]
    facts = []
    if b is not None and report.status != "destroyed":
        facts.append(f"Branch {_code(b.name)}")
    if report.head_sha:
        facts.append(f"head {_code(report.head_sha[:7])}")
    if b is not None and b.create_seconds is not None and report.status != "destroyed":
        facts.append(f"created in {b.create_seconds:.2f} s")
    line = ", ".join(facts)
    if report.run_url:
        line += f"{'. ' if line else ''}[Workflow run]({_url(report.run_url)})"
    if line:
        parts.append(line)
    if report.status == "destroyed":
        merged = {
            True: "the pull request was merged",
            False: "the pull request was closed without merging",
            None: "whether the pull request was merged is unknown",
        }[report.merged]
        name = f"Branch {_code(b.name)}" if b is not None else "The branch"
        parts.append(f"{name} was destroyed: {merged}.")
        parts.append(f"Final writable layer: {_layer(b)}.")
    if report.message:
        parts.append(_prose(report.message, _MESSAGE, cell=False))
    if b is not None and report.status != "destroyed":
        parts.append(_details(b, report.password_hint))
    return parts


def _details(b: BranchInfo, hint: str) -> str:
    """How to connect, how big the writable layer is, what base the branch came from."""
    base = f"{_code(b.base_name, cell=True)} version {b.base_version}"
    if b.base_seeded_at is not None:
        base += f", seeded {datetime.fromtimestamp(b.base_seeded_at, tz=UTC):%Y-%m-%d %H:%M} UTC"
    rows = [
        ("Host", _code(b.host, cell=True)),
        ("Port", _code(str(b.port), cell=True)),
        ("Database", _code(b.database, cell=True)),
        ("User", _code(b.user, cell=True)),
        ("Password", _prose(hint, _CELL, cell=True, redact=False) if hint else ""),
        ("Writable layer", _layer(b)),
        ("Base", base),
        ("Data", _masking(b)),
        ("Runtime", _code(b.runtime, cell=True)),
    ]
    lines = ["| Connection | |", "|---|---|"]
    return "\n".join(lines + [f"| {key} | {value} |" for key, value in rows if value])


def _masking(b: BranchInfo) -> str:
    """Whether the base's personal data was masked, and by which rules (file and checksum)."""
    if b.base_masked is None:
        return ""
    if not b.base_masked:
        return "**not masked**: a copy of the source's data as it is"
    rules = _code(b.base_mask_rules, cell=True)
    return f"masked by {rules} (sha256 {_code(b.base_mask_sha256[:12], cell=True)})"


def _row(m: MigrationRun) -> str:
    result = "**failed**" if m.status == "failed" else m.status
    return f"| {_code(m.name, cell=True)} | {m.seconds:.2f} s | {result} |"


def _error(m: MigrationRun, cap: int | None, see: str) -> str:
    where = m.file or m.name
    if m.file and m.line is not None:
        where = f"{m.file}:{m.line}"
    return f"#### Error in {_code(where)}\n\n{_fence(_excerpt(m.error, cap, see))}"


def _excerpt(text: str, cap: int | None, see: str) -> str:
    """The error text, redacted; past ``cap`` characters keep its start and its end."""
    text = _redact(text.replace("\r\n", "\n").replace("\r", "\n")).strip("\n")
    if cap is None or len(text) <= cap:
        return text
    head = cap * 2 // 3
    tail = cap - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n… {cut:,} characters not shown (see {see}) …\n{text[-tail:]}"


def _fence(text: str) -> str:
    """A fenced code block that ``text`` cannot close: the fence outruns any backtick run."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _code(text: str, *, cell: bool = False) -> str:
    """Inline code on one line; in a table cell its pipes are escaped (GFM unescapes them)."""
    body = _line(text, _CELL)
    if not body:
        return "(none)"
    if cell:
        body = body.replace("|", "\\|")
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", body)), default=0) + 1)
    pad = " " if len(ticks) > 1 else ""
    return f"{ticks}{pad}{body}{pad}{ticks}"


def _prose(text: str, limit: int, *, cell: bool, redact: bool = True) -> str:
    """One line of plain text, markdown and HTML escaped; `quoted` parts become inline code."""
    body = _line(text, limit, redact=redact)
    pieces = body.split("`")
    if len(pieces) % 2 == 0:  # an odd number of backticks: no code, all plain text
        pieces = [body]
    return "".join(
        _code(p, cell=cell) if i % 2 else _MD_SPECIAL.sub(r"\\\1", p) for i, p in enumerate(pieces)
    )


def _redact(text: str) -> str:
    """Hide what looks like a password (``password=...``, ``scheme://user:secret@``)."""
    return _URL_SECRET.sub(r"\1[redacted]@", _SECRET.sub(r"\1\2[redacted]", text))


def _line(text: str, limit: int, *, redact: bool = True) -> str:
    """``text`` on one line (whitespace runs become one space), cut to ``limit`` characters."""
    head = text[: limit * 8]  # bounded work on huge input
    line = " ".join((_redact(head) if redact else head).split())
    if len(line) > limit or len(head) < len(text):
        line = line[: limit - 1] + "…"
    return line


def _layer(b: BranchInfo | None) -> str:
    if b is None:
        return "unknown"
    logical, physical = format_bytes(b.layer_logical_bytes), format_bytes(b.layer_physical_bytes)
    return f"{logical} logical, {physical} physical"


def _url(url: str) -> str:
    # Percent-encode what would end a markdown link destination early (spaces, parentheses).
    return quote(_line(url, 2000, redact=False), safe=":/?#[]@!$&'*+,;=%~")


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
