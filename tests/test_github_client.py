"""The comment client's HTTP behaviour, with `responses` standing in for GitHub."""

from __future__ import annotations

import json
import logging

import pytest
import responses

from pgoverlay.action.comment import has_marker, marker
from pgoverlay.action.github import GitHub
from pgoverlay.errors import GitHubError

API = "http://ghe.example.com:8080/api/v3"
MARK = marker("acme/shop", 5, "pr-5")


def comment(cid: int, body: str, login: str) -> dict[str, object]:
    return {
        "id": cid,
        "body": body,
        "user": {"login": login, "id": cid, "type": "Bot"},
        "html_url": f"https://ghe.example.com/acme/shop/pull/5#issuecomment-{cid}",
        "url": f"{API}/repos/acme/shop/issues/comments/{cid}",
    }


def pull() -> dict[str, object]:
    return {
        "number": 5,
        "url": f"{API}/repos/acme/shop/pulls/5",
        "issue_url": f"{API}/repos/acme/shop/issues/5",
        "comments_url": f"{API}/repos/acme/shop/issues/5/comments",
    }


def client() -> GitHub:
    return GitHub("ghs_token", api_url=API, backoff=0.0)


def mock_common(rsps: responses.RequestsMock, pages: list[list[dict[str, object]]]) -> None:
    rsps.get(f"{API}/user", status=403, json={"message": "Resource not accessible by integration"})
    rsps.get(f"{API}/repos/acme/shop/pulls/5", json=pull())
    url = f"{API}/repos/acme/shop/issues/5/comments"
    for number, page in enumerate(pages, start=1):
        links = []
        if number < len(pages):
            links.append(f'<{url}?per_page=100&page={number + 1}>; rel="next"')
            links.append(f'<{url}?per_page=100&page={len(pages)}>; rel="last"')
        rsps.get(
            url,
            json=page,
            headers={"Link": ", ".join(links)} if links else {},
            match=[
                responses.matchers.query_param_matcher(
                    {"per_page": "100"} | ({"page": str(number)} if number > 1 else {})
                )
            ],
        )


@responses.activate
def test_our_comment_on_a_later_page_is_edited_and_a_spoofed_one_is_ignored() -> None:
    spoof = comment(1, f"{MARK}\nfake", "mallory")
    ours = comment(2, f"{MARK}\nold", "github-actions[bot]")
    mock_common(responses.mock, [[spoof], [comment(3, "hi", "alice"), ours]])
    responses.patch(
        f"{API}/repos/acme/shop/issues/comments/2",
        json=comment(2, f"{MARK}\nnew", "github-actions[bot]"),
    )
    result = client().upsert_comment(
        "acme/shop", 5, f"{MARK}\nnew", lambda body: has_marker(body, MARK)
    )
    assert (result.id, result.action) == (2, "updated")
    patch = [c for c in responses.calls if c.request.method == "PATCH"]
    assert len(patch) == 1 and json.loads(patch[0].request.body or b"{}") == {
        "body": f"{MARK}\nnew"
    }


@responses.activate
def test_an_unchanged_comment_is_not_sent_again() -> None:
    mock_common(responses.mock, [[comment(2, f"{MARK}\nsame", "github-actions[bot]")]])
    result = client().upsert_comment(
        "acme/shop", 5, f"{MARK}\nsame", lambda body: has_marker(body, MARK)
    )
    assert result.action == "unchanged"
    assert [c.request.method for c in responses.calls if c.request.method != "GET"] == []


@responses.activate
def test_a_missing_comment_is_created_after_server_errors_are_retried() -> None:
    mock_common(responses.mock, [[]])
    url = f"{API}/repos/acme/shop/issues/5/comments"
    responses.post(url, status=502, json={"message": "Bad gateway"})
    responses.post(url, status=201, json=comment(9, f"{MARK}\nx", "github-actions[bot]"))
    result = client().upsert_comment(
        "acme/shop", 5, f"{MARK}\nx", lambda body: has_marker(body, MARK)
    )
    assert (result.id, result.action) == (9, "created")


@responses.activate
def test_a_refused_comment_is_a_clear_error_without_the_token() -> None:
    mock_common(responses.mock, [[]])
    responses.post(
        f"{API}/repos/acme/shop/issues/5/comments",
        status=403,
        json={"message": "Resource not accessible by integration"},
    )
    with pytest.raises(GitHubError, match="HTTP 403: Resource not accessible") as caught:
        client().upsert_comment("acme/shop", 5, "x", lambda body: False)
    assert "ghs_token" not in str(caught.value)


@responses.activate
def test_the_job_tokens_normal_403_on_user_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG - 9)  # everything, down to urllib3's retry lines
    mock_common(responses.mock, [[comment(2, f"{MARK}\nsame", "github-actions[bot]")]])
    result = client().upsert_comment(
        "acme/shop", 5, f"{MARK}\nsame", lambda body: has_marker(body, MARK)
    )
    assert result.action == "unchanged", "the job token is known as github-actions[bot]"
    noisy = [r for r in caplog.records if r.levelno >= logging.INFO and "/user" in r.getMessage()]
    assert noisy == []


@responses.activate
def test_a_first_run_lists_then_creates_without_reading_the_pull_request() -> None:
    mock_common(responses.mock, [[comment(3, "hi", "alice")]])
    responses.post(
        f"{API}/repos/acme/shop/issues/5/comments",
        status=201,
        json=comment(9, f"{MARK}\nx", "github-actions[bot]"),
    )
    result = client().upsert_comment(
        "acme/shop", 5, f"{MARK}\nx", lambda body: has_marker(body, MARK)
    )
    assert (result.id, result.action) == (9, "created")
    calls = [(c.request.method, (c.request.url or "").split("?")[0]) for c in responses.calls]
    assert calls == [
        ("GET", f"{API}/repos/acme/shop/issues/5/comments"),
        ("POST", f"{API}/repos/acme/shop/issues/5/comments"),
    ]


@responses.activate
def test_a_prefetched_comment_deleted_before_the_write_is_created_again() -> None:
    mock_common(responses.mock, [[comment(2, f"{MARK}\nold", "github-actions[bot]")]])
    responses.patch(f"{API}/repos/acme/shop/issues/comments/2", status=404, json={})
    responses.post(
        f"{API}/repos/acme/shop/issues/5/comments",
        status=201,
        json=comment(7, f"{MARK}\nnew", "github-actions[bot]"),
    )
    pending = client().prefetch_comment("acme/shop", 5, lambda body: has_marker(body, MARK))
    result = pending.write(f"{MARK}\nnew")
    assert (result.id, result.action) == (7, "created")


@responses.activate
def test_a_failed_search_is_the_writes_error_without_the_token() -> None:
    responses.get(
        f"{API}/repos/acme/shop/issues/5/comments",
        status=403,
        json={"message": "Resource not accessible by integration"},
    )
    pending = client().prefetch_comment("acme/shop", 5, lambda body: has_marker(body, MARK))
    with pytest.raises(GitHubError, match="HTTP 403: Resource not accessible") as caught:
        pending.write(f"{MARK}\nx")
    assert "ghs_token" not in str(caught.value)
    assert [c.request.method for c in responses.calls] == ["GET"]
