"""What the PR workflow keeps with a branch between runs: the head it last worked on, how that
ended, and its report. A re-run of the same head finds its work done; the closing comment lists
the migrations of the last run.

The engine keeps this as JSON text it never reads (``Engine.save_record``), owner-checked,
size-limited and removed with its branch; this module alone knows its fields. A report whose
insight would not fit is kept coarser (without per-statement detail, then without findings:
``jsonreport.fit``), so saving never fails for its size.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError

from pgoverlay.action.insight import jsonreport
from pgoverlay.action.report import Report, RunStatus
from pgoverlay.runner.service.models import MAX_RECORD_BYTES
from pgoverlay.runner.service.views import BranchView, Record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrRecord:
    head_sha: str  # the head the workflow last ran for
    status: RunStatus  # how that run ended
    report: Report  # what it found


@functools.cache
def _adapter() -> TypeAdapter[PrRecord]:
    """The record's pydantic adapter, built when first used (building it takes a while, and a
    pull request's first run reads no record)."""
    return TypeAdapter(PrRecord)


def prepare() -> None:
    """Build what ``dumps`` and ``loads`` use, ahead of their first call."""
    _adapter()
    jsonreport.prepare()


def dumps(record: PrRecord, *, limit: int = MAX_RECORD_BYTES) -> str:
    """``record`` as JSON text of at most ``limit`` bytes (what the engine keeps)."""

    def encode(report: Report, _: jsonreport.Detail) -> str:
        slim = PrRecord(record.head_sha, record.status, report)
        return _adapter().dump_json(slim).decode()

    return jsonreport.fit(record.report, encode, limit=limit)


def loads(text: str) -> PrRecord:
    """The record in ``text``; ``ValidationError`` if it is not one this module wrote."""
    return _adapter().validate_json(text)


def read(found: Record | None, *, branch: str = "") -> PrRecord | None:
    """The workflow's record in an engine record, or None when there is none or it cannot be
    read (the branch is then treated as one with no record: its work is done again)."""
    if found is None:
        return None
    try:
        return loads(found.data)
    except ValidationError as err:
        first = err.errors(include_url=False, include_input=False)[0]
        log.warning("branch %s: its record is not one this release reads: %s", branch, first["msg"])
        return None


def of(view: BranchView | None) -> PrRecord | None:
    """The workflow's record of ``view``'s branch."""
    return read(view.record, branch=view.name) if view is not None else None
