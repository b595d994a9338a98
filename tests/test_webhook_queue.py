"""The durable webhook job queue: dedupe, lanes, coalescing, leases, retries, concurrency."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from typing import Any, Literal

import pytest

from pgoverlay.errors import QueueError
from pgoverlay.webhook.payload import pull_request_event
from pgoverlay.webhook.queue import (
    REDELIVERY_WINDOW,
    Job,
    NewJob,
    Queue,
    backoff_delay,
)
from pgoverlay.webhook.routing import JobEvent, job_event

T0 = 1_700_000_000.0  # a fixed "now" for tests that move the clock by hand
LEASE = 30.0


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Queue]:
    q = Queue(tmp_path / "queue.db", max_attempts=3)
    yield q
    q.close()


def new(kind: str, pr: int | None = 1, *, repo: str = "org/app", sha: str = "a" * 40) -> NewJob:
    return NewJob(repository=repo, pr=pr, kind=kind, head_sha=sha, payload='{"k": 1}')


_serial = iter(range(10**9))


def put(
    q: Queue,
    kind: str,
    pr: int | None = 1,
    *,
    repo: str = "org/app",
    sha: str = "a" * 40,
    now: float = T0,
) -> int:
    """Accept a fresh delivery with one job; return the job's id."""
    delivery = f"delivery-{next(_serial)}"
    job = new(kind, pr, repo=repo, sha=sha)
    outcome = q.accept(delivery_id=delivery, event="pull_request", action=kind, job=job, now=now)
    assert outcome == "queued"
    return next(j.id for j in q.jobs() if j.delivery_id == delivery)


def claim(q: Queue, worker: str = "w1", now: float = T0) -> Job | None:
    return q.claim(worker=worker, lease_seconds=LEASE, now=now)


def claimed(q: Queue, worker: str = "w1", now: float = T0) -> Job:
    job = claim(q, worker, now)
    assert job is not None, "expected a job to be claimable"
    return job


def states(q: Queue) -> dict[int, str]:
    return {j.id: j.state for j in q.jobs()}


# deliveries ------------------------------------------------------------------------------


