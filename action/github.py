"""The GitHub side of the PR workflow, through PyGithub: the one sticky comment.

Honours ``GITHUB_API_URL`` (GitHub Enterprise works the same way). Server errors and rate
limits are retried a bounded number of times (PyGithub's ``GithubRetry``, which also waits out
secondary rate limits and ``Retry-After``); PyGithub does not retry a 502 by itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from github import Auth, Github, GithubException, GithubRetry

log = logging.getLogger(__name__)

ACTIONS_BOT = "github-actions[bot]"
RETRY_STATUSES = frozenset({500, 502, 503, 504})


@dataclass(frozen=True)
class CommentResult:
    id: int
    action: Literal["created", "updated", "unchanged"]
    url: str


class GitHubError(Exception):
    """A GitHub call failed after its retries; the message is safe to show."""


def _reason(err: GithubException) -> str:
    message = err.data.get("message") if isinstance(err.data, dict) else None
    return f"HTTP {err.status}: {message or 'no message'}"


class GitHub:
    def __init__(
        self,
        token: str,
        *,
        api_url: str,
        retries: int = 4,
        backoff: float = 1.0,
        timeout: float = 30.0,
    ) -> None:
        retry = GithubRetry(
            total=retries,
            backoff_factor=backoff,
            status_forcelist=sorted(RETRY_STATUSES),
            secondary_rate_wait=60,
        )
        self._gh = Github(
            auth=Auth.Token(token),
            base_url=api_url.rstrip("/"),
            retry=retry,
            timeout=int(timeout),
            per_page=100,
            lazy=True,
        )
        self._login: str | None = None

    def close(self) -> None:
        self._gh.close()

    def login(self) -> str:
        """Who we comment as. The job's token cannot read /user: it acts as github-actions[bot]."""
        if self._login is None:
            try:
                self._login = self._gh.get_user().login
            except GithubException as err:
                if err.status not in (401, 403, 404):
                    raise GitHubError(
                        f"cannot tell who the token belongs to ({_reason(err)})"
                    ) from None
                self._login = ACTIONS_BOT
        return self._login

    def upsert_comment(
        self, repository: str, pr: int, body: str, is_ours: Callable[[str | None], bool]
    ) -> CommentResult:
        """Edit the PR's comment that ``is_ours`` recognises and we wrote, or create one.

        Every page of comments is searched; a comment with our marker written by someone else
        is ignored. Nothing is sent when the body is unchanged.
        """
        try:
            me = self.login()
            pull = self._gh.get_repo(repository).get_pull(pr)
            for comment in pull.get_issue_comments():
                if comment.user is not None and comment.user.login == me and is_ours(comment.body):
                    if comment.body == body:
                        return CommentResult(comment.id, "unchanged", comment.html_url)
                    comment.edit(body)
                    return CommentResult(comment.id, "updated", comment.html_url)
            created = pull.create_issue_comment(body)
            return CommentResult(created.id, "created", created.html_url)
        except GithubException as err:
            raise GitHubError(f"could not write the PR comment ({_reason(err)})") from None
