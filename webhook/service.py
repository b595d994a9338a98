"""The worker process (`pgoverlay webhook work`, started and stopped by `webhook serve`): the
workers and reconcile, on the queue the intake process fills. `serve` starts it at a lower CPU
priority than intake, so acknowledging deliveries wins the CPU over building branches."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from pgoverlay.action import record
from pgoverlay.errors import PgoverlayError, TimeoutExpiredError
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.settings import Settings
from pgoverlay.webhook import sandbox
from pgoverlay.webhook.clients import GitHubClients
from pgoverlay.webhook.engines import Engines
from pgoverlay.webhook.jobmetrics import Metrics
from pgoverlay.webhook.queue import Job, NewJob, Queue
from pgoverlay.webhook.settings import WebhookSettings
from pgoverlay.webhook.worker import Worker, cleanup_scratch

log = logging.getLogger(__name__)


class Service:
    def __init__(self, settings: WebhookSettings, runner: Settings) -> None:
        self.settings = settings
        self.runner = runner
        settings.make_state_dir()
        self.engines = Engines(settings, runner)
        self.queue_path = settings.queue_file()
        self.queue = Queue(self.queue_path, max_attempts=settings.max_attempts)
        self.metrics = Metrics(self.queue)
        self.clients = GitHubClients(settings)
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.workers: list[Worker] = []

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        sandbox.check()
        if not self.engines.remote:
            # A previous process may have been killed mid-job: finish or undo its sagas first
            # (a pool on another host does so itself, when its engine service starts).
            report = self.engines.local().gc()
            log.info("start-up repair: %s", "; ".join(report.lines))
        cleanup_scratch(self.settings.state_dir)
        for index in range(self.settings.workers):
            worker = Worker(
                f"worker-{index}-{threading.get_native_id()}-{time.time_ns()}",
                settings=self.settings,
                runner=self.runner,
                engines=self.engines,
                queue=self.queue,
                clients=self.clients,
                metrics=self.metrics,
                stop=self.stopping,
            )
            self.workers.append(worker)
            self._spawn(worker.run_forever, f"pgoverlay-{worker.name}")
        self._spawn(self._reconcile_forever, "pgoverlay-reconcile")

    def _spawn(self, target: object, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self.threads.append(thread)

    def stop(self, *, abandon: Callable[[], bool] = lambda: False) -> None:
        """Stop taking jobs; let running ones finish until the grace period ends, or until
        ``abandon`` says to wait no more. Jobs not finished by then keep their lease and run
        again after a restart."""
        self.stopping.set()
        with contextlib.suppress(TimeoutExpiredError):  # the grace is over: said below
            wait_for(
                lambda: abandon() or not any(t.is_alive() for t in self.threads),
                timeout=self.settings.shutdown_grace,
                what="the running jobs to finish",
            )
        left = [t.name for t in self.threads if t.is_alive()]
        if left and not abandon():
            log.warning("shutdown grace over; still running: %s", ", ".join(left))
        self.clients.close()

    # -- reconcile --------------------------------------------------------------------------

    def _reconcile_forever(self) -> None:
        while not self.stopping.is_set():
            try:
                self.reconcile()
            except Exception:  # the edge of a loop: log, try again next interval
                log.exception("reconcile failed")
            self.stopping.wait(self.settings.reconcile_interval)

    def reconcile(self) -> dict[str, int]:
        """Destroy branches whose PR is closed or gone; reap expired TTLs."""
        actions = {"closed": 0, "expired": 0}
        mine = self._branched()
        for repository in sorted({repository for repository, _, _ in mine}):
            if self.settings.repo(repository) is None:
                continue
            try:
                open_prs = set(self.clients.for_repo(repository).open_pulls(repository))
            except PgoverlayError as err:
                log.warning("reconcile: cannot list pull requests of %s: %s", repository, err)
                continue
            for of, pr, head in mine:
                closed = of == repository and pr not in open_prs
                if closed and self._queue_close(repository, pr, head):
                    actions["closed"] += 1
        if not self.engines.remote:  # a pool on another host reaps its expired branches itself
            actions["expired"] = sum(
                line.startswith("destroyed expired") for line in self.engines.local().gc().lines
            )
        self.queue.prune()  # finished jobs and old deliveries (kept 30 days by default)
        self.queue.count_reconcile(actions)
        if any(actions.values()):
            log.info("reconcile: %s", actions)
        return actions

    def _branched(self) -> list[tuple[str, int, str]]:
        """The pull requests that may have a branch (repository, number, the head it was last
        made for): the engine's branches on this host; with a pool on another host, whose
        branches this listener cannot list, those whose last job in the queue is not a close
        that ran."""
        if not self.engines.remote:
            found = []
            for b in self.engines.local().branches():
                if b.repository and b.pr is not None:
                    last = record.of(b)
                    found.append((b.repository, b.pr, last.head_sha if last else ""))
            return found
        latest: dict[tuple[str, int], Job] = {}
        for job in self.queue.jobs():
            key = (job.repository, job.pr or 0)
            if job.pr is not None and (key not in latest or job.id > latest[key].id):
                latest[key] = job
        return [
            (repository, pr, job.head_sha)
            for (repository, pr), job in latest.items()
            if not (job.kind == "close" and job.state == "done")
        ]

    def _queue_close(self, repository: str, pr: int, head_sha: str) -> bool:
        """Queue a close (with no delivery: the worker asks the API about the pull request)
        unless one is already queued or running; True if queued."""
        pending = [
            j
            for j in self.queue.jobs(repository=repository, pr=pr)
            if j.kind == "close" and j.state in ("queued", "running")
        ]
        if pending:
            return False
        outcome = self.queue.accept(
            delivery_id=f"reconcile-{repository}-{pr}-{time.time_ns()}",
            event="reconcile",
            action="closed",
            job=NewJob(repository=repository, pr=pr, kind="close", head_sha=head_sha, payload=""),
        )
        return outcome == "queued"

    def close(self) -> None:
        self.queue.close()


def work(settings: WebhookSettings, runner: Settings) -> int:
    """Run the workers and reconcile until SIGTERM or SIGINT; then stop as :meth:`Service.stop`
    says. If the intake process that started this one dies (the kernel then sends SIGTERM, and
    this process's parent changes), stop at once instead, also in the middle of a graceful
    stop: see :func:`_orphaned`."""
    parent = os.getppid()
    jobs = Service(settings, runner)

    def orphaned() -> bool:
        # Not the signal: the kernel sends it when the thread of intake that started this
        # process ends, which may be before the rest of intake has.
        return os.getppid() != parent

    def on_signal(*_: object) -> None:
        jobs.stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    log.info("worker process %s: %s workers", os.getpid(), settings.workers)
    try:
        jobs.start()
        while not jobs.stopping.wait(1.0) and not orphaned():
            pass
    finally:
        jobs.stop(abandon=orphaned)
        if orphaned():
            _orphaned(settings)
        jobs.close()
    return 0


def _orphaned(settings: WebhookSettings) -> NoReturn:
    """Intake is gone (killed, or crashed), and a new listener may start beside this process:
    end now, without the shutdown grace. The process exits at once; the kernel kills every
    job command it started (they die with it, and each sandbox's namespace with its first
    process), and the jobs it held keep their lease, so they run again, in the new listener,
    once the lease has expired (``lease_seconds``)."""
    log.warning(
        "the intake process is gone: stopping now; running jobs end and run again once their"
        " lease has expired (%.0f s at most)",
        settings.lease_seconds,
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(1)
