"""The pull request's GitHub Deployment: the state a report gives it (pure), the fake GitHub's
deployments checked against GitHub's OpenAPI, the writes against it, and the workflow on real
branches: created on open with the branch page as its URL, inactive on close, a token without
`deployments: write` a warning with the comment still posted, and no secret anywhere."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from github import Auth, Github, GithubException

from fakegithub import FakeGitHub
from helpers import SESSION_BASE, read_outputs
from pgoverlay.action import conclusion, event, main, workflow
from pgoverlay.action.conclusion import DeploymentEnd
from pgoverlay.action.deployment import PendingDeployment, environment
from pgoverlay.action.github import GitHub
from pgoverlay.action.report import BranchInfo, Report
from pgoverlay.action.request import Inputs
from pgoverlay.action.wayin import WayIn
from pgoverlay.action.workflow import Outcome
from pgoverlay.errors import GitHubError
from pgoverlay.runner import branch
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.webhook.clients import GitHubClients

REPO = "acme/shop"
HEAD, NEXT = "a" * 40, "c" * 40
PAGE = "https://db.acme.dev/b/shop-pr-5"
RUN = "https://github.com/acme/shop/actions/runs/1"
FORBIDDEN = {"message": "Resource not accessible by integration"}
WEBHOOKS = Path(__file__).resolve().parent / "fixtures" / "github" / "webhooks"


def deployed(fake: FakeGitHub) -> list[dict[str, Any]]:
    return fake.deployments(REPO)


def latest(d: dict[str, Any]) -> str | None:
    return d["statuses"][-1]["state"] if d["statuses"] else None


def writes(fake: FakeGitHub) -> list[str]:
    return [f"{r['method']} {r['path']}" for r in fake.requests if r["method"] != "GET"]


# -- the state a report gives the Deployment (pure) --------------------------------------------

INFO = BranchInfo("shop-pr-5", "127.0.0.1", 55432, "app", "pgoverlay", "app", 1, None, 0, 0)
WAY = WayIn(page=PAGE, host="db.acme.dev", port=6543, database="shop-pr-5", sslmode="verify-full")


def report(**changes: Any) -> Report:
    base = Report(REPO, 5, "shop-pr-5", HEAD, "ready", INFO, way_in=WAY)
    return dataclasses.replace(base, **changes)


def test_a_report_gives_the_deployment_its_state_url_and_a_short_redacted_line() -> None:
    assert conclusion.deployment(report()) == DeploymentEnd(
        "success", "branch shop-pr-5 ready", PAGE
    )
    failed_migration = conclusion.deployment(report(status="migration failed"))
    assert failed_migration is not None and failed_migration.state == "success"
    assert failed_migration.url == PAGE  # the branch is up, to look into
    leaky = "could not connect: password=hunter2 postgresql://u:s3cret@h/db " + "x" * 300
    failed = conclusion.deployment(report(status="failed", branch=None, message=leaky))
    assert failed is not None and (failed.state, failed.url) == ("failure", "")
    assert "hunter2" not in failed.description and "s3cret" not in failed.description
    assert len(failed.description) <= 140
    gone = conclusion.deployment(report(status="destroyed"))
    assert gone == DeploymentEnd("inactive", "branch shop-pr-5 destroyed")
    assert conclusion.deployment(report(status="not branched", branch=None)) is None


def test_a_person_and_a_program_are_told_verify_full_and_where_the_certificate_is() -> None:
    from pgoverlay.action.wayin import YOUR_LOGIN, way_in
    from pgoverlay.runner.settings import Settings

    own = Settings(door_host="db.acme.dev", door_port=5432, door_https_port=443)
    w = way_in(own, "shop-pr-5")
    assert w.page == "https://db.acme.dev/b/shop-pr-5"  # 443: no port in the address
    # the door's own certificate: the file the page offers (and the comment links)
    assert w.url(YOUR_LOGIN) == (
        "postgresql://<your GitHub login>@db.acme.dev:5432/shop-pr-5"
        "?sslmode=verify-full&sslrootcert=pgoverlay-door.crt"
    )
    assert w.certificate == "https://db.acme.dev/pgoverlay-door.crt"
    # a program on the runner: the path of its copy
    program = dataclasses.replace(w, sslrootcert="/var/lib/pgoverlay/door/door.crt")
    assert program.url("app_pr_5", "p@ss/w:rd") == (
        "postgresql://app_pr_5:p%40ss%2Fw%3Ard@db.acme.dev:5432/shop-pr-5"
        "?sslmode=verify-full&sslrootcert=/var/lib/pgoverlay/door/door.crt"
    )
    admins = own.replace(
        door_https_port=8443, door_cert_file="/etc/door.pem", door_key_file="/etc/door.key"
    )
    signed = way_in(admins, "shop-pr-5")
    assert signed.page == "https://db.acme.dev:8443/b/shop-pr-5"
    assert signed.url(YOUR_LOGIN).endswith("?sslmode=verify-full&sslrootcert=system")
    assert signed.certificate is None  # the system's trusted authorities verify it
    fallback = Settings(advertise_host="runner-3.acme.dev")
    assert way_in(fallback, "x").host == "runner-3.acme.dev"  # no door_host: advertise_host


def test_the_json_report_keeps_schema_2s_password_hint_now_pointing_at_the_page() -> None:
    from pgoverlay.action.insight import jsonreport

    doc = json.loads(jsonreport.dumps(report()))
    assert doc["schema_version"] == 2  # no field of schema 2 removed
    assert doc["password_hint"] == f"get your password on the branch page, {PAGE}"
    assert doc["way_in"]["page"] == PAGE and doc["way_in"]["sslmode"] == "verify-full"
    assert json.loads(jsonreport.dumps(report(way_in=None)))["password_hint"] == ""


# -- the fake GitHub's deployments: GitHub's rules, GitHub's schema ----------------------------


@pytest.fixture
def gh() -> Any:
    with FakeGitHub() as fake:
        fake.add_token("ghs_job", "github-actions[bot]", kind="installation")
        fake.add_pull(REPO, 5, HEAD, "b" * 40)
        yield fake
        assert fake.violations == []


def test_the_fake_keeps_githubs_deployment_rules_through_pygithub(gh: FakeGitHub) -> None:
    repo = Github(auth=Auth.Token("ghs_job"), base_url=gh.url).get_repo(REPO)
    # auto_merge left at its default merges the base into a head behind it: no deployment
    merged = gh.respond(
        "POST",
        f"/repos/{REPO}/deployments",
        {"Authorization": "token ghs_job"},
        json.dumps({"ref": HEAD, "required_contexts": []}).encode(),
    )
    assert merged.status == 202 and deployed(gh) == []
    # required_contexts left out waits on every commit status: a pending one refuses it
    repo.get_commit(HEAD).create_status("pending", context="pgoverlay/branch")
    with pytest.raises(GithubException) as refused:
        repo.create_deployment(ref=HEAD, environment="pgoverlay/x", auto_merge=False)
    assert refused.value.status == 409
    made = repo.create_deployment(
        ref=HEAD, environment="pgoverlay/x", auto_merge=False, required_contexts=[]
    )
    made.create_status("success", environment_url=PAGE)
    other = repo.create_deployment(
        ref=NEXT, environment="pgoverlay/y", auto_merge=False, required_contexts=[]
    )
    assert [d.id for d in repo.get_deployments(environment="pgoverlay/x")] == [made.id]
    assert [d.id for d in repo.get_deployments()] == [other.id, made.id]  # newest first
    assert [d.id for d in repo.get_deployments(sha=NEXT)] == [other.id]
    made.create_status("inactive")
    assert [s.state for s in made.get_statuses()] == ["inactive", "success"]  # newest first
    stored = deployed(gh)[0]
    assert stored["production_environment"] is False and stored["environment"] == "pgoverlay/x"


def client(fake: FakeGitHub) -> GitHub:
    return GitHub("ghs_job", api_url=fake.url, backoff=0.01)


def ready(url: str = PAGE) -> DeploymentEnd:
    return DeploymentEnd("success", "branch shop-pr-5 ready", url)


def test_a_deployment_is_made_for_the_head_with_the_branch_page_as_its_url(
    gh: FakeGitHub,
) -> None:
    done = PendingDeployment(client(gh), REPO, "shop-pr-5").write(ready(), sha=HEAD, log_url=RUN)
    assert done.action == "created"
    (d,) = deployed(gh)
    assert (d["id"], d["sha"], d["environment"]) == (done.id, HEAD, "pgoverlay/shop-pr-5")
    assert d["transient_environment"] is True and d["production_environment"] is False
    (status,) = d["statuses"]
    assert (status["state"], status["environment_url"], status["log_url"]) == (
        "success",
        PAGE,
        RUN,
    )
    asked = next(r["json"] for r in gh.requests if r["method"] == "POST")
    assert asked["auto_merge"] is False and asked["required_contexts"] == []


def test_a_rerun_of_a_head_writes_nothing_and_a_new_head_retires_the_old_one(
    gh: FakeGitHub,
) -> None:
    first = PendingDeployment(client(gh), REPO, "shop-pr-5").write(ready(), sha=HEAD)
    before = writes(gh)
    again = PendingDeployment(client(gh), REPO, "shop-pr-5").write(ready(), sha=HEAD)
    assert (again.id, again.action) == (first.id, "unchanged") and writes(gh) == before
    gh.add_pull(REPO, 6, NEXT, "b" * 40)
    pushed = PendingDeployment(client(gh), REPO, "shop-pr-5").write(ready(), sha=NEXT)
    assert (pushed.action, pushed.retired) == ("created", 1)
    assert {d["sha"]: latest(d) for d in deployed(gh)} == {HEAD: "inactive", NEXT: "success"}


def test_a_close_retires_every_deployment_of_the_environment_and_no_other(
    gh: FakeGitHub,
) -> None:
    PendingDeployment(client(gh), REPO, "shop-pr-5").write(ready(), sha=HEAD)
    PendingDeployment(client(gh), REPO, "shop-pr-9").write(ready(), sha=HEAD)
    end = DeploymentEnd("inactive", "branch shop-pr-5 destroyed")
    done = PendingDeployment(client(gh), REPO, "shop-pr-5").write(end, sha=HEAD)
    assert (done.id, done.action, done.retired) == (None, "retired", 1)
    assert {d["environment"]: latest(d) for d in deployed(gh)} == {
        environment("shop-pr-5"): "inactive",
        environment("shop-pr-9"): "success",
    }


def test_a_token_without_deployments_write_is_a_clear_error_without_the_token(
    gh: FakeGitHub,
) -> None:
    gh.fail_next("POST", r"/deployments$", 403, body=FORBIDDEN)
    with pytest.raises(GitHubError) as refused:
        PendingDeployment(client(gh), REPO, "shop-pr-5").write(ready(), sha=HEAD)
    assert "HTTP 403" in str(refused.value) and "`deployments: write`" in str(refused.value)
    assert "ghs_job" not in str(refused.value)
    gh.fail_next("GET", r"/deployments$", 403, body=FORBIDDEN)  # the search's error, at the write
    with pytest.raises(GitHubError, match="could not list the deployments"):
        PendingDeployment(client(gh), REPO, "shop-pr-5").write(ready(), sha=HEAD)


def test_the_listener_warns_once_a_repository_for_what_fails_every_job() -> None:
    clients = GitHubClients(None)  # type: ignore[arg-type]  # (no client is made here)
    assert clients.first_warning("Acme/Shop", "deployment")
    assert not clients.first_warning("acme/shop", "deployment")
    assert clients.first_warning("acme/other", "deployment")


# -- the workflow on real branches -------------------------------------------------------------


def pr(kind: event.Kind = "open", head: str = HEAD) -> event.Event:
    return event.Event(
        kind=kind,
        repository=REPO,
        pr=5,
        head_sha=head,
        base_sha="b" * 40,
        merged=True if kind == "close" else None,
        from_fork=False,
        draft=False,
        ref_name="feature",
        action="closed" if kind == "close" else "opened",
    )


def handle(pool: Pool, ev: event.Event, github: GitHub, tmp_path: Path, **inputs: Any) -> Outcome:
    return workflow.handle(
        LocalEngine(pool),
        ev,
        Inputs(base=SESSION_BASE, **inputs),
        settings=pool.settings,
        repo_dir=tmp_path,
        github=github,
        run_url=RUN,
    )


def test_open_deploys_the_branch_page_and_close_retires_it_with_no_secret_sent_or_logged(
    pool: Pool,
    base: BaseVersion,
    tmp_path: Path,
    github: tuple[FakeGitHub, GitHub],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, gh = github
    caplog.set_level(logging.DEBUG)
    try:
        opened = handle(pool, pr(), gh, tmp_path)
        assert opened.report is not None and opened.report.status == "ready"
        assert opened.deployment is not None and opened.deployment.action == "created"
        assert opened.deployment_error == ""
        password = LocalEngine(pool).connection("shop-pr-5").password
        (d,) = fake.deployments(REPO)
        page = pool.settings.page_url("shop-pr-5")
        assert (d["environment"], d["sha"], latest(d)) == ("pgoverlay/shop-pr-5", HEAD, "success")
        assert d["statuses"][-1]["environment_url"] == page
        body = fake.state.comments[0]["body"]
        assert f"]({page})" in body  # the comment links the same page
        closed = handle(pool, pr("close"), gh, tmp_path)
        assert closed.report is not None and closed.report.status == "destroyed"
        assert closed.deployment is not None and closed.deployment.retired == 1
        (d,) = fake.deployments(REPO)
        assert latest(d) == "inactive"
    finally:
        branch.destroy(pool, "shop-pr-5")
    sent = json.dumps(fake.requests) + json.dumps(fake.deployments(REPO))
    sent += "".join(c["body"] for c in fake.state.comments)
    assert password not in sent and password not in caplog.text


def test_a_close_after_the_branch_is_gone_still_retires_its_deployment(
    pool: Pool, base: BaseVersion, tmp_path: Path, github: tuple[FakeGitHub, GitHub]
) -> None:
    fake, gh = github
    try:
        handle(pool, pr(), gh, tmp_path)
    finally:
        branch.destroy(pool, "shop-pr-5")  # its ttl, or a person: not the close
    assert [latest(d) for d in fake.deployments(REPO)] == ["success"]
    closed = handle(pool, pr("close"), gh, tmp_path)
    assert closed.report is None  # no branch to destroy, no comment to write
    assert closed.deployment is not None and closed.deployment.retired == 1
    assert [latest(d) for d in fake.deployments(REPO)] == ["inactive"]


def test_a_token_without_deployments_write_leaves_the_comment_and_the_branch(
    pool: Pool, base: BaseVersion, tmp_path: Path, github: tuple[FakeGitHub, GitHub]
) -> None:
    fake, gh = github
    fake.fail_next("POST", r"/deployments$", 403, body=FORBIDDEN)
    try:
        outcome = handle(pool, pr(), gh, tmp_path)
        assert outcome.report is not None and outcome.report.status == "ready"
        assert outcome.comment is not None and outcome.comment.action == "created"
        assert outcome.deployment is None and "`deployments: write`" in outcome.deployment_error
        assert fake.deployments(REPO) == []
    finally:
        branch.destroy(pool, "shop-pr-5")


def test_a_forks_read_only_token_is_named_as_the_reason_the_deployment_was_not_written(
    pool: Pool, base: BaseVersion, tmp_path: Path, github: tuple[FakeGitHub, GitHub]
) -> None:
    fake, gh = github
    fake.fail_next("POST", r"/deployments$", 403, body=FORBIDDEN)
    fork = dataclasses.replace(pr(), from_fork=True)
    try:
        outcome = handle(pool, fork, gh, tmp_path, allow_forks=True)
        assert outcome.report is not None and outcome.report.status == "ready"
        assert "forks get a read-only token" in outcome.deployment_error
    finally:
        branch.destroy(pool, "shop-pr-5")


def test_deployment_false_asks_github_nothing_about_deployments(
    pool: Pool, base: BaseVersion, tmp_path: Path, github: tuple[FakeGitHub, GitHub]
) -> None:
    fake, gh = github
    try:
        outcome = handle(pool, pr(), gh, tmp_path, deployment=False)
        assert outcome.deployment is None and outcome.comment is not None
        assert not [r for r in fake.requests if "/deployments" in r["path"]]
    finally:
        branch.destroy(pool, "shop-pr-5")


def test_the_actions_step_warns_once_and_passes_when_the_token_cannot_deploy(
    pool: Pool,
    base: BaseVersion,
    service: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    github: tuple[FakeGitHub, GitHub],
) -> None:
    fake, _ = github
    data = json.loads((WEBHOOKS / "pull_request.opened.json").read_text())
    data["pull_request"]["number"] = 5
    data["pull_request"]["head"]["sha"] = HEAD
    data["repository"]["full_name"] = REPO
    fake.fail_next("POST", r"/deployments$", 403, body=FORBIDDEN, times=5)
    event_path = tmp_path / "event.json"
    event_path.write_text(json.dumps(data))
    for key, value in {
        "GITHUB_EVENT_PATH": str(event_path),
        "GITHUB_EVENT_NAME": "pull_request",
        "GITHUB_REPOSITORY": REPO,
        "GITHUB_WORKSPACE": str(tmp_path),
        "GITHUB_OUTPUT": str(tmp_path / "output"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"),
        "GITHUB_API_URL": fake.url,
        "INPUT_GITHUB_TOKEN": "ghs_job",
        "INPUT_BASE": SESSION_BASE,
        "PGOVERLAY_HOME": str(pool.home),
        "PGOVERLAY_PORT_MIN": str(pool.settings.port_min),
        "PGOVERLAY_PORT_MAX": str(pool.settings.port_max),
    }.items():
        monkeypatch.setenv(key, value)
    out = io.StringIO()
    try:
        assert main.run(out=out) == 0
    finally:
        branch.destroy(pool, "shop-pr-5")
    log = out.getvalue()
    warnings = [line for line in log.splitlines() if "Deployment" in line]
    assert len(warnings) == 1 and warnings[0].startswith("::warning")
    assert "title=GitHub Deployment not written" in warnings[0]
    assert "deployments: write" in warnings[0]
    assert len(fake.state.comments) == 1  # the comment alone
    assert "The GitHub Deployment was not written" in (tmp_path / "summary").read_text()


# -- the `database-url` output: a preview app's credential, masked before it is written -------


class Log(io.StringIO):
    """The step's log: each mask line, when written, is checked against GITHUB_OUTPUT, which
    must not hold the value yet (a secret is registered before it is written anywhere)."""

    def __init__(self, output: Path) -> None:
        super().__init__()
        self.output = output

    def write(self, text: str) -> int:
        if text.startswith("::add-mask::"):
            value = text.removeprefix("::add-mask::").rstrip("\n")
            written = self.output.read_text() if self.output.exists() else ""
            assert value not in written, "a secret was written before it was masked"
        return super().write(text)


def step_env(tmp_path: Path, pool: Pool, number: int, **inputs: str) -> dict[str, str]:
    data = json.loads((WEBHOOKS / "pull_request.opened.json").read_text())
    data["pull_request"]["number"] = number
    event_path = tmp_path / "event.json"
    event_path.write_text(json.dumps(data))
    return {
        "GITHUB_EVENT_PATH": str(event_path),
        "GITHUB_EVENT_NAME": "pull_request",
        "GITHUB_REPOSITORY": data["repository"]["full_name"],
        "GITHUB_WORKSPACE": str(tmp_path),
        "GITHUB_OUTPUT": str(tmp_path / "output"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"),
        "PGOVERLAY_HOME": str(pool.home),
        "PGOVERLAY_PORT_MIN": str(pool.settings.port_min),
        "PGOVERLAY_PORT_MAX": str(pool.settings.port_max),
        "INPUT_BASE": SESSION_BASE,
        **{f"INPUT_{k.upper()}": v for k, v in inputs.items()},
    }


def test_database_url_is_the_front_door_as_the_prs_app_role_renewed_per_run_and_masked(
    pool: Pool, base: BaseVersion, service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re
    from urllib.parse import unquote, urlsplit

    import psycopg

    for key, value in step_env(tmp_path, pool, 7, comment="false").items():
        monkeypatch.setenv(key, value)
    name = "hello-world-pr-7"

    def run() -> tuple[str, str]:
        (tmp_path / "output").write_text("")
        log = Log(tmp_path / "output")
        assert main.run(out=log) == 0
        return read_outputs(tmp_path / "output")["database-url"], log.getvalue()

    def connects(url: str) -> str:
        """Log in as the URL's role with its password, to the branch itself (the front door
        routes to it by the database name; its own tests are the door's)."""
        parts = urlsplit(url)
        b = branch.get(pool, name)
        with psycopg.connect(
            host="127.0.0.1",
            port=b.port,
            dbname=b.database,
            user=unquote(parts.username or ""),
            password=unquote(parts.password or ""),
            connect_timeout=10,
        ) as conn:
            return str(conn.execute("select current_user").fetchone()[0])  # type: ignore[index]

    try:
        first, log = run()
        s = pool.settings
        pattern = (
            rf"postgresql://app_pr_7:(?P<password>[^@]+)@{re.escape(s.door_name)}:{s.door.port}/"
            rf"{name}\?sslmode=verify-full&sslrootcert={re.escape(str(s.home))}/door/door\.crt"
        )
        found = re.fullmatch(pattern, first)
        assert found is not None, first
        password = unquote(found["password"])
        assert f"::add-mask::{password}" in log and f"::add-mask::{first}" in log
        unmasked = log.replace(f"::add-mask::{password}", "").replace(f"::add-mask::{first}", "")
        assert password not in unmasked
        assert password not in (tmp_path / "summary").read_text()
        assert connects(first) == "app_pr_7"
        # A re-run (another job of the pull request): the deployed credential renewed, the
        # same password, so the preview an earlier job deployed keeps its database.
        again, _ = run()
        assert again == first and connects(first) == "app_pr_7"
    finally:
        branch.destroy(pool, name)
    closed = json.loads((WEBHOOKS / "pull_request.closed.json").read_text())
    closed["pull_request"]["number"] = 7
    (tmp_path / "event.json").write_text(json.dumps(closed))
    (tmp_path / "output").write_text("")
    assert main.run(out=io.StringIO()) == 0  # nothing left to destroy: no output to mint
    assert "database-url" not in read_outputs(tmp_path / "output")


def test_a_destroyed_branch_takes_its_app_role_and_leaves_no_database_url(
    pool: Pool, base: BaseVersion, service: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in step_env(tmp_path, pool, 8, comment="false").items():
        monkeypatch.setenv(key, value)
    try:
        assert main.run(out=io.StringIO()) == 0
        assert "database-url" in read_outputs(tmp_path / "output")
        engine = LocalEngine(pool)
        assert [g.role for g in engine.grants("hello-world-pr-8")] == ["app_pr_8"]
        closed = json.loads((WEBHOOKS / "pull_request.closed.json").read_text())
        closed["pull_request"]["number"] = 8
        (tmp_path / "event.json").write_text(json.dumps(closed))
        (tmp_path / "output").write_text("")
        assert main.run(out=io.StringIO()) == 0
        values = read_outputs(tmp_path / "output")
        assert values["status"] == "destroyed" and "database-url" not in values
        assert pool.registry.grants("hello-world-pr-8") == []
    finally:
        branch.destroy(pool, "hello-world-pr-8")
