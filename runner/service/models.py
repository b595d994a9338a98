"""What the engine service accepts and answers: one pydantic model per request and answer,
shared by the service and its clients.

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


class Answer(BaseModel):
    model_config = ConfigDict(frozen=True)


class Record(Answer):
    """A branch's record, as its owner saved it."""

    data: str
    updated_at: float


class Layer(Answer):
    logical_bytes: int
    physical_bytes: int


class BranchView(Answer):
    """A branch as anyone in the service's group may see it: no password."""

    name: str
    state: str
    running: bool
    # running, stopped, or unknown when the runtime could not be asked (liveness_reason: why)
    liveness: Literal["running", "stopped", "unknown"]
    liveness_reason: str = ""
    base: str
    base_version: int
    runtime: str
    host: str
    port: int
    database: str
    user: str
    created_at: float
    ready_at: float | None
    expires_at: float | None
    repository: str
    pr: int | None
    owner_uid: int
    layer: Layer | None = None  # asked for by `list` and `status`; measuring it walks the layer
    record: Record | None = None
    seconds: float | None = None  # how long a create or reset took


class BaseView(Answer):
    name: str
    version: int
    state: str
    pg_major: int | None
    size_bytes: int
    database: str
    created_at: float
    prepared_at: float | None
    masked: bool
    mask_rules: str
    mask_sha256: str
    locked_down: bool
    branches: int


class Destroyed(Answer):
    destroyed: bool
    record: Record | None = None  # what the workflow last recorded, for its closing report


class GcReport(Answer):
    lines: list[str]
    problems: int


class ErrorBody(Answer):
    """Every error answer: a stable ``code`` (the error's class, snake_case) and a message that
    says what is wrong and how to fix it."""

    code: str
    message: str
