"""The PR workflow: event -> create or reset -> migrate -> report -> comment; close -> destroy.

One code path, called by the composite Action (``action/main.py``) and by the webhook listener;
what it does for an event is ``decide``'s answer (``action/decide.py``). Idempotent per
(repository, branch, head SHA, run options): a re-run of the same job finds the branch ready
for that head and reports again without redoing work; the comment is edited only if its text
changed. A re-run with changed run options (another migrations folder, other thresholds, ...)
runs again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pgoverlay.action import comment, conclusion, record, when
from pgoverlay.action.conclusion import refusal
from pgoverlay.action.decide import Decision, as_work, decide, fingerprint
from pgoverlay.action.deployment import DeploymentResult, PendingDeployment
from pgoverlay.action.event import WORK_KINDS, Event, branch_name
from pgoverlay.action.github import CommentResult, GitHub, PendingComment
from pgoverlay.action.report import BranchInfo, MigrationRun, Report
from pgoverlay.action.request import PrRequest
from pgoverlay.action.sandbox import AS_SELF, Sandbox
from pgoverlay.action.wayin import way_in
from pgoverlay.errors import (
    BranchMissingError,
    ConfigError,
    GitHubError,
    NotOwnerError,
    PgoverlayError,
    RequestError,
)
from pgoverlay.runner.names import check_name
from pgoverlay.runner.service.models import CreateRequest, RecordRequest
from pgoverlay.runner.service.views import BaseView, BranchView, Connection
from pgoverlay.runner.settings import Settings

if TYPE_CHECKING:
    from pgoverlay.action import migrations
    from pgoverlay.action.insight.schemadiff import SchemaDiff
    from pgoverlay.runner.service.engine import Engine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    report: Report | None  # None when the event needs nothing (e.g. a PR was labeled)
    branch: BranchView | None  # the ready branch to hand out, if any
    connection: Connection | None = None  # how to log in to it
    comment: CommentResult | None = None
    comment_error: str = ""
    deployment: DeploymentResult | None = None
    deployment_error: str = ""  # why the Deployment could not be written (the run goes on)
    reused: bool = False  # a re-run found the work already done
    # seconds spent in each phase that ran: branch (create, reset or destroy), migrations,
    # comment; what is left of the step's time is its own
    timings: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def _timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    """Add the time the block takes to ``timings[phase]``."""
    started = time.monotonic()
    try:
        yield
    finally:
        timings[phase] = timings.get(phase, 0.0) + time.monotonic() - started


Echo = Callable[[str], None]


def _base_of(engine: Engine, b: BranchView) -> BaseView | None:
    return next(
        (x for x in engine.bases() if (x.name, x.version) == (b.base, b.base_version)), None
    )


def _branch_info(
    engine: Engine, b: BranchView, base: BaseView | None, *, create_seconds: float | None
) -> BranchInfo:
    layer = engine.size(b.name)
    return BranchInfo(
        name=b.name,
        host=b.host,
        port=b.port,
        database=b.database,
        user=b.user,
        base_name=b.base,
        base_version=b.base_version,
        base_seeded_at=base.prepared_at if base else None,
        layer_logical_bytes=layer.logical_bytes,
        layer_physical_bytes=layer.physical_bytes,
        create_seconds=create_seconds,
        runtime=b.runtime,
        base_masked=base.masked if base else None,
        base_mask_rules=base.mask_rules if base else "",
        base_mask_sha256=base.mask_sha256 if base else "",
        suspend_after=b.suspend_after,
    )


Changed = Callable[[str], list[str]]  # folder -> the .sql files the PR adds or changes


def _folder(request: PrRequest, repo_dir: Path) -> str:
    """The request's migrations folder, relative to the checkout ``repo_dir``."""
    workdir = (repo_dir / request.working_directory).resolve()
    return os.path.relpath(workdir / (request.migrations or ""), repo_dir)


def _listing(changed: Changed | None, *, repo_dir: Path, event: Event, sandbox: Sandbox) -> Changed:
    """``changed`` (the listener's tarballs), else git's diff of the checkout ``repo_dir``
    between the pull request's base and head, asked once per folder: the decision (does the
    pull request change migrations?) and the run (which files does it apply?) ask alike."""
    known: dict[str, list[str]] = {}

    def listed(folder: str) -> list[str]:
        if folder not in known:
            if changed is not None:
                known[folder] = changed(folder)
            else:
                from pgoverlay.action import migrations

                known[folder] = migrations.changed_files(
                    repo_dir,
                    folder,
                    base_sha=event.base_sha or "",
                    head_sha=event.head_sha,
                    sandbox=sandbox,
                )
        return list(known[folder])

    return listed


