"""What the engine answers: one ``Shape`` (a frozen record class, see ``shape``) per answer,
shared by the engine, the service (FastAPI writes them out through their dataclass twins) and
its clients.

Neither pydantic models nor dataclasses: the CLI defines these classes for every read-only
command, and importing either would cost each such command more than the rest of its
start-up. The service's client reads what it receives with ``wire.decode``, which checks each
field's presence and type as these annotations state them; a field added after a class's first
release has a default (an older engine does not send it).
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import quote

from pgoverlay.runner.service.shape import Shape, field


class Record(Shape):
    """A branch's record, as its owner saved it."""

    data: str
    updated_at: float


class Layer(Shape):
    logical_bytes: int
    physical_bytes: int


class Login(Shape):
    """A role that may log in to a branch through the front door, until ``expires_at``."""

    role: str
    expires_at: float


class BranchView(Shape):
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
    # when it was suspended (state suspended: it wakes on its next connection), and the idle
    # seconds after which the engine service suspends it (its own, else the pool's; 0: never;
    # None: not said, by an engine older than suspending)
    suspended_at: float | None = None
    suspend_after: float | None = None
    # the front door's answer only (None in anyone else's): the roles the engine minted a
    # credential for (people's and the preview app's grants), the only ones the door lets in
    logins: list[Login] | None = None


class WarmView(Shape):
    """A base's warm branches on one runtime: started, unclaimed, each waiting for a create."""

    runtime: str
    target: int  # how many are kept (`pgoverlay base warm NAME --count N`)
    ready: int
    memory_bytes_each: int | None  # median proportional set size of one; None: not measured


class BaseDetail(Shape):
    """What root alone is shown of a base version: where it came from and what preparing it
    took away."""

    source: str  # host:port (or socket) and database of the server it was copied from
    source_role: str  # primary or standby, when it was copied
    via: str  # basebackup or dump
    start_lsn: str
    superuser: str
    owner_uid: int
    source_settings: str  # JSON: the source's settings that matter
    tablespaces: str
    neutralised: list[str] | None  # what the lockdown removed; None: prepared before lockdown


class BaseView(Shape):
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
    warm: list[WarmView] = field(default_factory=list)  # of the base's latest version only
    detail: BaseDetail | None = None  # root's answer only


class WorkloadStatement(Shape):
    """One of production's statements, as the source's pg_stat_statements counted it: its text
    normalized (constants are ``$n``), comments stripped; plannable statements only."""

    queryid: int = 0
    query: str = ""
    calls: int = 0
    mean_ms: float = 0.0
    total_ms: float = 0.0
    rows: int = 0
    per_second: float = 0.0  # calls per second since the source's statistics were reset


class BaseWorkload(Shape):
    """The workload kept with a base's newest version (`pgoverlay base workload`), by total
    time, then calls. ``captured_at`` 0: none is kept, and ``note`` says why."""

    name: str = ""
    version: int = 0
    captured_at: float = 0.0
    source: str = ""  # the server (host:port, database) or the file it was read from
    stats_reset: float | None = None  # since when the source counted; None: not known
    statements: list[WorkloadStatement] = field(default_factory=list)
    note: str = ""


class Destroyed(Shape):
    destroyed: bool
    record: Record | None = None  # what the workflow last recorded, for its closing report


class GcReport(Shape):
    lines: list[str]
    problems: int


class ErrorBody(Shape):
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


# The pg_stat_all_tables counters a RelationState carries, each in a field of its name (an int
# with a default): the trace's snapshot reads those named here (``trace/snapshot.py``).
STAT_COUNTERS = ("seq_scan", "seq_tup_read", "n_tup_ins", "n_tup_upd", "n_tup_del")


class RelationState(Shape):
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


class LockSpan(Shape):
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


class LogEntry(Shape):
    """One entry of the branch's server log by its login role: the head line's time, pid and
    level, and the message with its continuation lines (joined with newlines)."""

    time: float  # server clock, epoch seconds (millisecond precision)
    pid: int
    level: str  # LOG, ERROR, WARNING, ..., or DETAIL / CONTEXT / STATEMENT / HINT
    message: str


SchemaChangeKind = Literal["added", "dropped", "changed"]


class SchemaAttribute(Shape):
    """One attribute of a schema object (a column's ``type``, an index's ``definition``) as
    the base had it and as the branch has it ("" where the object is missing on that side)."""

    name: str
    before: str = ""
    after: str = ""


class SchemaChange(Shape):
    """An object of the branch's schema the base does not have, has differently, or has and
    the branch does not (``runner.trace.schema`` names the kinds)."""

    kind: str  # "table", "column", "index", "constraint", "trigger", "view", ...
    name: str  # quoted where Postgres would quote it: public.orders.amount
    change: SchemaChangeKind
    table: str = ""  # the table a column, index, constraint, trigger or grant belongs to
    # added/dropped: the object's attributes on its side; changed: those that differ
    attributes: list[SchemaAttribute] = field(default_factory=list)


class SchemaCount(Shape):
    kind: str
    change: SchemaChangeKind
    count: int


class SchemaDiff(Shape):
    """The branch's schema against its base's, read from the catalogs when a trace ends."""

    base_taken_at: float  # when the base's side was read (0: it was not available)
    changes: list[SchemaChange] = field(default_factory=list)  # at most MAX_CHANGES
    counts: list[SchemaCount] = field(default_factory=list)  # of every change, listed or not
    left_out: int = 0  # changes past MAX_CHANGES, counted but not listed
    notes: list[str] = field(default_factory=list)  # what could not be compared, and why


