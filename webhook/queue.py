"""The webhook listener's durable job queue, in SQLite (WAL, one ``BEGIN IMMEDIATE`` per change).

It remembers deliveries (a redelivery is acknowledged, not run twice, across restarts) and holds
their jobs. Threads share one :class:`Queue` (each gets its own connection); processes open
their own. The file is its owner's alone (0600): it holds what each delivery asked for. A job
keeps its delivery's event as parsed at intake (``routing.JobEvent``, JSON), never GitHub's
JSON; a close that reconcile queues keeps none. The queue, not its callers, enforces:

* **Lanes**: one per PR (``repository`` + ``pr``; PR-less jobs share one per repository). A lane
  runs one job at a time, oldest first, even past an older job waiting out a retry delay.
* **Coalescing** on accept: a new ``sync`` skips the lane's older *queued* syncs; a new ``close``
  cancels all its *queued* jobs. Running jobs are left alone, but a retry is refused to a job
  overtaken meanwhile (cancelled by a newer close, or skipped: a sync with a newer sync).
* **Leases**: a worker killed with ``kill -9`` stops renewing, and after expiry the next
  ``claim`` requeues its job at the head of its lane. ``attempts`` counts *starts* (``claim``
  adds one, ``retry`` does not), so a crash costs an attempt and a job that kills its worker
  every time fails after ``max_attempts`` starts. Delivery is at least once (a worker that
  outlives its lease may run a job twice): the PR workflow must be idempotent.
* **Dedupe** by delivery id and by the SHA-256 of the signed body: the signature does not cover
  ``X-GitHub-Delivery``, so a captured body replayed under a new id is the same delivery. A
  repeat is counted on the delivery first recorded (``repeats``), so replays add no rows.
* **Reports**: a job that ends ``done`` may keep its run's report (the Action's JSON report) of
  at most ``MAX_REPORT_BYTES``, apart from the job's columns: listing jobs never reads them.
* **Retention**: deliveries are kept 30 days by default, never less than the 3 days GitHub lets
  users redeliver; a delivery's ``outcome`` follows its job's final state in the same commit.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import logging
import os
import random
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from pgoverlay.errors import DeliveryError, QueueError
from pgoverlay.runner import safefs
from pgoverlay.runner.polling import wait_for
from pgoverlay.webhook.payload import pull_request_event
from pgoverlay.webhook.routing import job_event

log = logging.getLogger(__name__)

State = Literal["queued", "running", "done", "failed", "skipped", "cancelled"]
STATES: tuple[State, ...] = ("queued", "running", "done", "failed", "skipped", "cancelled")
Accepted = Literal["queued", "duplicate", "ignored"]
# A delivery's outcome: its job's state, or one of these when it has none.
OUTCOMES: tuple[str, ...] = (*STATES, "ignored", "rejected", "duplicate")

REDELIVERY_WINDOW = 3 * 86400.0  # GitHub lets users redeliver a webhook for 3 days
DEFAULT_RETENTION = 30 * 86400.0
MAX_SERVER_WAIT = 3600.0  # GitHub's primary rate limit resets within the hour
MAX_REPORT_BYTES = 1024 * 1024  # a job's stored JSON report (the worker drops detail to fit)
# The queue's format (SQLite's user_version): 0 kept each delivery's body in its job, 1 keeps the
# parsed event (see _upgrade_payloads).
FORMAT = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    delivery_id TEXT PRIMARY KEY, event TEXT NOT NULL, action TEXT NOT NULL,
    received_at REAL NOT NULL, outcome TEXT NOT NULL, body_sha256 TEXT,
    reason TEXT NOT NULL DEFAULT '', repeats INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, delivery_id TEXT NOT NULL,
    repository TEXT NOT NULL, pr INTEGER, kind TEXT NOT NULL, head_sha TEXT NOT NULL,
    payload TEXT NOT NULL, state TEXT NOT NULL
        CHECK (state IN ('queued', 'running', 'done', 'failed', 'skipped', 'cancelled')),
    attempts INTEGER NOT NULL DEFAULT 0, not_before REAL NOT NULL, lease_owner TEXT,
    lease_expires REAL, created_at REAL NOT NULL, finished_at REAL,
    result TEXT NOT NULL DEFAULT '', report TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, id);
CREATE INDEX IF NOT EXISTS jobs_by_lane ON jobs (repository, pr, state, id);
CREATE INDEX IF NOT EXISTS jobs_by_delivery ON jobs (delivery_id);
CREATE INDEX IF NOT EXISTS deliveries_by_age ON deliveries (received_at);
CREATE TABLE IF NOT EXISTS job_runs (
    kind TEXT NOT NULL, result TEXT NOT NULL, runs INTEGER NOT NULL, seconds REAL NOT NULL,
    PRIMARY KEY (kind, result));
CREATE TABLE IF NOT EXISTS reconcile_actions (action TEXT PRIMARY KEY, count INTEGER NOT NULL);
"""
# Columns a queue made by an earlier release lacks; the index needs the column first.
_ADDED = {
    "body_sha256": "TEXT",
    "reason": "TEXT NOT NULL DEFAULT ''",
    "repeats": "INTEGER NOT NULL DEFAULT 0",
}
_ADDED_TO_JOBS = {"report": "TEXT NOT NULL DEFAULT ''"}
_BODY_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS deliveries_by_body ON deliveries (body_sha256)"
# The delivery recorded before under this id or with this signed body, counted once more.
_REPEAT = """
UPDATE deliveries SET repeats = repeats + 1 WHERE rowid = (SELECT rowid FROM deliveries
WHERE delivery_id = ?1 OR (?2 IS NOT NULL AND body_sha256 = ?2) LIMIT 1)
"""

