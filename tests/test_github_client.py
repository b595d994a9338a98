"""The GitHub client's HTTP behaviour against the fake GitHub API (real HTTP, checked against
GitHub's OpenAPI description): the sticky comment, the listener's calls, and the one retry and
rate-limit path every caller (the Action, the listener, the branch page) goes through."""

from __future__ import annotations

import functools
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from fakegithub import FakeGitHub
from pgoverlay.action.comment import has_marker, marker
from pgoverlay.action.github import GitHub
from pgoverlay.errors import GitHubError
from pgoverlay.github.grammar import ACTIONS_BOT
from pgoverlay.runner.callers import oauth
from pgoverlay.webhook.clients import GitHubClients
from pgoverlay.webhook.settings import WebhookSettings

REPO = "acme/shop"
MARK = marker(REPO, 5, "pr-5")
JOB = "ghs_job00000000000000000000000000000000"  # a workflow's GITHUB_TOKEN
ALICE = "ghp_alice0000000000000000000000000000000"
COMMENTS = rf"/repos/{REPO}/issues/5/comments$"


@pytest.fixture
def gh() -> Iterator[FakeGitHub]:
    with FakeGitHub() as fake:
        fake.add_token(JOB, "github-actions", kind="installation")
        fake.add_token(ALICE, "alice")
        fake.add_pull(REPO, 5, "a" * 40, "b" * 40)
        yield fake
        assert fake.violations == []


def client(fake: FakeGitHub, token: str = JOB) -> GitHub:
    return GitHub(token, api_url=fake.url, backoff=0.0)


def ours(body: str | None) -> bool:
    return has_marker(body, MARK)


def sent(fake: FakeGitHub) -> list[tuple[str, str]]:
    return [(r["method"], r["path"]) for r in fake.requests]


def test_our_comment_on_a_later_page_is_edited_and_a_spoofed_one_is_ignored(
    gh: FakeGitHub,
) -> None:
    gh.add_comment(REPO, 5, f"{MARK}\nfake", "mallory")
    for i in range(120):
        gh.add_comment(REPO, 5, f"review {i}", "alice")
    mine = gh.add_comment(REPO, 5, f"{MARK}\nold", ACTIONS_BOT)
    result = client(gh).upsert_comment(REPO, 5, f"{MARK}\nnew", ours)
    assert (result.id, result.action) == (mine, "updated")
    assert [c["body"] for c in gh.state.comments if c["id"] == mine] == [f"{MARK}\nnew"]
    listed = [r for r in gh.requests if r["method"] == "GET" and r["path"].endswith("/comments")]
    assert [r["query"].get("page") for r in listed] == [None, "2"]
    assert [r["json"] for r in gh.requests if r["method"] == "PATCH"] == [{"body": f"{MARK}\nnew"}]


def test_an_unchanged_comment_is_not_sent_again(gh: FakeGitHub) -> None:
    gh.add_comment(REPO, 5, f"{MARK}\nsame", ACTIONS_BOT)
    result = client(gh).upsert_comment(REPO, 5, f"{MARK}\nsame", ours)
    assert result.action == "unchanged"
    assert [m for m, _ in sent(gh) if m != "GET"] == []


def test_a_missing_comment_is_created_after_server_errors_are_retried(gh: FakeGitHub) -> None:
    gh.fail_next("GET", COMMENTS, 503)
    gh.fail_next("POST", COMMENTS, 502, times=2)
    result = client(gh).upsert_comment(REPO, 5, f"{MARK}\nx", ours)
    assert result.action == "created"
    assert [c["body"] for c in gh.state.comments] == [f"{MARK}\nx"]
    assert [r["status"] for r in gh.requests] == [503, 200, 502, 502, 201]


