"""Peers of different releases read each other's wire types: the engine's answers (read by its
client with ``wire.decode``), its requests (read by the service), and the PR workflow's record
(kept by the engine across releases, read back by the next run).

A field that is missing is taken at its default and a field the reader does not know is left
out, so an older and a newer release agree as long as every field added after a type's first
release has a default. ``fixtures/wire/required.json`` lists, for every wire type, the fields
that may not be missing; ``fixtures/wire/<commit>.json`` holds an example of each type as that
release wrote it (``fixtures/wire/example.py`` writes them)."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgoverlay.action import record
from pgoverlay.runner.service import models, operations, views, wire
from pgoverlay.runner.service.shape import Shape, field

FIXTURES = Path(__file__).parent / "fixtures" / "wire"
REQUIRED = FIXTURES / "required.json"
EXAMPLES = [path for path in sorted(FIXTURES.glob("*.json")) if path != REQUIRED]


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _nested(kind: Any) -> Iterator[type]:
    if typing.get_origin(kind) in (types.UnionType, typing.Union, list):
        for arg in typing.get_args(kind):
            yield from _nested(arg)
    elif wire.is_wire_type(kind):
        yield kind


def operation_types() -> list[type]:
    """The requests and answers of the engine's operations, as they declare them
    (``operations.OPERATIONS``), and the error answer of every one."""
    found: list[type] = [views.ErrorBody]
    for op in operations.OPERATIONS:
        if op.request is not None:
            found.append(getattr(models, op.request))
        found += op.answer_types()
    return found


def wire_types() -> dict[str, type]:
    """Every type that crosses a process or a release: the engine's operations' requests and
    answers, the workflow's record, and every type they hold."""
    found: dict[str, type] = {}
    todo = [*operation_types(), record.PrRecord]
    while todo:
        cls = todo.pop()
        if _name(cls) not in found:
            found[_name(cls)] = cls
            todo.extend(k for kind, _ in wire.fields(cls).values() for k in _nested(kind))
    return dict(sorted(found.items()))


def test_every_request_and_answer_class_is_an_operations() -> None:
    """A class of ``views`` or ``models`` is a request or an answer of a declared operation
    (or a type one holds): a new one is declared in ``operations``, and its fields are then
    kept compatible here like every other's."""
    defined = {
        _name(cls)
        for module in (views, models)
        for cls in vars(module).values()
        if wire.is_wire_type(cls) and cls.__module__ == module.__name__
    }
    assert defined - set(wire_types()) == set()


def compatibility_problems(now: dict[str, type], committed: dict[str, list[str]]) -> list[str]:
    """What would break a peer of another release, against the committed required fields."""
    problems: list[str] = []
    for name, cls in now.items():
        if name not in committed:
            problems.append(
                f"{name} is a new wire type: add it to {REQUIRED.name} with its required fields "
                f"{wire.required(cls)}, and an example (run {FIXTURES.name}/example.py)"
            )
            continue
        fields = wire.fields(cls)
        for added in sorted(set(wire.required(cls)) - set(committed[name])):
            problems.append(
                f"{name}.{added} has no default: an older release does not send it, give it one"
            )
        for gone in sorted(set(committed[name]) - set(fields)):
            problems.append(
                f"{name}.{gone} is gone: an older release cannot do without it, keep it"
            )
    problems += [
        f"{name} is gone: an older release still sends or reads it; if it was renamed, "
        f"rename it in {REQUIRED.name} too"
        for name in committed.keys() - now.keys()
    ]
    return problems


def test_no_wire_type_requires_a_field_an_older_release_does_not_send() -> None:
    assert compatibility_problems(wire_types(), json.loads(REQUIRED.read_text())) == []


def test_the_committed_list_is_the_required_fields_of_today() -> None:
    """A field that got a default stays listed until the list is renewed: keep it current."""
    now = {name: wire.required(cls) for name, cls in wire_types().items()}
    assert json.loads(REQUIRED.read_text()) == now


class _Mark(Shape):
    at: float
    notes: list[str] = field(default_factory=list)


class _NewerMark(Shape):
    at: float
    notes: list[str] = field(default_factory=list)
    origin: str  # added without a default


def test_the_check_finds_a_field_added_without_a_default_and_a_required_field_removed() -> None:
    committed = {"m": ["at"], "gone": ["at", "x"]}
    assert compatibility_problems({"m": _Mark}, committed) == [
        "gone is gone: an older release still sends or reads it; if it was renamed, "
        "rename it in required.json too"
    ]
    problems = compatibility_problems({"m": _NewerMark, "gone": _Mark}, committed)
    assert problems == [
        "m.origin has no default: an older release does not send it, give it one",
        "gone.x is gone: an older release cannot do without it, keep it",
    ]


def _with_unknown_fields(data: Any) -> Any:
    """``data`` with a field no release has in every object, as a newer release may send."""
    if isinstance(data, dict):
        return {**{k: _with_unknown_fields(v) for k, v in data.items()}, "added_later": [1, {}]}
    if isinstance(data, list):
        return [_with_unknown_fields(item) for item in data]
    return data


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_each_wire_type_reads_what_an_earlier_release_wrote(path: Path) -> None:
    now = wire_types()
    examples = json.loads(path.read_text())
    assert examples, path
    for name, data in examples.items():
        assert name in now, f"{name} (in {path.name}) is no wire type any more"
        decoded: object = wire.decode(now[name], data)
        assert wire.decode(now[name], _with_unknown_fields(data)) == decoded, name


def test_every_wire_type_has_an_example() -> None:
    given = {name for path in EXAMPLES for name in json.loads(path.read_text())}
    requests = {_name(cls) for cls in vars(models).values() if isinstance(cls, type)}
    assert set(wire_types()) - requests - given == set()
