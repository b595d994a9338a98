"""The pool's state in SQLite (WAL mode): base versions and branches.

Safe under concurrent ``pgoverlay`` processes: every change is one ``BEGIN IMMEDIATE``
transaction, and uniqueness (branch names, ports) is enforced by the schema, not by a
check-then-insert in Python.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pgoverlay.errors import RegistryError, RegistryRowError
from pgoverlay.github.grammar import REPOSITORY_RE
from pgoverlay.runner.names import NAME_RE
from pgoverlay.runner.names import WAKEABLE as WAKEABLE  # the front door reads it there
from pgoverlay.runner.runtime import table as runtimes

SCHEMA = """
CREATE TABLE IF NOT EXISTS bases (
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    state TEXT NOT NULL,
    pg_major INTEGER,
    source TEXT NOT NULL DEFAULT '',
    via TEXT NOT NULL DEFAULT 'basebackup',
    start_lsn TEXT NOT NULL DEFAULT '',
    size_bytes INTEGER NOT NULL DEFAULT 0,
    superuser TEXT NOT NULL DEFAULT '',
    database TEXT NOT NULL DEFAULT 'postgres',
    owner_uid INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    prepared_at REAL,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS branches (
    name TEXT PRIMARY KEY,
    base_name TEXT NOT NULL,
    base_version INTEGER NOT NULL,
    state TEXT NOT NULL,
    step TEXT NOT NULL DEFAULT '',
    port INTEGER NOT NULL UNIQUE,
    runtime TEXT NOT NULL DEFAULT 'local',
    user TEXT NOT NULL,
    password TEXT NOT NULL,
    database TEXT NOT NULL,
    created_at REAL NOT NULL,
    ready_at REAL,
    expires_at REAL,
    FOREIGN KEY (base_name, base_version) REFERENCES bases (name, version)
);
-- How many warm branches (started, unclaimed, reachable by nobody) to keep per base and runtime
CREATE TABLE IF NOT EXISTS warm_targets (
    base_name TEXT NOT NULL,
    runtime TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (base_name, runtime)
);
CREATE TABLE IF NOT EXISTS records (
    branch TEXT PRIMARY KEY REFERENCES branches (name) ON DELETE CASCADE,
    data TEXT NOT NULL,
    updated_at REAL NOT NULL
);
-- Credentials granted in a branch (runner/branch/grants.py): a person's login role, the
-- preview app's, or a job's on another runner (``job``). They go with their branch.
-- ``verifier`` is the password's SCRAM verifier, so a reset gives the role back as it was;
-- ``password`` is kept for the preview app's alone (as the branch's own password is), '' for
-- a person's and a job's.
CREATE TABLE IF NOT EXISTS grants (
    branch TEXT NOT NULL REFERENCES branches (name) ON DELETE CASCADE ON UPDATE CASCADE,
    role TEXT NOT NULL,
    login TEXT NOT NULL,
    read_only INTEGER NOT NULL,
    app INTEGER NOT NULL DEFAULT 0,
    verifier TEXT NOT NULL,
    expires_at REAL NOT NULL,
    granted_by TEXT NOT NULL,
    granted_at REAL NOT NULL,
    password TEXT NOT NULL DEFAULT '',
    job INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (branch, role)
);
"""
# Tables of earlier releases that held the PR workflow's state in the workflow's own columns:
# ``pr_state`` (unread since records moved to ``pr_record``) and ``pr_record`` (moved into
# ``records`` as the JSON the workflow writes now, then dropped).
_OLD_RECORDS = """
SELECT branch, head_sha, status, report, updated_at FROM pr_record
WHERE branch IN (SELECT name FROM branches)
"""

# Columns added after a table was first created: (table, column, definition). A pool made by an
# older release gains them when its registry is opened; new pools get them from SCHEMA too.
ADDED_COLUMNS: list[tuple[str, str, str]] = [
    ("bases", "source_role", "TEXT NOT NULL DEFAULT ''"),
    ("bases", "source_settings", "TEXT NOT NULL DEFAULT '{}'"),
    ("bases", "tablespaces", "TEXT NOT NULL DEFAULT ''"),
    ("bases", "mask_rules", "TEXT NOT NULL DEFAULT ''"),
    ("bases", "mask_sha256", "TEXT NOT NULL DEFAULT ''"),
    # '' for a base prepared before preparing locked bases down (see lockdown)
    ("bases", "neutralised", "TEXT NOT NULL DEFAULT ''"),
    # who asked for the branch: a repository's pull request (through the engine service), and
    # the uid of the caller (0 for root's own CLI)
    ("branches", "repository", "TEXT NOT NULL DEFAULT ''"),
    ("branches", "pr", "INTEGER"),
    ("branches", "owner_uid", "INTEGER NOT NULL DEFAULT 0"),
    # the branch's directories, sockets and containers are named after its slot, which a
    # claimed warm branch keeps while its name changes; '' (rows of earlier releases): its name
    ("branches", "slot", "TEXT NOT NULL DEFAULT ''"),
    # the id of the repository the front door vouched for when it asked for the branch (the
    # network API, for a verified GitHub Actions job); NULL for a branch asked for on the socket
    ("branches", "owner_repository_id", "INTEGER"),
    # when the branch was last suspended (NULL: never, or woken since), and how long it may be
    # idle before it is (NULL: the pool's suspend_after; 0: never)
    ("branches", "suspended_at", "REAL"),
    ("branches", "suspend_after", "REAL"),
    # the preview app's password, kept as the branch's own is, so each job of the pull request
    # gets the deployed one again (runner/branch/grants.py); '' for a person's credential
    ("grants", "password", "TEXT NOT NULL DEFAULT ''"),
    # a job's credential on another runner (the network API's connection): its sessions act as
    # the branch role (runner/branch/grants.py)
    ("grants", "job", "INTEGER NOT NULL DEFAULT 0"),
]
# Made after ADDED_COLUMNS, which the index needs on a pool made by an older release.
INDEXES = """
CREATE UNIQUE INDEX IF NOT EXISTS branches_slot ON branches (slot) WHERE slot <> '';
"""


@dataclass(frozen=True)
class BaseVersion:
    name: str
    version: int
    state: str
    pg_major: int | None
    source: str
    via: str
    start_lsn: str
    size_bytes: int
    superuser: str
    database: str
    owner_uid: int
    created_at: float
    prepared_at: float | None
    source_role: str = ""  # "primary" or "standby": what the source was when it was copied
    source_settings: str = "{}"  # JSON: the source's settings that matter (sourceinfo.RELEVANT)
    tablespaces: str = ""  # comma-separated names of the tablespaces made in-place
    mask_rules: str = ""  # name of the masking rules file; '' when the base is not masked
    mask_sha256: str = ""  # SHA-256 of that file's bytes
    # JSON list: what preparing took away (see lockdown), one note each; '' when the base was
    # prepared by a release that did not lock bases down
    neutralised: str = ""

    @property
    def masked(self) -> bool:
        return bool(self.mask_sha256)

    @property
    def locked_down(self) -> bool:
        return bool(self.neutralised)

    @property
    def neutralised_notes(self) -> list[str]:
        return [str(note) for note in json.loads(self.neutralised or "[]")]

    @property
    def mask_label(self) -> str:
        """``rules.yml (sha256 1a2b3c4d5e6f)``, or ``not masked``."""
        if not self.masked:
            return "not masked"
        return f"{self.mask_rules} (sha256 {self.mask_sha256[:12]})"


@dataclass(frozen=True)
class Branch:
    name: str
    base_name: str
    base_version: int
    state: str
    step: str
    port: int
    runtime: str
    user: str
    password: str
    database: str
    created_at: float
    ready_at: float | None
    expires_at: float | None
    repository: str = ""  # owner/name of the pull request's repository, '' when none
    pr: int | None = None
    owner_uid: int = 0  # the uid that asked for it
    slot: str = ""  # what its directories and container are named after; '' for its name
    # the repository (by GitHub's id) the front door vouched for; None: not asked for that way
    owner_repository_id: int | None = None
    suspended_at: float | None = None  # when it was suspended; None while it is not
    suspend_after: float | None = None  # idle seconds before it is; None: the pool's setting

    @property
    def key(self) -> str:
        """The name its directories, sockets, locks of its files and container go by."""
        return self.slot or self.name

    @property
    def warm(self) -> bool:
        return self.state == "warm"

    def __repr__(self) -> str:  # keep the password out of any repr that reaches a log
        return f"Branch(name={self.name!r}, state={self.state!r}, port={self.port})"


@dataclass(frozen=True)
class WarmTarget:
    """How many warm branches of base ``base_name`` to keep started for ``runtime``."""

    base_name: str
    runtime: str
    count: int


@dataclass(frozen=True)
class StoredRecord:
    """What a branch's owner last noted about it: JSON text the engine keeps and never reads
    (the PR workflow's record, ``action/record.py``). It lives and dies with its branch: a
    branch destroyed by hand or by its TTL leaves no record behind."""

    branch: str
    data: str
    updated_at: float


@dataclass(frozen=True)
class StoredGrant:
    """A credential granted in a branch: the role made for a GitHub ``login`` (or the preview
    app's role, whose ``login`` is its role's name), until ``expires_at``, and who asked
    (``granted_by``: ``uid:N``, or the person the front door vouched for, ``github:LOGIN``).
    ``password``: the preview app's, kept so each job gets the deployed one again; '' for a
    person's (shown once, never kept) and a job's (``job``: the credential a job on another
    runner logs in with, its sessions acting as the branch role)."""

    branch: str
    role: str
    login: str
    read_only: bool
    app: bool
    verifier: str = field(repr=False)
    expires_at: float
    granted_by: str
    granted_at: float
    password: str = field(default="", repr=False)
    job: bool = False


@dataclass(frozen=True)
class Usage:
    """How many branches (warm ones aside) the pool holds, of them one repository's and one
    owner's (``Registry.usage``)."""

    total: int
    of_repository: int
    of_owner: int


def _columns(cls: type) -> str:
    return ", ".join(f.name for f in fields(cls))


# What pgoverlay itself writes into a row. Root builds paths, ports and commands from rows, so a
# row that says anything else (``../../x``, a port outside the pool's range) is refused on read.
# "warm": started, unclaimed, no password; "claiming": bound to a name, its password being set
BRANCH_STATES = frozenset(
    {
        "creating",
        "ready",
        "resetting",
        "destroying",
        "warm",
        "claiming",
        # an idle branch stopped and unmounted, its writable layer kept (``branch.suspend``),
        # and the two steps between it and ready
        "suspending",
        "suspended",
        "waking",
    }
)
WARM_PREFIX = "warm-"
# "removing": `base rm` committed to removing the version; gc finishes it (see runner/seed/bases.py)
BASE_STATES = frozenset({"seeding", "ready", "removing"})
IDENTIFIER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_$. -]{0,62}$")


