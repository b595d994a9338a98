"""The PR workflow: event -> create or reset -> migrate -> report -> comment; close -> destroy.

One code path, called by the composite Action (``action/main.py``) and by the webhook listener.
Idempotent per (repository, branch, head SHA): a re-run of the same job finds the branch ready
for that head and reports again without redoing work; the comment is edited only if its text
changed.
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

from pgoverlay.action import comment, record
from pgoverlay.action.event import WORK_KINDS, Event, branch_name
from pgoverlay.action.github import CommentResult, GitHub, PendingComment
from pgoverlay.action.report import BranchInfo, MigrationRun, Report
from pgoverlay.action.request import Inputs, PrRequest
from pgoverlay.action.sandbox import AS_SELF, Sandbox
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


def password_hint(name: str) -> str:
    return (
        f"the step's `password` output (masked in logs), or `pgoverlay branch connect {name}` "
        "on the runner, as the runner's user"
    )


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
    )


def _save(engine: Engine, report: Report) -> None:
    """Keep the report with its branch, for re-runs and the closing comment. A branch that
    could not be made, or that is not this caller's, keeps nothing."""
    with contextlib.suppress(BranchMissingError, NotOwnerError):
        engine.save_record(
            report.branch_name,
            RecordRequest(
                repository=report.repository,
                data=record.dumps(record.PrRecord(report.head_sha, report.status, report)),
            ),
        )


def _owner_refusal(current: BranchView | None, repository: str) -> str:
    """Why a branch name is not this repository's to use, or ''."""
    if current is None or not current.repository:
        return ""
    if current.repository.lower() == repository.lower():
        return ""
    where = f"{current.repository}#{current.pr}" if current.pr else current.repository
    return (
        f"branch {current.name} on this runner belongs to {where}: set the `branch-name` input "
        "to a name unique on this runner (the default, '{repo}-pr-{number}', is)"
    )


def fork_refusal(event: Event, inputs: Inputs) -> str:
    """Why a pull request from a fork gets no branch, or '' when it may have one.

    Closing is never refused: a branch made while forks were allowed is still destroyed.
    """
    if not event.from_fork or inputs.allow_forks or event.kind not in ("open", "sync"):
        return ""
    return (
        "this pull request comes from a fork, and this workflow does not branch forks: no "
        "branch was made and none of the fork's migrations or commands ran. To branch pull "
        "requests from forks, set `allow-forks: true` on the pgoverlay step (their SQL then "
        "runs against their own branch; `migrate-command` also needs `allow-fork-commands: true`)"
    )