# The oldest due queued job that heads its lane (nothing of the lane running or queued before).
_CLAIMABLE = """
SELECT j.id FROM jobs AS j WHERE j.state = 'queued' AND j.not_before <= ? AND NOT EXISTS (
    SELECT 1 FROM jobs AS o WHERE o.repository = j.repository AND o.pr IS j.pr
    AND (o.state = 'running' OR (o.state = 'queued' AND o.id < j.id)))
ORDER BY j.id LIMIT 1
"""
# End the lane's older queued jobs: all of them for a new close, the syncs for a new sync.
_COALESCE = """
UPDATE jobs SET state = ?1, finished_at = ?2, result = ?3 WHERE repository = ?4 AND pr IS ?5
AND state = 'queued' AND id < ?6 AND (?7 = 'close' OR kind = 'sync') RETURNING delivery_id
"""

# The newest queued close and sync of a job's lane that arrived after it.
_OVERTAKEN_BY = """
SELECT kind, max(id) FROM jobs WHERE repository = ? AND pr IS ? AND id > ? AND state = 'queued'
AND kind IN ('close', 'sync') GROUP BY kind
"""


def pr_label(repository: str, pr: int | None) -> str:
    """How log lines name a pull request: `owner/name#N` (what docs/webhook.md says to search
    for), or the repository alone for a job that is not about one."""
    return repository if pr is None else f"{repository}#{pr}"


@dataclass(frozen=True)
class NewJob:
    repository: str  # "owner/name"
    pr: int | None
    kind: str  # one of action.event.JOB_KINDS: only close and sync coalesce
    head_sha: str
    payload: str  # the delivery's routing.JobEvent as JSON; '' for a close reconcile queued


@dataclass(frozen=True)
class Delivery:
    """A delivery to record (and its job, if it needs one)."""

    delivery_id: str
    event: str
    action: str
    job: NewJob | None
    body_sha256: str | None = None


