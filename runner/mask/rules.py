"""Masking rules: the YAML file an admin passes to ``base seed --mask``, parsed and checked. Pure.

A rules file names tables and, per column, how to mask it::

    tables:
      public.customers:
        email: {fake: email}
        full_name: {fake: name}
        tax_id: hash
        referrer: null
        birthday: {truncate_date: year}
      public.sessions: truncate
    sql:
      - DELETE FROM audit_log

Whether the tables and columns exist, and whether a strategy fits a column's type, is checked
against a database by :mod:`pgoverlay.runner.mask`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from pgoverlay.errors import MaskError

Strategy = Literal["value", "null", "fake", "hash", "truncate_date", "sql"]
FAKES = ("email", "name", "first_name", "last_name", "phone", "text")
DATE_UNITS = ("year", "month", "day", "hour")
# Deterministic strategies: the same input gives the same output in every table of one seed.
DETERMINISTIC: frozenset[Strategy] = frozenset({"fake", "hash"})
_BARE: dict[str, Strategy] = {"null": "null", "hash": "hash"}
_WITH_ARGUMENT: tuple[Strategy, ...] = ("value", "fake", "truncate_date", "sql")
_HOW = (
    "write null, hash, {fake: email|name|first_name|last_name|phone|text}, {value: ...}, "
    "{truncate_date: year|month|day|hour} or {sql: EXPRESSION}"
)


class ColumnRule(BaseModel):
    """How one column is masked; ``argument`` is the fake kind, value, date unit or expression."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: Strategy
    argument: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, data: Any) -> Any:
        if data is None:
            return {"strategy": "null"}
        if isinstance(data, str):
            if data in _BARE:
                return {"strategy": _BARE[data]}
            raise ValueError(f"unknown strategy {data!r}: {_HOW}")
        if isinstance(data, dict) and set(data) <= {"strategy", "argument"} and data:
            return data  # already in model form (e.g. from model_dump)
        if not isinstance(data, dict) or len(data) != 1:
            raise ValueError(f"a column rule is one strategy: {_HOW}")
        ((key, argument),) = data.items()
        if key not in _WITH_ARGUMENT:
            raise ValueError(f"unknown strategy {key!r}: {_HOW}")
        if argument is None or isinstance(argument, list | dict):
            raise ValueError(
                f"{key} needs one plain value"
                + (" (to set NULL, write null instead of {value: null})" if key == "value" else "")
            )
        if isinstance(argument, bool):
            argument = "true" if argument else "false"
        return {"strategy": key, "argument": str(argument)}

    @model_validator(mode="after")
    def _check_argument(self) -> ColumnRule:
        if self.strategy == "fake" and self.argument not in FAKES:
            raise ValueError(f"fake {self.argument!r} is not one of: {', '.join(FAKES)}")
        if self.strategy == "truncate_date" and self.argument not in DATE_UNITS:
            raise ValueError(
                f"truncate_date {self.argument!r} is not one of: {', '.join(DATE_UNITS)}"
            )
        if self.strategy == "sql" and not (self.argument or "").strip():
            raise ValueError("sql needs an expression, e.g. {sql: \"left(zip, 2) || '000'\"}")
        return self

    def describe(self) -> str:
        return self.strategy if self.argument is None else f"{self.strategy}: {self.argument}"


class TableRule(BaseModel):
    """A table's entry: ``truncate``, or a mapping of its columns to rules."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    truncate: bool = False
    columns: dict[str, ColumnRule] = {}

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, data: Any) -> Any:
        if data == "truncate":
            return {"truncate": True}
        if isinstance(data, dict) and set(data) <= {"truncate", "columns"} and "truncate" in data:
            return data  # already in model form
        if not isinstance(data, dict) or not data:
            raise ValueError("a table rule is `truncate` or a mapping of its columns to rules")
        return {"columns": data}


class Rules(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tables: dict[str, TableRule] = {}
    sql: list[str] = []

    @field_validator("sql", mode="before")
    @classmethod
    def _statements(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [value]
        return value

    @model_validator(mode="after")
    def _check(self) -> Rules:
        if not self.tables and not self.sql:
            raise ValueError("the rules mask nothing: add tables or sql")
        seen: dict[QualifiedName, str] = {}
        for name in self.tables:
            qualified = parse_table(name)
            if qualified in seen:
                raise ValueError(f"{name} and {seen[qualified]} name the same table")
            seen[qualified] = name
        if any(not s.strip() for s in self.sql):
            raise ValueError("sql: an empty statement")
        return self

    def columns(self) -> dict[QualifiedName, dict[str, ColumnRule]]:
        return {
            parse_table(name): entry.columns
            for name, entry in self.tables.items()
            if not entry.truncate
        }

    def truncated(self) -> list[QualifiedName]:
        return [parse_table(name) for name, entry in self.tables.items() if entry.truncate]

    def rule(self, table: QualifiedName, column: str) -> ColumnRule | None:
        return self.columns().get(table, {}).get(column)


@dataclass(frozen=True, order=True)
class QualifiedName:
    schema: str
    table: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"


def parse_table(name: str) -> QualifiedName:
    """``schema.table`` or ``table`` (schema ``public``), as the names are stored in the catalog
    (lower case unless the table was created with a quoted name)."""
    parts = name.split(".")
    if len(parts) > 2 or not all(parts):
        raise ValueError(f"{name!r} is not a table name: write schema.table or table")
    return QualifiedName(*parts) if len(parts) == 2 else QualifiedName("public", parts[0])


@dataclass(frozen=True)
class RulesFile:
    """Rules as loaded from a file, with what a base version records about them."""

    rules: Rules
    name: str  # the file's name, without its directory
    sha256: str  # of the file's bytes

    @property
    def label(self) -> str:
        return f"{self.name} (sha256 {self.sha256[:12]})"


def load(path: Path) -> RulesFile:
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise MaskError(
            f"cannot read the masking rules file {path}: {err.strerror}; check the path"
        ) from None
    return parse(raw, name=path.name)


def parse(raw: bytes, *, name: str) -> RulesFile:
    import yaml  # a rules file is read by a seed only; a branch imports this package

    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(err, "problem", None) or "not YAML"
        raise MaskError(f"masking rules {name} are not valid YAML{line}: {problem}") from None
    if not isinstance(data, dict):
        raise MaskError(
            f"masking rules {name}: the file must be a mapping with `tables:` and/or `sql:`"
        )
    try:
        rules = Rules.model_validate(data)
    except ValidationError as err:
        problems = list(dict.fromkeys(_problem(e["loc"], str(e["msg"])) for e in err.errors()))
        raise MaskError(f"masking rules {name}: {'; '.join(problems[:5])}") from None
    return RulesFile(rules=rules, name=name, sha256=hashlib.sha256(raw).hexdigest())


def _problem(loc: tuple[int | str, ...], message: str) -> str:
    """One validation error as the user wrote the file: ``table T, column C: message``."""
    message = message.removeprefix("Value error, ")
    if len(loc) >= 2 and loc[0] == "tables":
        where = f"table {loc[1]}"
        if len(loc) >= 4 and loc[2] == "columns":
            where += f", column {loc[3]}"
        return f"{where}: {message}"
    if loc and loc[0] == "sql":
        return f"sql: {message}"
    if len(loc) == 1 and message == "Extra inputs are not permitted":
        return f"unknown key {loc[0]!r}: a rules file has `tables:` and `sql:`"
    return f"{'.'.join(str(p) for p in loc)}: {message}" if loc else message
