"""Reading a wire type back from JSON: the engine's answers (``views``, read by its client) and
the PR workflow's record (``pgoverlay.action.record``, kept by the engine between runs).

One decoder for both, driven by each class's annotations (``typing.get_type_hints``), so a
nested type is found wherever it is defined; each annotation is read by the one reader of
typed values (``runner/values.py``, its JSON reading). A wire type is a ``Shape`` or a
dataclass whose annotations use only ``str``, ``int``, ``float``, ``bool``, ``X | None``,
``list[X]``, ``Literal[...]`` and other wire types.

Peers of different releases read each other's JSON: a field that is missing is taken at its
default (an older peer did not send it), so every field added to a wire type after its first
release has one (``tests/test_wire.py`` keeps the list of fields that may not be missing); a
field the class does not have is left out (a newer peer sent it).

Neither ``dataclasses`` nor pydantic is imported here: the CLI's read-only commands decode the
service's answers, and either would cost them more than the rest of their start-up.
"""

from __future__ import annotations

import typing
from typing import Any, TypeVar

from pgoverlay.runner import values
from pgoverlay.runner.service.shape import MISSING, Shape

T = TypeVar("T")

# A wire type's fields: name -> (its annotation as a type, whether it has a default).
_FIELDS: dict[type, dict[str, tuple[Any, bool]]] = {}


def fields(cls: type) -> dict[str, tuple[Any, bool]]:
    """``cls``'s fields in order: each one's annotation, as a type, and whether it has a
    default (may be missing from what a peer sends)."""
    found = _FIELDS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        if isinstance(cls, type) and issubclass(cls, Shape):
            found = {
                name: (hints[name], not (default is MISSING and factory is None))
                for name, (_, default, factory, _) in cls.__shape_fields__.items()
            }
        elif hasattr(cls, "__dataclass_fields__"):
            import dataclasses  # a dataclass's module has imported it already

            found = {
                f.name: (
                    hints[f.name],
                    f.default is not dataclasses.MISSING
                    or f.default_factory is not dataclasses.MISSING,
                )
                for f in dataclasses.fields(typing.cast(Any, cls))
                if f.init
            }
        else:
            raise TypeError(f"{cls.__name__} is neither a Shape nor a dataclass")
        _FIELDS[cls] = found
    return found


def required(cls: type) -> list[str]:
    """The fields of ``cls`` without a default: what every peer must send."""
    return [name for name, (_, optional) in fields(cls).items() if not optional]


def is_wire_type(kind: object) -> bool:
    return isinstance(kind, type) and (
        issubclass(kind, Shape) or hasattr(kind, "__dataclass_fields__")
    )


def decode(cls: type[T], data: object, where: str = "") -> T:
    """``data`` (parsed JSON) as the wire type ``cls``. Each field must be there unless it has a
    default, and hold what its annotation says; fields ``cls`` does not have are left out. A
    ValueError names the first field that does not fit (``layer.logical_bytes``: ``where`` is
    the path to ``data``)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where or cls.__name__}: expected an object, got {type(data).__name__}")
    given: dict[str, Any] = {}
    for name, (kind, optional) in fields(cls).items():
        place = f"{where}.{name}" if where else name
        if name in data:
            given[name] = _reader(kind)(data[name], place)
        elif not optional:
            raise ValueError(f"{place}: missing")
    return cls(**given)


def _reader(kind: Any) -> values.Reader:
    """How to read a value of the annotation ``kind`` from JSON (``values.reader``), a wire
    type among them."""
    return values.reader(kind, text=False, nested=_nested)


def _nested(kind: Any) -> values.Reader | None:
    if is_wire_type(kind):
        return lambda value, where: decode(kind, value, where)
    return None