@dataclass(frozen=True)
class Job:
    id: int
    delivery_id: str
    repository: str
    pr: int | None
    kind: str
    head_sha: str
    payload: str
    state: State
    attempts: int
    not_before: float
    lease_owner: str | None
    lease_expires: float | None
    created_at: float
    finished_at: float | None
    result: str

    def log_extra(self) -> dict[str, str]:
        """The delivery id and the PR, for a log line about this job."""
        return {"delivery_id": self.delivery_id, "pr": pr_label(self.repository, self.pr)}

    def __repr__(self) -> str:  # what a job names, without the sender and installation
        return (
            f"Job(id={self.id}, {self.repository}#{self.pr}, kind={self.kind!r}, "
            f"state={self.state!r}, attempts={self.attempts}, delivery={self.delivery_id!r})"
        )


_COLUMNS = ", ".join(f.name for f in fields(Job))


def _clock(now: float | None) -> float:
    return time.time() if now is None else now


class Queue:
    def __init__(
        self,
        path: Path,
        *,
        max_attempts: int = 5,
        synchronous: Literal["NORMAL", "FULL"] = "FULL",
        busy_timeout: float = 30.0,
        checkpoint_pages: int = 1000,
    ) -> None:
        """``checkpoint_pages``: the WAL size (in pages) past which a commit of this process
        copies the WAL into the database (SQLite's ``wal_autocheckpoint``; 1000 is its
        default). Intake sets it high, so the worker process's commits do that work."""
        if max_attempts < 1 or synchronous not in ("NORMAL", "FULL"):
            raise QueueError(
                f"max_attempts must be at least 1 (got {max_attempts}) and synchronous NORMAL or"
                f" FULL (got {synchronous!r})"
            )
        self.path = path
        self.max_attempts = max_attempts
        self._synchronous = synchronous
        self._busy_ms = int(busy_timeout * 1000)
        self._checkpoint_pages = int(checkpoint_pages)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._closed = False
        _make_private(path)
        with self._write() as db:
            for statement in filter(str.strip, SCHEMA.split(";")):
                db.execute(statement)
            have = {row[1] for row in db.execute("PRAGMA table_info(deliveries)")}
            for column, declaration in _ADDED.items():
                if column not in have:
                    db.execute(f"ALTER TABLE deliveries ADD COLUMN {column} {declaration}")
            have = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
            for column, declaration in _ADDED_TO_JOBS.items():
                if column not in have:
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {declaration}")
            db.execute(_BODY_INDEX)
            if db.execute("PRAGMA user_version").fetchone()[0] < FORMAT:
                _upgrade_payloads(db, time.time())
                db.execute(f"PRAGMA user_version = {FORMAT}")

    def close(self) -> None:
        """Close every thread's connection; call once the threads using the queue are done."""
        with self._lock:
            self._closed = True
            for db in self._connections:
                db.close()
            self._connections.clear()

    def _db(self) -> sqlite3.Connection:
        """This thread's connection: SQLite connections are not shared between threads."""
        if self._closed:
            raise QueueError(f"job queue {self.path} is closed")
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
        return db

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            db.execute(f"PRAGMA synchronous = {self._synchronous}")
            db.execute(f"PRAGMA wal_autocheckpoint = {self._checkpoint_pages}")
            # A new file turns to WAL once for good. That needs it alone, and SQLite says "locked"
            # at once instead of waiting if another process opens it too: retry to a deadline.
            mode = wait_for(
                lambda: _journal_mode(db),
                timeout=self._busy_ms / 1000,
                what=f"the job queue {self.path} to switch to WAL mode",
            )
        except sqlite3.Error as err:
            raise QueueError(f"cannot open the job queue {self.path}: {err}") from err
        if mode != "wal":
            raise QueueError(f"job queue {self.path}: no WAL mode ({mode}); use a local disk")
        with self._lock:
            if self._closed:
                db.close()
                raise QueueError(f"job queue {self.path} is closed")
            self._connections.append(db)
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        db = self._db()
        # This process's threads queue up here, in turn, rather than in SQLite's busy handler,
        # which sleeps and retries (1, 2, 5 … 100 ms) and lets a busy burst wait for nothing.
        # Only another process's transaction makes BEGIN IMMEDIATE wait there.
        try:
            with self._writing:
                db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as err:
            raise QueueError(
                f"job queue {self.path}: {err} (if locked: another process held the database"
                f" for over {self._busy_ms / 1000:.0f} s; look for a hung listener)"
            ) from err

    def _read(self, query: str, args: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return self._db().execute(query, args).fetchall()
        except sqlite3.Error as err:
            raise QueueError(f"job queue {self.path}: {err}") from err

    # intake ------------------------------------------------------------------------------

    def accept(
        self,
        *,
        delivery_id: str,
        event: str,
        action: str,
        job: NewJob | None,
        body_sha256: str | None = None,
        now: float | None = None,
    ) -> Accepted:
        """Record a delivery and queue its job, in one transaction.

        ``"duplicate"``: the delivery id or the signed body (its SHA-256) was seen before,
        nothing is queued. ``"ignored"``: recorded, no job. ``"queued"``: recorded, job queued,
        its lane coalesced.
        """
        delivery = Delivery(delivery_id, event, action, job, body_sha256)
        [outcome] = self.accept_all([delivery], now=now)
        return outcome

    def accept_all(
        self, deliveries: Sequence[Delivery], *, now: float | None = None
    ) -> list[Accepted]:
        """:meth:`accept` each delivery, in order, all in one transaction: deliveries that
        arrive together share one disk sync instead of waiting for one each."""
        now = _clock(now)
        with self._write() as db:
            done = [_accept(db, delivery, now) for delivery in deliveries]
        for delivery, (outcome, job_id) in zip(deliveries, done, strict=True):
            job = delivery.job
            if outcome == "queued" and job is not None:
                log.info(
                    "queued %s job %s for %s#%s",
                    job.kind,
                    job_id,
                    job.repository,
                    job.pr,
                    extra={
                        "delivery_id": delivery.delivery_id,
                        "pr": pr_label(job.repository, job.pr),
                    },
                )
        return [outcome for outcome, _ in done]

    def reject(
        self,
        *,
        delivery_id: str,
        event: str,
        action: str,
        reason: str,
        body_sha256: str,
        now: float | None = None,
    ) -> bool:
        """Record a signed delivery that cannot be acted on, with why; False if it repeats one
        recorded before (same id or same body), which is then counted once more instead."""
        with self._write() as db:
            if db.execute(_REPEAT, (delivery_id, body_sha256)).rowcount:
                return False
            db.execute(
                "INSERT INTO deliveries (delivery_id, event, action, received_at, outcome,"
                " body_sha256, reason) VALUES (?, ?, ?, ?, 'rejected', ?, ?)",
                (delivery_id, event, action, _clock(now), body_sha256, reason),
            )
        return True

    # work --------------------------------------------------------------------------------

    def claim(self, *, worker: str, lease_seconds: float, now: float | None = None) -> Job | None:
        """Lease the next runnable job to ``worker``, or None if nothing can run now."""
        now = _clock(now)
        with self._write() as db:
            self._reap(db, now)
            row = db.execute(_CLAIMABLE, (now,)).fetchone()
            if row is None:
                return None
            claimed = db.execute(
                "UPDATE jobs SET state = 'running', lease_owner = ?, lease_expires = ?,"
                f" attempts = attempts + 1 WHERE id = ? RETURNING {_COLUMNS}",
                (worker, now + lease_seconds, row[0]),
            ).fetchone()
        return Job(*claimed)

    def _reap(self, db: sqlite3.Connection, now: float) -> None:
        """Requeue jobs whose worker stopped renewing its lease; fail those with no attempt left."""
        rows = db.execute(
            f"SELECT {_COLUMNS} FROM jobs WHERE state = 'running' AND lease_expires <= ?", (now,)
        ).fetchall()
        for job in (Job(*row) for row in rows):
            log.warning("lease of %s on %r expired", job.lease_owner, job, extra=job.log_extra())
            if job.attempts >= self.max_attempts:
                self._end(db, job, "failed", "its worker died or hung on the last attempt", now)
            else:
                reclaimed = f"lease of {job.lease_owner} expired; requeued"
                db.execute(
                    "UPDATE jobs SET state = 'queued', lease_expires = NULL, result = ?"
                    " WHERE id = ?",
                    (reclaimed, job.id),
                )

    def _owned(self, db: sqlite3.Connection, job_id: int, worker: str) -> Job:
        row = db.execute(
            f"SELECT {_COLUMNS} FROM jobs WHERE id = ? AND state = 'running' AND lease_owner = ?",
            (job_id, worker),
        ).fetchone()
        if row is None:
            raise QueueError(
                f"job {job_id} is not running under worker {worker!r}: its lease expired and it"
                " went to another worker, or it already ended; renew leases before they expire"
            )
        return Job(*row)

    def _end(self, db: sqlite3.Connection, job: Job, state: State, result: str, now: float) -> None:
        db.execute(
            "UPDATE jobs SET state = ?, finished_at = ?, result = ?, lease_expires = NULL"
            " WHERE id = ?",
            (state, now, result, job.id),
        )
        _set_outcomes(db, state, [job.delivery_id])

    def renew(
        self, job_id: int, *, worker: str, lease_seconds: float, now: float | None = None
    ) -> bool:
        """Extend the lease; False if ``worker`` no longer holds it (then stop the work)."""
        with self._write() as db:
            renewed = db.execute(
                "UPDATE jobs SET lease_expires = ? WHERE id = ? AND state = 'running'"
                " AND lease_owner = ?",
                (_clock(now) + lease_seconds, job_id, worker),
            )
            return renewed.rowcount == 1

    def finish(
        self,
        job_id: int,
        *,
        worker: str,
        state: Literal["done", "failed", "skipped"],
        result: str = "",
        report: str = "",
        now: float | None = None,
    ) -> None:
        """End a job this worker holds, keeping ``report`` (JSON text, at most
        MAX_REPORT_BYTES) with it; QueueError if its lease was lost meanwhile."""
        size = len(report.encode())
        if size > MAX_REPORT_BYTES:
            raise QueueError(
                f"job {job_id}'s report is {size:,} bytes; at most {MAX_REPORT_BYTES:,} are kept"
            )
        with self._write() as db:
            self._end(db, self._owned(db, job_id, worker), state, result, _clock(now))
            db.execute("UPDATE jobs SET report = ? WHERE id = ?", (report, job_id))

    def report(self, job_id: int) -> str | None:
        """The report a job kept (JSON text), or None when the job is unknown or kept none."""
        rows = self._read("SELECT report FROM jobs WHERE id = ?", (job_id,))
        return rows[0][0] if rows and rows[0][0] else None

    def retry(
        self, job_id: int, *, worker: str, delay: float, result: str = "", now: float | None = None
    ) -> bool:
        """Requeue a job after a transient failure, due in ``delay`` s and still first in its lane.

        False when it will not run again: its ``max_attempts`` starts are spent (now failed), or
        a newer close (cancelled) or, for a sync, a newer sync (skipped) was queued meanwhile.
        """
        now = _clock(now)
        with self._write() as db:
            job = self._owned(db, job_id, worker)
            lane = (job.repository, job.pr, job.id)
            newer = dict(db.execute(_OVERTAKEN_BY, lane).fetchall())
            if job.attempts >= self.max_attempts:
                self._end(
                    db, job, "failed", f"gave up after {job.attempts} attempts: {result}", now
                )
            elif "close" in newer:
                self._end(db, job, "cancelled", f"cancelled by close job {newer['close']}", now)
            elif job.kind == "sync" and "sync" in newer:
                self._end(db, job, "skipped", f"superseded by sync job {newer['sync']}", now)
            else:
                db.execute(
                    "UPDATE jobs SET state = 'queued', not_before = ?, lease_expires = NULL,"
                    " result = ? WHERE id = ?",
                    (now + max(delay, 0.0), result, job.id),
                )
                return True
        return False

    # inspection and upkeep ---------------------------------------------------------------

    def depth(self) -> dict[str, int]:
        """Jobs by state, every state present (zeros included) so gauges never vanish."""
        counts: dict[str, int] = dict.fromkeys(STATES, 0)
        counts.update(self._read("SELECT state, count(*) FROM jobs GROUP BY state"))
        return counts

    def delivery_count(self) -> dict[tuple[str, str], int]:
        """Deliveries by event and outcome; repeats of a recorded one count as "duplicate"."""
        rows = self._read(
            "SELECT event, outcome, count(*), sum(repeats) FROM deliveries GROUP BY 1, 2"
        )
        counts: Counter[tuple[str, str]] = Counter()
        for event, outcome, n, repeats in rows:
            counts[(event, outcome)] += n
            if repeats:
                counts[(event, "duplicate")] += repeats
        return dict(counts)

    def job_count(self) -> dict[tuple[str, str], int]:
        """Jobs by kind and state (kinds and states with no job are left out)."""
        rows = self._read("SELECT kind, state, count(*) FROM jobs GROUP BY 1, 2")
        return {(kind, state): n for kind, state, n in rows}

    def oldest_queued_age(self, *, now: float | None = None) -> float:
        """Seconds the oldest queued job has waited since it was accepted; 0 with none."""
        [(created,)] = self._read("SELECT min(created_at) FROM jobs WHERE state = 'queued'")
        return max(_clock(now) - created, 0.0) if created is not None else 0.0

    def count_run(self, *, kind: str, result: str, seconds: float) -> None:
        """Add one job run (an attempt) and its duration to the durable totals."""
        with self._write() as db:
            db.execute(
                "INSERT INTO job_runs VALUES (?, ?, 1, ?) ON CONFLICT (kind, result) DO UPDATE"
                " SET runs = runs + 1, seconds = seconds + excluded.seconds",
                (kind, result, seconds),
            )

    def runs(self) -> dict[tuple[str, str], tuple[int, float]]:
        """Job runs by kind and result: (runs, seconds)."""
        rows = self._read("SELECT kind, result, runs, seconds FROM job_runs")
        return {(kind, result): (runs, seconds) for kind, result, runs, seconds in rows}

    def count_reconcile(self, actions: dict[str, int]) -> None:
        """Add what a reconcile run did to the durable totals."""
        with self._write() as db:
            db.executemany(
                "INSERT INTO reconcile_actions VALUES (?, ?) ON CONFLICT (action) DO UPDATE"
                " SET count = count + excluded.count",
                list(actions.items()),
            )

    def reconcile_count(self) -> dict[str, int]:
        return dict(self._read("SELECT action, count FROM reconcile_actions"))

    def jobs(self, *, repository: str | None = None, pr: int | None = None) -> list[Job]:
        """Jobs oldest first, optionally only one repository's and/or one PR number's."""
        rows = self._read(
            f"SELECT {_COLUMNS} FROM jobs WHERE (?1 IS NULL OR repository = ?1)"
            " AND (?2 IS NULL OR pr = ?2) ORDER BY id",
            (repository, pr),
        )
        return [Job(*row) for row in rows]

    def prune(
        self, older_than_seconds: float = DEFAULT_RETENTION, *, now: float | None = None
    ) -> dict[str, int]:
        """Delete ended jobs, then deliveries without jobs, older than the cutoff.

        Refuses a cutoff under 3 days: a delivery forgotten while GitHub still lets a user
        redeliver it would run twice.
        """
        if older_than_seconds < REDELIVERY_WINDOW:
            days = older_than_seconds / 86400
            raise QueueError(
                f"keep deliveries at least 3 days (GitHub's redelivery window), not {days:g}"
            )
        cutoff = _clock(now) - older_than_seconds
        with self._write() as db:
            jobs = db.execute(
                "DELETE FROM jobs WHERE state NOT IN ('queued', 'running') AND finished_at < ?",
                (cutoff,),
            ).rowcount
            deliveries = db.execute(
                "DELETE FROM deliveries WHERE received_at < ? AND NOT EXISTS"
                " (SELECT 1 FROM jobs WHERE jobs.delivery_id = deliveries.delivery_id)",
                (cutoff,),
            ).rowcount
        return {"jobs": jobs, "deliveries": deliveries}

    # fork approvals -----------------------------------------------------------------------
    # A maintainer's label approves a fork's pull request at one head SHA only. The table is
    # made on first use, in the transaction that uses it.

    def approve(
        self, repository: str, pr: int, *, head_sha: str, approver: str, now: float | None = None
    ) -> None:
        """Record that ``approver`` approved ``repository#pr`` at ``head_sha`` (replacing any
        earlier approval of that pull request)."""
        with self._write() as db:
            db.execute(_APPROVALS)
            db.execute(
                "INSERT INTO approvals VALUES (?, ?, ?, ?, ?) ON CONFLICT (repository, pr)"
                " DO UPDATE SET head_sha = excluded.head_sha, approver = excluded.approver,"
                " approved_at = excluded.approved_at",
                (repository.lower(), pr, head_sha, approver, _clock(now)),
            )

    def approval(self, repository: str, pr: int) -> Approval | None:
        """The pull request's latest approval, or None."""
        with self._write() as db:
            db.execute(_APPROVALS)
            row = db.execute(
                "SELECT head_sha, approver, approved_at FROM approvals"
                " WHERE repository = ? AND pr = ?",
                (repository.lower(), pr),
            ).fetchone()
        return Approval(*row) if row else None

    def revoke(self, repository: str, pr: int) -> None:
        """Forget the pull request's approval (e.g. once it is closed)."""
        with self._write() as db:
            db.execute(_APPROVALS)
            db.execute(
                "DELETE FROM approvals WHERE repository = ? AND pr = ?", (repository.lower(), pr)
            )


_APPROVALS = """
CREATE TABLE IF NOT EXISTS approvals (
    repository TEXT NOT NULL, pr INTEGER NOT NULL, head_sha TEXT NOT NULL,
    approver TEXT NOT NULL, approved_at REAL NOT NULL, PRIMARY KEY (repository, pr))
"""


@dataclass(frozen=True)
class Approval:
    head_sha: str  # the head the maintainer labelled: the only one it approves
    approver: str
    approved_at: float


def _accept(db: sqlite3.Connection, delivery: Delivery, now: float) -> tuple[Accepted, int | None]:
    """One delivery of :meth:`Queue.accept_all`, inside its transaction; its job's id."""
    d, job = delivery, delivery.job
    if db.execute(_REPEAT, (d.delivery_id, d.body_sha256)).rowcount:
        return "duplicate", None
    db.execute(
        "INSERT INTO deliveries (delivery_id, event, action, received_at, outcome, body_sha256)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (
            d.delivery_id,
            d.event,
            d.action,
            now,
            "ignored" if job is None else "queued",
            d.body_sha256,
        ),
    )
    if job is None:
        return "ignored", None
    job_id = db.execute(
        "INSERT INTO jobs (delivery_id, repository, pr, kind, head_sha, payload, state,"
        " not_before, created_at) VALUES (:delivery_id, :repository, :pr, :kind,"
        " :head_sha, :payload, 'queued', :now, :now)",
        {**asdict(job), "delivery_id": d.delivery_id, "now": now},
    ).lastrowid
    if job.kind in ("sync", "close"):
        state: State = "skipped" if job.kind == "sync" else "cancelled"
        why = f"{state} by {job.kind} job {job_id} (head {job.head_sha})"
        ended = db.execute(
            _COALESCE, (state, now, why, job.repository, job.pr, job_id, job.kind)
        ).fetchall()
        _set_outcomes(db, state, (delivery for (delivery,) in ended))
    return "queued", job_id


