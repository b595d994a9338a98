"""Reading a value as its annotation says: the one reader of typed values.

Three things are read by their annotations: the runner's settings (``settings.Settings``, from
``PGOVERLAY_*`` text), the PR workflow's request (``pgoverlay.action.request``, from the
Action's inputs and the listener's per-repository settings) and what peers send as JSON (the
engine's answers and the workflow's record, ``service.wire.decode``). Each asks
:func:`reader` for the annotation it holds and gets a function made once per annotation.

Two readings, because what is given differs:

- **text** (``text=True``): what a person wrote in a variable, an input or a file. A flag is
  one of :data:`TRUE` or :data:`FALSE` (any case, spaces around it ignored), a number may be
  written as text, a ``Literal`` is matched without regard to case, and for ``X | None`` an
  empty text is None. A problem is worded for that person: what the value should be.
- **JSON** (``text=False``): what a program sent. Each value must already have its type (a
  float field takes an integer, as JSON numbers go; a flag is no number), and nested wire types
  are read by the ``nested`` reader the caller gives. A problem names where it is
  (``layer.logical_bytes: expected int, got str``).

Hand-written, not pydantic's ``TypeAdapter``: every command reads its settings and the Action's
every step its inputs, and importing pydantic cost each of them more than the rest of its
start-up (docs/benchmarks.md, "process"; ``tests/test_cli_imports.py`` keeps it out). The
listener, which does import pydantic, reads a request's fields through this reader too
(``webhook.settings``), so a flag means the same wherever it is written.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

# What a flag written as text may say: the words pydantic (and so the listener's own settings)
# and Postgres's boolean settings read as true and false.
TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
FALSE = frozenset({"0", "false", "f", "no", "n", "off"})

Reader = Callable[[object, str], Any]  # a value and where it is -> the value as its annotation
# How JSON mode reads an annotation that is none of the plain ones (a wire type), or None.
Nested = Callable[[Any], Reader | None]

_READERS: dict[tuple[Any, bool], Reader] = {}


def flag(text: str) -> bool | None:
    """``text`` as a flag: True or False when it is one of :data:`TRUE` or :data:`FALSE`
    (any case, spaces around it ignored), else None."""
    word = text.strip().lower()
    return True if word in TRUE else False if word in FALSE else None


def read(kind: Any, value: object) -> Any:
    """``value`` (text a person wrote, or a value of the annotation already) as ``kind``; a
    ValueError says what it should be."""
    return reader(kind, text=True)(value, "")


def reader(kind: Any, *, text: bool, nested: Nested | None = None) -> Reader:
    """How to read a value of the annotation ``kind``, made once per annotation and reading: a
    command that lists many branches reads the same annotations many times. ``nested`` (JSON
    only) reads the annotations that are wire types; it is the same for every caller that
    reads them (``wire.decode``'s)."""
    key = (kind, text)
    found = _READERS.get(key)
    if found is None:
        found = _READERS[key] = _make(kind, text, nested)
    return found


def _wrong(where: str, problem: str) -> ValueError:
    return ValueError(f"{where}: {problem}" if where else problem)


def _make(kind: Any, text: bool, nested: Nested | None) -> Reader:
    origin = typing.get_origin(kind)
    if origin is types.UnionType or origin is typing.Union:
        options = [option for option in typing.get_args(kind) if option is not type(None)]
        if len(options) == 1:
            inner = reader(options[0], text=text, nested=nested)

            def read_optional(value: object, where: str) -> object:
                if value is None or (text and isinstance(value, str) and not value.strip()):
                    return None
                return inner(value, where)

            return read_optional
    elif origin is list and not text:
        item = reader(typing.get_args(kind)[0], text=text, nested=nested)

        def read_list(value: object, where: str) -> list[Any]:
            if not isinstance(value, list):
                raise _wrong(where, f"expected a list, got {type(value).__name__}")
            return [item(v, f"{where}[{i}]") for i, v in enumerate(value)]

        return read_list
    elif origin is Literal:
        return _literal(typing.get_args(kind), text)
    elif kind in (_TEXT if text else _JSON):
        return (_TEXT if text else _JSON)[kind]
    elif nested is not None and not text:
        made = nested(kind)
        if made is not None:
            return made

    def unreadable(value: object, where: str) -> object:
        raise TypeError(f"{where}: no reader for the annotation {kind!r}")

    return unreadable


def _literal(allowed: tuple[Any, ...], text: bool) -> Reader:
    def read_literal(value: object, where: str) -> object:
        if text and isinstance(value, str):
            value = value.strip().lower()
        if value not in allowed:
            if text:
                raise _wrong(where, "should be one of " + ", ".join(map(str, allowed)))
            expected = ", ".join(map(str, allowed))
            raise _wrong(where, f"expected one of {expected}, got {value!r}")
        return value

    return read_literal


# -- text: what a person wrote ----------------------------------------------------------------


def _text_bool(value: object, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    said = flag(value) if isinstance(value, str) else None
    if said is None:
        raise _wrong(where, "should be true or false (also accepted: 1/0, yes/no, on/off)")
    return said


def _text_int(value: object, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise _wrong(where, "should be a whole number") from None


def _text_float(value: object, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        raise _wrong(where, "should be a number") from None


def _text_path(value: object, where: str) -> Path:
    if isinstance(value, Path):
        return value
    if isinstance(value, str) and value.strip():
        return Path(value.strip())
    raise _wrong(where, "should be a path")


def _text_str(value: object, where: str) -> str:
    if isinstance(value, str):
        return value
    raise _wrong(where, "should be text")


_TEXT: dict[Any, Reader] = {
    bool: _text_bool,
    int: _text_int,
    float: _text_float,
    Path: _text_path,
    str: _text_str,
}


# -- JSON: what a program sent ----------------------------------------------------------------


def _json_scalar(kind: type) -> Reader:
    # JSON's numbers: a float field takes an integer; bool is an int to Python, not to JSON:
    # true is no port number
    ok = (int, float) if kind is float else kind

    def read_scalar(value: object, where: str) -> object:
        if not isinstance(value, ok) or (isinstance(value, bool) and kind is not bool):
            raise _wrong(where, f"expected {kind.__name__}, got {type(value).__name__}")
        return float(typing.cast(float, value)) if kind is float else value

    return read_scalar


_JSON: dict[Any, Reader] = {kind: _json_scalar(kind) for kind in (str, int, float, bool)}
