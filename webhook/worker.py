"""Workers: take jobs from the durable queue and run the shared PR workflow for them.

The same code path as the Action (`pgoverlay.action.workflow.handle`), fed from the API
instead of a checkout: the PR's head (and base) come as tarballs, so no git credentials are
on disk. A commit status `pgoverlay/branch` goes pending, then success or failure.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import os
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from pgoverlay.action import event as events
from pgoverlay.action import record
from pgoverlay.action.conclusion import conclude, refusal
from pgoverlay.action.decide import as_work, decide
from pgoverlay.action.github import GitHub
from pgoverlay.action.insight import jsonreport
from pgoverlay.action.migrations import changed_between
from pgoverlay.action.report import Report, RunStatus
from pgoverlay.action.request import PrRequest
from pgoverlay.action.request import read as read_request
from pgoverlay.action.workflow import Outcome, handle, post_comment
from pgoverlay.errors import (
    ConfigError,
    GitHubError,
    PgoverlayError,
    PolicyError,
    Problems,
    QueueError,
    TokenError,
    TransientError,
    UnsafeFileError,
    config_error,
)
from pgoverlay.runner import safefs
from pgoverlay.runner.service.acting import Acting
from pgoverlay.runner.service.engine import Engine
from pgoverlay.runner.settings import Settings
from pgoverlay.webhook import forks
from pgoverlay.webhook.clients import GitHubClients
from pgoverlay.webhook.engines import Engines
from pgoverlay.webhook.jobmetrics import Metrics
from pgoverlay.webhook.queue import MAX_REPORT_BYTES, Job, Queue, backoff_delay
from pgoverlay.webhook.routing import JobEvent
from pgoverlay.webhook.sandbox import JobSandbox, job_uid, remove_scratch
from pgoverlay.webhook.settings import RepoSettings, WebhookSettings

log = logging.getLogger(__name__)

REPO_FILE = ".pgoverlay.yml"
REPO_FILE_KEYS = {"migrations", "migrations_select", "working_directory", "base"}
REPO_FILE_BYTES = 64 * 1024
# The job a worker thread is on, for log lines written deep inside the engine.
CURRENT: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar(
    "pgoverlay_job", default=("-", "-")
)


# Both processes of the listener log alike: the time, the level, the logger, the delivery and the
# pull request (`owner/name#N`: search for `pr=owner/name#N`), then the message.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s delivery=%(delivery_id)s pr=%(pr)s %(message)s"


class JobLogContext(logging.Filter):
    """Every log line carries the delivery id and the PR (`owner/name#N`), or '-'."""

    def filter(self, record: logging.LogRecord) -> bool:
        delivery, pr = CURRENT.get()
        record.delivery_id = getattr(record, "delivery_id", delivery)
        record.pr = getattr(record, "pr", pr)
        return True


def _extract(tarball: Path, dest: Path) -> Path:
    """Extract a GitHub tarball (one top-level folder) safely; return that folder.

    Only folders and regular files that stay inside ``dest`` are extracted, without their
    owners, modes or times; links, devices and FIFOs are left out. The same on every Python:
    Debian 12's 3.11.2 has no extraction filters (3.11.4 brought them), and where they exist
    the ``data`` filter checks each member as well."""
    filters = hasattr(tarfile, "data_filter")
    with tarfile.open(tarball) as archive:
        for member in archive:
            if not _plain(member):
                continue
            if filters:
                archive.extract(member, dest, set_attrs=False, filter="data")
            else:
                archive.extract(member, dest, set_attrs=False)
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise PgoverlayError("the repository tarball does not have one top-level folder")
    return tops[0]


def _plain(member: tarfile.TarInfo) -> bool:
    """A folder or a regular file that stays inside the destination; links, devices and FIFOs
    are left out (what the ``data`` filter refuses or rewrites, made simple)."""
    parts = Path(member.name).parts
    inside = bool(parts) and not Path(member.name).is_absolute() and ".." not in parts
    return inside and (member.isreg() or member.isdir())


@dataclass(frozen=True)
class Done:
    """How a job ended: its one-line result, and the run's report when it made one."""

    result: str
    report: Report | None = None

    def json(self) -> str:
        """The report as the Action's JSON report, cut to what the queue keeps; '' for none."""
        if self.report is None:
            return ""
        return jsonreport.dumps(self.report, limit=MAX_REPORT_BYTES)