def _bad(kind: str, name: object, why: str) -> RegistryRowError:
    return RegistryRowError(
        f"registry row {kind} {str(name)[:80]!r} is not one pgoverlay wrote ({why}): it is left "
        "alone; remove it with `sqlite3` (as root) once you know how it got there"
    )


def _check_common(kind: str, name: object, version: object) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _bad(kind, name, "its name is not a valid name")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _bad(kind, name, f"version {version!r} is not a positive integer")


def branch_from_row(row: tuple[Any, ...], *, ports: tuple[int, int] | None) -> Branch:
    """A branch row as a Branch, if every field is one pgoverlay could have written."""
    b = Branch(*row)
    _check_common("branch", b.name, b.base_version)
    if not isinstance(b.base_name, str) or not NAME_RE.match(b.base_name):
        raise _bad("branch", b.name, "its base name is not a valid name")
    if b.state not in BRANCH_STATES:
        raise _bad("branch", b.name, f"unknown state {str(b.state)[:40]!r}")
    unknown = runtimes.problem(b.runtime)
    if unknown:
        raise _bad("branch", b.name, unknown)
    low, high = ports or (1, 65535)
    if not isinstance(b.port, int) or isinstance(b.port, bool) or not low <= b.port <= high:
        raise _bad(
            "branch",
            b.name,
            f"port {b.port!r} is outside the pool's range {low}-{high} "
            "(PGOVERLAY_PORT_MIN/PGOVERLAY_PORT_MAX)",
        )
    for what, value in (("user", b.user), ("database", b.database)):
        if not isinstance(value, str) or not IDENTIFIER_RE.match(value):
            raise _bad("branch", b.name, f"its {what} is not a plain identifier")
    if b.repository and not REPOSITORY_RE.match(b.repository):
        raise _bad("branch", b.name, "its repository is not owner/name")
    if b.slot and (not isinstance(b.slot, str) or not NAME_RE.match(b.slot)):
        raise _bad("branch", b.name, "its slot is not a valid name")
    repository_id = b.owner_repository_id
    if repository_id is not None and (
        not isinstance(repository_id, int) or isinstance(repository_id, bool) or repository_id < 1
    ):
        raise _bad("branch", b.name, "its owner repository id is not a positive integer")
    for what, seconds in (("suspended_at", b.suspended_at), ("suspend_after", b.suspend_after)):
        if seconds is not None and (
            not isinstance(seconds, int | float)
            or isinstance(seconds, bool)
            or not 0 <= seconds < 1e12
        ):
            raise _bad("branch", b.name, f"its {what} is not a number of seconds")
    if b.state == "warm" and b.slot != b.name:
        raise _bad("branch", b.name, "a warm branch is named after its slot")
    return b


