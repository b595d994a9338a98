"""The run's report as JSON, for tools other than GitHub's comment: plain data, no I/O.

The document is the :class:`~pgoverlay.action.report.Report` as its dataclasses name it, times in
seconds and sizes in bytes, with ``schema_version`` (raised when a field is removed or changes
meaning; new fields may appear in any release) and ``detail``, which says what was left out to
keep the document under a size limit: ``full``, ``no statements`` (per-statement detail dropped),
``no findings`` (squawk's findings dropped too) or ``no insight`` (the insights dropped, and the
schema diff's listed changes: its counts stay).

The same ladder keeps the PR record (``action/record.py``) and the listener's stored report
within their limits, so a big report is never refused for its size, only made coarser.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, Literal

from pgoverlay.action.insight.model import MigrationInsight
from pgoverlay.action.report import Report

__all__ = ["DETAILS", "SCHEMA_VERSION", "Detail", "document", "dumps", "fit", "trim"]

SCHEMA_VERSION = 2
Detail = Literal["full", "no statements", "no findings", "no insight"]
DETAILS: tuple[Detail, ...] = ("full", "no statements", "no findings", "no insight")


_NOTE: dict[Detail, str] = {
    "full": "",
    "no statements": "per-statement detail left out to keep the report within {limit:,} bytes",
    "no findings": "per-statement detail and findings left out to keep the report within "
    "{limit:,} bytes",
    "no insight": "",
}


def document(report: Report, *, detail: Detail = "full") -> dict[str, Any]:
    """The JSON document (as Python data) of ``report``, which ``detail`` says is complete or
    not."""
    return {
        "schema_version": SCHEMA_VERSION,
        "detail": detail,
        **dataclasses.asdict(report),
        # Schema 2's field, kept with its meaning (how to get the password, never the password
        # itself) now that the report holds the way in: its page is where.
        "password_hint": _hint(report),
    }


def _hint(report: Report) -> str:
    way = report.way_in
    return f"get your password on the branch page, {way.page}" if way is not None else ""


def dumps(report: Report, *, limit: int | None = None) -> str:
    """``report`` as JSON text; with ``limit``, at most that many UTF-8 bytes, dropping detail
    (see :func:`fit`) while it is over."""
    if limit is None:
        return json.dumps(document(report), ensure_ascii=False)

    def encode(slim: Report, detail: Detail) -> str:
        return json.dumps(document(slim, detail=detail), ensure_ascii=False)

    return fit(report, encode, limit=limit)


def fit(report: Report, encode: Callable[[Report, Detail], str], *, limit: int) -> str:
    """The first of ``encode``'s texts, from the full report down the ladder of ``DETAILS``,
    that fits in ``limit`` UTF-8 bytes; past the ladder, the report without its migrations'
    error texts, then without migrations at all (the run's status and message stay)."""
    text = ""
    for detail in DETAILS:
        text = encode(trim(report, detail, limit=limit), detail)
        if _size(text) <= limit:
            return text
    bare = trim(report, "no insight", limit=limit)
    quiet = [dataclasses.replace(m, error=m.error[:200]) for m in bare.migrations]
    text = encode(dataclasses.replace(bare, migrations=quiet), "no insight")
    if _size(text) <= limit:
        return text
    return encode(dataclasses.replace(bare, migrations=[]), "no insight")


def trim(report: Report, detail: Detail, *, limit: int = 0) -> Report:
    """``report`` without what ``detail`` leaves out; each trimmed insight says so in its notes
    (``limit`` is the size named there)."""
    if detail == "full":
        return report
    runs = []
    for m in report.migrations:
        insight = m.insight
        if insight is not None:
            insight = None if detail == "no insight" else _trim_insight(insight, detail, limit)
        runs.append(dataclasses.replace(m, insight=insight))
    schema = report.schema_diff
    if schema is not None and detail == "no insight" and schema.changes:
        # the counts stay: the comment's headline; the listed changes go
        note = f"the listed schema changes were left out to keep the report within {limit:,} bytes"
        schema = dataclasses.replace(
            schema,
            changes=[],
            left_out=schema.left_out + len(schema.changes),
            notes=[*schema.notes, note],
        )
    return dataclasses.replace(report, migrations=runs, schema_diff=schema)


def _trim_insight(insight: MigrationInsight, detail: Detail, limit: int) -> MigrationInsight:
    findings = [] if detail == "no findings" else insight.findings
    note = _NOTE[detail].format(limit=limit)
    return dataclasses.replace(
        insight, statements=[], findings=findings, notes=[*insight.notes, note]
    )


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
