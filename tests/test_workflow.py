"""The PR workflow's decisions: events, inputs, forks, ownership, comments that fail, outputs."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import io
import json
import re
import subprocess
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
import yaml
from pydantic import ValidationError

from fakegithub import FakeGitHub
from helpers import SESSION_BASE, cli, read_outputs
from pgoverlay.action import event, main, request, workflow
from pgoverlay.action.github import GitHub
from pgoverlay.action.request import Inputs, read_inputs
from pgoverlay.action.workflow import Outcome
from pgoverlay.errors import ConfigError, RequestError
from pgoverlay.runner import branch
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest
from pgoverlay.runner.service.views import BranchView

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "github" / "webhooks"


def payload(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"pull_request.{name}.json").read_text())
    return data


def parse(data: dict[str, Any]) -> event.Event:
    return event.parse("pull_request", data, repository="x/y", sha="", ref="")


# -- events and inputs (pure) ---------------------------------------------------------------


def test_pull_request_actions_map_to_what_the_workflow_does() -> None:
    assert parse(payload("opened")).kind == "open"
    assert parse(payload("reopened")).kind == "open"
    assert parse(payload("synchronize")).kind == "sync"
    closed = parse(payload("closed"))
    assert (closed.kind, closed.merged) == ("close", False)
    labeled = parse(payload("labeled"))
    assert labeled.kind == "label"  # the listener's fork approval, or a `branch-when` label
    assert labeled.label == "bug" and labeled.labels == ("bug",)
    unlabeled = parse({**payload("labeled"), "action": "unlabeled"})
    assert (unlabeled.kind, unlabeled.label) == ("unlabel", "bug")
    assert {"label", "unlabel"}.isdisjoint(event.WORK_KINDS)  # unless `branch-when` names it
    edited = {**payload("opened"), "action": "edited"}
    assert parse(edited).kind == "ignore"


def test_a_fork_is_told_by_the_head_repository_not_by_repository_fork() -> None:
    same = payload("opened")
    same["repository"]["fork"] = True  # the base repository being a fork says nothing
    assert parse(same).from_fork is False
    forked = copy.deepcopy(payload("opened"))
    forked["pull_request"]["head"]["repo"]["full_name"] = "stranger/Hello-World"
    assert parse(forked).from_fork is True
    deleted = copy.deepcopy(payload("opened"))
    deleted["pull_request"]["head"]["repo"] = None
    assert parse(deleted).from_fork is True


def test_branches_are_named_after_the_repository_and_the_pr_or_the_ref() -> None:
    ev = event.parse(
        "workflow_dispatch", {}, repository="x/y", sha="abc", ref="refs/heads/Feature/Big_Change"
    )
    assert ev.kind == "ref" and event.branch_name(ev, None) == "y-feature-big-change"
    pr = parse(payload("opened"))
    assert pr.repository == "Codertocat/Hello-World"
    assert event.branch_name(pr, None) == f"hello-world-pr-{pr.pr}"
    assert event.branch_name(pr, "shop-pr-{number}") == f"shop-pr-{pr.pr}"


def test_inputs_left_empty_take_their_defaults_and_conflicts_are_refused() -> None:
    inputs = Inputs(migrations="", reset_on_push="", comment="", ttl="")  # type: ignore[arg-type]
    assert (inputs.migrations, inputs.reset_on_push, inputs.comment) == (None, True, True)
    with pytest.raises(ConfigError, match="not both"):
        read_inputs({"INPUT_MIGRATIONS": "db", "INPUT_MIGRATE_COMMAND": "alembic upgrade head"})
    with pytest.raises(ConfigError, match="^input `ttl`: .*duration"):
        read_inputs({"INPUT_TTL": "soon"})
    with pytest.raises(ConfigError, match="^input `migrations-select`: "):
        read_inputs({"INPUT_MIGRATIONS_SELECT": "some"})


def passed_inputs(spec: dict[str, Any]) -> dict[str, str]:
    """The INPUT_* variables an action.yml's run step sets, and what it sets them to."""
    [step] = [s for s in spec["runs"]["steps"] if s.get("id") == "run"]
    return {k: v for k, v in step["env"].items() if k.startswith("INPUT_")}


# The inputs the job's environment model reads (the token, the pool's server): no part of the
# request.
JOB_INPUTS = {
    variable.removeprefix("INPUT_").lower().replace("_", "-")
    for variables in main.JobEnv.VARIABLES.values()
    for variable in variables
    if variable.startswith("INPUT_")
}