def test_redelivery_after_a_restart_is_a_duplicate_and_queues_nothing(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    first = Queue(path)
    assert first.accept(delivery_id="d-1", event="pull_request", action="opened", job=new("open"))
    first.close()

    restarted = Queue(path)
    again = restarted.accept(
        delivery_id="d-1", event="pull_request", action="opened", job=new("open")
    )
    assert again == "duplicate"
    assert len(restarted.jobs()) == 1
    assert restarted.delivery_count() == {
        ("pull_request", "queued"): 1,
        ("pull_request", "duplicate"): 1,
    }
    restarted.close()


def test_delivery_without_a_job_is_remembered_as_ignored(queue: Queue) -> None:
    assert queue.accept(delivery_id="p", event="ping", action="", job=None) == "ignored"
    assert queue.accept(delivery_id="p", event="ping", action="", job=None) == "duplicate"
    assert queue.jobs() == []
    assert queue.delivery_count() == {("ping", "ignored"): 1, ("ping", "duplicate"): 1}


def test_delivery_outcome_follows_its_job(queue: Queue) -> None:
    job_id = put(queue, "open")
    job = claimed(queue)
    assert job.id == job_id
    queue.finish(job_id, worker="w1", state="done", result="branch ready", now=T0 + 1)
    assert queue.delivery_count() == {("pull_request", "done"): 1}
    assert queue.jobs()[0].result == "branch ready"
    assert queue.jobs()[0].finished_at == T0 + 1

    failing = put(queue, "open", pr=2)
    assert claimed(queue).id == failing
    queue.finish(failing, worker="w1", state="failed", result="migration failed", now=T0 + 2)
    assert queue.delivery_count() == {("pull_request", "done"): 1, ("pull_request", "failed"): 1}


def test_depth_counts_every_state(queue: Queue) -> None:
    put(queue, "open", pr=1)
    put(queue, "open", pr=2)
    claim(queue)
    assert queue.depth() == {
        "queued": 1,
        "running": 1,
        "done": 0,
        "failed": 0,
        "skipped": 0,
        "cancelled": 0,
    }


def test_jobs_filters_by_repository_and_pr(queue: Queue) -> None:
    a = put(queue, "open", pr=1, repo="org/a")
    b = put(queue, "open", pr=2, repo="org/a")
    c = put(queue, "open", pr=1, repo="org/b")
    assert [j.id for j in queue.jobs()] == [a, b, c]
    assert [j.id for j in queue.jobs(repository="org/a")] == [a, b]
    assert [j.id for j in queue.jobs(pr=1)] == [a, c]
    assert [j.id for j in queue.jobs(repository="org/b", pr=1)] == [c]


# lanes -----------------------------------------------------------------------------------


def test_one_pr_runs_its_jobs_one_at_a_time_in_arrival_order(queue: Queue) -> None:
    opened = put(queue, "open")
    synced = put(queue, "sync", sha="b" * 40)
    labelled = put(queue, "label")
    for expected in (opened, synced, labelled):
        job = claim(queue)
        assert job is not None and job.id == expected
        assert claim(queue, "w2") is None  # the PR's job is running: nothing else of it may start
        queue.finish(job.id, worker="w1", state="done")
    assert claim(queue) is None


def test_open_then_sync_then_close_are_claimed_in_order(queue: Queue) -> None:
    opened = put(queue, "open")
    assert claimed(queue).id == opened
    queue.finish(opened, worker="w1", state="done")
    synced = put(queue, "sync", sha="b" * 40)
    assert claimed(queue).id == synced
    closed = put(queue, "close")  # arrives while the sync runs
    assert claim(queue, "w2") is None
    queue.finish(synced, worker="w1", state="done")
    assert claimed(queue).id == closed
    assert states(queue) == {opened: "done", synced: "done", closed: "running"}


def test_a_busy_pr_does_not_hold_up_another_pr(queue: Queue) -> None:
    first = put(queue, "open", pr=1)
    put(queue, "sync", pr=1, sha="b" * 40)
    other = put(queue, "open", pr=2)
    assert claimed(queue, "w1").id == first
    assert claimed(queue, "w2").id == other  # skips PR 1's waiting sync, not PR 1's order
    assert claim(queue, "w3") is None


def test_two_prs_run_in_parallel_and_the_same_number_in_two_repositories_too(
    queue: Queue,
) -> None:
    ids = [put(queue, "open", pr=7, repo="org/a"), put(queue, "open", pr=7, repo="org/b")]
    ids.append(put(queue, "open", pr=8, repo="org/a"))
    running = [claim(queue, f"w{i}") for i in range(3)]
    assert [j.id for j in running if j is not None] == ids
    assert queue.depth()["running"] == 3


def test_jobs_without_a_pr_share_one_lane_per_repository(queue: Queue) -> None:
    first = put(queue, "reconcile", pr=None)
    put(queue, "reconcile", pr=None)
    other_repo = put(queue, "reconcile", pr=None, repo="org/other")
    assert [claimed(queue, "w1").id, claimed(queue, "w2").id] == [first, other_repo]
    assert claim(queue, "w3") is None


def test_a_job_waiting_out_a_retry_still_blocks_its_lane(queue: Queue) -> None:
    first = put(queue, "open")
    second = put(queue, "label")
    elsewhere = put(queue, "open", pr=2)
    assert claimed(queue).id == first
    assert queue.retry(first, worker="w1", delay=60, now=T0)
    assert claimed(queue, "w2", now=T0 + 1).id == elsewhere
    queue.finish(elsewhere, worker="w2", state="done")
    assert claim(queue, "w3", now=T0 + 59) is None  # `second` may not overtake `first`
    assert claimed(queue, "w3", now=T0 + 60).id == first
    queue.finish(first, worker="w3", state="done")
    assert claimed(queue, "w3", now=T0 + 61).id == second


# coalescing ------------------------------------------------------------------------------


def test_a_newer_sync_skips_queued_syncs_of_the_same_pr_only(queue: Queue) -> None:
    opened = put(queue, "open")
    old_sync = put(queue, "sync", sha="b" * 40)
    label = put(queue, "label")
    other_pr = put(queue, "sync", pr=2, sha="b" * 40)
    new_sync = put(queue, "sync", sha="c" * 40)
    assert states(queue) == {
        opened: "queued",
        old_sync: "skipped",
        label: "queued",
        other_pr: "queued",
        new_sync: "queued",
    }
    skipped = next(j for j in queue.jobs() if j.id == old_sync)
    assert "c" * 40 in skipped.result and skipped.finished_at == T0
    assert queue.delivery_count()[("pull_request", "skipped")] == 1


def test_close_cancels_every_queued_job_of_its_pr(queue: Queue) -> None:
    queued = [put(queue, "open"), put(queue, "sync", sha="b" * 40), put(queue, "label")]
    other_pr = put(queue, "open", pr=2)
    other_repo = put(queue, "open", repo="org/other")
    closed = put(queue, "close")
    assert states(queue) == {
        **dict.fromkeys(queued, "cancelled"),
        other_pr: "queued",
        other_repo: "queued",
        closed: "queued",
    }
    assert queue.delivery_count()[("pull_request", "cancelled")] == 3
    assert [j.id for j in queue.jobs(repository="org/app", pr=1) if j.state == "queued"] == [closed]


def test_close_leaves_a_running_job_alone_and_waits_for_it(queue: Queue) -> None:
    opened = put(queue, "open")
    assert claimed(queue).id == opened
    synced = put(queue, "sync", sha="b" * 40)
    closed = put(queue, "close")
    assert states(queue) == {opened: "running", synced: "cancelled", closed: "queued"}
    assert claim(queue, "w2") is None
    queue.finish(opened, worker="w1", state="done")
    assert claimed(queue, "w2").id == closed


def test_a_running_sync_is_not_skipped_by_a_newer_sync(queue: Queue) -> None:
    running = put(queue, "sync", sha="b" * 40)
    assert claimed(queue).id == running
    newer = put(queue, "sync", sha="c" * 40)
    assert states(queue) == {running: "running", newer: "queued"}


def test_retry_is_refused_to_a_job_overtaken_meanwhile(queue: Queue) -> None:
    sync = put(queue, "sync", sha="b" * 40)
    assert claimed(queue).id == sync
    newer = put(queue, "sync", sha="c" * 40)
    assert not queue.retry(sync, worker="w1", delay=5)
    assert states(queue) == {sync: "skipped", newer: "queued"}

    assert claimed(queue).id == newer
    closed = put(queue, "close")
    assert not queue.retry(newer, worker="w1", delay=5)
    assert states(queue)[newer] == "cancelled"
    assert claimed(queue).id == closed


# leases and retries ----------------------------------------------------------------------


def test_an_expired_lease_is_reclaimed_after_a_crash_and_the_old_worker_is_locked_out(
    queue: Queue,
) -> None:
    job_id = put(queue, "open")
    first = claim(queue, "dead", now=T0)
    assert first is not None and first.attempts == 1 and first.lease_expires == T0 + LEASE
    assert claim(queue, "w2", now=T0 + LEASE - 1) is None
    second = claim(queue, "w2", now=T0 + LEASE)
    assert second is not None and second.id == job_id
    assert second.attempts == 2 and second.lease_owner == "w2"
    assert not queue.renew(job_id, worker="dead", lease_seconds=LEASE)
    with pytest.raises(QueueError, match="not running under worker 'dead'"):
        queue.finish(job_id, worker="dead", state="done")
    queue.finish(job_id, worker="w2", state="done")
    assert states(queue) == {job_id: "done"}


def test_renewing_a_lease_keeps_the_job(queue: Queue) -> None:
    job_id = put(queue, "open")
    claim(queue, "w1", now=T0)
    assert queue.renew(job_id, worker="w1", lease_seconds=LEASE, now=T0 + 20)
    assert claim(queue, "w2", now=T0 + LEASE + 1) is None
    assert claimed(queue, "w2", now=T0 + 20 + LEASE).id == job_id


def test_a_job_that_crashes_its_worker_every_time_fails_after_max_attempts(queue: Queue) -> None:
    put(queue, "open")
    now = T0
    for attempt in (1, 2, 3):
        job = claim(queue, f"w{attempt}", now=now)
        assert job is not None and job.attempts == attempt
        now += LEASE
    assert claim(queue, "w4", now=now) is None
    (job,) = queue.jobs()
    assert (job.state, job.attempts, job.finished_at) == ("failed", 3, now)
    assert queue.delivery_count() == {("pull_request", "failed"): 1}


def test_retry_waits_for_not_before_and_gives_up_after_max_attempts(queue: Queue) -> None:
    job_id = put(queue, "open")
    now = T0
    for attempt in (1, 2):
        job = claim(queue, now=now)
        assert job is not None and job.attempts == attempt
        assert queue.retry(job_id, worker="w1", delay=10, result="HTTP 502", now=now)
        (waiting,) = queue.jobs()
        assert (waiting.state, waiting.not_before) == ("queued", now + 10)
        assert waiting.result == "HTTP 502"
        assert claim(queue, now=now + 9.9) is None
        now += 10
    job = claim(queue, now=now)
    assert job is not None and job.attempts == 3
    assert not queue.retry(job_id, worker="w1", delay=10, result="HTTP 502", now=now)
    (failed,) = queue.jobs()
    assert failed.state == "failed" and "gave up after 3 attempts: HTTP 502" in failed.result
    assert claim(queue, now=now + 3600) is None


def test_a_job_killed_mid_run_completes_once_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    q = Queue(path)
    job_id = put(q, "open", now=time.time())
    q.close()
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from pgoverlay.webhook.queue import Queue\n"
        "q = Queue(Path(sys.argv[1]))\n"
        "job = q.claim(worker='doomed', lease_seconds=2)\n"
        "print(job.id, flush=True)\n"
        "time.sleep(120)\n"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout is not None
        assert int(worker.stdout.readline()) == job_id
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    assert worker.returncode == -signal.SIGKILL

    restarted = Queue(path)
    (running,) = restarted.jobs()
    assert (running.state, running.lease_owner) == ("running", "doomed")
    assert restarted.claim(worker="new", lease_seconds=LEASE) is None  # lease still held
    assert running.lease_expires is not None
    job = restarted.claim(worker="new", lease_seconds=LEASE, now=running.lease_expires)
    assert job is not None and job.id == job_id and job.attempts == 2
    restarted.finish(job_id, worker="new", state="done")
    assert restarted.claim(worker="new", lease_seconds=LEASE, now=time.time() + 3600) is None
    assert restarted.depth()["done"] == 1
    restarted.close()


# retention -------------------------------------------------------------------------------


def test_prune_forgets_old_finished_work_and_keeps_pending_and_recent(queue: Queue) -> None:
    old_done = put(queue, "open", pr=1, now=T0)
    claim(queue, now=T0)
    queue.finish(old_done, worker="w1", state="done", now=T0)
    old_pending = put(queue, "open", pr=2, now=T0)
    queue.claim(worker="slow", lease_seconds=100 * 86400, now=T0)  # still running at prune time
    queue.accept(delivery_id="old-ping", event="ping", action="", job=None, now=T0)
    recent = put(queue, "open", pr=3, now=T0 + 29 * 86400)
    claim(queue, now=T0 + 29 * 86400)
    queue.finish(recent, worker="w1", state="done", now=T0 + 29 * 86400)

    removed = queue.prune(now=T0 + 30 * 86400 + 1)
    assert removed == {"jobs": 1, "deliveries": 2}
    assert [j.id for j in queue.jobs()] == [old_pending, recent]
    assert queue.accept(delivery_id="old-ping", event="ping", action="", job=None) == "ignored"


def test_prune_refuses_to_forget_deliveries_github_may_still_redeliver(queue: Queue) -> None:
    with pytest.raises(QueueError, match="3 days"):
        queue.prune(REDELIVERY_WINDOW - 1)
    assert queue.prune(REDELIVERY_WINDOW) == {"jobs": 0, "deliveries": 0}


def test_a_closed_queue_refuses_work(tmp_path: Path) -> None:
    q = Queue(tmp_path / "queue.db")
    q.close()
    with pytest.raises(QueueError, match="closed"):
        q.depth()


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
def test_the_database_is_in_wal_mode_with_the_chosen_synchronous_level(
    tmp_path: Path, synchronous: Literal["NORMAL", "FULL"]
) -> None:
    q = Queue(tmp_path / "queue.db", synchronous=synchronous)
    with closing(sqlite3.connect(tmp_path / "queue.db")) as other:  # WAL is a property of the file
        assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    level = q._db().execute("PRAGMA synchronous").fetchone()  # per connection: look inside
    assert level == ({"NORMAL": 1, "FULL": 2}[synchronous],)
    q.close()


def test_bad_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(QueueError, match="max_attempts"):
        Queue(tmp_path / "queue.db", max_attempts=0)


# backoff ---------------------------------------------------------------------------------


def test_backoff_honours_retry_after_seconds() -> None:
    assert backoff_delay(1, retry_after="120", now=T0) == 120.0
    assert backoff_delay(4, retry_after=" 0 ", now=T0) == 0.0
    assert backoff_delay(1, retry_after="120", ratelimit_reset=str(T0 + 900), now=T0) == 120.0


def test_backoff_honours_retry_after_as_an_http_date() -> None:
    later = format_datetime(datetime.fromtimestamp(T0 + 90, UTC), usegmt=True)
    assert later.endswith("GMT")
    assert backoff_delay(1, retry_after=later, now=T0) == pytest.approx(90.0)
    earlier = format_datetime(datetime.fromtimestamp(T0 - 90, UTC), usegmt=True)
    assert backoff_delay(1, retry_after=earlier, now=T0) == 0.0


def test_backoff_honours_the_rate_limit_reset_time() -> None:
    assert backoff_delay(1, ratelimit_reset=str(int(T0) + 42), now=T0) == 42.0
    assert backoff_delay(1, ratelimit_reset=str(int(T0) - 42), now=T0) == 0.0
    assert backoff_delay(1, ratelimit_reset=str(int(T0) + 10**9), now=T0) == 3600.0


@pytest.mark.parametrize("attempt", [0, 1, 3, 8, 9, 1000])
def test_backoff_without_hints_is_full_jitter_within_the_capped_ceiling(attempt: int) -> None:
    rng = random.Random(attempt)
    ceiling = min(300.0, 2.0**attempt)
    delays = [backoff_delay(attempt, now=T0, rng=rng) for _ in range(2000)]
    assert all(0.0 <= d <= ceiling for d in delays)
    assert min(delays) < ceiling * 0.05 and max(delays) > ceiling * 0.95  # spread over the range
    assert len(set(delays)) > 1900


@pytest.mark.parametrize(
    "junk", ["soon", "", "-5", "1.5e3", "inf", "nan", "Mon, 99 Foo 2024 99:99:99 GMT", "٣"]
)
def test_backoff_ignores_unparseable_headers(junk: str) -> None:
    delay = backoff_delay(2, retry_after=junk, ratelimit_reset=junk, now=T0, rng=random.Random(1))
    assert 0.0 <= delay <= 4.0


# concurrency -----------------------------------------------------------------------------


def test_concurrent_accepts_and_claims_run_every_job_exactly_once(tmp_path: Path) -> None:
    q = Queue(tmp_path / "queue.db", synchronous="NORMAL")
    producers, per_producer, consumers = 8, 250, 4
    errors: list[BaseException] = []
    ran: list[int] = []
    running_lanes: set[tuple[str, int | None]] = set()
    last_in_lane: dict[tuple[str, int | None], int] = {}
    lock = threading.Lock()
    produced = threading.Barrier(producers + 1)
    done_producing = threading.Event()
    deadline = time.monotonic() + 120

    def produce(t: int) -> None:
        try:
            for i in range(per_producer):
                job = NewJob(f"org/r{i % 3}", i % 10, "label", f"{i:040x}", f'{{"t": {t}}}')
                outcome = q.accept(
                    delivery_id=f"{t}-{i}", event="pull_request", action="x", job=job
                )
                assert outcome == "queued"
            assert q.accept(delivery_id=f"{t}-0", event="pull_request", action="x", job=job) == (
                "duplicate"
            )
        except BaseException as err:  # reported by the main thread
            errors.append(err)
        finally:
            produced.wait(timeout=120)

    def consume(name: str) -> None:
        try:
            while time.monotonic() < deadline:
                job = q.claim(worker=name, lease_seconds=60)
                if job is None:
                    if done_producing.is_set() and q.depth()["queued"] == 0:
                        return
                    time.sleep(0.001)
                    continue
                lane = (job.repository, job.pr)
                with lock:
                    assert lane not in running_lanes, f"two jobs of {lane} at once"
                    assert job.id > last_in_lane.get(lane, 0), f"{lane} ran out of order"
                    running_lanes.add(lane)
                    last_in_lane[lane] = job.id
                    ran.append(job.id)
                with lock:  # leave the lane before finishing: the lane stays busy until then
                    running_lanes.remove(lane)
                q.finish(job.id, worker=name, state="done")
            raise AssertionError("consumers did not drain the queue within 120 s")
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(producers)]
    threads += [threading.Thread(target=consume, args=(f"w{c}",)) for c in range(consumers)]
    for thread in threads:
        thread.start()
    produced.wait(timeout=120)
    done_producing.set()
    for thread in threads:
        thread.join(timeout=max(deadline - time.monotonic(), 1))
    assert not errors, errors[:3]
    total = producers * per_producer
    assert sorted(ran) == sorted(set(ran)) and len(ran) == total
    assert q.depth()["done"] == total and sum(q.depth().values()) == total
    assert q.delivery_count() == {
        ("pull_request", "done"): total,
        ("pull_request", "duplicate"): producers,
    }
    q.close()