def base_from_row(row: tuple[Any, ...]) -> BaseVersion:
    """A base row as a BaseVersion, if every field is one pgoverlay could have written."""
    b = BaseVersion(*row)
    _check_common("base", b.name, b.version)
    if b.state not in BASE_STATES:
        raise _bad("base", b.name, f"unknown state {str(b.state)[:40]!r}")
    for what, value in (("superuser", b.superuser), ("database", b.database)):
        if value and (not isinstance(value, str) or not IDENTIFIER_RE.match(value)):
            raise _bad("base", b.name, f"its {what} is not a plain identifier")
    return b


class Registry:
    """The registry file, root's alone. Rows are validated as they are read: ``branches()`` and
    ``bases()`` leave out rows that fail (``rejected()`` names them), and a lookup of one such
    row raises RegistryRowError. SQLite's own errors (a damaged file, a lock held past
    ``busy_timeout`` seconds, a full disk) leave as RegistryError."""

    def __init__(
        self, path: Path, *, ports: tuple[int, int] | None = None, busy_timeout: float = 60.0
    ) -> None:
        self.path = path
        self.ports = ports
        self._busy_timeout = busy_timeout
        fresh = not path.exists()
        try:
            self._db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
            if fresh:
                os.chmod(path, 0o600)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # what a transaction is unless told
            self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(SCHEMA)
        except sqlite3.Error as err:
            raise self._failed(err) from None
        self._add_missing_columns()
        try:
            self._db.executescript(INDEXES)
        except sqlite3.Error as err:
            raise self._failed(err) from None
        self._move_old_records()

    def _failed(self, err: sqlite3.Error) -> RegistryError:
        """SQLite's error as ours, with what to do about it."""
        code = getattr(err, "sqlite_errorname", "")
        if code in ("SQLITE_BUSY", "SQLITE_LOCKED"):
            fix = (
                f"another process kept it locked for over {self._busy_timeout:g} s: find it with "
                f"`fuser {self.path}` (as root), let it finish or stop it, then try again"
            )
        elif code in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
            fix = (
                f"the file is damaged: check it with `sqlite3 {self.path} 'PRAGMA "
                "integrity_check'` (as root) and restore it from a backup"
            )
        elif code == "SQLITE_FULL":
            fix = "its file system is full: free space, then try again"
        else:
            fix = "check that root can read and write the file and its folder"
        return RegistryError(f"the pool's registry {self.path} cannot be used ({err}): {fix}")

    def _read(self, query: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(query, args).fetchall()
        except sqlite3.Error as err:
            raise self._failed(err) from None

    def _add_missing_columns(self) -> None:
        with self.transaction() as db:
            for table, column, definition in ADDED_COLUMNS:
                have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")

    def _move_old_records(self) -> None:
        """Move an earlier release's ``pr_record`` rows into ``records`` (as the JSON object the
        workflow writes: ``head_sha``, ``status`` and ``report``), then drop the old tables."""
        old = {"pr_record", "pr_state"}
        if not old & {row[0] for row in self._db.execute("SELECT name FROM sqlite_master")}:
            return
        with self.transaction() as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
            if "pr_record" in tables:
                for branch, head_sha, status, report, updated_at in db.execute(_OLD_RECORDS):
                    try:
                        last = json.loads(report)
                    except ValueError:
                        continue  # a report no release wrote: the branch is redone, not read
                    data = json.dumps({"head_sha": head_sha, "status": status, "report": last})
                    db.execute(
                        "INSERT OR IGNORE INTO records VALUES (?, ?, ?)",
                        (branch, data, updated_at),
                    )
                db.execute("DROP TABLE pr_record")
            db.execute("DROP TABLE IF EXISTS pr_state")

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; SQLite's errors in it leave as RegistryError.

        A transaction that is not ``durable`` commits without waiting for the disk
        (``synchronous = NORMAL``): a killed process loses nothing, but a power loss or a host
        crash may roll it back, until the next durable transaction (or checkpoint) of anyone
        writes it down. Only for steps whose undoing after a host crash leaves a row ``gc``
        mends: a warm branch's claim, whose server a host crash stops anyway."""
        try:
            if not durable:
                self._db.execute("PRAGMA synchronous = NORMAL")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            finally:
                if not durable:
                    self._db.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error as err:
            raise self._failed(err) from None

    # bases -------------------------------------------------------------------------------

    def bases(self, name: str | None = None) -> list[BaseVersion]:
        query = f"SELECT {_columns(BaseVersion)} FROM bases"
        args: tuple[Any, ...] = ()
        if name is not None:
            query += " WHERE name = ?"
            args = (name,)
        rows = self._read(query + " ORDER BY name, version", args)
        return [base for base in map(self._base_or_none, rows) if base is not None]

    def _base_or_none(self, row: tuple[Any, ...]) -> BaseVersion | None:
        try:
            return base_from_row(row)
        except RegistryRowError:
            return None

    def _branch_or_none(self, row: tuple[Any, ...]) -> Branch | None:
        try:
            return branch_from_row(row, ports=self.ports)
        except RegistryRowError:
            return None

    def rejected(self) -> list[str]:
        """Why each row that fails validation is refused (one line per row)."""
        found = []
        for row in self._read(f"SELECT {_columns(BaseVersion)} FROM bases"):
            try:
                base_from_row(row)
            except RegistryRowError as err:
                found.append(str(err))
        for row in self._read(f"SELECT {_columns(Branch)} FROM branches"):
            try:
                branch_from_row(row, ports=self.ports)
            except RegistryRowError as err:
                found.append(str(err))
        return found

    def latest_base(self, name: str) -> BaseVersion | None:
        ready = [b for b in self.bases(name) if b.state == "ready"]
        return ready[-1] if ready else None

    def base(self, name: str, version: int) -> BaseVersion | None:
        found = [b for b in self.bases(name) if b.version == version]
        return found[0] if found else None

    def add_base_version(self, name: str, *, source: str, via: str) -> int:
        with self.transaction() as db:
            row = db.execute("SELECT MAX(version) FROM bases WHERE name = ?", (name,)).fetchone()
            version = int(row[0] or 0) + 1
            db.execute(
                "INSERT INTO bases (name, version, state, source, via, created_at) "
                "VALUES (?, ?, 'seeding', ?, ?, ?)",
                (name, version, source, via, time.time()),
            )
        return version

    def update_base(self, name: str, version: int, **values: Any) -> None:
        allowed = {f.name for f in fields(BaseVersion)} - {"name", "version"}
        unknown = set(values) - allowed
        if unknown:
            raise ValueError(f"unknown base fields: {sorted(unknown)}")
        assignments = ", ".join(f"{key} = ?" for key in values)
        with self.transaction() as db:
            db.execute(
                f"UPDATE bases SET {assignments} WHERE name = ? AND version = ?",
                (*values.values(), name, version),
            )

    def mark_removing(
        self, name: str, versions: list[int], *, allow_branches: bool
    ) -> dict[int, list[str]]:
        """Mark ``versions`` of base ``name`` as ``removing``, in one transaction with the check
        of which branches use them (every row, valid or not), so no branch of them is created
        in between. Returns those branches per version; marks nothing if some exist and
        ``allow_branches`` is false."""
        with self.transaction() as db:
            users = {v: found for v in versions if (found := self.branches_of(name, v, warm=False))}
            if users and not allow_branches:
                return users
            db.executemany(
                "UPDATE bases SET state = 'removing' WHERE name = ? AND version = ?",
                [(name, version) for version in versions],
            )
        return users

    def branches_of(self, name: str, version: int, *, warm: bool = True) -> list[str]:
        """The name of every branch row of base ``name`` version ``version``, valid or not
        (warm ones, which nobody uses yet, only with ``warm``)."""
        rows = self._read(
            "SELECT name FROM branches WHERE base_name = ? AND base_version = ? "
            + ("" if warm else "AND state <> 'warm' ")
            + "ORDER BY name",
            (name, version),
        )
        return [str(row[0]) for row in rows]

    def delete_base(self, name: str, version: int) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM bases WHERE name = ? AND version = ?", (name, version))

    # branches ----------------------------------------------------------------------------

    def branches(self, *, warm: bool = False) -> list[Branch]:
        """The branches; warm ones (unclaimed, nobody's yet) only with ``warm``."""
        rows = self._read(f"SELECT {_columns(Branch)} FROM branches ORDER BY name")
        found = [branch for branch in map(self._branch_or_none, rows) if branch is not None]
        return found if warm else [b for b in found if not b.warm]

    def branch_names(self) -> set[str]:
        """The name of every branch row, valid or not."""
        return {str(row[0]) for row in self._read("SELECT name FROM branches")}

    def branch_keys(self) -> set[str]:
        """What every branch row's files are named after (its slot, else its name), valid or
        not: no directory, socket or container of theirs is an orphan."""
        rows = self._read("SELECT CASE WHEN slot <> '' THEN slot ELSE name END FROM branches")
        return {str(row[0]) for row in rows}

    def name_taken(self, db: sqlite3.Connection, name: str) -> bool:
        """Whether ``name`` is a branch's name or the slot of one (a claimed warm branch)."""
        query = "SELECT 1 FROM branches WHERE name = ? OR slot = ?"
        return db.execute(query, (name, name)).fetchone() is not None

    def claim_warm(
        self, db: sqlite3.Connection, base: BaseVersion, runtime: str, **values: Any
    ) -> Branch | None:
        """In the caller's transaction: bind the oldest warm branch of ``base`` on ``runtime``
        to ``values`` (its name, password, owner...) and mark it ``claiming``. None if none is
        warm. One UPDATE guarded by ``state = 'warm'``: two claims never get the same one."""
        query = (
            "SELECT name FROM branches WHERE state = 'warm' AND base_name = ? "
            "AND base_version = ? AND runtime = ? ORDER BY created_at, name"
        )
        for (slot,) in db.execute(query, (base.name, base.version, runtime)).fetchall():
            changes = {**values, "state": "claiming", "step": ""}
            assignments = ", ".join(f"{key} = ?" for key in changes)
            done = db.execute(
                f"UPDATE branches SET {assignments} WHERE name = ? AND state = 'warm'",
                (*changes.values(), slot),
            )
            if done.rowcount == 1:
                rows = db.execute(
                    f"SELECT {_columns(Branch)} FROM branches WHERE name = ?", (values["name"],)
                ).fetchall()
                return branch_from_row(rows[0], ports=self.ports)
        return None

    def unwarm(self, slot: str) -> bool:
        """Take warm branch ``slot`` out of the warm set (marked ``destroying``) unless a claim
        got it first. True if it is now this caller's to tear down."""
        with self.transaction() as db:
            done = db.execute(
                "UPDATE branches SET state = 'destroying', step = '' "
                "WHERE name = ? AND state = 'warm'",
                (slot,),
            )
            return done.rowcount == 1

    # warm targets -----------------------------------------------------------------------

    def warm_targets(self) -> list[WarmTarget]:
        rows = self._read(
            f"SELECT {_columns(WarmTarget)} FROM warm_targets ORDER BY base_name, runtime"
        )
        return [WarmTarget(str(n), str(r), int(c)) for n, r, c in rows if r in runtimes.names()]

    def set_warm_target(self, base_name: str, runtime: str, count: int) -> None:
        """Keep ``count`` warm branches of ``base_name`` on ``runtime`` (0 forgets the target)."""
        with self.transaction() as db:
            if count <= 0:
                db.execute(
                    "DELETE FROM warm_targets WHERE base_name = ? AND runtime = ?",
                    (base_name, runtime),
                )
            else:
                db.execute(
                    "INSERT OR REPLACE INTO warm_targets (base_name, runtime, count) "
                    "VALUES (?, ?, ?)",
                    (base_name, runtime, count),
                )

    def forget_warm_targets(self, base_name: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM warm_targets WHERE base_name = ?", (base_name,))

    def branch(self, name: str) -> Branch | None:
        """Branch ``name``, None if there is none; RegistryRowError if its row is not valid."""
        rows = self._read(f"SELECT {_columns(Branch)} FROM branches WHERE name = ?", (name,))
        return branch_from_row(rows[0], ports=self.ports) if rows else None

    def insert_branch(self, db: sqlite3.Connection, branch: Branch) -> None:
        names = [f.name for f in fields(Branch)]
        db.execute(
            f"INSERT INTO branches ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})",
            tuple(getattr(branch, n) for n in names),
        )

    def usage(
        self,
        db: sqlite3.Connection,
        *,
        repository: str,
        owner_uid: int,
        repository_id: int | None = None,
    ) -> Usage:
        """In the caller's transaction: how many branch rows (warm ones aside, valid or not)
        the pool, ``repository`` (none when '') and ``owner_uid`` hold. Read in the transaction
        that registers a new branch, so a limit checked against it cannot be passed by
        creates that run at the same time (see ``branch.quota``). With ``repository_id`` (the
        network API's), the repository's branches are those made for that id: a renamed
        repository keeps its count, a re-created one of the same name starts its own."""
        row = db.execute(
            "SELECT count(*), "
            "coalesce(sum(CASE WHEN ?3 IS NOT NULL THEN owner_repository_id = ?3 "
            "ELSE ?1 <> '' AND lower(repository) = lower(?1) END), 0), "
            "coalesce(sum(owner_uid = ?2), 0) "
            "FROM branches WHERE state <> 'warm'",
            (repository, owner_uid, repository_id),
        ).fetchone()
        return Usage(total=int(row[0]), of_repository=int(row[1]), of_owner=int(row[2]))

    def used_ports(self, db: sqlite3.Connection) -> set[int]:
        return {int(row[0]) for row in db.execute("SELECT port FROM branches")}

    def update_branch(self, name: str, *, durable: bool = True, **values: Any) -> None:
        """Set ``values`` in branch ``name``'s row (``durable``: see ``transaction``)."""
        allowed = {f.name for f in fields(Branch)} - {"name"}
        unknown = set(values) - allowed
        if unknown:
            raise ValueError(f"unknown branch fields: {sorted(unknown)}")
        assignments = ", ".join(f"{key} = ?" for key in values)
        with self.transaction(durable=durable) as db:
            db.execute(
                f"UPDATE branches SET {assignments} WHERE name = ?", (*values.values(), name)
            )

    def delete_branch(self, name: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM branches WHERE name = ?", (name,))

    # records ------------------------------------------------------------------------------

    def record(self, branch: str) -> StoredRecord | None:
        rows = self._read(
            f"SELECT {_columns(StoredRecord)} FROM records WHERE branch = ?", (branch,)
        )
        return StoredRecord(*rows[0]) if rows else None

    def records(self) -> dict[str, StoredRecord]:
        """Every branch's record, by branch: one query for a list of all of them."""
        rows = self._read(f"SELECT {_columns(StoredRecord)} FROM records")
        return {str(row[0]): StoredRecord(*row) for row in rows}

    def save_record(self, record: StoredRecord) -> bool:
        """Keep ``record`` with its branch; False if the branch is gone (nothing kept)."""
        with self.transaction() as db:
            if not db.execute("SELECT 1 FROM branches WHERE name = ?", (record.branch,)).fetchone():
                return False
            db.execute(
                "INSERT OR REPLACE INTO records (branch, data, updated_at) VALUES (?, ?, ?)",
                (record.branch, record.data, record.updated_at),
            )
        return True

    # grants -------------------------------------------------------------------------------

    def grants(self, branch: str | None = None) -> list[StoredGrant]:
        """The credentials granted in ``branch`` (in every branch when None), by role."""
        query = f"SELECT {_columns(StoredGrant)} FROM grants"
        args: tuple[Any, ...] = ()
        if branch is not None:
            query += " WHERE branch = ?"
            args = (branch,)
        rows = self._read(query + " ORDER BY branch, role", args)
        return [_grant(row) for row in rows]

    def grant(self, branch: str, role: str) -> StoredGrant | None:
        rows = self._read(
            f"SELECT {_columns(StoredGrant)} FROM grants WHERE branch = ? AND role = ?",
            (branch, role),
        )
        return _grant(rows[0]) if rows else None

    def save_grant(self, grant: StoredGrant) -> bool:
        """Keep ``grant`` (replacing the role's earlier one); False if the branch is gone."""
        with self.transaction() as db:
            if not db.execute("SELECT 1 FROM branches WHERE name = ?", (grant.branch,)).fetchone():
                return False
            names = [f.name for f in fields(StoredGrant)]
            db.execute(
                f"INSERT OR REPLACE INTO grants ({', '.join(names)}) "
                f"VALUES ({', '.join('?' for _ in names)})",
                tuple(getattr(grant, n) for n in names),
            )
        return True

    def delete_grant(self, branch: str, role: str) -> bool:
        with self.transaction() as db:
            done = db.execute("DELETE FROM grants WHERE branch = ? AND role = ?", (branch, role))
            return done.rowcount == 1


def _grant(row: tuple[Any, ...]) -> StoredGrant:
    g = StoredGrant(*row)
    return StoredGrant(
        branch=str(g.branch),
        role=str(g.role),
        login=str(g.login),
        read_only=bool(g.read_only),
        app=bool(g.app),
        verifier=str(g.verifier),
        expires_at=float(g.expires_at),
        granted_by=str(g.granted_by),
        granted_at=float(g.granted_at),
        password=str(g.password or ""),
        job=bool(g.job),
    )