@dataclass(frozen=True)
class Current:
    """A job's pull request as the API has it now."""

    event: events.Event  # its event, with the head, base and merged state of now
    open: bool
    labels: list[str] = dataclasses.field(default_factory=list)
    # The base repository's id and its owner's, as the API has them (None for a pull request
    # the API no longer knows).
    repository_id: int | None = None
    owner_id: int | None = None


def _gone(job: Job, delivered: JobEvent | None) -> events.Event:
    """The close of a pull request the API no longer knows: its delivery's event, or (for a
    close reconcile queued) what the job itself says."""
    if delivered is not None:
        return delivered.event
    return events.Event(
        kind="close",
        repository=job.repository,
        pr=job.pr,
        head_sha=job.head_sha,
        base_sha=None,
        merged=None,  # not known: the comment says so
        from_fork=False,
        draft=False,
        ref_name="",
        action="closed",
    )


class Worker:
    """Runs jobs; one per thread, each with its own pool (SQLite) connection."""

    def __init__(
        self,
        name: str,
        *,
        settings: WebhookSettings,
        runner: Settings,
        engines: Engines,
        queue: Queue,
        clients: GitHubClients,
        metrics: Metrics,
        stop: threading.Event,
    ) -> None:
        self.name = name
        self.settings = settings
        self.runner = runner
        self.engines = engines
        self.queue = queue
        self.clients = clients
        self.metrics = metrics
        self.stop = stop

    def run_forever(self) -> None:
        while not self.stop.is_set():
            job: Job | None = None
            try:
                job = self.queue.claim(worker=self.name, lease_seconds=self.settings.lease_seconds)
                if job is None:
                    self.stop.wait(0.2)
                    continue
                self.run_one(job)
            except QueueError as err:
                # e.g. our lease ran out while the job ran: another worker owns it now
                extra = job.log_extra() if job is not None else None
                log.warning("%s: %s", self.name, err, extra=extra)
                self.stop.wait(1.0)

    def run_one(self, job: Job) -> None:
        extra = job.log_extra()
        CURRENT.set((extra["delivery_id"], extra["pr"]))
        started = time.monotonic()
        renewing = threading.Event()
        keeper = threading.Thread(target=self._keep_lease, args=(job, renewing), daemon=True)
        keeper.start()
        try:
            done = self.process(job)
        except TransientError as err:
            delay = backoff_delay(
                job.attempts, retry_after=err.retry_after, ratelimit_reset=err.ratelimit_reset
            )
            again = self.queue.retry(job.id, worker=self.name, delay=delay, result=str(err))
            log.warning(
                "job %s: %s; %s",
                job.id,
                err,
                f"retrying in {delay:.0f} s"
                if again
                else "not retried (out of attempts, or superseded by a newer push or close)",
                extra=extra,
            )
            self.metrics.job(job.kind, "retry" if again else "failed", time.monotonic() - started)
            return
        except Exception as err:  # the edge of a job: record it, keep the worker alive
            log.exception("job %s failed", job.id, extra=extra)
            self.queue.finish(job.id, worker=self.name, state="failed", result=str(err)[:500])
            self.metrics.job(job.kind, "failed", time.monotonic() - started)
            return
        finally:
            renewing.set()
            keeper.join()
            CURRENT.set(("-", "-"))
        self.queue.finish(
            job.id, worker=self.name, state="done", result=done.result, report=done.json()
        )
        self.metrics.job(job.kind, "done", time.monotonic() - started)
        log.info("job %s done: %s", job.id, done.result, extra=extra)

    def _keep_lease(self, job: Job, done: threading.Event) -> None:
        interval = self.settings.lease_seconds / 3
        while not done.wait(interval):
            try:
                if not self.queue.renew(
                    job.id, worker=self.name, lease_seconds=self.settings.lease_seconds
                ):
                    log.error("job %s: lease lost while running", job.id, extra=job.log_extra())
                    return
            except QueueError as err:  # e.g. a busy database: try again at the next tick
                log.warning(
                    "job %s: could not renew the lease: %s", job.id, err, extra=job.log_extra()
                )

    # -- one job ----------------------------------------------------------------------------

    def process(self, job: Job) -> Done:
        repo = self.settings.repo(job.repository)
        if repo is None:
            return Done("repository no longer allowed")
        delivered = JobEvent.model_validate_json(job.payload) if job.payload else None
        self.clients.remember(job.repository, delivered.installation if delivered else None)
        github = self.clients.for_repo(job.repository)
        # A delivery may be old (a redelivery, a replay): act on the pull request as it is now.
        now = self._now(github, job, delivered)
        if now is None:
            return Done("pull request not found")
        engine = self._engine(job, delivered, now)
        if engine is None:
            return Done("the repository's id is unknown: no branch can be asked of the pool")
        request = repo.request()
        if job.kind == "close":
            return self._close(engine, job, now, request, github)
        if not now.open:
            return Done("the pull request is closed: nothing to do")
        # A fork's approval: its label added (a job queued before labels were kept names none)
        approving = job.kind == "label" and now.event.label in ("", repo.fork_label)
        approving = approving and now.event.from_fork
        ev = dataclasses.replace(now.event, labels=tuple(now.labels))
        ev = dataclasses.replace(ev, kind="open") if approving else as_work(ev, request)
        if ev.kind not in events.WORK_KINDS:
            return Done("label needs no work")
        refused = self._admit(github, job, delivered, now.labels, ev, repo, approving=approving)
        if isinstance(refused, Done):
            return refused
        # A pull request the policy refuses is refused whatever its branch: the engine is not asked.
        try:
            current = (
                None if refused else engine.branch(events.branch_name(ev, request.branch_name))
            )
        except (TokenError, PolicyError) as err:
            # The pool on another host refused the listener's credential or this repository:
            # said on the pull request too, not only in the queue, then the job fails.
            self._refuse(github, ev, request, "failed", f"the pool refused this job: {err}")
            raise
        decision = decide(ev, current, record.of(current), request, refused=refused)
        if decision.action in ("unwanted", "destroy"):
            # `branch-when` does not want it (a label it lacks: migrations are known only once
            # the sources are fetched, and handle() asks then)
            outcome = handle(
                engine, ev, request, settings=self.runner, repo_dir=Path("/"), github=github
            )
            self._say_deployment(job, outcome)
            return self._end(github, ev, request, outcome)
        if decision.action == "refuse":
            report = self._refuse(github, ev, request, decision.status, decision.why)
            return (
                Done("not branched")
                if decision.status == "not branched"
                else Done("failed", report)
            )
        if decision.ran:
            # An older delivery, or a replay, of a head already branched and migrated with these
            # settings: its status and comment stand.
            return Done(f"already done at {ev.head_sha[:7]}")
        return self._work(engine, job, ev, repo, request, github)

    def _close(
        self, engine: Engine, job: Job, now: Current, request: PrRequest, github: GitHub
    ) -> Done:
        if now.open:
            return Done("the pull request is open: nothing to destroy")
        self.queue.revoke(job.repository, job.pr or 0)
        outcome = handle(
            engine,
            now.event,
            request,
            settings=self.engines.runner_for(engine),
            repo_dir=Path("/"),
            github=github,
        )
        self._say_deployment(job, outcome)
        if outcome.report is None:
            return Done("nothing to destroy")
        return Done(outcome.report.status, outcome.report)

    def _admit(
        self,
        github: GitHub,
        job: Job,
        delivered: JobEvent | None,
        labels: list[str],
        ev: events.Event,
        repo: RepoSettings,
        *,
        approving: bool,
    ) -> str | Done:
        """Why the listener's policy (forks, drafts, a maintainer's label) does not branch this
        pull request, '' when it may; or how the job ends when a fork's verdict says nothing.
        ``approving``: the job is the fork label's."""
        refusal = self._refusal(ev, repo)
        if refusal or not ev.from_fork:
            return refusal
        verdict = self._fork_verdict(
            github, job, delivered, labels, ev, repo.fork_label, approving=approving
        )
        if verdict.quiet:
            return Done(f"not branched: {verdict.reason}")
        return verdict.reason

    def _work(
        self,
        engine: Engine,
        job: Job,
        ev: events.Event,
        repo: RepoSettings,
        request: PrRequest,
        github: GitHub,
    ) -> Done:
        """Fetch the PR's trees, run the workflow on them in the job's sandbox, and set the
        commit status for how it ended."""
        self._status(github, ev, "pending", "creating the branch")
        sandbox = JobSandbox(
            Path(tempfile.mkdtemp(prefix="pgoverlay-pr-", dir=self.settings.state_dir)),
            job_uid(job.id),
        )
        asked = request
        try:
            # Everything the listener reads from the trees is read before the sandbox gets
            # them (the first command hands them over): the repository file here, the
            # migration list and the migration files inside handle().
            head, base = self._sources(github, ev, sandbox.scratch)
            if repo.honour_repo_file and not ev.from_fork:
                try:
                    request = self._repo_file(head, request)
                except ConfigError as err:
                    self._refuse(github, ev, request, "failed", str(err))
                    return Done("failed: bad repository file")
            runner = self.engines.runner_for(engine)
            with self.engines.holding(engine, events.branch_name(ev, request.branch_name)):
                outcome = handle(
                    engine,
                    ev,
                    request,
                    settings=runner,
                    repo_dir=head,
                    github=github,
                    changed=(lambda folder: changed_between(base, head, folder)) if base else None,
                    sandbox=sandbox,
                    # The repository file is the head's: the settings' run options and the
                    # head say what ran.
                    asked=asked,
                    door=self.engines.door_answers(engine),
                )
        finally:
            try:
                sandbox.remove()
            except PgoverlayError as err:  # left for the start-up clean-up
                log.warning("job %s: could not remove its scratch folder: %s", job.id, err)
        self._say_deployment(job, outcome)
        return self._end(github, ev, request, outcome)

    def _end(self, github: GitHub, ev: events.Event, request: PrRequest, outcome: Outcome) -> Done:
        """The commit status for how the run ended (a pull request `branch-when` does not want:
        success, saying why it has no branch), and the job's result."""
        if outcome.report is None:
            return Done("nothing to do")
        end = conclude(outcome.report, fail_on_threshold=request.fail_on_threshold)
        self._status(github, ev, "success" if end.passed else "failure", end.line)
        return Done(outcome.report.status, outcome.report)

    def _now(self, github: GitHub, job: Job, delivered: JobEvent | None) -> Current | None:
        """The pull request as the API has it now (state, head and base, head repository,
        draft, merged, labels); for one the API no longer knows, the delivery's own event if
        the job is a close, else None."""
        try:
            pull = github.pull(job.repository, job.pr or 0)
            if pull is None:
                return Current(_gone(job, delivered), open=False) if job.kind == "close" else None
            labels = github.labels(job.repository, job.pr or 0)
        except GitHubError as err:
            raise TransientError(str(err)) from None
        action = delivered.event.action if delivered else "closed"
        label = delivered.event.label if delivered else ""
        ev = events.from_pull(action, pull, repository=job.repository, label=label)
        base = pull.get("base", {}).get("repo") or {}
        owner = base.get("owner") or {}
        return Current(
            ev,
            open=pull.get("state") == "open",
            labels=labels,
            repository_id=_positive(base.get("id")),
            owner_id=_positive(owner.get("id")),
        )

    def _engine(self, job: Job, delivered: JobEvent | None, now: Current) -> Engine | None:
        """The engine for this job: the service on this host, or the pool's network API acting
        for the job's repository, named by the ids the signed delivery holds (for a close that
        reconcile queued, which has none, those the API has now); None when neither has them."""
        if not self.engines.remote:
            return self.engines.local()
        ids = (delivered.repository_id, delivered.owner_id) if delivered else (None, None)
        if None in ids:
            ids = (now.repository_id, now.owner_id)
        repository_id, owner_id = ids
        if repository_id is None or owner_id is None:
            log.warning(
                "job %s: neither the delivery nor the API names the repository's id", job.id
            )
            return None
        return self.engines.acting_for(
            Acting(
                repository=job.repository,
                repository_id=repository_id,
                owner_id=owner_id,
                from_fork=now.event.from_fork,
            )
        )

    def _fork_verdict(
        self,
        github: GitHub,
        job: Job,
        delivered: JobEvent | None,
        labels: list[str],
        ev: events.Event,
        label: str,
        *,
        approving: bool,
    ) -> forks.Verdict:
        """Whether this fork's head may run (see ``forks.decide``), and its side effects: an
        approval recorded, or the label taken off. ``labels`` are the PR's labels now;
        ``approving``: the job is ``label``'s (any other job asks about its head)."""
        kind = "label" if approving else ev.kind
        sender = delivered.sender if delivered else ""
        labelled_sha = job.head_sha  # the head the delivery (for a label job, the label) saw
        pending = any(
            j.kind == "label" and j.state == "queued" and j.id > job.id
            for j in self.queue.jobs(repository=job.repository, pr=job.pr)
        )
        try:
            can_write = (
                kind == "label" and label in labels and github.can_write(ev.repository, sender)
            )
            verdict = forks.decide(
                kind=kind,
                label=label,
                labels=labels,
                head_sha=ev.head_sha,
                approval=self.queue.approval(job.repository, job.pr or 0),
                labelled_sha=labelled_sha,
                sender=sender,
                sender_can_write=can_write,
                label_job_pending=pending,
            )
            if verdict.remove_label:
                github.remove_label(ev.repository, job.pr or 0, label)
        except GitHubError as err:
            raise TransientError(str(err)) from None
        if verdict.approver:
            self.queue.approve(
                job.repository, job.pr or 0, head_sha=ev.head_sha, approver=verdict.approver
            )
            log.info("fork approved at %s by %s", ev.head_sha[:7], verdict.approver)
        return verdict

    def _refuse(
        self, github: GitHub, ev: events.Event, request: PrRequest, status: RunStatus, reason: str
    ) -> Report:
        """Say on the PR, and in its commit status, why it gets no branch; the report said."""
        report = refusal(ev, request.branch_name, reason, status=status)
        post_comment(github, ev, request, report)
        self._status(github, ev, "failure", f"{status}: {reason}")
        return report

    def _say_deployment(self, job: Job, outcome: Outcome) -> None:
        """Log why the pull request's Deployment was not written: a warning the first time for
        the repository, then at debug level (the comment and the status go on either way)."""
        if not outcome.deployment_error:
            return
        first = self.clients.first_warning(job.repository, "deployment")
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "job %s: the GitHub Deployment was not written, the PR comment stands alone: %s",
            job.id,
            outcome.deployment_error,
            extra=job.log_extra(),
        )

    @staticmethod
    def _refusal(ev: events.Event, repo: RepoSettings) -> str:
        if ev.from_fork and repo.forks == "deny":
            return "pull requests from forks are not branched in this repository"
        if ev.draft and not repo.drafts:
            return "draft pull requests are not branched here: mark it ready for review"
        return ""

    def _status(self, github: GitHub, ev: events.Event, state: str, description: str) -> None:
        try:
            github.set_status(ev.repository, ev.head_sha, state, description)
        except GitHubError as err:
            raise TransientError(str(err)) from None

    def _sources(self, github: GitHub, ev: events.Event, scratch: Path) -> tuple[Path, Path | None]:
        trees: list[Path | None] = []
        for label, sha in (("head", ev.head_sha), ("base", ev.base_sha)):
            if sha is None:
                trees.append(None)
                continue
            archive = scratch / f"{label}.tar.gz"
            try:
                github.download_tarball(ev.repository, sha, archive)
            except GitHubError as err:
                raise TransientError(str(err)) from None
            tree = _extract(archive, scratch / label)
            archive.unlink()
            trees.append(tree)
        head, base = trees
        assert head is not None
        return head, base

    @staticmethod
    def _repo_file(head: Path, request: PrRequest) -> PrRequest:
        if not os.path.lexists(head / REPO_FILE):
            return request
        try:
            text = safefs.read_inside(head, REPO_FILE, limit=REPO_FILE_BYTES, what=REPO_FILE)
        except UnsafeFileError as err:
            raise ConfigError(f"{REPO_FILE} at the PR's head: {err}") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{REPO_FILE} at the PR's head is not YAML: {err}") from None
        if not isinstance(data, dict):
            return request
        changes = {
            k.replace("-", "_"): v for k, v in data.items() if k.replace("-", "_") in REPO_FILE_KEYS
        }
        merged = {**dataclasses.asdict(request), **changes}
        settled, problems = read_request(type(request), merged)
        if problems:
            raise config_error(Problems(problems), what=f"{REPO_FILE} at the PR's head:")
        return type(request)(**settled)


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def cleanup_scratch(state_dir: Path) -> None:
    """Scratch folders (PR sources, and what their jobs left) of a killed worker."""
    for path in state_dir.glob("pgoverlay-pr-*"):
        try:
            remove_scratch(path)
        except PgoverlayError as err:
            log.warning("could not remove %s: %s", path, err)
