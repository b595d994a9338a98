"""`pgoverlay webhook serve` is two processes: intake (HTTP: verify, dedupe, queue) and the
workers. Intake keeps acknowledging while the workers are busy or dead, and the worker process
never outlives it."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import cast

import psycopg
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from test_webhook_e2e import (
    BASE_SHA,
    REPO,
    SYSTEM_PYTHON,
    TOKEN,
    Listener,
    pr_payload,
    statuses,
    system_python_fits,
    tarball,
)

from fakegithub import FakeGitHub
from helpers import require
from pgoverlay.runner import branch
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion, Branch

GO = "pgoverlay-test-go"
# Holds the job until a session named GO connects to the branch (at most ~2 minutes).
WAIT_FOR_GO = f"""
DO $$
BEGIN
  FOR i IN 1..2400 LOOP
    EXIT WHEN EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = '{GO}');
    PERFORM pg_stat_clear_snapshot();
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
CREATE TABLE widgets (id int);
"""


@pytest.fixture()
def listener(pool: Pool, base: BaseVersion, service: Path) -> Iterator[tuple[Listener, FakeGitHub]]:
    require(system_python_fits(), f"needs {SYSTEM_PYTHON} of this Python's version")
    with FakeGitHub() as github:
        github.add_token(TOKEN, "pgoverlay-bot")
        github.add_tarball(
            REPO, BASE_SHA, tarball(BASE_SHA, {"db/migrations/000.sql": "SELECT 1;"})
        )
        hook = Listener(pool, github, service)
        try:
            hook.start()
            yield hook, github
        finally:
            hook.stop()
            print(hook.log.read_text()[-6000:])  # shown when a test fails
            for b in pool.registry.branches():
                if b.name.startswith("shop-pr-"):
                    branch.destroy(pool, b.name)
            shutil.rmtree(hook.top, ignore_errors=True)
        assert github.violations == []


def worker_pid(service: Listener) -> int:
    assert service.process is not None
    pid = service.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1, f"expected one worker process, found {children}"
    return int(children[0])


def nice(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])  # the 19th field of /proc/PID/stat; two are before the ")"


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def job_states(service: Listener) -> dict[int, str]:
    path = f"file:{service.state / 'queue.db'}?mode=ro"
    with closing(sqlite3.connect(path, uri=True, timeout=30)) as db:
        return dict(db.execute("SELECT pr, state FROM jobs").fetchall())


def metric(service: Listener, name: str) -> float:
    text = requests.get(f"{service.url}/metrics", timeout=10).text
    values = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and not s.labels
    ]
    assert len(values) == 1, (name, values)
    return values[0]


def held_by_its_migration(service: Listener, pr: int) -> bool:
    state = job_states(service).get(pr)
    assert state in (None, "queued", "running"), f"the job ended ({state}) instead of waiting"
    made = service.pool.registry.branch(f"shop-pr-{pr}")
    return state == "running" and made is not None and made.state == "ready"


def add_pull(github: FakeGitHub, number: int, head: str, migration: str) -> None:
    github.add_pull(REPO, number, head, BASE_SHA)
    github.add_tarball(REPO, head, tarball(head, {"db/migrations/001.sql": migration}))


def test_the_worker_process_runs_at_a_lower_priority_than_intake(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    service, _ = listener
    assert service.process is not None
    assert nice(worker_pid(service)) == min(nice(service.process.pid) + 10, 19)


def test_intake_keeps_acknowledging_while_the_worker_process_is_busy(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    service, github = listener
    held, other = "a" * 40, "c" * 40
    add_pull(github, 21, held, WAIT_FOR_GO)
    add_pull(github, 22, other, "CREATE TABLE widgets (id int);\n")
    assert service.send(pr_payload("opened", held, number=21)).status_code == 202
    wait_for(lambda: held_by_its_migration(service, 21), timeout=120, what="the job to hold")
    assert service.send(pr_payload("opened", other, number=22)).status_code == 202
    assert requests.get(f"{service.url}/healthz", timeout=10).status_code == 200
    assert metric(service, "pgoverlay_webhook_worker_up") == 1
    assert job_states(service)[21] == "running", "the ack came while the job held its worker"
    made = branch.get(service.pool, "shop-pr-21")
    with psycopg.connect(
        **branch.connection(service.pool, made).connect_kwargs(), application_name=GO
    ):
        wait_for(lambda: "success" in statuses(github, held), timeout=120, what="the held job")
    wait_for(lambda: "success" in statuses(github, other), timeout=120, what="the second job")


def test_intake_keeps_acknowledging_when_the_worker_process_dies_and_healthz_says_so(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    service, _ = listener
    os.kill(worker_pid(service), signal.SIGKILL)
    health = wait_for(
        lambda: (r := requests.get(f"{service.url}/healthz", timeout=10)).status_code == 503 and r,
        timeout=60,
        what="/healthz to report the dead worker process",
    )
    assert isinstance(health, requests.Response)
    assert "worker process was killed by signal 9" in health.json()["detail"]
    head = "d" * 40
    assert service.send(pr_payload("opened", head, number=23)).status_code == 202
    assert job_states(service) == {23: "queued"}
    assert metric(service, "pgoverlay_webhook_worker_up") == 0
    assert metric(service, "pgoverlay_webhook_queue_depth") == 1


def test_the_worker_process_ends_with_intake_stopped_or_killed(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    service, _ = listener
    first = worker_pid(service)
    service.stop()
    assert service.process is not None and service.process.returncode is not None
    assert gone(first)
    service.start()
    second = worker_pid(service)
    service.stop(signal.SIGKILL)
    wait_for(lambda: gone(second), timeout=120, what="the orphaned worker process to stop")
    service.start()  # the fixture stops it


def sandboxed_processes(service: Listener) -> list[int]:
    """Processes of this listener's job sandboxes: `unshare` and the namespace's shell carry
    the job's name (`pgoverlay-job`) and its scratch folder, in the listener's state folder, in
    their arguments (other listeners on the host have other state folders)."""
    state = os.fsencode(service.state)
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes() if entry.isdigit() else b""
            if b"\0pgoverlay-job\0" in cmdline and state in cmdline:
                found.append(int(entry))
        except OSError:
            pass
    return found


def test_after_kill_9_of_intake_the_worker_ends_its_job_at_once_and_the_job_runs_again(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    """A killed intake is restarted (systemd's Restart=on-failure): its orphaned worker process
    must not go on running jobs beside the new listener's for the shutdown grace. It ends its
    job's processes and exits; the job's lease brings the job back in the new listener."""
    service, github = listener
    service.stop()
    service.env["PGOVERLAY_WEBHOOK_SHUTDOWN_GRACE"] = "600"  # a graceful stop would wait
    service.start()
    held = "e" * 40
    add_pull(github, 25, held, WAIT_FOR_GO)
    assert service.send(pr_payload("opened", held, number=25)).status_code == 202
    wait_for(lambda: held_by_its_migration(service, 25), timeout=120, what="the job to hold")
    wait_for(lambda: sandboxed_processes(service), timeout=60, what="the job's sandboxed psql")
    worker = worker_pid(service)
    made = branch.get(service.pool, "shop-pr-25")
    first_server = server_started(made, service)
    service.stop(signal.SIGKILL)
    wait_for(
        lambda: gone(worker) and not sandboxed_processes(service),
        timeout=30,
        what="the orphaned worker process and its job's processes to end",
    )
    assert job_states(service)[25] == "running", "the job keeps its lease, for its next run"
    service.start()
    # The job runs again once its lease has expired: it resets the branch (a new server) and
    # applies the migration, which waits for GO again.
    wait_for(
        lambda: migrating_on_a_new_server(made, service, first_server),
        timeout=120,
        what="the job to run again in the new listener",
    )
    with psycopg.connect(
        **branch.connection(service.pool, made).connect_kwargs(), application_name=GO
    ):
        wait_for(lambda: "success" in statuses(github, held), timeout=120, what="the job")
    log = service.log.read_text()
    assert "the intake process is gone: stopping now" in log
    assert "shutdown grace over" not in log


def server_started(made: Branch, service: Listener) -> datetime:
    with psycopg.connect(**branch.connection(service.pool, made).connect_kwargs()) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    assert row is not None
    return cast(datetime, row[0])


def migrating_on_a_new_server(made: Branch, service: Listener, after: datetime) -> bool:
    """The branch's server started after ``after`` (the job reset it), and the migration that
    waits for GO runs on it."""
    try:
        with psycopg.connect(
            **branch.connection(service.pool, made).connect_kwargs(), connect_timeout=5
        ) as conn:
            row = conn.execute(
                "SELECT pg_postmaster_start_time(), EXISTS (SELECT 1 FROM pg_stat_activity"
                " WHERE query LIKE %s AND pid <> pg_backend_pid())",
                (f"%{GO}%",),
            ).fetchone()
    except psycopg.OperationalError:  # the reset is restarting it
        return False
    assert row is not None
    return bool(row[0] > after and row[1])