def check_inputs_agree(spec: dict[str, Any]) -> set[str]:
    """Each input an action.yml declares is a field of the model (or the token), with the
    model's default, and is passed to the entry point as the model reads it; returns them."""
    declared: dict[str, dict[str, Any]] = spec["inputs"]
    fields = {request.input_name(f.name): f for f in dataclasses.fields(Inputs)}
    for name, entry in declared.items():
        assert entry.get("description"), name
        assert passed_inputs(spec)[f"INPUT_{name.upper().replace('-', '_')}"] == (
            f"${{{{ inputs.{name} }}}}"
        ), name
        if name in JOB_INPUTS:
            continue
        assert name in fields, f"action.yml declares {name}, which Inputs lacks"
        info = fields[name]
        required = (
            info.default is dataclasses.MISSING and info.default_factory is dataclasses.MISSING
        )
        assert entry.get("required", False) is required, name
        default = info.default
        text = (
            "" if default is None else str(default).lower() if default in (True, False) else default
        )
        assert str(entry.get("default", "")) == text, name
        assert request.env_name(info.name) in passed_inputs(spec), name
    assert set(passed_inputs(spec)) == {
        f"INPUT_{name.upper().replace('-', '_')}" for name in declared
    }
    return set(declared)


def test_action_yml_declares_passes_and_defaults_exactly_the_inputs_of_the_model() -> None:
    """Adding an input means adding a field to the model and the input (declared, and passed to
    the entry point as INPUT_<NAME>) to action.yml: forgetting either side fails here."""
    main_spec = yaml.safe_load((ROOT / "action.yml").read_text())
    # The token is a credential the job's environment model reads, no part of the request.
    assert "INPUT_GITHUB_TOKEN" in main.JobEnv.VARIABLES["token"]
    declared = check_inputs_agree(main_spec)
    assert {"github-token", "server", "server-ca"} == JOB_INPUTS
    assert declared == {request.input_name(f) for f in names(Inputs)} | JOB_INPUTS
    destroy = yaml.safe_load((ROOT / "action" / "destroy" / "action.yml").read_text())
    assert check_inputs_agree(destroy) == {"branch-name", "comment", "deployment"} | JOB_INPUTS


