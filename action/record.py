"""What the PR workflow keeps with a branch between runs: the head it last worked on, how that
ended, the fingerprint of the run options it ran with (``decide.fingerprint``), and its
report. A re-run of the same head with the same options finds its work done; the closing
comment lists the migrations of the last run.

The engine keeps this as JSON text it never reads (``Engine.save_record``), owner-checked,
size-limited and removed with its branch; this module alone knows its fields. A report whose
insight would not fit is kept coarser (without per-statement detail, then without findings:
``jsonreport.fit``), so saving never fails for its size.

Read back with ``loads`` through the engine's own decoder (``wire.decode``), which checks each
field's presence and type as the dataclasses' annotations state them (the Action's step imports
no pydantic: building its model of the report cost the step more than reading the record does).
A record outlives a release: a field added to it, or to a part of its report, has a default.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass

from pgoverlay.action.insight import jsonreport
from pgoverlay.action.report import Report, RunStatus
from pgoverlay.runner.service import wire
from pgoverlay.runner.service.models import MAX_RECORD_BYTES
from pgoverlay.runner.service.views import BranchView, Record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrRecord:
    head_sha: str  # the head the workflow last ran for
    status: RunStatus  # how that run ended
    report: Report  # what it found
    # The run options' fingerprint ('' in a record an older release kept: taken as different)
    inputs: str = ""


def dumps(record: PrRecord, *, limit: int = MAX_RECORD_BYTES) -> str:
    """``record`` as JSON text of at most ``limit`` bytes (what the engine keeps)."""

    def encode(report: Report, _: jsonreport.Detail) -> str:
        slim = dataclasses.replace(record, report=report)
        return json.dumps(dataclasses.asdict(slim), ensure_ascii=False, separators=(",", ":"))

    return jsonreport.fit(record.report, encode, limit=limit)


def loads(text: str) -> PrRecord:
    """The record in ``text``; a ValueError naming the first field that does not fit if it is
    not one this module wrote (fields it does not know are left out: a newer release's)."""
    return wire.decode(PrRecord, json.loads(text))


def read(found: Record | None, *, branch: str = "") -> PrRecord | None:
    """The workflow's record in an engine record, or None when there is none or it cannot be
    read (the branch is then treated as one with no record: its work is done again)."""
    if found is None:
        return None
    try:
        return loads(found.data)
    except ValueError as err:
        log.warning("branch %s: its record is not one this release reads: %s", branch, err)
        return None


def of(view: BranchView | None) -> PrRecord | None:
    """The workflow's record of ``view``'s branch."""
    return read(view.record, branch=view.name) if view is not None else None
