"""The PR workflow: event -> create or reset -> migrate -> report -> comment; close -> destroy.

One code path, called by the composite Action (``action/main.py``) and by the webhook listener.
Idempotent per (repository, branch, head SHA): a re-run of the same job finds the branch ready
for that head and reports again without redoing work; the comment is edited only if its text
changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psycopg
from pydantic import BaseModel, model_validator

from pgoverlay.action import comment, migrations
from pgoverlay.action.event import Event, branch_name
from pgoverlay.action.github import CommentResult, GitHub, GitHubError
from pgoverlay.action.report import BranchInfo, MigrationRun, Report
from pgoverlay.errors import BranchExistsError, ConfigError, PgoverlayError
from pgoverlay.runner import branch as branches
from pgoverlay.runner import pgbin
from pgoverlay.runner.names import check_name, parse_duration
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.proc import OsUser
from pgoverlay.runner.registry import Branch, PrState
from pgoverlay.runner.runtime import docker as docker_runtime
from pgoverlay.runner.runtime.docker_tools import DockerTools
from pgoverlay.runner.tools import Tools

log = logging.getLogger(__name__)


class Inputs(BaseModel):
    """What a workflow (or the webhook's per-repository settings) asks for."""

    base: str | None = None
    migrations: str | None = None
    migrate_command: str | None = None
    migrations_select: Literal["changed", "all"] = "changed"
    working_directory: str = "."
    branch_name: str | None = None
    reset_on_push: bool = True
    ttl: str | None = None
    comment: bool = True
    runtime: Literal["auto", "local", "docker"] = "auto"
    fail_on_migration_error: bool = True
    allow_fork_commands: bool = False

    @model_validator(mode="before")
    @classmethod
    def _blank_is_unset(cls, data: object) -> object:
        """An input left empty in the workflow means its default."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (isinstance(v, str) and not v.strip())}
        return data

    def model_post_init(self, _context: object) -> None:
        if self.migrations and self.migrate_command:
            raise ConfigError(
                "set either `migrations` (a folder of .sql files) or `migrate-command`, not both"
            )
        if self.ttl:
            parse_duration(self.ttl)


@dataclass(frozen=True)
class Outcome:
    report: Report | None  # None when the event needs nothing (e.g. a PR was labeled)
    branch: Branch | None  # the ready branch to hand out, if any
    comment: CommentResult | None = None
    comment_error: str = ""
    reused: bool = False  # a re-run found the work already done


Echo = Callable[[str], None]


def password_hint(name: str) -> str:
    return (
        f"the step's `password` output (masked in logs), or `sudo pgoverlay branch connect {name}` "
        "on the runner"
    )


def _branch_info(pool: Pool, b: Branch, *, create_seconds: float | None) -> BranchInfo:
    base = pool.registry.base(b.base_name, b.base_version)
    layer = branches.layer_size(pool, b.name)
    return BranchInfo(
        name=b.name,
        host=pool.settings.public_host,
        port=b.port,
        database=b.database,
        user=b.user,
        base_name=b.base_name,
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


def _target(pool: Pool, b: Branch) -> migrations.Target:
    return migrations.Target(
        host=pool.settings.public_host,
        port=b.port,
        user=b.user,
        password=b.password,
        database=b.database,
    )


def report_to_json(report: Report) -> str:
    return json.dumps(dataclasses.asdict(report), sort_keys=True)


def report_from_json(text: str) -> Report:
    data = json.loads(text)
    info = data.pop("branch")
    runs = [MigrationRun(**m) for m in data.pop("migrations")]
    return Report(branch=BranchInfo(**info) if info else None, migrations=runs, **data)


def _save(pool: Pool, report: Report) -> None:
    pool.registry.save_pr_state(
        PrState(
            repository=report.repository,
            branch=report.branch_name,
            pr=report.pr,
            head_sha=report.head_sha,
            status=report.status,
            report=report_to_json(report),
            updated_at=time.time(),
        )
    )


def _check_ownership(pool: Pool, name: str, repository: str) -> None:
    """A branch name is one repository's: refuse to touch another's live branch."""
    if pool.registry.branch(name) is None:
        return
    for other in pool.registry.pr_states(name):
        if other.repository != repository and other.status in ("ready", "migration failed"):
            where = f"{other.repository}#{other.pr}" if other.pr else other.repository
            raise BranchExistsError(
                f"branch {name} on this runner belongs to {where}: set the `branch-name` input "
                "to a name unique on this runner (e.g. 'myrepo-pr-{number}')"
            )


Changed = Callable[[str], list[str]]  # folder -> the .sql files the PR adds or changes


def _migrate(
    pool: Pool,
    b: Branch,
    event: Event,
    inputs: Inputs,
    repo_dir: Path,
    echo: Echo,
    changed: Changed | None,
) -> tuple[list[MigrationRun], str]:
    """Apply the PR's migrations; returns the runs and a note for the report."""
    workdir = (repo_dir / inputs.working_directory).resolve()
    target = _target(pool, b)
    # The PR's code and SQL run as the owner of the checkout (the runner user), never with
    # the engine's root privileges.
    owner = OsUser.owner_of(repo_dir)
    if inputs.migrate_command:
        if event.from_fork and not inputs.allow_fork_commands:
            return [MigrationRun(inputs.migrate_command, "not run", 0.0)], (
                "the migrate command was not run: this pull request comes from a fork, and "
                "running a fork's code needs `allow-fork-commands: true`"
            )
        echo(f"running migrate command in {workdir}")
        run = migrations.run_command(
            target,
            inputs.migrate_command,
            cwd=workdir,
            timeout=pool.settings.command_timeout,
            echo=echo,
            user=owner,
        )
        return [run], ""
    if not inputs.migrations:
        return [], ""
    folder = os.path.relpath(workdir / inputs.migrations, repo_dir)
    if inputs.migrations_select == "changed" and event.pr is not None and event.base_sha:
        files = (
            changed(folder)
            if changed is not None
            else migrations.changed_files(
                repo_dir, folder, base_sha=event.base_sha, head_sha=event.head_sha, user=owner
            )
        )
    else:
        files = migrations.all_files(repo_dir, folder)
    base = pool.registry.base(b.base_name, b.base_version)
    major = base.pg_major if base and base.pg_major else 0
    echo(f"applying {len(files)} migration file(s) from {folder}")
    with _psql_tools(pool, b, major, repo_dir=repo_dir, owner=owner) as tools:
        runs = migrations.apply_files(
            target,
            repo_dir,
            files,
            tools=tools,
            skip_recorded=True,
            timeout=pool.settings.command_timeout,
            user=owner,
        )
    return runs, ""


@contextlib.contextmanager
def _psql_tools(
    pool: Pool, b: Branch, major: int, *, repo_dir: Path, owner: OsUser
) -> Iterator[Tools]:
    """This host's psql when it has one of the base's major; otherwise, for a Docker branch,
    the image's, in a container that sees only the checkout and a private scratch directory."""
    if b.runtime != "docker" or major in pgbin.installs(pool.settings.pg_bindir):
        yield pgbin.for_major(major, pool.settings.pg_bindir)
        return
    scratch = Path(tempfile.mkdtemp(prefix="pgoverlay-psql-"))
    try:
        if os.geteuid() == 0:
            os.chown(scratch, owner.uid, owner.gid)
        yield DockerTools.for_image(
            docker_runtime.connect(),
            pool.settings.image_for(major),
            owner=owner,
            scratch=scratch,
            mounts=[repo_dir],
            timeout=pool.settings.command_timeout,
            labels={docker_runtime.LABEL_POOL: pool.id, docker_runtime.LABEL_BRANCH: b.name},
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _bring_up(
    pool: Pool, event: Event, inputs: Inputs, name: str, state: PrState | None, echo: Echo
) -> tuple[Branch, float | None]:
    """Create the branch, or reset it for a new head; returns it and the seconds it took."""
    existing = pool.registry.branch(name)
    started = time.monotonic()
    if existing is None:
        echo(f"creating branch {name}")
        ttl = parse_duration(inputs.ttl) if inputs.ttl else None
        created = branches.create(
            pool,
            name,
            base_name=inputs.base,
            ttl_seconds=ttl,
            runtime=None if inputs.runtime == "auto" else inputs.runtime,
        )
        return created, time.monotonic() - started
    if existing.state != "ready":
        raise PgoverlayError(
            f"branch {name} is {existing.state} (an earlier run was interrupted): run "
            "`sudo pgoverlay gc` on the runner, then re-run this job"
        )
    new_head = state is None or state.head_sha != event.head_sha
    if inputs.reset_on_push and (new_head or (state and state.status != "ready")):
        echo(f"resetting branch {name} to its base")
        return branches.reset(pool, name), time.monotonic() - started
    return existing, None


def handle(
    pool: Pool,
    event: Event,
    inputs: Inputs,
    *,
    repo_dir: Path,
    github: GitHub | None,
    run_url: str = "",
    echo: Echo = log.info,
    changed: Changed | None = None,
) -> Outcome:
    """Do what ``event`` asks for; never raises for a failed comment.

    ``repo_dir`` holds the PR's head. ``changed`` lists a folder's changed .sql files when
    there is no git history to ask (the webhook listener works from tarballs).
    """
    if event.kind == "ignore":
        return Outcome(report=None, branch=None)
    name = check_name(branch_name(event, inputs.branch_name))
    state = pool.registry.pr_state(event.repository, name)
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
    ready: Branch | None = None
    reused = False
    try:
        _check_ownership(pool, name, event.repository)
    except BranchExistsError as err:
        # Nothing of ours to record: the branch and its state belong to the other repository.
        report = dataclasses.replace(skeleton, message=str(err))
        result, error = post_comment(github, event, inputs, report)
        return Outcome(report=report, branch=None, comment=result, comment_error=error)
    if event.kind == "close" and state is None and pool.registry.branch(name) is None:
        echo(f"no branch {name} to destroy")
        return Outcome(report=None, branch=None)
    if event.kind == "close":
        report = _close(pool, event, name, state, skeleton)
    elif (
        state is not None
        and state.head_sha == event.head_sha
        and state.status == "ready"
        and (current := pool.registry.branch(name)) is not None
        and current.state == "ready"
        and branches.status(pool, name).running
    ):
        echo(f"branch {name} is already up to date with {event.head_sha[:7]}")
        previous = report_from_json(state.report)
        report = dataclasses.replace(previous, run_url=run_url or previous.run_url)
        ready, reused = current, True
    else:
        try:
            b, seconds = _bring_up(pool, event, inputs, name, state, echo)
            runs, note = _migrate(pool, b, event, inputs, repo_dir, echo, changed)
            failed = any(r.status == "failed" for r in runs)
            report = dataclasses.replace(
                skeleton,
                status="migration failed" if failed else "ready",
                branch=_branch_info(pool, b, create_seconds=seconds),
                migrations=runs,
                message=note,
            )
            ready = b
        except (PgoverlayError, psycopg.Error, OSError) as err:
            log.warning("branch %s not ready: %s", name, err)
            report = dataclasses.replace(skeleton, message=str(err).strip().splitlines()[0])
    _save(pool, report)
    result, error = post_comment(github, event, inputs, report)
    return Outcome(report=report, branch=ready, comment=result, comment_error=error, reused=reused)


def _close(pool: Pool, event: Event, name: str, state: PrState | None, skeleton: Report) -> Report:
    current = pool.registry.branch(name)
    last = report_from_json(state.report) if state else None
    info = _branch_info(pool, current, create_seconds=None) if current else None
    if current is not None:
        branches.destroy(pool, name)
    return dataclasses.replace(
        skeleton,
        status="destroyed",
        branch=info or (last.branch if last else None),
        merged=event.merged,
        migrations=last.migrations if last else [],
    )


def post_comment(
    github: GitHub | None, event: Event, inputs: Inputs, report: Report
) -> tuple[CommentResult | None, str]:
    if github is None or not inputs.comment or event.pr is None:
        return None, ""
    mark = comment.marker(report.repository, report.pr, report.branch_name)
    try:
        return github.upsert_comment(
            report.repository,
            event.pr,
            comment.render_comment(report),
            lambda body: comment.has_marker(body, mark),
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
