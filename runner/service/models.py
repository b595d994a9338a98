"""What the engine service accepts: one pydantic model per request, shared by the service
(which validates what a caller sends) and its clients (which validate before sending). The
answers are in ``views``.

Nothing here names a filesystem path, a command or a setting: a caller chooses a branch name,
a base among the seeded ones, a runtime among two, a TTL and whose pull request it is for.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from pgoverlay.runner.names import NAME_RE
from pgoverlay.runner.pool.registry import REPOSITORY_RE

Name = Annotated[str, StringConstraints(pattern=NAME_RE.pattern, max_length=63)]
Repository = Annotated[str, StringConstraints(pattern=REPOSITORY_RE.pattern, max_length=201)]
MAX_RECORD_BYTES = 256 * 1024
MAX_TTL_SECONDS = 366 * 86400


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CreateRequest(Request):
    name: Name
    base: Name | None = None
    ttl_seconds: int | None = Field(default=None, gt=0, le=MAX_TTL_SECONDS)
    runtime: Literal["local", "docker"] | None = None
    repository: Repository | None = None
    pr: int | None = Field(default=None, gt=0, lt=2**31)


class OwnerRequest(Request):
    """Reset and destroy: with ``repository``, refused when the branch is another's."""

    repository: Repository | None = None


class RecordRequest(Request):
    """A note the branch's owner keeps with it: JSON text of at most ``MAX_RECORD_BYTES``
    bytes, which the engine stores and hands back but never reads (the PR workflow keeps what
    it last did there). With ``repository``, refused when the branch is another's."""

    repository: Repository | None = None
    data: str = Field(max_length=MAX_RECORD_BYTES)

    @field_validator("data")
    @classmethod
    def _bounded_json(cls, data: str) -> str:
        size = len(data.encode())
        if size > MAX_RECORD_BYTES:
            raise ValueError(f"the record is {size} bytes; at most {MAX_RECORD_BYTES} are kept")
        try:
            json.loads(data)
        except ValueError:
            raise ValueError("the record is not JSON text") from None
        return data


class TraceRequest(Request):
    """Open a trace of a branch (replacing one left open). With ``repository``, refused when
    the branch is another's."""

    repository: Repository | None = None
    interval: float = Field(default=0.05, ge=0.01, le=0.1)  # seconds between pg_locks samples
    max_seconds: float = Field(default=6 * 3600, gt=0, le=48 * 3600)  # ends itself after this