def changes_migrations(
    request: PrRequest, event: Event, *, repo_dir: Path, listed: Changed
) -> bool | None:
    """Whether the pull request adds or changes a .sql file under the request's migrations
    folder (what `branch-when: migrations` asks); None when the request does not ask, or when
    the files cannot be listed: the run then lists them again and its report says why."""
    asked = when.needs_changes(request, event) and event.kind in ("open", "sync")
    if not asked or not request.migrations or not event.base_sha:
        return None
    try:
        return bool(listed(_folder(request, repo_dir)))
    except (PgoverlayError, OSError) as err:
        log.warning("cannot tell whether the pull request changes migrations: %s", err)
        return None


def _run_options(
    request: PrRequest, target: Connection, *, settings: Settings, sandbox: Sandbox
) -> migrations.RunOptions:
    """How the request's migrations run on the branch ``target``: each within the runner's
    ``command_timeout``, in ``sandbox``."""
    from pgoverlay.action import migrations

    return migrations.RunOptions(
        target=target, timeout=settings.command_timeout, request=request, sandbox=sandbox
    )


@dataclass(frozen=True, kw_only=True)
class _Migrations:
    """What applying one PR's migrations needs: how each runs (``options``: the branch, the
    request, the sandbox its code runs in), and where the PR is."""

    options: migrations.RunOptions
    settings: Settings
    major: int
    event: Event
    repo_dir: Path
    echo: Echo
    changed: Changed | None
    fork_commands: bool

    def apply(self, engine: Engine, name: str) -> tuple[list[MigrationRun], str, SchemaDiff | None]:
        """Apply them, measured unless the ``insight`` input is off; returns the runs, a note
        for the report and the schema's changes (measured only). A fork's migrate command runs
        only with ``fork_commands``."""
        request = self.options.request
        if not request.insight:
            return *self._run(self.options), None
        from pgoverlay.action.insight import probe
        from pgoverlay.action.insight.observe import Observer

        observer = Observer(
            engine,
            name,
            repository=self.event.repository,
            thresholds=request.thresholds(),
            pg_major=self.major,
            # Long enough for every file to reach its timeout; the trace then ends itself.
            max_seconds=min(48 * 3600, self.settings.command_timeout * 10 + 600),
            probing=probe.Options(
                target=self.options.target, long_transaction=request.long_transaction()
            ),
        )
        with observer:
            runs, note = self._run(dataclasses.replace(self.options, watcher=observer))
        return runs, note or observer.problem, observer.schema_diff

    def _run(self, options: migrations.RunOptions) -> tuple[list[MigrationRun], str]:
        from pgoverlay.action import migrations
        from pgoverlay.runner.runtime import choose

        inputs, event, repo_dir = options.request, self.event, self.repo_dir
        workdir = (repo_dir / inputs.working_directory).resolve()
        if inputs.migrate_command:
            if event.from_fork and not self.fork_commands:
                return [MigrationRun(inputs.migrate_command, "not run", 0.0)], (
                    "the migrate command was not run: this pull request comes from a fork, and "
                    "running a fork's code needs `allow-fork-commands: true`"
                )
            self.echo(f"running migrate command in {workdir}")
            run = migrations.run_command(
                options, inputs.migrate_command, cwd=workdir, echo=self.echo
            )
            return [run], ""
        if not inputs.migrations:
            return [], ""
        folder = _folder(inputs, repo_dir)
        if inputs.migrations_select == "changed" and event.pr is not None and event.base_sha:
            files = _listing(self.changed, repo_dir=repo_dir, event=event, sandbox=options.sandbox)(
                folder
            )
        else:
            files = migrations.all_files(repo_dir, folder)
        self.echo(f"applying {len(files)} migration file(s) from {folder}")
        return migrations.apply_files(
            options,
            repo_dir,
            files,
            psql=choose.tools_for("psql", settings=self.settings, major=self.major).tool("psql"),
            skip_recorded=True,
        ), ""


# What applying and reporting the migrations needs, and the engine's first answers do not.
_LATER = ("pgoverlay.action.insight.observe", "pgoverlay.runner.runtime.choose")


def _preload(modules: tuple[str, ...]) -> None:
    """Import ``modules`` in a daemon thread while the engine makes or destroys the branch
    (this process only waits for it then). An import that fails here fails again where the
    module is used, with its error."""

    def load() -> None:
        with contextlib.suppress(Exception):
            for name in modules:
                importlib.import_module(name)

    threading.Thread(target=load, name="pgoverlay-preload", daemon=True).start()


