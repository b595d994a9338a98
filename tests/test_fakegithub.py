"""The fake GitHub API, driven the way pgoverlay drives GitHub: PyGithub and plain HTTP."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from github import Auth, BadCredentialsException, Github, GithubException, GithubIntegration
from github.GithubRetry import GithubRetry
from requests import Response

from fakegithub import FakeGitHub

REPO = "octo/app"
HEAD, BASE = "a" * 40, "b" * 40
ALICE, BOB = "ghp_alice0000000000000000000000000000000", "ghp_bob00000000000000000000000000000000"
JOB = "ghs_job00000000000000000000000000000000"  # a workflow's GITHUB_TOKEN
TOKENS = (ALICE, BOB, JOB)


@pytest.fixture
def gh() -> Iterator[FakeGitHub]:
    with FakeGitHub() as fake:
        fake.add_token(ALICE, "alice")
        fake.add_token(BOB, "bob")
        fake.add_token(JOB, "github-actions", kind="installation")
        fake.add_pull(REPO, 7, HEAD, BASE, head_ref="feature", labels=["database"])
        yield fake


def client(fake: FakeGitHub, token: str, *, retry: GithubRetry | None = None) -> Github:
    """PyGithub against the fake, without its default throttle (0.25 s a request, 1 s a write)."""
    return Github(
        auth=Auth.Token(token),
        base_url=fake.url,
        retry=retry,
        seconds_between_requests=0,
        seconds_between_writes=0,
    )


def raw(fake: FakeGitHub, method: str, path: str, token: str = ALICE, **kw: Any) -> Response:
    """One plain HTTP request, for what PyGithub would not send or would hide."""
    headers = {"Authorization": f"token {token}", "Accept": "application/vnd.github+json"}
    return requests.request(method, fake.url + path, headers=headers, timeout=10, **kw)


def test_comment_is_created_listed_and_edited_through_pygithub(gh: FakeGitHub) -> None:
    pull = client(gh, ALICE).get_repo(REPO).get_pull(7)
    comment = pull.create_issue_comment("branch ready")
    assert (comment.user.login, comment.user.type) == ("alice", "User")
    assert comment.html_url.endswith(f"/{REPO}/pull/7#issuecomment-{comment.id}")

    comment.edit("branch reset")
    assert [c.body for c in pull.get_issue_comments()] == ["branch reset"]
    assert [c["body"] for c in gh.state.comments] == ["branch reset"]
    assert gh.violations == []


def test_job_token_comments_as_github_actions_bot_and_cannot_read_user(gh: FakeGitHub) -> None:
    comment = client(gh, JOB).get_repo(REPO).get_pull(7).create_issue_comment("from the job")
    assert (comment.user.login, comment.user.type) == ("github-actions[bot]", "Bot")

    with pytest.raises(GithubException) as denied:
        client(gh, JOB).get_user().login  # noqa: B018 - the attribute read sends GET /user
    assert denied.value.status == 403
    assert denied.value.data["message"] == "Resource not accessible by integration"
    assert client(gh, ALICE).get_user().login == "alice"
    assert gh.violations == []


def test_pygithub_lists_all_250_comments_by_following_link_headers(gh: FakeGitHub) -> None:
    ids = [gh.add_comment(REPO, 7, f"comment {n}", "bob") for n in range(250)]

    listed = client(gh, ALICE).get_repo(REPO).get_pull(7).get_issue_comments()

    assert [c.id for c in listed] == ids
    pages = [r for r in gh.requests if r["path"].endswith("/issues/7/comments")]
    assert len(pages) == 9  # 30 a page by default
    assert gh.violations == []


def test_link_header_names_prev_next_last_and_first_on_a_middle_page(gh: FakeGitHub) -> None:
    for n in range(250):
        gh.add_comment(REPO, 7, f"comment {n}", "bob")

    page = raw(gh, "GET", f"/repos/{REPO}/issues/7/comments", params={"per_page": 100, "page": 2})

    assert page.status_code == 200 and len(page.json()) == 100
    base = f"{gh.url}/repos/{REPO}/issues/7/comments?per_page=100"
    assert {rel: link["url"] for rel, link in page.links.items()} == {
        "prev": f"{base}&page=1",
        "next": f"{base}&page=3",
        "last": f"{base}&page=3",
        "first": f"{base}&page=1",
    }
    too_many = raw(gh, "GET", f"/repos/{REPO}/issues/7/comments", params={"per_page": 500})
    assert len(too_many.json()) == 100
    assert gh.violations == []


def test_editing_someone_elses_comment_is_forbidden(gh: FakeGitHub) -> None:
    theirs = gh.add_comment(REPO, 7, "bob's words", "bob")
    [comment] = client(gh, ALICE).get_repo(REPO).get_pull(7).get_issue_comments()
    assert comment.id == theirs

    with pytest.raises(GithubException) as edit:
        comment.edit("alice's words")
    assert edit.value.status == 403
    assert [c["body"] for c in gh.state.comments] == ["bob's words"]
    assert gh.violations == []


def test_unknown_token_gets_401_with_githubs_error_shape(gh: FakeGitHub) -> None:
    with pytest.raises(BadCredentialsException):
        client(gh, "ghp_unknown").get_repo(REPO)

    answer = raw(gh, "GET", f"/repos/{REPO}/pulls/7", token="ghp_unknown")
    assert answer.status_code == 401
    assert answer.json() == {
        "message": "Bad credentials",
        "documentation_url": "https://docs.github.com/rest",
    }
    anonymous = requests.get(f"{gh.url}/repos/{REPO}/pulls/7", timeout=10)
    assert (anonymous.status_code, anonymous.json()["message"]) == (401, "Requires authentication")


def test_commit_status_is_stored_with_its_creator(gh: FakeGitHub) -> None:
    commit = client(gh, JOB).get_repo(REPO).get_commit(HEAD)
    status = commit.create_status(
        "success", target_url="http://127.0.0.1/b/7", description="ready", context="pgoverlay"
    )
    assert (status.state, status.context, status.creator.login) == (
        "success",
        "pgoverlay",
        "github-actions[bot]",
    )
    default = raw(gh, "POST", f"/repos/{REPO}/statuses/{HEAD}", json={"state": "pending"})
    assert (default.status_code, default.json()["context"]) == (201, "default")
    assert [(s["sha"], s["state"]) for s in gh.state.statuses] == [
        (HEAD, "success"),
        (HEAD, "pending"),
    ]
    assert gh.violations == []


def test_pulls_are_got_and_listed_by_state_head_and_base(gh: FakeGitHub) -> None:
    gh.add_pull(REPO, 8, "c" * 40, BASE, head_repo="mallory/app", head_ref="evil", draft=True)
    gh.add_pull(REPO, 9, "d" * 40, BASE, state="closed", merged=True)
    repo = client(gh, ALICE).get_repo(REPO)

    fork = repo.get_pull(8)
    assert (fork.head.repo.full_name, fork.base.repo.full_name, fork.draft) == (
        "mallory/app",
        REPO,
        True,
    )
    assert fork.head.repo.fork and not fork.base.repo.fork
    assert [label.name for label in repo.get_pull(7).labels] == ["database"]
    assert repo.get_pull(9).merged
    assert [p.number for p in repo.get_pulls()] == [8, 7]
    assert [p.number for p in repo.get_pulls(state="all", direction="asc")] == [7, 8, 9]
    assert [p.number for p in repo.get_pulls(head="mallory:evil")] == [8]
    assert [p.number for p in repo.get_pulls(state="closed", base="main")] == [9]
    with pytest.raises(GithubException) as missing:
        repo.get_pull(99)
    assert missing.value.status == 404
    assert gh.violations == []


def test_app_jwt_gets_an_installation_token_that_comments_as_the_bot(gh: FakeGitHub) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    gh.add_app(4242, "pgoverlay")
    app = GithubIntegration(auth=Auth.AppAuth(4242, pem), base_url=gh.url, seconds_between_writes=0)

    token = app.get_access_token(17).token

    comment = client(gh, token).get_repo(REPO).get_pull(7).create_issue_comment("hello")
    assert (comment.user.login, comment.user.type) == ("pgoverlay[bot]", "Bot")
    assert token not in json.dumps(gh.requests)
    assert gh.violations == []


def test_pygithub_retry_recovers_from_injected_502s(gh: FakeGitHub) -> None:
    gh.fail_next("POST", r"/issues/7/comments$", 502, times=2)
    retrying = client(gh, ALICE, retry=GithubRetry(total=3, status_forcelist=[502]))

    comment = retrying.get_repo(REPO).get_pull(7).create_issue_comment("after a hiccup")

    assert comment.body == "after a hiccup"
    posts = [(r["status"], r["injected"]) for r in gh.requests if r["method"] == "POST"]
    assert posts == [(502, True), (502, True), (201, False)]
    assert gh.violations == []


def test_injected_secondary_rate_limit_carries_retry_after_then_clears(gh: FakeGitHub) -> None:
    message = "You have exceeded a secondary rate limit. Please wait a few minutes."
    gh.fail_next(
        "POST", r"/comments$", 403, headers={"Retry-After": "1"}, body={"message": message}
    )
    path = f"/repos/{REPO}/issues/7/comments"

    limited = raw(gh, "POST", path, json={"body": "x"})
    assert (limited.status_code, limited.headers["Retry-After"]) == (403, "1")
    assert limited.json() == {"message": message}
    assert raw(gh, "POST", path, json={"body": "x"}).status_code == 201
    gh.fail_next("GET", r"/pulls$", 429)
    assert raw(gh, "GET", f"/repos/{REPO}/pulls").status_code == 429


def test_requests_outside_the_schema_get_422_and_are_recorded(gh: FakeGitHub) -> None:
    no_body = raw(gh, "POST", f"/repos/{REPO}/issues/7/comments", json={"text": "hi"})
    assert no_body.status_code == 422
    assert set(no_body.json()) >= {"message", "documentation_url", "errors"}
    assert raw(gh, "GET", f"/repos/{REPO}/pulls", params={"state": "merged"}).status_code == 422
    assert raw(gh, "GET", f"/repos/{REPO}/issues/seven/comments").status_code == 422
    bad_state = raw(gh, "POST", f"/repos/{REPO}/statuses/{HEAD}", json={"state": "green"})
    assert bad_state.status_code == 422

    assert [(v["kind"], v["method"]) for v in gh.violations] == [
        ("request", "POST"),
        ("request", "GET"),
        ("request", "GET"),
        ("request", "POST"),
    ]
    assert "'body' is a required property" in gh.violations[0]["error"]
    assert gh.state.comments == [] and gh.state.statuses == []


def test_a_response_that_breaks_the_schema_is_recorded(
    gh: FakeGitHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gh, "_comment_json", lambda c: {"id": c["id"], "url": "x", "body": "x"})

    raw(gh, "POST", f"/repos/{REPO}/issues/7/comments", json={"body": "x"})

    assert [v["kind"] for v in gh.violations] == ["response"]
    assert "'node_id' is a required property" in gh.violations[0]["error"]


def test_request_log_and_state_hold_no_token(gh: FakeGitHub, tmp_path: Path) -> None:
    client(gh, ALICE).get_repo(REPO).get_pull(7).create_issue_comment("a")
    raw(gh, "GET", f"/repos/{REPO}/pulls", token=BOB)
    raw(gh, "GET", f"/repos/{REPO}/pulls", token="ghp_wrong_guess_000000000000000000000000")
    gh.save(tmp_path / "state.json")

    logged = json.dumps(gh.requests)
    saved = (tmp_path / "state.json").read_text()
    for token in (*TOKENS, "ghp_wrong_guess_000000000000000000000000"):
        assert token not in logged and token not in saved
    assert all(k.lower() != "authorization" for r in gh.requests for k in r["headers"])
    assert [r["login"] for r in gh.requests][-2:] == ["bob", None]


def test_runs_as_a_process_and_persists_its_state(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    seed = FakeGitHub(state_file=state)
    seed.add_token(JOB, "github-actions", kind="installation")
    seed.add_pull(REPO, 7, HEAD, BASE)
    script = Path(__file__).with_name("fakegithub.py")
    proc = subprocess.Popen(
        [sys.executable, str(script), "--port", "0", "--state", str(state)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "the fake printed no URL within 30 s"
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")

        github = Github(
            auth=Auth.Token(JOB), base_url=url, seconds_between_requests=0, seconds_between_writes=0
        )
        github.get_repo(REPO).get_pull(7).create_issue_comment("from act")

        saved = json.loads(state.read_text())
        assert [c["body"] for c in saved["comments"]] == ["from act"]
        assert [r["path"] for r in saved["requests"]][-1] == f"/repos/{REPO}/issues/7/comments"
        assert saved["violations"] == []
        assert JOB not in state.read_text()
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_collaborator_permission_labels_and_label_removal_through_pygithub(
    gh: FakeGitHub,
) -> None:
    gh.add_collaborator(REPO, "alice", "maintain")
    gh.add_collaborator(REPO, "bob", "triage")
    repo = client(gh, JOB).get_repo(REPO)
    assert repo.get_collaborator_permission("alice") == "write"
    assert repo.get_collaborator_role_name("alice") == "maintain"
    assert repo.get_collaborator_permission("bob") == "read"
    assert repo.get_collaborator_permission("github-actions[bot]") == "none"
    with pytest.raises(GithubException) as missing:
        repo.get_collaborator_permission("nobody-at-all")
    assert missing.value.status == 404
    pull = repo.get_pull(7)
    assert [label.name for label in pull.get_labels()] == ["database"]
    pull.remove_from_labels("database")
    assert [label.name for label in pull.get_labels()] == []
    assert repo.get_pull(7).labels == []
    with pytest.raises(GithubException) as gone:
        pull.remove_from_labels("database")
    assert gone.value.status == 404
    assert gh.violations == []


# -- OAuth web flow (the branch page's sign-in) ------------------------------------------------
CALLBACK = "https://page.example:8443/oauth/callback"


def authorize(gh: FakeGitHub, **query: str) -> Response:
    params = {"client_id": "Iv1.x", "redirect_uri": CALLBACK, "state": "st", "scope": ""} | query
    return requests.get(f"{gh.url}/login/oauth/authorize", params=params, allow_redirects=False)


def exchange(gh: FakeGitHub, code: str, **form: str) -> dict[str, Any]:
    fields = {"client_id": "Iv1.x", "client_secret": "sec", "code": code,
              "redirect_uri": CALLBACK} | form
    answer = requests.post(f"{gh.url}/login/oauth/access_token", data=fields,
                           headers={"Accept": "application/json"})
    assert answer.status_code == 200  # GitHub answers its errors with a 200 too
    return dict(answer.json())


def test_the_web_flow_signs_in_the_chosen_login_once_per_code(gh: FakeGitHub) -> None:
    gh.add_oauth_app("Iv1.x", "sec", callback=CALLBACK)
    assert authorize(gh).status_code == 401  # nobody signed in at the fake
    gh.sign_in("carol")
    back = authorize(gh)
    assert back.status_code == 302
    location = back.headers["Location"]
    assert location.startswith(CALLBACK + "?code=") and location.endswith("&state=st")
    code = location.split("code=")[1].split("&")[0]
    assert exchange(gh, code, client_secret="wrong")["error"] == "incorrect_client_credentials"
    # a code is taken out by its first exchange, whatever the outcome: good once
    assert exchange(gh, code)["error"] == "bad_verification_code"
    code = authorize(gh).headers["Location"].split("code=")[1].split("&")[0]
    assert exchange(gh, code, redirect_uri=CALLBACK + "/x")["error"] == "redirect_uri_mismatch"
    code = authorize(gh).headers["Location"].split("code=")[1].split("&")[0]
    answer = exchange(gh, code)
    assert answer["token_type"] == "bearer" and answer["access_token"].startswith("gho_")
    assert exchange(gh, code)["error"] == "bad_verification_code"
    me = requests.get(f"{gh.url}/user",
                      headers={"Authorization": f"Bearer {answer['access_token']}"})
    assert me.json()["login"] == "carol" and me.json()["user_view_type"] == "public"
    assert authorize(gh, redirect_uri="https://elsewhere.example/cb").status_code == 400
    assert authorize(gh, client_id="Iv1.unknown").status_code == 404
    assert gh.violations == []


def test_a_private_repository_is_a_404_to_a_user_who_does_not_collaborate(gh: FakeGitHub) -> None:
    gh.add_repo("octo/vault", private=True)
    gh.add_collaborator("octo/vault", "alice", "triage")

    def get(token: str, repo: str) -> Response:
        return requests.get(f"{gh.url}/repos/{repo}", headers={"Authorization": f"token {token}"})

    assert get(BOB, "octo/vault").status_code == 404
    mine = get(ALICE, "octo/vault").json()
    assert mine["private"] is True and mine["visibility"] == "private"
    assert mine["permissions"] == {"pull": True, "triage": True, "push": False,
                                   "maintain": False, "admin": False}
    assert get(BOB, REPO).json()["permissions"]["pull"] is True  # public: anyone reads it
    assert "permissions" not in get(JOB, "octo/vault").json()  # an installation sees it all
    assert gh.violations == []