def _accept_all(
    path: str,
    ids: list[str],
    go: multiprocessing.synchronize.Event,
    out: multiprocessing.Queue[Counter[str]],
) -> None:
    q = Queue(Path(path))
    go.wait(60)
    out.put(
        Counter(
            q.accept(
                delivery_id=d,
                event="pull_request",
                action="synchronize",
                job=new("sync", pr=int(d) % 25, sha=f"{int(d):040x}"),
            )
            for d in ids
        )
    )
    q.close()


def test_two_processes_accepting_the_same_deliveries_queue_each_once(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    ids = [str(i) for i in range(500)]
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    out: multiprocessing.Queue[Counter[str]] = ctx.Queue()
    procs = [ctx.Process(target=_accept_all, args=(str(path), ids, go, out)) for _ in range(2)]
    for proc in procs:
        proc.start()
    go.set()
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0
    counts = [out.get(timeout=5) for _ in procs]
    assert sum(counts, Counter()) == Counter({"queued": 500, "duplicate": 500})
    q = Queue(path)
    jobs = q.jobs()
    assert sorted(j.delivery_id for j in jobs) == sorted(ids)
    # Coalescing ran under concurrency too: one live sync per PR, the rest superseded.
    assert Counter(j.state for j in jobs) == Counter({"queued": 25, "skipped": 475})
    q.close()


def test_the_queue_file_and_its_journals_are_their_owners_alone(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    old = os.umask(0)
    try:
        q = Queue(path)
        put(q, "open")
    finally:
        os.umask(old)
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == ["queue.db", "queue.db-shm", "queue.db-wal"]
    assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == dict.fromkeys(
        made, 0o600
    )
    q.close()


def test_a_queue_file_left_readable_by_an_earlier_release_is_made_private(
    tmp_path: Path,
) -> None:
    path = tmp_path / "queue.db"
    with closing(sqlite3.connect(path)) as db:  # an earlier release's queue, mode 0644
        db.execute(
            "CREATE TABLE deliveries (delivery_id TEXT PRIMARY KEY, event TEXT NOT NULL,"
            " action TEXT NOT NULL, received_at REAL NOT NULL, outcome TEXT NOT NULL)"
        )
        db.execute("INSERT INTO deliveries VALUES ('old', 'pull_request', 'opened', 1, 'done')")
        db.commit()
    path.chmod(0o644)
    q = Queue(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert q.accept(delivery_id="old", event="pull_request", action="x", job=None) == ("duplicate")
    assert (
        q.accept(
            delivery_id="new", event="pull_request", action="x", job=None, body_sha256="f" * 64
        )
        == "ignored"
    )
    assert (
        q.accept(
            delivery_id="newer", event="pull_request", action="x", job=None, body_sha256="f" * 64
        )
        == "duplicate"
    )
    q.close()


def test_a_link_in_place_of_the_queue_file_is_refused(tmp_path: Path) -> None:
    from pgoverlay.errors import UnsafePathError

    target = tmp_path / "elsewhere"
    target.write_text("not a queue")
    target.chmod(0o644)
    (tmp_path / "queue.db").symlink_to(target)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        Queue(tmp_path / "queue.db")
    assert target.read_text() == "not a queue" and target.stat().st_mode & 0o777 == 0o644


def test_a_rejected_delivery_is_recorded_with_its_reason_once(queue: Queue) -> None:
    args: dict[str, Any] = {"event": "pull_request", "action": "opened", "body_sha256": "e" * 64}
    assert queue.reject(delivery_id="r-1", reason="pull_request.head: missing", **args)
    assert not queue.reject(delivery_id="r-2", reason="pull_request.head: missing", **args)
    assert queue.accept(delivery_id="r-3", job=new("open"), **args) == "duplicate"
    assert queue.jobs() == []
    assert queue.delivery_count() == {
        ("pull_request", "rejected"): 1,
        ("pull_request", "duplicate"): 2,
    }


def test_deliveries_stored_together_keep_their_order_and_dedupe_among_themselves(
    queue: Queue,
) -> None:
    from pgoverlay.webhook.queue import Delivery

    opened = Delivery("d-1", "pull_request", "opened", new("open"), "1" * 64)
    replay = Delivery("d-2", "pull_request", "opened", new("open"), "1" * 64)
    push = Delivery("d-3", "pull_request", "synchronize", new("sync"), "3" * 64)
    newer = Delivery("d-4", "pull_request", "synchronize", new("sync", sha="b" * 40), "4" * 64)
    outcomes = queue.accept_all([opened, replay, push, newer], now=T0)
    assert outcomes == ["queued", "duplicate", "queued", "queued"]
    assert [(j.delivery_id, j.state) for j in queue.jobs()] == [
        ("d-1", "queued"),
        ("d-3", "skipped"),
        ("d-4", "queued"),
    ]


def test_the_committer_answers_every_concurrent_delivery_with_its_own_outcome(
    queue: Queue,
) -> None:
    from pgoverlay.webhook.intake import Committer
    from pgoverlay.webhook.queue import Delivery

    committer = Committer(queue)
    outcomes: dict[int, str] = {}

    def send(i: int) -> None:
        body = f"{i % 50:064x}"  # every body twice: one of each pair is a replay
        job = new("open", pr=i % 50)
        outcomes[i] = committer.accept(Delivery(f"c-{i}", "pull_request", "opened", job, body))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    committer.close()
    assert len(outcomes) == 100
    assert Counter(outcomes.values()) == {"queued": 50, "duplicate": 50}
    for pr in range(50):
        assert sorted(outcomes[i] for i in (pr, pr + 50)) == ["duplicate", "queued"]
    assert len(queue.jobs()) == 50


def test_an_older_queues_jobs_survive_the_upgrade_as_parsed_events(tmp_path: Path) -> None:
    """A queue of the release before kept each job's delivery body: opening it keeps every
    queued job, each with the event parsed from its body, as intake stores it now."""
    fixtures = Path(__file__).resolve().parent / "fixtures" / "github" / "webhooks"
    opened = (fixtures / "pull_request.opened.json").read_text()
    labeled = json.loads((fixtures / "pull_request.labeled.json").read_text())
    made_up_close = json.dumps(  # what reconcile queued: a body GitHub never sent
        {
            "action": "closed",
            "number": 9,
            "repository": {"full_name": "org/app"},
            "pull_request": {
                "number": 9,
                "merged": None,
                "state": "closed",
                "head": {"sha": "d" * 40, "repo": {"full_name": "org/app"}},
                "base": {"sha": "", "repo": {"full_name": "org/app"}},
            },
        }
    )
    path = tmp_path / "queue.db"
    Queue(path).close()
    old = [
        ("d-open", "open", 2, opened),
        ("d-label", "label", 2, json.dumps(labeled)),
        ("reconcile-org/app-9-1", "close", 9, made_up_close),
        ("d-junk", "sync", 3, "{not json"),
    ]
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("PRAGMA user_version = 0")  # what the release before left
        for delivery, kind, pr, body in old:
            db.execute(
                "INSERT INTO deliveries (delivery_id, event, action, received_at, outcome)"
                " VALUES (?, 'pull_request', ?, ?, 'queued')",
                (delivery, kind, T0),
            )
            db.execute(
                "INSERT INTO jobs (delivery_id, repository, pr, kind, head_sha, payload, state,"
                " not_before, created_at) VALUES (?, 'org/app', ?, ?, ?, ?, 'queued', ?, ?)",
                (delivery, pr, kind, "a" * 40, body, T0, T0),
            )
    q = Queue(path)
    try:
        jobs = {j.delivery_id: j for j in q.jobs()}
        assert set(jobs) == {d for d, *_ in old}, "a job was lost"
        assert {d: j.state for d, j in jobs.items()} == {
            "d-open": "queued",
            "d-label": "queued",
            "reconcile-org/app-9-1": "queued",
            "d-junk": "failed",
        }
        assert "redeliver it" in jobs["d-junk"].result
        assert q.delivery_count()[("pull_request", "failed")] == 1
        parsed_open = JobEvent.model_validate_json(jobs["d-open"].payload)
        assert parsed_open == job_event(pull_request_event(json.loads(opened)))
        assert parsed_open.event.kind == "open" and parsed_open.event.pr == 2
        parsed_label = JobEvent.model_validate_json(jobs["d-label"].payload)
        assert parsed_label.sender == labeled["sender"]["login"]
        assert parsed_label.installation == labeled["installation"]["id"]
        assert jobs["reconcile-org/app-9-1"].payload == ""  # a close needs no delivery
        assert "pull_request" not in "".join(j.payload for j in jobs.values())
    finally:
        q.close()
    q = Queue(path)  # upgraded once: opening again changes nothing
    try:
        assert {j.delivery_id: j.payload for j in q.jobs()} == {
            d: j.payload for d, j in jobs.items()
        }
    finally:
        q.close()


def test_every_queue_log_line_about_a_job_names_its_pr_as_owner_name_number(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/webhook.md says to follow a PR by searching for `pr=owner/name#N`: the queue's own
    lines (queued, a lease that expired) carry that, not the bare number."""
    from pgoverlay.webhook.worker import LOG_FORMAT, JobLogContext

    caplog.set_level(logging.INFO, logger="pgoverlay.webhook")
    put(queue, "open", 101, repo="acme/shop")
    claimed(queue, "w1", T0)
    assert claim(queue, "w2", T0 + LEASE + 1) is not None  # reaps w1's lease, then claims
    formatter = logging.Formatter(LOG_FORMAT)
    context = JobLogContext()
    lines = [formatter.format(r) for r in caplog.records if context.filter(r)]
    about_the_job = [line for line in lines if "queued open job" in line or "expired" in line]
    assert len(about_the_job) == 2, lines
    for line in about_the_job:
        assert " pr=acme/shop#101 " in line, line
