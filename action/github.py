"""The GitHub side of the PR workflow, through PyGithub: the one sticky comment.

Honours ``GITHUB_API_URL`` (GitHub Enterprise works the same way). Server errors and rate
limits are retried a bounded number of times (PyGithub's ``GithubRetry``, which also waits out
secondary rate limits and ``Retry-After``); PyGithub does not retry a 502 by itself.

PyGithub (and requests) are imported when a ``GitHub`` is made: a step that comments on
nothing does not pay for them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pgoverlay.errors import GitHubError

if TYPE_CHECKING:
    from github import Auth, Github, GithubException
    from github.IssueComment import IssueComment

log = logging.getLogger(__name__)

ACTIONS_BOT = "github-actions[bot]"
RETRY_STATUSES = frozenset({500, 502, 503, 504})
STATUS_CONTEXT = "pgoverlay/branch"
# The permission levels that may approve a fork's pull request: GitHub reports the maintain
# role (and custom roles built on write) as "write", and triage as "read".
WRITERS = frozenset({"admin", "write"})


@dataclass(frozen=True)
class CommentResult:
    id: int
    action: Literal["created", "updated", "unchanged"]
    url: str


@dataclass(frozen=True)
class Existing:
    """Our comment as it was found: its id, text and address, and PyGithub's object to edit."""

    id: int
    body: str | None
    url: str
    handle: IssueComment


def _reason(err: GithubException) -> str:
    message = err.data.get("message") if isinstance(err.data, dict) else None
    return f"HTTP {err.status}: {message or 'no message'}"