def _upgrade_payloads(db: sqlite3.Connection, now: float) -> None:
    """Jobs of a queue made before :data:`FORMAT` 1 hold their delivery's body: each gets the
    event parsed from it, as intake stores it now, so an upgrade loses no queued job. A close
    reconcile queued (its body was made up, not GitHub's) keeps none, as it would now. A body
    that cannot be read any more ends its waiting job as failed, saying why."""
    rows = db.execute("SELECT id, delivery_id, kind, state, payload FROM jobs").fetchall()
    for job_id, delivery_id, kind, state, text in rows:
        try:
            parsed = job_event(pull_request_event(json.loads(text))).model_dump_json()
        except (DeliveryError, ValueError):
            parsed = ""
            if kind != "close" and state in ("queued", "running"):
                db.execute(
                    "UPDATE jobs SET state = 'failed', finished_at = ?, result = ? WHERE id = ?",
                    (
                        now,
                        "its delivery could not be read after an upgrade: redeliver it from the"
                        " webhook's Recent Deliveries on GitHub",
                        job_id,
                    ),
                )
                _set_outcomes(db, "failed", [delivery_id])
        db.execute("UPDATE jobs SET payload = ? WHERE id = ?", (parsed, job_id))


def _make_private(path: Path) -> None:
    """Create the database file, or take the one there, as its owner's alone (0600), along
    with the journals SQLite left beside it (it makes new ones with the database's mode)."""
    for suffix, flags in (("", os.O_RDWR | os.O_CREAT), ("-wal", 0), ("-shm", 0), ("-journal", 0)):
        try:
            fd = safefs.open_regular(Path(f"{path}{suffix}"), os.O_RDONLY | flags, mode=0o600)
        except FileNotFoundError:
            if not suffix:
                raise QueueError(
                    f"cannot create the job queue {path}: its folder is missing; create it or"
                    " set queue_path"
                ) from None
            continue
        except OSError as err:
            raise QueueError(f"cannot open the job queue {path}: {err.strerror}") from None
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)


