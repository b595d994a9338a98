"""``Shape``: the base of the engine service's requests (``models``) and answers (``views``), a
frozen, keyword-only record class that behaves like ``@dataclass(frozen=True, kw_only=True)``
and costs nothing to define.

Why not dataclasses: every `pgoverlay` command that asks the service defines these classes, and
``dataclasses`` (with the ``inspect`` it imports) plus the code each ``@dataclass`` compiles
cost such a command about 40 ms, a third of its whole run. A ``Shape`` subclass is an ordinary
class: its fields are its annotations, read once when the class is made.

pydantic (in the service only) sees a ``Shape`` through a twin: a real dataclass with the same
name, fields, docstring and ``__pydantic_config__``, made the first time FastAPI asks for its
schema. An answer is read into its twin to be written out as JSON; a request is read from JSON
into its twin, then made into the ``Shape`` itself, so its ``__post_init__`` checks run as a
caller's own would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from typing import Self

    from typing_extensions import dataclass_transform  # frozen_default: Python 3.12's typing
else:

    def dataclass_transform(**_: object) -> Callable[[type], type]:
        return lambda cls: cls


MISSING: Any = object()


class _Field:
    __slots__ = ("default", "factory", "repr")

    def __init__(self, default: Any, factory: Callable[[], Any] | None, show: bool) -> None:
        self.default = default
        self.factory = factory
        self.repr = show


def field(
    *,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | None = None,
    repr: bool = True,  # noqa: A002 - dataclasses' own name for it
) -> Any:
    """A field's default made anew for each instance (``default_factory``), or a field left
    out of ``repr`` (a password)."""
    return _Field(default, default_factory, repr)


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(field,))
class Shape:
    """Fields are the class's annotations (``ClassVar`` ones excepted); a class attribute of
    the same name is the default. Instances are made with keywords only, compare and hash by
    their fields, and cannot be changed (``replace`` makes a changed copy)."""

    # name -> (annotation text, default or MISSING, factory or None, shown in repr)
    __shape_fields__: ClassVar[dict[str, tuple[str, Any, Callable[[], Any] | None, bool]]] = {}
    __pydantic_twin__: ClassVar[type | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        found = dict(getattr(cls, "__shape_fields__", {}))
        for name, kind in cls.__dict__.get("__annotations__", {}).items():
            text = kind if isinstance(kind, str) else getattr(kind, "__name__", repr(kind))
            if text.startswith(("ClassVar", "typing.ClassVar")):
                continue
            value = cls.__dict__.get(name, MISSING)
            if isinstance(value, _Field):
                found[name] = (text, value.default, value.factory, value.repr)
            else:
                found[name] = (text, value, None, True)
            if value is not MISSING:
                delattr(cls, name)  # defaults live in __shape_fields__, not on the class
        cls.__shape_fields__ = found
        cls.__pydantic_twin__ = None

    def __init__(self, **given: Any) -> None:
        values = self.__dict__
        for name, (_, default, factory, _) in self.__shape_fields__.items():
            if name in given:
                values[name] = given.pop(name)
            elif factory is not None:
                values[name] = factory()
            elif default is not MISSING:
                values[name] = default
            else:
                raise TypeError(f"{type(self).__name__}: missing keyword argument {name!r}")
        if given:
            raise TypeError(
                f"{type(self).__name__}: unexpected keyword argument {next(iter(given))!r}"
            )
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: a {type(self).__name__} is frozen")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: a {type(self).__name__} is frozen")

    def _values(self) -> tuple[Any, ...]:
        return tuple(self.__dict__[name] for name in self.__shape_fields__)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined, unused-ignore]

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}={self.__dict__[name]!r}"
            for name, spec in self.__shape_fields__.items()
            if spec[3]
        )
        return f"{type(self).__name__}({shown})"

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes``, checked again as a new instance is."""
        return type(self)(**{**self.__dict__, **changes})

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        twin = cls.twin()
        inner = handler(twin)
        if "__pydantic_config__" in cls.__dict__:
            # A request, read from JSON into the twin, then made into the Shape (its checks).
            return core_schema.no_info_after_validator_function(
                lambda made: cls(**{name: getattr(made, name) for name in cls.__shape_fields__}),
                inner,
            )

        # An answer, given to be written out: its fields are read into the twin (FastAPI
        # validates what a route returns before writing it), or written as the twin's.
        def write(value: Any, serialize: Any) -> Any:
            return serialize(twin(**value.__dict__) if isinstance(value, cls) else value)

        return core_schema.no_info_before_validator_function(
            lambda value: dict(value.__dict__) if isinstance(value, cls) else value,
            inner,
            serialization=core_schema.wrap_serializer_function_ser_schema(write, schema=inner),
        )

    @classmethod
    def twin(cls) -> type:
        """The dataclass pydantic reads and writes for ``cls``."""
        if cls.__pydantic_twin__ is None:
            import dataclasses

            specs: list[Any] = []
            for name, (text, default, factory, _) in cls.__shape_fields__.items():
                if factory is not None:
                    specs.append((name, text, dataclasses.field(default_factory=factory)))
                elif default is not MISSING:
                    specs.append((name, text, dataclasses.field(default=default)))
                else:
                    specs.append((name, text))
            namespace: dict[str, Any] = {"__doc__": cls.__doc__}
            for extra in ("__pydantic_config__", "_checks"):
                if extra in cls.__dict__:
                    namespace[extra] = cls.__dict__[extra]
            twin = dataclasses.make_dataclass(
                cls.__name__, specs, namespace=namespace, frozen=True, kw_only=True
            )
            twin.__module__ = cls.__module__
            twin.__qualname__ = cls.__qualname__
            cls.__pydantic_twin__ = twin
        return cls.__pydantic_twin__


def as_dict(value: Any) -> Any:
    """``value`` with every Shape in it (also in lists and dicts) made a dict of its fields, as
    ``dataclasses.asdict`` does."""
    if isinstance(value, Shape):
        return {name: as_dict(value.__dict__[name]) for name in value.__shape_fields__}
    if isinstance(value, list | tuple):
        return type(value)(as_dict(item) for item in value)
    if isinstance(value, dict):
        return {key: as_dict(item) for key, item in value.items()}
    return value