class GitHub:
    def __init__(
        self,
        token: str | Auth.Auth,
        *,
        api_url: str,
        retries: int = 4,
        backoff: float = 1.0,
        timeout: float = 30.0,
    ) -> None:
        self._token = token
        self._login: str | None = None
        self._api_url = api_url.rstrip("/")
        self._timeout = timeout
        self._retries = retries
        self._backoff = backoff
        self._client: Github | None = None

    @property
    def _auth(self) -> Auth.Auth:
        from github import Auth

        return Auth.Token(self._token) if isinstance(self._token, str) else self._token

    @property
    def _gh(self) -> Github:
        """PyGithub's client, made (and PyGithub imported) at the first call to the API."""
        if self._client is None:
            from github import Github, GithubRetry

            retry = GithubRetry(
                total=self._retries,
                backoff_factor=self._backoff,
                status_forcelist=sorted(RETRY_STATUSES),
                secondary_rate_wait=60,
            )
            self._client = Github(
                auth=self._auth,
                base_url=self._api_url,
                retry=retry,
                timeout=int(self._timeout),
                per_page=100,
                lazy=True,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def login(self) -> str:
        """Who we comment as. The job's token cannot read /user: it acts as github-actions[bot].

        Asked once, outside PyGithub, retrying server errors only: PyGithub's retry looks at
        every 403 and logs the job token's normal answer as a failed request."""
        if self._login is None:
            import requests
            from requests.adapters import HTTPAdapter
            from urllib3.util.retry import Retry

            headers = {"Accept": "application/vnd.github+json"}
            self._auth_header(headers)
            retry = Retry(
                total=self._retries,
                backoff_factor=self._backoff,
                status_forcelist=sorted(RETRY_STATUSES),
                allowed_methods=["GET"],
                raise_on_status=False,
            )
            try:
                with requests.Session() as session:
                    session.mount(self._api_url, HTTPAdapter(max_retries=retry))
                    resp = session.get(
                        f"{self._api_url}/user", headers=headers, timeout=self._timeout
                    )
            except requests.RequestException as err:
                raise GitHubError(
                    f"cannot tell who the token belongs to ({type(err).__name__})"
                ) from None
            if resp.status_code in (401, 403, 404):
                self._login = ACTIONS_BOT
            elif resp.status_code != 200:
                raise GitHubError(f"cannot tell who the token belongs to (HTTP {resp.status_code})")
            else:
                self._login = str(resp.json()["login"])
        return self._login

    def upsert_comment(
        self, repository: str, pr: int, body: str, is_ours: Callable[[str | None], bool]
    ) -> CommentResult:
        """Edit the PR's comment that ``is_ours`` recognises and we wrote, or create one.

        Every page of comments is searched; a comment with our marker written by someone else
        is ignored. Nothing is sent when the body is unchanged. Who we are is asked only when a
        comment has our marker: a pull request's first run makes two calls, not three.
        """
        return self.write_comment(repository, pr, body, self.find_comment(repository, pr, is_ours))

    def find_comment(
        self, repository: str, pr: int, is_ours: Callable[[str | None], bool]
    ) -> Existing | None:
        """Our comment on the PR (the first that ``is_ours`` recognises and we wrote), or None.

        The issue is addressed without reading it (PyGithub's lazy objects): listing its
        comments is the one call, plus who we are when a comment has our marker."""
        from github import GithubException

        try:
            for comment in self._gh.get_repo(repository).get_issue(pr).get_comments():
                if (
                    comment.user is not None
                    and is_ours(comment.body)
                    and comment.user.login == self.login()
                ):
                    return Existing(comment.id, comment.body, comment.html_url, comment)
        except GithubException as err:
            raise GitHubError(f"could not read the PR's comments ({_reason(err)})") from None
        return None

    def write_comment(
        self, repository: str, pr: int, body: str, existing: Existing | None
    ) -> CommentResult:
        """Make ``body`` the PR's comment: edit ``existing`` (nothing is sent when its text is
        already ``body``), or create one when there is none, or it was deleted meanwhile."""
        from github import GithubException

        try:
            if existing is not None:
                if existing.body == body:
                    return CommentResult(existing.id, "unchanged", existing.url)
                try:
                    existing.handle.edit(body)
                    return CommentResult(existing.id, "updated", existing.url)
                except GithubException as err:
                    if err.status != 404:
                        raise
            created = self._gh.get_repo(repository).get_issue(pr).create_comment(body)
            return CommentResult(created.id, "created", created.html_url)
        except GithubException as err:
            raise GitHubError(f"could not write the PR comment ({_reason(err)})") from None

    def prefetch_comment(
        self, repository: str, pr: int, is_ours: Callable[[str | None], bool]
    ) -> PendingComment:
        """Start looking for our comment now, in a thread, and write it later: PyGithub's import
        and the listing then overlap the branch and its migrations, and the step waits only for
        the write."""
        return PendingComment(self, repository, pr, is_ours)

    # -- used by the webhook listener -------------------------------------------------------

    def set_status(self, repository: str, sha: str, state: str, description: str) -> None:
        """The `pgoverlay/branch` commit status a repository can require."""
        from github import GithubException

        try:
            self._gh.get_repo(repository).get_commit(sha).create_status(
                state=state, description=description[:140], context=STATUS_CONTEXT
            )
        except GithubException as err:
            raise GitHubError(f"could not set the commit status ({_reason(err)})") from None

    def open_pulls(self, repository: str) -> list[int]:
        """Numbers of every open pull request (all pages)."""
        from github import GithubException

        try:
            return [p.number for p in self._gh.get_repo(repository).get_pulls(state="open")]
        except GithubException as err:
            raise GitHubError(f"could not list open pull requests ({_reason(err)})") from None

    def pull(self, repository: str, number: int) -> dict[str, Any] | None:
        """The pull request as the API has it now (state, head, base, labels, draft), or None
        if it is gone: what a worker acts on, rather than on a delivery that may be stale."""
        from github import GithubException

        try:
            return dict(self._gh.get_repo(repository).get_pull(number).raw_data)
        except GithubException as err:
            if err.status == 404:
                return None
            raise GitHubError(f"could not read pull request #{number} ({_reason(err)})") from None

    def labels(self, repository: str, number: int) -> list[str]:
        """The names of the labels on the pull request now."""
        from github import GithubException

        try:
            issue = self._gh.get_repo(repository).get_issue(number)
            return [label.name for label in issue.get_labels()]
        except GithubException as err:
            raise GitHubError(f"could not list the labels of #{number} ({_reason(err)})") from None

    def remove_label(self, repository: str, number: int, label: str) -> None:
        """Take ``label`` off the pull request (already gone is fine)."""
        from github import GithubException

        try:
            self._gh.get_repo(repository).get_issue(number).remove_from_labels(label)
        except GithubException as err:
            if err.status == 404:
                return
            raise GitHubError(f"could not remove the label {label!r} ({_reason(err)})") from None

    def can_write(self, repository: str, login: str) -> bool:
        """Whether ``login`` has write, maintain or admin rights on the repository."""
        from github import GithubException

        try:
            answer = self._gh.get_repo(repository).get_collaborator_permission(login)
        except GithubException as err:
            if err.status == 404:
                return False
            raise GitHubError(f"could not read {login}'s permission ({_reason(err)})") from None
        return answer in WRITERS

    def download_tarball(self, repository: str, ref: str, dest: Path) -> None:
        """The repository at ``ref`` as a tarball, through the API (no git credentials)."""
        import requests

        headers = {"Accept": "application/vnd.github+json"}
        self._auth_header(headers)
        url = f"{self._api_url}/repos/{repository}/tarball/{ref}"
        try:
            with requests.get(url, headers=headers, timeout=self._timeout, stream=True) as resp:
                if resp.status_code != 200:
                    raise GitHubError(
                        f"could not download {repository}@{ref[:7]} (HTTP {resp.status_code})"
                    )
                with dest.open("wb") as handle:
                    for chunk in resp.iter_content(1 << 16):
                        handle.write(chunk)
        except requests.RequestException as err:
            raise GitHubError(
                f"could not download {repository}@{ref[:7]}: {type(err).__name__}"
            ) from None

    def _auth_header(self, headers: dict[str, str]) -> None:
        # PyGithub's auth objects know how to make (and refresh) the header value.
        self._auth.authentication(headers)


class PendingComment:
    """Our comment on a PR, looked for in a daemon thread from the moment this is made; ``write``
    waits for the search, then edits or creates. An error of the search is raised by ``write``,
    where the caller expects GitHub's errors."""

    def __init__(
        self, github: GitHub, repository: str, pr: int, is_ours: Callable[[str | None], bool]
    ) -> None:
        self._github, self._repository, self._pr = github, repository, pr
        self._found: Existing | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._find, args=(is_ours,), name="pgoverlay-comment", daemon=True
        )
        self._thread.start()

    def _find(self, is_ours: Callable[[str | None], bool]) -> None:
        try:
            self._found = self._github.find_comment(self._repository, self._pr, is_ours)
        except BaseException as err:  # handed to write(), in the caller's thread
            self._error = err

    def write(self, body: str) -> CommentResult:
        """Make ``body`` the PR's comment, once the search is done."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._github.write_comment(self._repository, self._pr, body, self._found)