class TraceMark(Shape):
    """What a trace saw since its previous mark (since it opened, for the first)."""

    at: float  # server clock when the mark was taken
    wal_lsn: int  # pg_current_wal_lsn() in bytes
    layer: Layer  # the writable layer's size now
    # Relations new or changed since the previous mark (every relation, in the first mark),
    # and the oids of those that are gone.
    relations: list[RelationState]
    dropped: list[int] = field(default_factory=list)
    locks: list[LockSpan] = field(
        default_factory=list
    )  # spans that ended, or are still open, since the previous mark
    log: list[LogEntry] = field(default_factory=list)
    log_truncated: bool = False  # the log since the previous mark was larger than is kept
    interval: float  # seconds between pg_locks samples
    instrumented: bool  # the event triggers were in place at this mark
    notes: list[str] = field(default_factory=list)  # what could not be observed, and why
    # The branch's schema against its base's: with the trace's end only.
    schema_diff: SchemaDiff | None = None
    # The statement procedure was in place too (a base prepared before it has none): a
    # migration file's statements may be marked (``pgoverlay.action.insight.marks``).
    statement_marks: bool = False


class GrantView(Shape):
    """A credential granted in a branch, reached through the front door (``dsn_host``,
    ``dsn_port``; the branch's name is the database the door routes by). ``password`` is in a
    grant's own answer only, once: None in a list."""

    branch: str
    login: str  # the GitHub login, lower-cased; for the app's credential, its role's name
    role: str
    read_only: bool
    app: bool = False
    expires_at: float
    granted_by: str = ""  # uid:N, or github:LOGIN when the front door vouched for the person
    password: str | None = field(default=None, repr=False)
    # the preview app's credential as deployed, given a new expiry (its password unchanged)
    renewed: bool = False
    dsn_host: str
    dsn_port: int
    database: str

    @property
    def url(self) -> str:
        """``postgresql://role:password@host:port/branch?sslmode=verify-full`` (without the
        password when the view has none)."""
        who = quote(self.role, safe="")
        if self.password is not None:
            who += ":" + quote(self.password, safe="")
        return (
            f"postgresql://{who}@{self.dsn_host}:{self.dsn_port}/"
            f"{quote(self.database, safe='')}?sslmode=verify-full"
        )


class Revoked(Shape):
    """What a revoke did: False when the login had no credential in the branch."""

    branch: str
    login: str
    revoked: bool


class Connection(Shape):
    """How to log in to a branch: for its owner (or root) only.

    ``sslmode`` is set when the branch is reached through the front door (the network API's
    answer: ``verify-full`` with a certificate a CA signed, ``require`` with the door's own);
    empty, the branch's own loopback port, where libpq's default applies. ``sslrootcert`` is a
    file on the caller's machine holding the certificate to verify the door with: the network
    client sets it (no server sends one); empty, libpq's own default."""

    host: str
    port: int
    database: str
    user: str
    password: str = field(repr=False)
    sslmode: str = ""
    sslrootcert: str = ""

    def _tls(self) -> dict[str, str]:
        tls = {"sslmode": self.sslmode} if self.sslmode else {}
        if self.sslrootcert:
            tls["sslrootcert"] = self.sslrootcert
        return tls

    @property
    def url(self) -> str:
        tls = "&".join(f"{key}={quote(value, safe='/')}" for key, value in self._tls().items())
        return (
            f"postgresql://{quote(self.user, safe='')}:{quote(self.password, safe='')}@"
            f"{self.host}:{self.port}/{quote(self.database, safe='')}" + (f"?{tls}" if tls else "")
        )

    def connect_kwargs(self) -> dict[str, Any]:
        """psycopg.connect's keywords."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "dbname": self.database,
            **self._tls(),
        }

    def libpq_env(self) -> dict[str, str]:
        """The libpq variables a child process (psql, a migrate command) connects with."""
        return {
            "PGHOST": self.host,
            "PGPORT": str(self.port),
            "PGUSER": self.user,
            "PGPASSWORD": self.password,
            "PGDATABASE": self.database,
            "PGAPPNAME": "pgoverlay-migrate",
            "PGCONNECT_TIMEOUT": "15",
            **{f"PG{key.upper()}": value for key, value in self._tls().items()},
        }

    @property
    def dsn(self) -> str:
        """A libpq key=value string, each value quoted as libpq's keyword/value syntax needs it.
        Written here rather than with psycopg's ``make_conninfo``: `branch connect` would import
        psycopg for it, which costs the command more than everything else it does."""
        pairs = {
            "host": self.host,
            "port": str(self.port),
            "dbname": self.database,
            "user": self.user,
            "password": self.password,
            **self._tls(),
        }
        return " ".join(f"{key}={_conninfo_value(value)}" for key, value in pairs.items())


def _conninfo_value(value: str) -> str:
    """``value`` as is when libpq reads it so, else in single quotes with ' and \\ escaped."""
    if value and not any(c.isspace() or c in "'\\=" for c in value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Credential(Shape):
    """An API token the admin issued, as the engine tells the front door it is good (never the
    token, nor its digest): its name, and the scope it was issued for (``repositories`` empty:
    every repository of the ``owners``)."""

    name: str
    owners: list[str]
    repositories: list[str]
    expires_at: float