def handle(
    engine: Engine,
    event: Event,
    inputs: PrRequest,
    *,
    settings: Settings,
    repo_dir: Path,
    github: GitHub | None,
    run_url: str = "",
    echo: Echo = log.info,
    changed: Changed | None = None,
    sandbox: Sandbox = AS_SELF,
    fork_commands: bool = False,
    refused: str = "",
    asked: PrRequest | None = None,
    door: bool = True,
) -> Outcome:
    """Do what ``decide`` says ``event`` asks for; never raises for a failed comment.

    ``repo_dir`` holds the PR's head. ``changed`` lists a folder's changed .sql files when
    there is no git history to ask (the webhook listener works from tarballs). The PR's SQL
    and commands run in ``sandbox`` (the Action's: as itself; the listener's: a uid of the
    job's own), never with the engine's privileges: the engine is reached through ``engine``
    only. A fork's ``migrate_command`` runs only with ``fork_commands`` (the Action's
    `allow-fork-commands`; the listener never sets it). ``refused`` is why the front end's
    policy does not branch this pull request: its report is returned, and the front end says
    it (no comment is written here). A pull request `branch-when` does not want gets the same,
    and loses its branch if it has one (that is said in its comment). ``asked`` is the request
    whose run options the record keeps when ``inputs`` adds what the head itself fixes (the
    listener's repository file). ``door``: whether the front door answers, so the report may
    give the way in through it (without it, a reader is pointed at nothing that answers).
    """
    event = as_work(event, inputs)  # a `branch-when` label added or taken off: an open, a sync
    if event.kind not in WORK_KINDS:
        return Outcome(report=None, branch=None)
    name = check_name(branch_name(event, inputs.branch_name))
    # A pull request the front end's policy refuses is refused whatever its branch (a close is
    # never refused): the engine is not asked.
    current = None if refused and event.kind != "close" else engine.branch(name)
    last = record.of(current)
    # Listed once, for the decision and then the run
    changed = _listing(changed, repo_dir=repo_dir, event=event, sandbox=sandbox)
    changes = (
        None if refused else changes_migrations(inputs, event, repo_dir=repo_dir, listed=changed)
    )
    decision = decide(event, current, last, asked or inputs, refused=refused, changes=changes)
    if decision.action == "skip":
        echo(f"no branch {name} to destroy")
        # One its ttl or a person destroyed may have left its Deployment active: retire it.
        deployed, deploy_error = (
            retire_deployments(github, event, inputs, name) if event.kind == "close" else (None, "")
        )
        return Outcome(report=None, branch=None, deployment=deployed, deployment_error=deploy_error)
    if decision.action == "unwanted" or (
        decision.action == "refuse" and decision.status == "not branched"
    ):
        report = refusal(event, inputs.branch_name, decision.why, status=decision.status)
        return Outcome(report=dataclasses.replace(report, run_url=run_url), branch=None)
    # Our comment and deployments are looked for now, while the branch and its migrations
    # take their time.
    pending = start_comment(github, event, inputs, name)
    deploying = start_deployment(github, event, inputs, name)
    run = _Run(
        engine=engine,
        event=event,
        inputs=inputs,
        settings=settings,
        repo_dir=repo_dir,
        echo=echo,
        changed=changed,
        sandbox=sandbox,
        fork_commands=fork_commands,
        fingerprint=fingerprint(asked or inputs),
        run_url=run_url,
        door=door,
    )
    report, ready, connection = run.act(decision, current, last)
    with _timed(run.timings, "comment"):
        result, error = post_comment(github, event, inputs, report, pending=pending)
    with _timed(run.timings, "deployment"):
        deployed, deploy_error = post_deployment(deploying, report, run_url=run_url)
    deploy_error += _fork_hint(event) if deploy_error else ""
    return Outcome(
        report=report,
        branch=ready,
        connection=connection if ready else None,
        comment=result,
        comment_error=error,
        deployment=deployed,
        deployment_error=deploy_error,
        reused=decision.action == "report",
        timings=run.timings,
    )


Done = tuple[Report, BranchView | None, Connection | None]  # the report, the branch left ready


