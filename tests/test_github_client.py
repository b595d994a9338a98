"""The GitHub client's HTTP behaviour: the sticky comment against the fake GitHub API (real
HTTP, checked against GitHub's OpenAPI description), the listener's PyGithub calls with
`responses` standing in for GitHub."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator

import pytest
import responses

from fakegithub import FakeGitHub
from pgoverlay.action.comment import has_marker, marker
from pgoverlay.action.github import ACTIONS_BOT, GitHub
from pgoverlay.errors import GitHubError

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


# -- the listener's calls, through PyGithub ------------------------------------------------

API = "http://ghe.example.com:8080/api/v3"


@responses.activate
def test_the_listeners_commit_status_is_set_after_server_errors_are_retried() -> None:
    url = f"{API}/repos/{REPO}/statuses/{'c' * 40}"
    responses.post(url, status=502, json={"message": "Bad gateway"})
    responses.post(url, status=201, json={"id": 1, "state": "success"})
    GitHub("ghs_token", api_url=API, backoff=0.0).set_status(REPO, "c" * 40, "success", "ready")
    posted = [c for c in responses.calls if c.request.method == "POST"]
    assert len(posted) == 2
    body = posted[-1].request.body
    assert isinstance(body, bytes | str)
    assert json.loads(body)["context"] == "pgoverlay/branch"


@responses.activate
def test_the_listener_reads_a_missing_collaborator_as_no_write_access() -> None:
    responses.get(
        f"{API}/repos/{REPO}/collaborators/mallory/permission",
        status=404,
        json={"message": "Not Found"},
    )
    assert GitHub("ghs_token", api_url=API).can_write(REPO, "mallory") is False