def test_a_rate_limited_request_waits_for_retry_after_then_goes_on(gh: FakeGitHub) -> None:
    limited = {"Retry-After": "0", "X-RateLimit-Remaining": "0"}
    body = {"message": "You have exceeded a secondary rate limit."}
    gh.fail_next("GET", COMMENTS, 403, headers=limited, body=body)
    result = client(gh).upsert_comment(REPO, 5, f"{MARK}\nx", ours)
    assert result.action == "created"
    assert [r["status"] for r in gh.requests] == [403, 200, 201]


def test_a_long_rate_limit_is_a_clear_error_rather_than_an_hour_of_waiting(
    gh: FakeGitHub,
) -> None:
    body = {"message": "API rate limit exceeded"}
    gh.fail_next("GET", COMMENTS, 403, headers={"Retry-After": "3600"}, body=body)
    with pytest.raises(GitHubError, match="rate limited for 3600 s more"):
        client(gh).upsert_comment(REPO, 5, "x", ours)


def test_a_refused_comment_is_a_clear_error_without_the_token(gh: FakeGitHub) -> None:
    body = {"message": "Resource not accessible by integration"}
    gh.fail_next("POST", COMMENTS, 403, body=body)
    with pytest.raises(GitHubError, match="HTTP 403: Resource not accessible") as caught:
        client(gh).upsert_comment(REPO, 5, "x", ours)
    assert JOB not in str(caught.value)


def test_the_job_tokens_normal_403_on_user_is_not_logged(
    gh: FakeGitHub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG - 9)  # everything
    gh.add_comment(REPO, 5, f"{MARK}\nsame", ACTIONS_BOT)
    result = client(gh).upsert_comment(REPO, 5, f"{MARK}\nsame", ours)
    assert result.action == "unchanged", "the job token is known as github-actions[bot]"
    assert ("GET", "/user") in sent(gh)
    noisy = [r for r in caplog.records if r.levelno >= logging.INFO and "/user" in r.getMessage()]
    assert noisy == []


def test_a_person_s_token_comments_as_that_person(gh: FakeGitHub) -> None:
    gh.add_comment(REPO, 5, f"{MARK}\nby the bot", ACTIONS_BOT)
    mine = gh.add_comment(REPO, 5, f"{MARK}\nold", "alice")
    result = client(gh, ALICE).upsert_comment(REPO, 5, f"{MARK}\nnew", ours)
    assert (result.id, result.action) == (mine, "updated")


def test_a_first_run_lists_then_creates_without_reading_the_pull_request(gh: FakeGitHub) -> None:
    gh.add_comment(REPO, 5, "hi", "alice")
    result = client(gh).upsert_comment(REPO, 5, f"{MARK}\nx", ours)
    assert result.action == "created"
    assert result.url.endswith(f"/{REPO}/pull/5#issuecomment-{result.id}")
    assert sent(gh) == [
        ("GET", f"/repos/{REPO}/issues/5/comments"),
        ("POST", f"/repos/{REPO}/issues/5/comments"),
    ]
    # What GitHub asks API clients to send.
    head = gh.requests[-1]["headers"]
    assert head.get("Accept") == "application/vnd.github+json" and head.get("User-Agent")


def test_a_prefetched_comment_deleted_before_the_write_is_created_again(gh: FakeGitHub) -> None:
    gone = gh.add_comment(REPO, 5, f"{MARK}\nold", ACTIONS_BOT)
    pending = client(gh).prefetch_comment(REPO, 5, ours)
    gh.fail_next("PATCH", rf"/issues/comments/{gone}$", 404)  # deleted meanwhile
    result = pending.write(f"{MARK}\nnew")
    assert result.action == "created" and result.id != gone


def test_a_failed_search_is_the_writes_error_without_the_token(gh: FakeGitHub) -> None:
    body = {"message": "Resource not accessible by integration"}
    gh.fail_next("GET", COMMENTS, 403, body=body)
    pending = client(gh).prefetch_comment(REPO, 5, ours)
    with pytest.raises(GitHubError, match="HTTP 403: Resource not accessible") as caught:
        pending.write(f"{MARK}\nx")
    assert JOB not in str(caught.value)
    assert [m for m, _ in sent(gh)] == ["GET"]