@dataclass(frozen=True, kw_only=True)
class _Run:
    """One ``handle``: what its steps share, and its steps."""

    engine: Engine
    event: Event
    inputs: PrRequest
    settings: Settings
    repo_dir: Path
    echo: Echo
    changed: Changed | None
    sandbox: Sandbox
    fork_commands: bool
    fingerprint: str  # the run options' fingerprint, kept in the record
    run_url: str
    door: bool = True  # the front door answers: the report gives the way in through it
    timings: dict[str, float] = field(default_factory=dict)

    def act(
        self, decision: Decision, current: BranchView | None, last: record.PrRecord | None
    ) -> Done:
        """Do what ``decision`` asks for: its report, and the branch it leaves ready."""
        event, name = self.event, branch_name(self.event, self.inputs.branch_name)
        if decision.action == "refuse":
            # Nothing of ours to record: the branch and its report belong to the other repository.
            report = refusal(event, self.inputs.branch_name, decision.why, status="failed")
            return dataclasses.replace(report, run_url=self.run_url), None, None
        skeleton = Report(
            repository=event.repository,
            pr=event.pr,
            branch_name=name,
            head_sha=event.head_sha,
            status="failed",
            branch=None,
            way_in=way_in(self.settings, name) if self.door else None,
            run_url=self.run_url,
        )
        if decision.action == "destroy":
            assert current is not None
            with _timed(self.timings, "branch"):
                # why: the pull request no longer wants a branch ('' for a close)
                gone = dataclasses.replace(skeleton, message=decision.why)
                return self.destroy(current, gone), None, None
        if decision.action == "report":
            assert current is not None and last is not None
            self.echo(f"branch {name} is already up to date with {event.head_sha[:7]}")
            url = self.run_url or last.report.run_url
            # The way in as the runner's settings say it now, not as they were then.
            report = dataclasses.replace(last.report, run_url=url, way_in=skeleton.way_in)
            return report, current, self.engine.connection(name)
        done = self.work(decision, current, skeleton)
        self.save(done[0])
        return done

    def work(self, decision: Decision, current: BranchView | None, skeleton: Report) -> Done:
        """Create or reset the branch (or keep it), then migrate it; a failed report when the
        branch cannot be made ready."""
        engine, name = self.engine, skeleton.branch_name
        try:
            _preload(_LATER)
            with _timed(self.timings, "branch"):
                b, seconds = self.ensure_branch(decision, current, name)
            connection = engine.connection(name)
            base = _base_of(engine, b)
            runs, note, schema_diff = self.migrate(connection, base, name)
        except (PgoverlayError, OSError) as err:
            log.warning("branch %s not ready: %s", name, err)
            report = dataclasses.replace(skeleton, message=str(err).strip().splitlines()[0])
            return report, None, None
        failed = any(r.status == "failed" for r in runs)
        report = dataclasses.replace(
            skeleton,
            status="migration failed" if failed else "ready",
            branch=_branch_info(engine, b, base, create_seconds=seconds),
            migrations=runs,
            message=note,
            schema_diff=schema_diff,
        )
        return report, b, connection

    def ensure_branch(
        self, decision: Decision, current: BranchView | None, name: str
    ) -> tuple[BranchView, float | None]:
        """Create the branch, reset it, or keep it as it is, as ``decision`` says; returns it
        and the seconds that took."""
        event, inputs = self.event, self.inputs
        if decision.action == "fail":
            raise PgoverlayError(decision.why)
        if decision.action == "create":
            self.echo(f"creating branch {name}")
            try:
                request = CreateRequest(
                    name=name,
                    base=inputs.base,
                    ttl_seconds=inputs.ttl_seconds(),
                    suspend_after_seconds=inputs.suspend_after_seconds(),
                    runtime=None if inputs.runtime == "auto" else inputs.runtime,
                    repository=event.repository,
                    pr=event.pr,
                )
            except RequestError as err:
                raise ConfigError(f"cannot ask for branch {name}: {err}") from None
            created = self.engine.create(request)
            return created, created.seconds
        assert current is not None
        if decision.action == "reset":
            self.echo(f"resetting branch {name} to its base")
            done = self.engine.reset(name, repository=event.repository)
            return done, done.seconds
        return current, None

    def migrate(
        self, connection: Connection, base: BaseView | None, name: str
    ) -> tuple[list[MigrationRun], str, SchemaDiff | None]:
        """Apply the PR's migrations to branch ``name``: the runs, a note, the schema's changes."""
        engine, settings, event, inputs = self.engine, self.settings, self.event, self.inputs
        repo_dir, echo, changed, sandbox = self.repo_dir, self.echo, self.changed, self.sandbox
        fork_commands = self.fork_commands
        with _timed(self.timings, "migrations"):
            return _Migrations(
                options=_run_options(inputs, connection, settings=settings, sandbox=sandbox),
                settings=settings,
                major=base.pg_major if base and base.pg_major else 0,
                event=event,
                repo_dir=repo_dir,
                echo=echo,
                changed=changed,
                fork_commands=fork_commands,
            ).apply(engine, name)

    def destroy(self, current: BranchView, skeleton: Report) -> Report:
        engine = self.engine
        info = _branch_info(engine, current, _base_of(engine, current), create_seconds=None)
        done = engine.destroy(current.name, repository=self.event.repository)
        last = record.read(done.record, branch=current.name)
        return dataclasses.replace(
            skeleton,
            status="destroyed",
            branch=info,
            merged=self.event.merged,
            migrations=last.report.migrations if last else [],
        )

    def save(self, report: Report) -> None:
        """Keep the report with its branch and the run options, for re-runs and the closing
        comment. A branch that could not be made, or that is not this caller's, keeps
        nothing."""
        kept = record.PrRecord(report.head_sha, report.status, report, inputs=self.fingerprint)
        with contextlib.suppress(BranchMissingError, NotOwnerError):
            self.engine.save_record(
                report.branch_name,
                RecordRequest(repository=report.repository, data=record.dumps(kept)),
            )