def names(cls: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_listeners_repository_settings_are_the_request_and_only_its_own_additions() -> None:
    """RepoSettings (a pydantic model, as the listener's settings are) takes the request's
    fields: with the same types and defaults, and its request() is the PrRequest."""
    from pgoverlay.webhook.settings import RepoSettings

    shared = {f.name: f for f in dataclasses.fields(request.PrRequest)}
    for name, f in shared.items():
        info = RepoSettings.model_fields[name]
        assert info.default == f.default, name
        assert info.annotation == typing.get_type_hints(request.PrRequest)[name], name
    own = set(RepoSettings.model_fields) - set(shared)
    assert own == {"forks", "fork_label", "drafts", "honour_repo_file"}
    # the Action's own inputs are not settings a repository of the listener may set
    action_only = names(Inputs) - set(shared)
    assert action_only == {"fail_on_migration_error", "allow_forks", "allow_fork_commands"}
    assert not action_only & set(RepoSettings.model_fields)
    with pytest.raises(ValidationError, match="allow_fork_commands"):
        RepoSettings.model_validate({"allow_fork_commands": True})
    made = RepoSettings.model_validate({"ttl": "7d", "comment": "no", "drafts": False})
    assert made.request() == request.PrRequest(ttl="7d", comment=False)


def test_a_field_added_to_the_request_is_a_repository_setting_with_its_type_default_and_check() -> (
    None
):
    """A new request field reaches the listener's settings by itself: its type, default,
    description and check, with nothing written in webhook/settings.py."""
    from pgoverlay.runner.names import parse_seconds
    from pgoverlay.webhook import settings

    def statement_time(text: str | None) -> None:
        if text:
            parse_seconds(text)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Wider(request.PrRequest):
        statement_timeout: str | None = request.option(
            None, "Longest a statement of a migration may run.", rerun=True, check=statement_time
        )

    @settings.with_request(Wider)
    class WiderSettings(settings.ListenerSettings):
        """The listener's settings for a wider request."""

    info = WiderSettings.model_fields["statement_timeout"]
    assert info.annotation == typing.get_type_hints(Wider)["statement_timeout"] == (str | None)
    assert info.default is None
    assert info.description == "Longest a statement of a migration may run."
    assert set(WiderSettings.model_fields) == set(settings.RepoSettings.model_fields) | {
        "statement_timeout"
    }
    assert "statement_timeout" not in settings.RepoSettings.model_fields
    with pytest.raises(ValidationError, match="statement_timeout\n.*cannot read duration 'soon'"):
        WiderSettings.model_validate({"statement_timeout": "soon"})
    # the Action reads the same field with the same check and words
    assert request.read(Wider, {"statement_timeout": "soon"})[1] == [
        (
            ("statement_timeout",),
            "cannot read duration 'soon': use a positive number and a unit "
            "ms, s, m, h, d or w (e.g. 500ms, 1.5s, 7d)",
        )
    ]
    made = WiderSettings.model_validate({"statement_timeout": "30s", "ttl": "", "drafts": False})
    assert made.request() == Wider(statement_timeout="30s")
    assert WiderSettings.model_validate({"statement_timeout": ""}).request() == Wider()


def _action_inputs_script() -> ModuleType:
    path = ROOT / "scripts" / "action_inputs.py"
    spec = importlib.util.spec_from_file_location("action_inputs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_action_yml_inputs_are_the_ones_written_from_the_request_fields() -> None:
    """action.yml's inputs and their INPUT_ variables are what scripts/action_inputs.py writes
    from the model: a description edited by hand, or an input left out, is written back."""
    checked = subprocess.run(
        [sys.executable, ROOT / "scripts" / "action_inputs.py", "--check"],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr
    script, text = _action_inputs_script(), (ROOT / "action.yml").read_text()
    assert script.render(text) == text
    edited = text.replace("Write the sticky PR comment.", "Write a comment.")
    assert edited != text and script.render(edited) == text
    dropped = text.replace("        INPUT_TTL: ${{ inputs.ttl }}\n", "")
    assert dropped != text and script.render(dropped) == text


def _table_keys(markdown: str, start: str, end: str) -> set[str]:
    """The first column's `names` of the table between headings ``start`` and ``end``."""
    part = markdown[markdown.index(start) : markdown.index(end, markdown.index(start))]
    return set(re.findall(r"^\| `([a-z_-]+)` \|", part, re.MULTILINE))


def test_the_docs_describe_every_input_and_every_repository_setting() -> None:
    from pgoverlay.webhook.settings import RepoSettings

    action_md = (ROOT / "docs" / "action.md").read_text()
    # the request's fields, and the inputs the job's variables carry (github-token, server, ...)
    job = {v for names in main.JobEnv.VARIABLES.values() for v in names if v.startswith("INPUT_")}
    inputs = {request.input_name(f) for f in names(Inputs)}
    inputs |= {v.removeprefix("INPUT_").lower().replace("_", "-") for v in job}
    assert _table_keys(action_md, "\n## Inputs\n", "\n## Outputs\n") == inputs
    webhook_md = (ROOT / "docs" / "webhook.md").read_text()
    keys = _table_keys(webhook_md, "\n### Per repository\n", "**Forks.**")
    assert keys == set(RepoSettings.model_fields)


def test_the_request_refuses_what_its_fields_cannot_hold() -> None:
    """Made in code, the request checks what read_inputs and the listener's settings check."""
    with pytest.raises(RequestError, match="^ttl: cannot read duration 'soon'"):
        request.PrRequest(ttl="soon")
    with pytest.raises(RequestError, match="^runtime: should be one of auto, local, docker$"):
        request.PrRequest(runtime="podman")
    with pytest.raises(RequestError, match="^set either `migrations`"):
        Inputs(migrations="db", migrate_command="x")
    with pytest.raises(RequestError, match=r"^base: .* \(and 1 more\)$"):
        request.PrRequest(base="Not A Name", max_rewrite="lots")
    with pytest.raises(TypeError, match="bogus"):
        Inputs(bogus=True)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="^input `comment`: should be true or false"):
        read_inputs({"INPUT_COMMENT": "maybe"})
    assert read_inputs({"INPUT_COMMENT": "No", "INPUT_ALLOW_FORKS": "1"}).comment is False
    assert request.read(Inputs, {"commment": "x"})[1] == [
        (("commment",), "Extra inputs are not permitted")
    ]


# -- the workflow against real branches and the fake GitHub -----------------------------------


def pr_event(
    *,
    fork: bool = False,
    kind: event.Kind = "open",
    number: int = 5,
    head: str = "a" * 40,
    repository: str = "acme/shop",
) -> event.Event:
    return event.Event(
        kind=kind,
        repository=repository,
        pr=number,
        head_sha=head,
        base_sha="b" * 40,
        merged=None if kind != "close" else True,
        from_fork=fork,
        draft=False,
        ref_name="feature",
        action="opened",
    )


def handle(pool: Pool, ev: event.Event, inputs: Inputs, **options: Any) -> Outcome:
    """The workflow as root's engine runs it (the service's own tests cover other callers), on
    the session's base unless ``inputs`` names one."""
    inputs = dataclasses.replace(inputs, base=inputs.base or SESSION_BASE)
    return workflow.handle(LocalEngine(pool), ev, inputs, settings=pool.settings, **options)


def test_a_forks_migrate_command_is_not_run_unless_allowed(
    pool: Pool, base: BaseVersion, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    inputs = Inputs(migrate_command=f"touch {marker}", comment=False, allow_forks=True)
    try:
        outcome = handle(pool, pr_event(fork=True), inputs, repo_dir=tmp_path, github=None)
        assert outcome.report is not None and outcome.report.status == "ready"
        assert outcome.report.migrations[0].status == "not run"
        assert "allow-fork-commands" in outcome.report.message
        assert not marker.exists()
        allowed = Inputs(
            migrate_command=f"touch {marker}",
            comment=False,
            allow_forks=True,
            allow_fork_commands=True,
            reset_on_push=False,
        )
        pushed = pr_event(fork=True, kind="sync", head="c" * 40)
        second = handle(
            pool,
            pushed,
            allowed,
            repo_dir=tmp_path,
            github=None,
            fork_commands=allowed.allow_fork_commands,  # as the Action's entry point passes it
        )
        assert second.report is not None and second.report.migrations[0].status == "applied"
        assert marker.exists()
    finally:
        branch.destroy(pool, "shop-pr-5")


def test_a_comment_that_cannot_be_written_does_not_hide_a_ready_branch(
    pool: Pool, base: BaseVersion, tmp_path: Path, github: tuple[FakeGitHub, GitHub]
) -> None:
    fake, client = github
    fake.fail_next(
        "POST",
        r"/issues/5/comments$",
        403,
        times=1,
        body={"message": "Resource not accessible by integration"},
    )
    try:
        outcome = handle(
            pool, pr_event(fork=True), Inputs(allow_forks=True), repo_dir=tmp_path, github=client
        )
        assert outcome.report is not None and outcome.report.status == "ready"
        assert outcome.branch is not None
        assert (
            "HTTP 403" in outcome.comment_error
            and "forks get a read-only token" in outcome.comment_error
        )
    finally:
        branch.destroy(pool, "shop-pr-5")


def test_server_errors_from_github_are_retried(
    pool: Pool, base: BaseVersion, tmp_path: Path, github: tuple[FakeGitHub, GitHub]
) -> None:
    fake, client = github
    fake.fail_next("POST", r"/issues/5/comments$", 502, times=2)
    try:
        outcome = handle(pool, pr_event(), Inputs(), repo_dir=tmp_path, github=client)
        assert outcome.comment is not None and outcome.comment.action == "created"
        posts = [r for r in fake.requests if r["method"] == "POST" and "comments" in r["path"]]
        assert [r["status"] for r in posts] == [502, 502, 201]
    finally:
        branch.destroy(pool, "shop-pr-5")


class ListingFirst(LocalEngine):
    """Makes a branch only once the PR's comments have been asked for: a workflow that looks
    for its comment only after the branch is made times out here."""

    def __init__(self, pool: Pool, fake: FakeGitHub) -> None:
        super().__init__(pool)
        self.fake = fake

    def create(self, request: CreateRequest) -> BranchView:
        wait_for(
            lambda: any(
                r["method"] == "GET" and r["path"].endswith("/issues/5/comments")
                for r in self.fake.requests
            ),
            timeout=60,
            what="the workflow to ask for the PR's comments",
        )
        return super().create(request)


def test_the_comment_is_looked_for_while_the_branch_is_made_and_written_once(
    pool: Pool, base: BaseVersion, tmp_path: Path, github: tuple[FakeGitHub, GitHub]
) -> None:
    fake, client = github
    engine = ListingFirst(pool, fake)
    try:
        first = workflow.handle(
            engine,
            pr_event(),
            Inputs(base=base.name),
            settings=pool.settings,
            repo_dir=tmp_path,
            github=client,
        )
        assert first.comment is not None and first.comment.action == "created"
        again = workflow.handle(
            engine,
            pr_event(head="c" * 40),
            Inputs(base=base.name),
            settings=pool.settings,
            repo_dir=tmp_path,
            github=client,
        )
        assert again.comment is not None and again.comment.action == "updated"
        assert again.comment.id == first.comment.id
        # (the Deployment's calls, in a thread of their own, are test_deployment.py's)
        calls = [
            f"{r['method']} {r['path']}" for r in fake.requests if "/deployments" not in r["path"]
        ]
        assert calls == [
            "GET /repos/acme/shop/issues/5/comments",
            "POST /repos/acme/shop/issues/5/comments",
            "GET /repos/acme/shop/issues/5/comments",
            "GET /user",
            f"PATCH /repos/acme/shop/issues/comments/{first.comment.id}",
        ], "no read of the pull request or the repository, one listing a run"
    finally:
        branch.destroy(pool, "shop-pr-5")


def test_a_branch_name_taken_by_another_repository_is_refused(
    pool: Pool, base: BaseVersion, tmp_path: Path
) -> None:
    shared = Inputs(comment=False, branch_name="pr-{number}")  # a name without the repository
    mine = handle(pool, pr_event(), shared, repo_dir=tmp_path, github=None)
    try:
        assert mine.report is not None and mine.report.status == "ready"
        other = pr_event(repository="other/repo")
        outcome = handle(pool, other, shared, repo_dir=tmp_path, github=None)
        assert outcome.report is not None and outcome.report.status == "failed"
        assert "belongs to acme/shop#5" in outcome.report.message
        assert "branch-name" in outcome.report.message
        assert outcome.branch is None
        closed = handle(
            pool,
            pr_event(repository="other/repo", kind="close"),
            shared,
            repo_dir=tmp_path,
            github=None,
        )
        assert closed.report is not None and closed.report.status == "failed"
        assert pool.registry.branch("pr-5") is not None, "another repository's close destroyed it"
    finally:
        branch.destroy(pool, "pr-5")


def test_two_repositories_pr_7_on_one_runner_get_two_branches(
    pool: Pool, base: BaseVersion, tmp_path: Path
) -> None:
    inputs = Inputs(comment=False)
    try:
        shop = handle(pool, pr_event(number=7), inputs, repo_dir=tmp_path, github=None)
        blog = handle(
            pool, pr_event(number=7, repository="acme/blog"), inputs, repo_dir=tmp_path, github=None
        )
        assert shop.report is not None and shop.report.status == "ready"
        assert blog.report is not None and blog.report.status == "ready"
        assert (shop.report.branch_name, blog.report.branch_name) == ("shop-pr-7", "blog-pr-7")
        rows = {b.name: (b.repository, b.pr) for b in pool.registry.branches()}
        assert rows["shop-pr-7"] == ("acme/shop", 7) and rows["blog-pr-7"] == ("acme/blog", 7)
        handle(pool, pr_event(number=7, kind="close"), inputs, repo_dir=tmp_path, github=None)
        assert pool.registry.branch("shop-pr-7") is None
        assert pool.registry.branch("blog-pr-7") is not None, "closing one closed the other"
    finally:
        for name in ("shop-pr-7", "blog-pr-7"):
            branch.destroy(pool, name)


def test_a_branch_destroyed_by_hand_frees_its_pr_for_another_repository(
    pool: Pool, base: BaseVersion, tmp_path: Path, env: dict[str, str]
) -> None:
    shared = Inputs(comment=False, branch_name="pr-{number}")
    widgets = pr_event(number=31, repository="acme/widgets")
    try:
        first = handle(pool, widgets, shared, repo_dir=tmp_path, github=None)
        assert first.report is not None and first.report.status == "ready"
        by_hand = cli(["branch", "destroy", "pr-31"], env=env)
        assert by_hand.returncode == 0, by_hand.stderr
        gadgets = pr_event(number=31, repository="other/gadgets")
        made = handle(pool, gadgets, shared, repo_dir=tmp_path, github=None)
        assert made.report is not None and made.report.status == "ready", made.report
        assert branch.get(pool, "pr-31").repository == "other/gadgets"
        rerun = handle(pool, gadgets, shared, repo_dir=tmp_path, github=None)
        assert rerun.reused and rerun.report is not None and rerun.report.status == "ready"
        pushed = pr_event(number=31, repository="other/gadgets", kind="sync", head="c" * 40)
        again = handle(pool, pushed, shared, repo_dir=tmp_path, github=None)
        assert again.report is not None and again.report.status == "ready", again.report
        closing = pr_event(number=31, repository="other/gadgets", kind="close", head="c" * 40)
        closed = handle(pool, closing, shared, repo_dir=tmp_path, github=None)
        assert closed.report is not None and closed.report.status == "destroyed"
        assert pool.registry.branch("pr-31") is None
    finally:
        branch.destroy(pool, "pr-31")


# -- the entry point: masks before outputs, no DSN unless ready --------------------------------


def job_env(tmp_path: Path, pool: Pool, data: dict[str, Any], **inputs: str) -> dict[str, str]:
    """A job's variables for ``data`` and ``inputs``, whose `base` is the session's unless
    given."""
    inputs = {"base": SESSION_BASE, **inputs}
    event_path = tmp_path / "event.json"
    event_path.write_text(json.dumps(data))
    return {
        "GITHUB_EVENT_PATH": str(event_path),
        "GITHUB_EVENT_NAME": "pull_request",
        "GITHUB_REPOSITORY": "acme/shop",
        "GITHUB_WORKSPACE": str(tmp_path),
        "GITHUB_OUTPUT": str(tmp_path / "output"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"),
        "PGOVERLAY_HOME": str(pool.home),
        "PGOVERLAY_PORT_MIN": str(pool.settings.port_min),
        "PGOVERLAY_PORT_MAX": str(pool.settings.port_max),
        **{f"INPUT_{k.upper()}": v for k, v in inputs.items()},
    }


def test_the_entry_point_masks_secrets_before_writing_outputs(
    pool: Pool, base: BaseVersion, service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = payload("opened")
    data["pull_request"]["number"] = 6
    env = job_env(tmp_path, pool, data, comment="false")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = io.StringIO()
    try:
        assert main.run(out=out) == 0
        values = read_outputs(tmp_path / "output")
        b = branch.get(pool, "hello-world-pr-6")
        assert values["password"] == b.password and values["status"] == "ready"
        assert values["dsn"].startswith("postgresql://pgoverlay:")
        log = out.getvalue()
        assert f"::add-mask::{b.password}" in log
        assert b.password not in log.replace(f"::add-mask::{b.password}", "").replace(
            f"::add-mask::{values['dsn']}", ""
        )
        assert b.password not in (tmp_path / "summary").read_text()
        assert "**Ready**" in (tmp_path / "summary").read_text()
    finally:
        branch.destroy(pool, "hello-world-pr-6")


def test_a_branch_that_cannot_be_made_ready_fails_the_step_without_a_dsn(
    pool: Pool, base: BaseVersion, service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = payload("opened")
    env = job_env(tmp_path, pool, data, comment="false", base="no-such-base")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = io.StringIO()
    assert main.run(out=out) == 1
    values = read_outputs(tmp_path / "output")
    assert values["status"] == "failed" and "dsn" not in values and "password" not in values
    assert "::error title=Branch not ready::no base named 'no-such-base'" in out.getvalue()


def test_a_forks_pull_request_gets_no_branch_unless_forks_are_allowed(
    pool: Pool, base: BaseVersion, service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = payload("opened")
    data["pull_request"]["head"]["repo"]["full_name"] = "stranger/Hello-World"
    marker = tmp_path / "ran"
    env = job_env(tmp_path, pool, data, comment="false", migrate_command=f"touch {marker}")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = io.StringIO()
    assert main.run(out=out) == 0
    assert read_outputs(tmp_path / "output") == {"status": "skipped", "branch": ""}
    summary = (tmp_path / "summary").read_text()
    assert "Not branched" in summary and "from a fork" in summary
    assert "`allow-forks: true`" in summary, "the summary says how to opt in"
    assert "::notice title=No branch for a fork::" in out.getvalue()
    assert pool.registry.branches() == [] and not marker.exists()

    (tmp_path / "output").unlink()
    monkeypatch.setenv("INPUT_ALLOW_FORKS", "true")
    try:
        assert main.run(out=io.StringIO()) == 0
        values = read_outputs(tmp_path / "output")
        assert values["status"] == "ready" and values["branch"] == "hello-world-pr-2"
        assert not marker.exists(), "a fork's command still needs allow-fork-commands"
    finally:
        branch.destroy(pool, "hello-world-pr-2")


def test_zizmor_finds_nothing_in_the_actions_and_example_workflows() -> None:
    root = Path(__file__).resolve().parents[1]
    targets = [root / "action.yml", *root.glob("action/**/action.yml"), *root.glob("docs/**/*.yml")]
    done = subprocess.run(
        [
            str(Path(__import__("sys").executable).parent / "zizmor"),
            "--offline",
            "--no-progress",
            *map(str, targets),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_closing_a_pr_that_never_had_a_branch_does_nothing(
    pool: Pool, base: BaseVersion, tmp_path: Path, github: tuple[FakeGitHub, GitHub]
) -> None:
    fake, client = github
    outcome = handle(
        pool, pr_event(kind="close", number=55), Inputs(), repo_dir=tmp_path, github=client
    )
    assert outcome.report is None
    assert [r for r in fake.requests if r["method"] != "GET"] == []


def test_a_failed_migration_is_retried_by_a_rerun_of_the_same_head(
    pool: Pool, base: BaseVersion, tmp_path: Path
) -> None:
    flag = tmp_path / "fixed"
    inputs = Inputs(migrate_command=f"test -e {flag}", comment=False)
    try:
        first = handle(pool, pr_event(), inputs, repo_dir=tmp_path, github=None)
        assert first.report is not None and first.report.status == "migration failed"
        flag.touch()
        again = handle(pool, pr_event(), inputs, repo_dir=tmp_path, github=None)
        assert not again.reused
        assert again.report is not None and again.report.status == "ready"
        third = handle(pool, pr_event(), inputs, repo_dir=tmp_path, github=None)
        assert third.reused, "a successful head is not redone"
    finally:
        branch.destroy(pool, "shop-pr-5")


def test_run_sh_starts_the_actions_own_entry_point_installed_next_to_pgoverlay() -> None:
    """run.sh finds `pgoverlay-action` beside the `pgoverlay` setup.sh names; a verb it does not
    know gets its usage (a missing script would be bash's 127)."""
    done = subprocess.run(
        [ROOT / "action" / "run.sh", "bogus"],
        env={
            "PATH": "/usr/bin:/bin",
            "PGOVERLAY_BIN": str(Path(sys.executable).parent / "pgoverlay"),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",
    )
    assert (done.returncode, done.stderr.strip()) == (2, "usage: pgoverlay-action run|destroy")


def test_a_rerun_of_the_same_head_with_changed_inputs_runs_again(
    pool: Pool, base: BaseVersion, tmp_path: Path, github: tuple[FakeGitHub, GitHub]
) -> None:
    fake, client = github
    for folder, table in (("one", "widgets"), ("two", "gadgets")):
        (tmp_path / "db" / folder).mkdir(parents=True)
        (tmp_path / "db" / folder / f"001_{table}.sql").write_text(f"CREATE TABLE {table} ();\n")
    asked = Inputs(migrations="db/one", migrations_select="all", insight=False)
    try:
        first = handle(pool, pr_event(), asked, repo_dir=tmp_path, github=client)
        assert first.report is not None and first.report.status == "ready", first.report
        assert first.comment is not None
        assert handle(pool, pr_event(), asked, repo_dir=tmp_path, github=client).reused

        changed = dataclasses.replace(asked, migrations="db/two")
        again = handle(pool, pr_event(), changed, repo_dir=tmp_path, github=client)
        assert not again.reused, "another migrations folder is not the run already done"
        assert again.report is not None and again.report.status == "ready", again.report
        assert [m.name for m in again.report.migrations] == ["db/two/001_gadgets.sql"]
        assert again.connection is not None
        with psycopg.connect(**again.connection.connect_kwargs()) as conn:
            row = conn.execute(
                "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables "
                "WHERE tablename IN ('widgets', 'gadgets')"
            ).fetchone()
        assert row == ("gadgets",), "the branch was reset before the new inputs ran"
        assert again.comment is not None and again.comment.id == first.comment.id
        [body] = [c["body"] for c in fake.state.comments if c["issue"] == 5]
        assert "db/two/001_gadgets.sql" in body and "db/one" not in body

        stricter = dataclasses.replace(changed, max_blocking_lock="1s")
        assert not handle(pool, pr_event(), stricter, repo_dir=tmp_path, github=None).reused
        assert handle(pool, pr_event(), stricter, repo_dir=tmp_path, github=None).reused
    finally:
        branch.destroy(pool, "shop-pr-5")


def test_the_actions_step_re_run_with_a_changed_input_runs_again(
    pool: Pool, base: BaseVersion, service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    env = job_env(
        tmp_path, pool, payload("opened"), comment="false", migrate_command=f"touch {one}"
    )
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    def step() -> dict[str, str]:
        (tmp_path / "output").unlink(missing_ok=True)
        assert main.run(out=io.StringIO()) == 0
        return read_outputs(tmp_path / "output")

    try:
        assert step()["migrations-applied"] == "1" and one.exists()
        assert step()["migrations-applied"] == "0", "the same inputs: the run already done"
        monkeypatch.setenv("INPUT_MIGRATE_COMMAND", f"touch {two}")
        values = step()
        assert values["status"] == "ready" and values["migrations-applied"] == "1"
        assert two.exists()
    finally:
        branch.destroy(pool, "hello-world-pr-2")


# -- branch-when: a branch only when the pull request wants one ---------------------------------


def labelled(kind: event.Kind, label: str = "", *labels: str) -> event.Event:
    action = {"open": "opened", "sync": "synchronize", "label": "labeled", "unlabel": "unlabeled"}
    ev = dataclasses.replace(pr_event(kind=kind), action=action[kind])
    return dataclasses.replace(ev, label=label, labels=labels)


def test_a_pull_request_has_a_branch_while_it_carries_the_branch_when_label(
    pool: Pool, base: BaseVersion, tmp_path: Path, github: tuple[FakeGitHub, GitHub]
) -> None:
    fake, client = github
    asked = Inputs(branch_when="label:needs-db", insight=False, deployment=False)
    engine = LocalEngine(pool)
    try:
        opened = handle(pool, labelled("open"), asked, repo_dir=tmp_path, github=client)
        assert opened.report is not None and opened.report.status == "not branched"
        assert opened.report.message == (
            "no branch: this pull request does not carry the label `needs-db` (branch-when: "
            "label:needs-db)"
        )
        assert engine.branch("shop-pr-5") is None
        assert fake.requests == [], "nothing is written on a pull request never branched"

        other = handle(pool, labelled("label", "ui", "ui"), asked, repo_dir=tmp_path, github=client)
        assert other.report is None and engine.branch("shop-pr-5") is None

        added = handle(
            pool, labelled("label", "needs-db", "needs-db"), asked, repo_dir=tmp_path, github=client
        )
        assert added.report is not None and added.report.status == "ready", added.report
        assert engine.branch("shop-pr-5") is not None
        assert added.comment is not None and added.comment.action == "created"

        removed = handle(
            pool, labelled("unlabel", "needs-db"), asked, repo_dir=tmp_path, github=client
        )
        assert removed.report is not None and removed.report.status == "destroyed"
        assert engine.branch("shop-pr-5") is None
        [body] = [c["body"] for c in fake.state.comments if c["issue"] == 5]
        assert (
            "was destroyed: this pull request does not carry the label `needs-db` "
            "(branch-when: label:needs-db)." in body.replace("\\", "")
        ), body
        writes = len([r for r in fake.requests if r["method"] != "GET"])

        pushed = handle(pool, labelled("sync"), asked, repo_dir=tmp_path, github=client)
        assert pushed.report is not None and pushed.report.status == "not branched"
        assert len([r for r in fake.requests if r["method"] != "GET"]) == writes
    finally:
        if engine.branch("shop-pr-5") is not None:
            branch.destroy(pool, "shop-pr-5")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.com",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.com",
            "PATH": "/usr/bin:/bin",
        },
    ).stdout.strip()


def test_the_step_branches_only_a_pull_request_that_changes_migrations(
    pool: Pool, base: BaseVersion, service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`branch-when: migrations`: the checkout's diff against the base says; a pull request
    that changes none gets a summary saying why and `status: skipped`; one that does is
    branched; a push that takes its migrations back out destroys its branch."""
    work = tmp_path / "work"
    (work / "db" / "migrations").mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    (work / "db/migrations/001_base.sql").write_text("CREATE TABLE t_base ();\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "base")
    first = git(work, "rev-parse", "HEAD")
    (work / "README.md").write_text("docs only\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "docs")
    data = payload("synchronize")
    data["pull_request"]["base"]["sha"] = first

    def step(head: str) -> tuple[int, dict[str, str], str, str]:
        data["pull_request"]["head"]["sha"] = head
        env = job_env(
            tmp_path,
            pool,
            data,
            comment="false",
            deployment="false",
            insight="false",
            migrations="db/migrations",
            branch_when="migrations",
        )
        for key, value in {**env, "GITHUB_WORKSPACE": str(work)}.items():
            monkeypatch.setenv(key, value)
        (tmp_path / "output").unlink(missing_ok=True)
        (tmp_path / "summary").unlink(missing_ok=True)
        out = io.StringIO()
        code = main.run(out=out)
        summary = (tmp_path / "summary").read_text()
        return code, read_outputs(tmp_path / "output"), summary, out.getvalue()

    why = (
        "this pull request adds or changes no .sql file under db/migrations "
        "(branch-when: migrations)"
    )
    try:
        code, values, summary, log = step(git(work, "rev-parse", "HEAD"))
        assert code == 0 and values["status"] == "skipped" and values["branch"] == ""
        assert "**Not branched**" in summary and f"no branch: {why}" in summary
        assert f"::notice title=No branch for this pull request::no branch: {why}" in log
        assert pool.registry.branches() == []

        (work / "db/migrations/002_new.sql").write_text("CREATE TABLE t_new ();\n")
        git(work, "add", "-A")
        git(work, "commit", "-qm", "a migration")
        code, values, summary, log = step(git(work, "rev-parse", "HEAD"))
        assert code == 0 and values["status"] == "ready", summary
        assert values["branch"] == "hello-world-pr-2" and values["migrations-applied"] == "1"

        (work / "db/migrations/002_new.sql").unlink()
        git(work, "add", "-A")
        git(work, "commit", "-qm", "not yet")
        code, values, summary, log = step(git(work, "rev-parse", "HEAD"))
        assert code == 0 and values["status"] == "destroyed"
        assert f"was destroyed: {why}." in summary.replace("\\", ""), summary
        assert pool.registry.branches() == []
    finally:
        if any(b.name == "hello-world-pr-2" for b in pool.registry.branches()):
            branch.destroy(pool, "hello-world-pr-2")


def test_the_report_gives_the_way_in_only_when_the_front_door_answers(
    pool: Pool, base: BaseVersion, service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from helpers import free_tcp_port

    data = payload("opened")
    data["pull_request"]["number"] = 7
    port = free_tcp_port()  # nothing answers there
    env = job_env(tmp_path, pool, data, comment="false")
    for key, value in {**env, "PGOVERLAY_DOOR_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    try:
        assert main.run(out=io.StringIO()) == 0
        summary = (tmp_path / "summary").read_text()
        assert "**Ready**" in summary
        assert "| Connection |" not in summary and "/b/hello-world-pr-7" not in summary, summary
        # a door that answers on that port: the way in through it
        with socket.create_server(("127.0.0.1", port)):
            assert main.run(out=io.StringIO()) == 0
        summary = (tmp_path / "summary").read_text()
        assert "| Connection |" in summary and "/b/hello-world-pr-7" in summary, summary
    finally:
        branch.destroy(pool, "hello-world-pr-7")


def test_the_listener_gives_the_way_in_only_when_this_hosts_door_answers(
    pool: Pool, service: Path
) -> None:
    import socket

    from helpers import free_tcp_port
    from pgoverlay.webhook.engines import Engines
    from pgoverlay.webhook.settings import WebhookSettings

    port = free_tcp_port()
    runner = pool.settings.replace(door_port=port)
    engines = Engines(WebhookSettings(secret="s", token="t"), runner)
    local = engines.local()
    assert not engines.door_answers(local)
    with socket.create_server(("127.0.0.1", port)):
        assert engines.door_answers(local)