def test_a_next_page_outside_the_api_is_not_followed(gh: FakeGitHub) -> None:
    """The token goes to the API's address alone, whatever a Link header names."""
    elsewhere = '<http://collector.example/steal?page=2>; rel="next"'
    gh.fail_next("GET", COMMENTS, 200, headers={"Link": elsewhere}, body=[])
    with pytest.raises(GitHubError, match="outside"):
        client(gh).upsert_comment(REPO, 5, "x", ours)


def test_an_api_address_that_is_not_http_is_refused() -> None:
    with pytest.raises(GitHubError, match="GITHUB_API_URL"):
        GitHub(JOB, api_url="file:///etc")


def test_github_unreachable_is_a_clear_error() -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    github = GitHub(JOB, api_url=f"http://127.0.0.1:{port}", retries=1, backoff=0.0)
    with pytest.raises(GitHubError, match="GitHub unreachable") as caught:
        github.upsert_comment(REPO, 5, "x", ours)
    assert JOB not in str(caught.value)


def test_an_answer_cut_short_is_retried_then_a_clear_error() -> None:
    """A connection that closes before the body it announced is GitHub unreachable, not a
    crash of the step."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    answers = []

    def serve() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n[")
                answers.append(1)

    thread = threading.Thread(target=serve, daemon=True)  # never outlives a failed run
    thread.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    with server, pytest.raises(GitHubError, match="GitHub unreachable: IncompleteRead"):
        GitHub(JOB, api_url=url, retries=1, backoff=0.0).upsert_comment(REPO, 5, "x", ours)
    thread.join(timeout=10)
    assert len(answers) == 2, "retried once"


# -- the listener's calls ------------------------------------------------------------------


def test_the_listeners_commit_status_is_set_after_server_errors_are_retried(
    gh: FakeGitHub,
) -> None:
    statuses = rf"/repos/{REPO}/statuses/"
    gh.fail_next("POST", statuses, 502)
    client(gh).set_status(REPO, "a" * 40, "success", "ready")
    posted = [r for r in gh.requests if r["method"] == "POST"]
    assert [r["status"] for r in posted] == [502, 201]
    assert posted[-1]["json"]["context"] == "pgoverlay/branch"


def test_the_listener_reads_a_missing_collaborator_as_no_write_access(gh: FakeGitHub) -> None:
    gh.add_collaborator(REPO, "maya", "maintain")
    gh.add_collaborator(REPO, "tom", "triage")
    github = client(gh)
    assert github.can_write(REPO, "maya") is True  # maintain reads as write
    assert github.can_write(REPO, "tom") is False
    assert github.can_write(REPO, "mallory") is False  # 404: no such user


def test_the_listener_reads_pulls_and_labels_and_takes_a_label_off(gh: FakeGitHub) -> None:
    gh.add_pull(REPO, 6, "c" * 40, "b" * 40, labels=["db-preview", "bug"])
    github = client(gh)
    assert sorted(github.open_pulls(REPO)) == [5, 6]
    pull = github.pull(REPO, 6)
    assert pull is not None and pull["head"]["sha"] == "c" * 40
    assert github.pull(REPO, 99) is None
    assert sorted(github.labels(REPO, 6)) == ["bug", "db-preview"]
    github.remove_label(REPO, 6, "db-preview")
    github.remove_label(REPO, 6, "db-preview")  # already gone is fine
    assert github.labels(REPO, 6) == ["bug"]


def test_a_tarball_is_downloaded_after_a_server_error(gh: FakeGitHub, tmp_path: Path) -> None:
    gh.add_tarball(REPO, "a" * 40, b"the archive")
    gh.fail_next("GET", r"/tarball/", 503)
    client(gh).download_tarball(REPO, "a" * 40, tmp_path / "src.tar.gz")
    assert (tmp_path / "src.tar.gz").read_bytes() == b"the archive"
    with pytest.raises(GitHubError, match=r"could not download acme/shop@bbbbbbb \(HTTP 404\)"):
        client(gh).download_tarball(REPO, "b" * 40, tmp_path / "none.tar.gz")


# -- one retry and rate-limit path, for every caller ------------------------------------------
# The Action (a workflow's token), the listener (a GitHub App's installation) and the branch
# page (a reader's token) each make their calls through pgoverlay.github.rest: each one tries a
# server error again, waits out a rate limit GitHub says ends soon, and refuses at once to wait
# out one that ends in an hour, saying so.

APP_ID = 4242
READER = "gho_reader0000000000000000000000000000"
Call = Callable[[FakeGitHub], object]


def _as_action(fake: FakeGitHub) -> object:
    return client(fake).upsert_comment(REPO, 5, f"{MARK}\nx", ours)


def _as_listener(fake: FakeGitHub) -> object:
    settings = WebhookSettings(
        secret="s",
        app_id=APP_ID,
        private_key=_app_key(),
        api_url=fake.url,
        repositories={REPO: {}},
    )
    clients = GitHubClients(settings)
    clients.remember(REPO, 77)
    try:
        clients.for_repo(REPO).set_status(REPO, "a" * 40, "success", "ready")
        return None
    finally:
        clients.close()


def _as_page(fake: FakeGitHub) -> object:
    github = oauth.GitHubSignIn(web_url=fake.url, api_url=fake.url, client_id="", client_secret="")
    return github.access(READER, REPO, write_permission="write")


@functools.cache
def _app_key() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


CALLERS: dict[str, tuple[Call, str, str]] = {
    # the caller, the method and path of its call to fail, and the token it sends
    "action": (_as_action, "GET", COMMENTS),
    "listener": (_as_listener, "POST", rf"/repos/{REPO}/statuses/"),
    "page": (_as_page, "GET", rf"^/repos/{REPO}$"),
}


@pytest.fixture
def everyone(gh: FakeGitHub) -> FakeGitHub:
    gh.add_app(APP_ID, "pgoverlay")
    gh.add_token(READER, "rita")
    gh.add_collaborator(REPO, "rita", "write")
    return gh


def _tried(fake: FakeGitHub, method: str, path: str) -> list[int]:
    return [
        r["status"] for r in fake.requests if r["method"] == method and re.search(path, r["path"])
    ]


@pytest.mark.parametrize("kind", sorted(CALLERS))
def test_every_caller_tries_a_server_error_again_and_waits_out_a_short_rate_limit(
    everyone: FakeGitHub, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    call, method, path = CALLERS[kind]
    everyone.fail_next(method, path, 502)
    limited = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time()))}
    body = {"message": "API rate limit exceeded for installation ID 77."}
    everyone.fail_next(method, path, 403, headers=limited, body=body)
    call(everyone)
    assert _tried(everyone, method, path) == [502, 403, 201 if method == "POST" else 200]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "Retry" in logged  # urllib3's lines are there, and hold no token
    assert not any(secret in logged for secret in (JOB, READER, "ghs_", "Bearer"))


@pytest.mark.parametrize("kind", sorted(CALLERS))
def test_every_caller_refuses_at_once_a_rate_limit_that_ends_in_an_hour(
    everyone: FakeGitHub, kind: str
) -> None:
    call, method, path = CALLERS[kind]
    limited = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time()) + 3600)}
    body = {"message": "API rate limit exceeded"}
    everyone.fail_next(method, path, 403, headers=limited, body=body)
    with pytest.raises(GitHubError, match=r"rate limited for 3[56]\d\d s more") as caught:
        call(everyone)
    assert _tried(everyone, method, path) == [403]
    for secret in (JOB, READER, "ghs_"):
        assert secret not in str(caught.value)