def start_comment(
    github: GitHub | None, event: Event, inputs: PrRequest, name: str
) -> PendingComment | None:
    """Start looking for the PR's comment on branch ``name``, when one is to be written."""
    if github is None or not inputs.comment or event.pr is None:
        return None
    mark = comment.marker(event.repository, event.pr, name)
    return github.prefetch_comment(
        event.repository, event.pr, lambda body: comment.has_marker(body, mark)
    )


def post_comment(
    github: GitHub | None,
    event: Event,
    inputs: PrRequest,
    report: Report,
    *,
    pending: PendingComment | None = None,
) -> tuple[CommentResult | None, str]:
    """Write the PR's comment for ``report`` (through ``pending`` when its search has begun);
    the result, or why it could not be written."""
    if github is None or not inputs.comment or event.pr is None:
        return None, ""
    mark = comment.marker(report.repository, report.pr, report.branch_name)
    body = comment.render_comment(report)
    try:
        if pending is not None:
            return pending.write(body), ""
        return github.upsert_comment(
            report.repository, event.pr, body, lambda text: comment.has_marker(text, mark)
        ), ""
    except GitHubError as err:
        return None, f"{err}{_fork_hint(event)}"


def _fork_hint(event: Event) -> str:
    """Why a write to the pull request fails on a fork's: GitHub's token is read-only there."""
    if not event.from_fork:
        return ""
    return (
        " (pull requests from forks get a read-only token: the branch works, but cannot be "
        "announced on the PR)"
    )


def start_deployment(
    github: GitHub | None, event: Event, inputs: PrRequest, name: str
) -> PendingDeployment | None:
    """Start looking for the pull request's deployments of branch ``name``, when the request
    asks for a Deployment."""
    if github is None or not inputs.deployment or event.pr is None:
        return None
    return PendingDeployment(github, event.repository, name)


def retire_deployments(
    github: GitHub | None, event: Event, inputs: PrRequest, name: str
) -> tuple[DeploymentResult | None, str]:
    """Mark the deployments of branch ``name`` inactive, on the close of a pull request whose
    branch is gone already; what was done, or why it could not be."""
    pending = start_deployment(github, event, inputs, name)
    if pending is None:
        return None, ""
    return _written(lambda: pending.write(conclusion.retired(name), sha=event.head_sha))


def post_deployment(
    pending: PendingDeployment | None, report: Report, *, run_url: str = ""
) -> tuple[DeploymentResult | None, str]:
    """Write the Deployment's state for ``report``; what was done, or why it could not be
    (never raised: a Deployment does not fail the run)."""
    if pending is None:
        return None, ""
    end = conclusion.deployment(report)
    if end is None:
        return None, ""
    return _written(lambda: pending.write(end, sha=report.head_sha, log_url=run_url))


def _written(write: Callable[[], DeploymentResult]) -> tuple[DeploymentResult | None, str]:
    """What ``write`` did, or why it failed: a Deployment never fails the run."""
    try:
        return write(), ""
    except GitHubError as err:
        return None, str(err)
    except OSError as err:  # GitHub unreachable (requests' errors are OSErrors)
        return None, f"could not reach GitHub for the deployment ({type(err).__name__})"
