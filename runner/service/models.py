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


# -- migration tracing ----------------------------------------------------------------------
#
# While a workflow applies migrations, the engine watches the branch from the inside with the
# base's superuser (what the PR's own role cannot switch off or fake): it samples pg_locks,
# keeps the branch role's server log (every statement with its duration, lock waits, and the
# event triggers' `pgoverlay-trace {json}` lines), and takes snapshots of the relations. A
# workflow opens a trace, asks for a mark after each migration, and ends it; each mark holds
# what happened since the one before.


class TraceRequest(Request):
    """Open a trace of a branch (replacing one left open). With ``repository``, refused when
    the branch is another's."""

    repository: Repository | None = None
    interval: float = Field(default=0.05, ge=0.01, le=0.1)  # seconds between pg_locks samples
    max_seconds: float = Field(default=6 * 3600, gt=0, le=48 * 3600)  # ends itself after this


class RelationState(Answer):
    """One relation of the branch's own schemas (no catalogs), as a snapshot saw it."""

    oid: int
    schema_name: str
    name: str
    kind: str  # pg_class.relkind: r, p, i, I, m, S, t, v, f, c
    table_oid: int | None = None  # an index's table; a TOAST table's owner
    filenode: int  # pg_relation_filenode(); 0 when it has no storage
    bytes: int  # pg_relation_size() of the main fork
    seq_scan: int = 0  # pg_stat_all_tables counters (tables, matviews, TOAST)
    seq_tup_read: int = 0
    n_tup_ins: int = 0
    n_tup_upd: int = 0
    n_tup_del: int = 0


class LockSpan(Answer):
    """A relation lock one backend of the branch's login role held (or waited for) across
    consecutive pg_locks samples: from the first sample that saw it to the last."""

    pid: int
    relation: int  # oid
    mode: str  # as pg_locks names it: AccessShareLock ... AccessExclusiveLock
    granted: bool  # False: the backend was waiting for it
    first: float  # server clock, epoch seconds
    last: float
    query_start: float | None  # of the statement running when it was first seen
    query: str  # that statement's text (at most 2000 characters)


class LogEntry(Answer):
    """One entry of the branch's server log by its login role: the head line's time, pid and
    level, and the message with its continuation lines (joined with newlines)."""

    time: float  # server clock, epoch seconds (millisecond precision)
    pid: int
    level: str  # LOG, ERROR, WARNING, ..., or DETAIL / CONTEXT / STATEMENT / HINT
    message: str


class TraceMark(Answer):
    """What a trace saw since its previous mark (since it opened, for the first)."""

    at: float  # server clock when the mark was taken
    wal_lsn: int  # pg_current_wal_lsn() in bytes
    layer: Layer  # the writable layer's size now
    # Relations new or changed since the previous mark (every relation, in the first mark),
    # and the oids of those that are gone.
    relations: list[RelationState]
    dropped: list[int] = []
    locks: list[LockSpan] = []  # spans that ended, or are still open, since the previous mark
    log: list[LogEntry] = []
    log_truncated: bool = False  # the log since the previous mark was larger than is kept
    interval: float  # seconds between pg_locks samples
    instrumented: bool  # the event triggers were in place at this mark
    notes: list[str] = []  # what could not be observed, and why