def _journal_mode(db: sqlite3.Connection) -> str | None:
    try:
        return str(db.execute("PRAGMA journal_mode = WAL").fetchone()[0])
    except sqlite3.OperationalError as err:
        if "locked" in str(err):
            return None
        raise


def _set_outcomes(db: sqlite3.Connection, outcome: str, delivery_ids: Iterable[str]) -> None:
    db.executemany(
        "UPDATE deliveries SET outcome = ? WHERE delivery_id = ?",
        [(outcome, delivery_id) for delivery_id in delivery_ids],
    )


def backoff_delay(
    attempt: int,
    *,
    retry_after: str | None = None,
    ratelimit_reset: str | None = None,
    now: float | None = None,
    base: float = 2.0,
    cap: float = 300.0,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first retry).

    GitHub's word wins: ``Retry-After`` (delay-seconds or an HTTP-date), else
    ``X-RateLimit-Reset`` (epoch seconds), clamped to [0, 1 h]. Otherwise full jitter:
    uniform in [0, min(cap, base ** attempt)]. Unparseable headers are ignored. Never negative.
    """
    now = _clock(now)
    hinted = _retry_after(retry_after.strip(), now) if retry_after is not None else None
    if hinted is None and ratelimit_reset is not None and _is_digits(ratelimit_reset.strip()):
        hinted = float(ratelimit_reset.strip()) - now
    if hinted is not None:
        return min(max(hinted, 0.0), MAX_SERVER_WAIT)
    ceiling = min(cap, base ** min(max(attempt, 0), 64))
    return max((rng or random).uniform(0.0, ceiling), 0.0)  # noqa: S311 - jitter, not crypto


def _is_digits(value: str) -> bool:
    return value.isascii() and value.isdigit()


def _retry_after(value: str, now: float) -> float | None:
    if _is_digits(value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": HTTP-dates are always GMT
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp() - now