Changed = Callable[[str], list[str]]  # folder -> the .sql files the PR adds or changes


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
        folder = os.path.relpath(workdir / inputs.migrations, repo_dir)
        if inputs.migrations_select == "changed" and event.pr is not None and event.base_sha:
            files = (
                self.changed(folder)
                if self.changed is not None
                else migrations.changed_files(
                    repo_dir,
                    folder,
                    base_sha=event.base_sha,
                    head_sha=event.head_sha,
                    sandbox=options.sandbox,
                )
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


def _bring_up(
    engine: Engine, event: Event, inputs: PrRequest, current: BranchView | None, echo: Echo
) -> tuple[BranchView, float | None]:
    """Create the branch, or reset it for a new head; returns it and the seconds it took."""
    name = branch_name(event, inputs.branch_name)
    if current is None:
        echo(f"creating branch {name}")
        try:
            request = CreateRequest(
                name=name,
                base=inputs.base,
                ttl_seconds=inputs.ttl_seconds(),
                runtime=None if inputs.runtime == "auto" else inputs.runtime,
                repository=event.repository,
                pr=event.pr,
            )
        except RequestError as err:
            raise ConfigError(f"cannot ask for branch {name}: {err}") from None
        created = engine.create(request)
        return created, created.seconds
    if current.state != "ready":
        raise PgoverlayError(
            f"branch {name} is {current.state} (an earlier run was interrupted): run "
            "`pgoverlay gc` on the runner, then re-run this job"
        )
    last = record.of(current)
    new_head = last is None or last.head_sha != event.head_sha
    if inputs.reset_on_push and (new_head or (last and last.status != "ready")):
        echo(f"resetting branch {name} to its base")
        done = engine.reset(name, repository=event.repository)
        return done, done.seconds
    return current, None


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
) -> Outcome:
    """Do what ``event`` asks for; never raises for a failed comment.

    ``repo_dir`` holds the PR's head. ``changed`` lists a folder's changed .sql files when
    there is no git history to ask (the webhook listener works from tarballs). The PR's SQL
    and commands run in ``sandbox`` (the Action's: as itself; the listener's: a uid of the
    job's own), never with the engine's privileges: the engine is reached through ``engine``
    only. A fork's ``migrate_command`` runs only with ``fork_commands`` (the Action's
    `allow-fork-commands`; the listener never sets it).
    """
    if event.kind not in WORK_KINDS:
        return Outcome(report=None, branch=None)
    timings: dict[str, float] = {}
    name = check_name(branch_name(event, inputs.branch_name))
    current = engine.branch(name)
    skeleton = Report(
        repository=event.repository,
        pr=event.pr,
        branch_name=name,
        head_sha=event.head_sha,
        status="failed",
        branch=None,
        password_hint=password_hint(name),
        run_url=run_url,
    )
    # Our comment is looked for now, while the branch and its migrations take their time.
    closing_nothing = event.kind == "close" and current is None
    pending = None if closing_nothing else start_comment(github, event, inputs, name)
    refusal = _owner_refusal(current, event.repository)
    if refusal:
        # Nothing of ours to record: the branch and its report belong to the other repository.
        report = dataclasses.replace(skeleton, message=refusal)
        with _timed(timings, "comment"):
            result, error = post_comment(github, event, inputs, report, pending=pending)
        return Outcome(
            report=report, branch=None, comment=result, comment_error=error, timings=timings
        )
    if event.kind == "close":
        if current is None:
            echo(f"no branch {name} to destroy")
            return Outcome(report=None, branch=None)
        with _timed(timings, "branch"):
            report = _close(engine, event, current, skeleton)
        with _timed(timings, "comment"):
            result, error = post_comment(github, event, inputs, report, pending=pending)
        return Outcome(
            report=report, branch=None, comment=result, comment_error=error, timings=timings
        )
    ready: BranchView | None = None
    connection: Connection | None = None
    reused = False
    last = record.of(current)
    if (
        current is not None
        and last is not None
        and last.head_sha == event.head_sha
        and last.status == "ready"
        and current.state == "ready"
        and current.running
    ):
        echo(f"branch {name} is already up to date with {event.head_sha[:7]}")
        report = dataclasses.replace(last.report, run_url=run_url or last.report.run_url)
        ready, reused = current, True
        connection = engine.connection(name)
    else:
        try:
            _preload(_LATER)
            with _timed(timings, "branch"):
                b, seconds = _bring_up(engine, event, inputs, current, echo)
            connection = engine.connection(name)
            base = _base_of(engine, b)
            with _timed(timings, "migrations"):
                runs, note, schema_diff = _Migrations(
                    options=_run_options(inputs, connection, settings=settings, sandbox=sandbox),
                    settings=settings,
                    major=base.pg_major if base and base.pg_major else 0,
                    event=event,
                    repo_dir=repo_dir,
                    echo=echo,
                    changed=changed,
                    fork_commands=fork_commands,
                ).apply(engine, name)
            failed = any(r.status == "failed" for r in runs)
            report = dataclasses.replace(
                skeleton,
                status="migration failed" if failed else "ready",
                branch=_branch_info(engine, b, base, create_seconds=seconds),
                migrations=runs,
                message=note,
                schema_diff=schema_diff,
            )
            ready = b
        except (PgoverlayError, OSError) as err:
            log.warning("branch %s not ready: %s", name, err)
            report = dataclasses.replace(skeleton, message=str(err).strip().splitlines()[0])
            connection = None
        _save(engine, report)
    with _timed(timings, "comment"):
        result, error = post_comment(github, event, inputs, report, pending=pending)
    return Outcome(
        report=report,
        branch=ready,
        connection=connection if ready else None,
        comment=result,
        comment_error=error,
        reused=reused,
        timings=timings,
    )


def _close(engine: Engine, event: Event, current: BranchView, skeleton: Report) -> Report:
    info = _branch_info(engine, current, _base_of(engine, current), create_seconds=None)
    done = engine.destroy(current.name, repository=event.repository)
    last = record.read(done.record, branch=current.name)
    return dataclasses.replace(
        skeleton,
        status="destroyed",
        branch=info,
        merged=event.merged,
        migrations=last.report.migrations if last else [],
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
        hint = (
            (
                " (pull requests from forks get a read-only token: the branch works, but "
                "cannot be announced on the PR)"
            )
            if event.from_fork
            else ""
        )
        return None, f"{err}{hint}"
