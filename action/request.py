"""What a pull request's branch is asked for: one model for the composite Action's inputs and
the webhook listener's per-repository settings.

:class:`PrRequest` holds what both front ends ask for, each rule checked once here. The Action's
:class:`Inputs` and the listener's ``webhook.settings.RepoSettings`` extend it with what only
they need. A field is the Action input of the same name with ``-`` for ``_`` (``action.yml``
describes it and passes it to the entry point as ``INPUT_<NAME>``), with the same default:
``tests/test_workflow.py`` checks that ``action.yml`` and :class:`Inputs` agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pgoverlay.action.insight.model import Thresholds
from pgoverlay.errors import ConfigError, config_error
from pgoverlay.runner.names import NAME_RE, parse_duration, parse_seconds

_BYTES: TypeAdapter[ByteSize] = TypeAdapter(ByteSize)
_LOCK_UNITS = "ms, s, m or h (e.g. 500ms, 5s, 1.5s, 2m)"


def lock_seconds(text: str) -> float:
    """'500ms', '5s', '1.5s', '2m' -> seconds: how long a lock may be held."""
    return parse_seconds(text, units=_LOCK_UNITS)


def parse_bytes(text: str) -> int:
    """'512MiB', '1GiB', '10GB', '1048576' -> bytes (KiB/MiB/GiB are powers of 1024, KB/MB/GB of
    1000, a bare number is bytes): how much one rewrite may write."""
    try:
        size = int(_BYTES.validate_python(text.strip()))
    except ValidationError:
        size = 0
    if size <= 0:
        raise ConfigError(
            f"cannot read size {text!r}: use a positive number of bytes, or a number and a unit "
            "KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000), "
            "e.g. 512MiB, 1GiB, 10GB"
        )
    return size


def _invalid(message: str) -> PydanticCustomError:
    """A validation error whose text is ``message`` as written (no "Value error, " prefix)."""
    return PydanticCustomError("invalid_request", "{message}", {"message": message})


class PrRequest(BaseModel):
    """What a workflow, or the listener's settings for a repository, asks for a pull request."""

    model_config = ConfigDict(extra="forbid")

    base: str | None = None
    migrations: str | None = None
    migrate_command: str | None = None
    migrations_select: Literal["changed", "all"] = "changed"
    working_directory: str = "."
    branch_name: str | None = None  # None: {repo}-pr-{number} (see event.branch_name)
    reset_on_push: bool = True
    ttl: str | None = None
    comment: bool = True
    runtime: Literal["auto", "local", "docker"] = "auto"  # auto: the runner's PGOVERLAY_RUNTIME
    insight: bool = True  # trace each migration: locks, rewrites, scans, volume, lint
    max_blocking_lock: str = "5s"  # longest hold of a lock that blocks reads or writes
    max_rewrite: str = "1GiB"  # largest table or index one rewrite may write
    fail_on_threshold: bool = False  # a migration over a threshold fails the step (or status)

    @model_validator(mode="before")
    @classmethod
    def _blank_is_unset(cls, data: object) -> object:
        """A value left empty (an input the workflow does not set) means its default."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (isinstance(v, str) and not v.strip())}
        return data

    @field_validator("base")
    @classmethod
    def _a_base_name(cls, base: str | None) -> str | None:
        if base and not NAME_RE.match(base):
            raise _invalid(
                f"{base!r} is not a base name; name one of the bases seeded on this runner "
                "(`pgoverlay seed list`), or leave it empty for the only one"
            )
        return base

    @field_validator("ttl")
    @classmethod
    def _a_duration(cls, ttl: str | None) -> str | None:
        if ttl:
            try:
                parse_duration(ttl)
            except ConfigError as err:
                raise _invalid(str(err)) from None
        return ttl

    @field_validator("max_blocking_lock")
    @classmethod
    def _a_lock_duration(cls, text: str) -> str:
        return _checked(lock_seconds, text)

    @field_validator("max_rewrite")
    @classmethod
    def _a_size(cls, text: str) -> str:
        return _checked(parse_bytes, text)

    @model_validator(mode="after")
    def _one_way_to_migrate(self) -> PrRequest:
        if self.migrations and self.migrate_command:
            raise _invalid(
                "set either `migrations` (a folder of .sql files) or `migrate-command`, not both"
            )
        return self

    def ttl_seconds(self) -> int | None:
        return parse_duration(self.ttl) if self.ttl else None

    def thresholds(self) -> Thresholds:
        """What a migration may do before its verdict is "over" (and, with
        ``fail_on_threshold``, fails the step)."""
        return Thresholds(
            max_blocking_lock=lock_seconds(self.max_blocking_lock),
            max_rewrite=parse_bytes(self.max_rewrite),
            fail=self.fail_on_threshold,
        )


def _checked(parse: Callable[[str], object], text: str) -> str:
    """``text`` as written, once ``parse`` reads it; its ConfigError as the field's error."""
    try:
        parse(text)
    except ConfigError as err:
        raise _invalid(str(err)) from None
    return text


class Inputs(PrRequest):
    """The composite Action's inputs: the request, and what only a workflow decides."""

    fail_on_migration_error: bool = True
    allow_forks: bool = False
    allow_fork_commands: bool = False


def input_name(field: str) -> str:
    """The Action input a field is read from: ``migrate_command`` -> ``migrate-command``."""
    return field.replace("_", "-")


def env_name(field: str) -> str:
    """The variable ``action.yml`` passes the field's input in: ``INPUT_MIGRATE_COMMAND``."""
    return f"INPUT_{field.upper()}"


def read_inputs(environ: dict[str, str]) -> Inputs:
    """The Action's inputs from the step's environment (an unset variable is an empty input)."""
    raw = {field: environ.get(env_name(field), "") for field in Inputs.model_fields}
    try:
        return Inputs.model_validate(raw)
    except ValidationError as exc:
        raise config_error(
            exc, what="input", where=lambda loc: f"`{input_name(str(loc[0]))}`" if loc else ""
        ) from None
