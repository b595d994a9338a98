"""What the PR workflow keeps with a branch between runs: the head it last worked on, how that
ended, the fingerprint of the run options it ran with (``decide.fingerprint``), and its
report. A re-run of the same head with the same options finds its work done; the closing
comment lists the migrations of the last run.

The engine keeps this as JSON text it never reads (``Engine.save_record``), owner-checked,
size-limited and removed with its branch; this module alone knows its fields. A report whose
insight would not fit is kept coarser (without per-statement detail, then without findings:
``jsonreport.fit``), so saving never fails for its size.

Read back with ``loads``, which checks each field's presence and type as the dataclasses'
annotations state them (the Action's step imports no pydantic: building its model of the report
cost the step more than reading the record does).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

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
    found: PrRecord = _decode(PrRecord, json.loads(text), "")
    return found


# -- reading the record's dataclasses back from JSON ------------------------------------------


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    """The dataclass's annotations as types (they are text here: ``from __future__``)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _decode(cls: type[Any], data: object, where: str) -> Any:
    """``data`` as the dataclass ``cls``: each field there unless it has a default."""
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'record'}: expected an object, got {type(data).__name__}")
    given: dict[str, Any] = {}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        place = f"{where}.{f.name}" if where else f.name
        if f.name in data:
            given[f.name] = _value(data[f.name], hints[f.name], place)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{place}: missing")
    return cls(**given)


def _value(value: object, kind: Any, where: str) -> Any:
    origin = typing.get_origin(kind)
    if origin is types.UnionType or origin is typing.Union:
        options = typing.get_args(kind)
        if value is None and type(None) in options:
            return None
        (kind,) = (option for option in options if option is not type(None))
        return _value(value, kind, where)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(kind)
        return [_value(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is Literal:
        if value not in typing.get_args(kind):
            raise ValueError(f"{where}: {value!r} is not one of {typing.get_args(kind)}")
        return value
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _decode(kind, value, where)
    # JSON's numbers: a float field takes an integer; bool is an int to Python, not to JSON
    ok = (int, float) if kind is float else kind
    if not isinstance(value, ok) or (isinstance(value, bool) and kind is not bool):
        raise ValueError(f"{where}: expected {kind.__name__}, got {type(value).__name__}")
    return float(value) if kind is float else value


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
