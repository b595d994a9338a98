"""The GitHub side of the PR workflow: the one sticky comment and the pull request's Deployment
(the Action and the listener), and what the listener alone asks (commit statuses, pulls,
labels, permissions, tarballs).

The comment and the Deployment go through the standard library's ``urllib.request``, a few
REST calls (``_request``): PyGithub's import, with requests, jwt and cryptography, took a
closing step about 0.4 s, more than everything else the step does (docs/benchmarks.md,
"process"). The listener's own calls go through PyGithub, imported when first used.

Honours ``GITHUB_API_URL`` (GitHub Enterprise works the same way) and the usual proxy
variables (``https_proxy``, ``no_proxy``). Server errors and rate limits are retried a bounded
number of times: 500, 502, 503 and 504 after a growing pause, a rate limit after its
``Retry-After`` (or its reset time, at most ``MAX_RATE_WAIT`` seconds); PyGithub's calls with
its ``GithubRetry``, which does the same.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from pgoverlay.action.markdown import inert
from pgoverlay.errors import GitHubError

if TYPE_CHECKING:
    from github import Auth, Github, GithubException

log = logging.getLogger(__name__)

ACTIONS_BOT = "github-actions[bot]"
RETRY_STATUSES = frozenset({500, 502, 503, 504})
MAX_RATE_WAIT = 120.0  # seconds a rate-limited request waits before it is an error
USER_AGENT = "pgoverlay"
STATUS_CONTEXT = "pgoverlay/branch"
# The permission levels that may approve a fork's pull request: GitHub reports the maintain
# role (and custom roles built on write) as "write", and triage as "read".
WRITERS = frozenset({"admin", "write"})
DESCRIPTION = 140  # characters GitHub keeps of a deployment's or a status's description


def _description(text: str) -> str:
    """A deployment's or a commit status's description: it may hold a pull request's text (a
    failure's reason), so nothing in it mentions anyone or references an issue; then cut to
    GitHub's limit."""
    return inert(text)[:DESCRIPTION]


@dataclass(frozen=True)
class CommentResult:
    id: int
    action: Literal["created", "updated", "unchanged"]
    url: str


@dataclass(frozen=True)
class Deployed:
    """One of the environment's deployments: its id, its head and its latest state."""

    id: int
    sha: str
    state: str | None  # None: no status yet


@dataclass(frozen=True)
class Existing:
    """Our comment as it was found: its id, text and address."""

    id: int
    body: str | None
    url: str


@dataclass(frozen=True)
class Answer:
    """One REST answer: its status, its JSON (None when it has none) and its next page."""

    status: int
    data: Any
    next_url: str | None

    @property
    def reason(self) -> str:
        message = self.data.get("message") if isinstance(self.data, dict) else None
        return f"HTTP {self.status}: {message or 'no message'}"


def _next_page(link: str | None) -> str | None:
    """The rel="next" address of a Link header."""
    for part in (link or "").split(","):
        address, _, params = part.partition(";")
        if 'rel="next"' in params:
            return address.strip().removeprefix("<").removesuffix(">")
    return None


def _reason(err: GithubException) -> str:
    message = err.data.get("message") if isinstance(err.data, dict) else None
    return f"HTTP {err.status}: {message or 'no message'}"


def _deploy_reason(answer: Answer) -> str:
    """GitHub's answer; for a 403, what the workflow must grant."""
    if answer.status == 403:
        return f"{answer.reason}: the token needs the `deployments: write` permission"
    return answer.reason


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
        if not api_url.startswith(("https://", "http://")):
            raise GitHubError(
                f"the GitHub API address {api_url!r} is not http(s): check GITHUB_API_URL"
            )
        self._token = token
        self._login: str | None = None
        self._api_url = api_url.rstrip("/")
        self._timeout = timeout
        self._retries = retries
        self._backoff = backoff
        self._client: Github | None = None
        self._making = threading.Lock()

    @property
    def _auth(self) -> Auth.Auth:
        from github import Auth

        return Auth.Token(self._token) if isinstance(self._token, str) else self._token

    @property
    def _gh(self) -> Github:
        """PyGithub's client, made (and PyGithub imported) at the first call to the API."""
        with self._making:  # the Action's deployment thread and its main thread
            return self._made()

    def _made(self) -> Github:
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

    # -- REST, for the comment ----------------------------------------------------------------

    def _request(self, method: str, target: str, body: Any = None, *, what: str) -> Answer:
        """One REST call (``target``: a path under the API, or a full address from a Link
        header), retried as the module says. Any answer comes back, errors included; a failure
        to reach GitHub at all is a GitHubError that starts with ``what``."""
        import http.client
        import urllib.error
        import urllib.request

        url = target if "://" in target else f"{self._api_url}{target}"
        if not url.startswith(f"{self._api_url}/"):  # a Link header's page elsewhere
            raise GitHubError(f"{what} (GitHub sent a page outside {self._api_url}: not followed)")
        headers = {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
            "User-Agent": USER_AGENT,
        }
        self._auth_header(headers)
        # Not sent on to wherever a redirect points: urllib would pass it to any host.
        authorization = headers.pop("Authorization")
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        attempt = 0
        while True:
            attempt += 1
            request = urllib.request.Request(  # noqa: S310 (see urlopen)
                url, data=data, headers=headers, method=method
            )
            request.add_unredirected_header("Authorization", authorization)
            try:
                # The address is the API's (checked above, its scheme in __init__).
                with urllib.request.urlopen(request, timeout=self._timeout) as resp:  # noqa: S310
                    status, head, raw = resp.status, resp.headers, resp.read()
            except urllib.error.HTTPError as err:
                status, head, raw = err.code, err.headers, err.read()
            except (OSError, ValueError, http.client.HTTPException) as err:
                # refused, reset, timed out, bad TLS, an answer cut short
                if attempt <= self._retries:
                    self._pause(attempt)
                    continue
                raise GitHubError(f"{what} (GitHub unreachable: {type(err).__name__})") from None
            wait = self._rate_wait(status, head)
            if attempt <= self._retries and (status in RETRY_STATUSES or wait is not None):
                if wait is not None and wait > MAX_RATE_WAIT:
                    raise GitHubError(
                        f"{what} (rate limited for {wait:.0f} s more: run the job again later)"
                    )
                self._pause(attempt, wait)
                continue
            try:
                decoded = json.loads(raw) if raw else None
            except ValueError:
                decoded = None
            return Answer(status, decoded, _next_page(head.get("Link")))

    def _pause(self, attempt: int, wait: float | None = None) -> None:
        time.sleep(wait if wait is not None else self._backoff * 2 ** (attempt - 1))

    @staticmethod
    def _rate_wait(status: int, head: Any) -> float | None:
        """Seconds to wait out a rate limit, or None when the answer is not one."""
        if status not in (403, 429):
            return None
        after = head.get("Retry-After")
        if after is not None and after.strip().isdigit():
            return float(after)
        if head.get("X-RateLimit-Remaining") == "0":
            reset = head.get("X-RateLimit-Reset", "")
            return max(0.0, float(reset) - time.time()) if reset.isdigit() else 60.0
        return 60.0 if status == 429 else None

    def _pages(self, path: str, *, what: str) -> Iterator[Any]:
        """Every item of a listing, page after page (Link: rel="next")."""
        target: str | None = path
        while target is not None:
            answer = self._request("GET", target, what=what)
            if answer.status != 200 or not isinstance(answer.data, list):
                raise GitHubError(f"{what} ({answer.reason})")
            yield from answer.data
            target = answer.next_url

    def login(self) -> str:
        """Who we comment as. The job's token cannot read /user: it acts as github-actions[bot]
        (GitHub answers 403, a normal answer for it, not logged as a failure)."""
        if self._login is None:
            what = "cannot tell who the token belongs to"
            answer = self._request("GET", "/user", what=what)
            if answer.status in (401, 403, 404):
                self._login = ACTIONS_BOT
            elif answer.status != 200 or not isinstance(answer.data, dict):
                raise GitHubError(f"{what} ({answer.reason})")
            else:
                self._login = str(answer.data["login"])
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

        Listing the issue's comments is the one call (a page per 100), plus who we are when a
        comment has our marker."""
        path = f"/repos/{repository}/issues/{pr}/comments?per_page=100"
        for comment in self._pages(path, what="could not read the PR's comments"):
            user = comment.get("user") or {}
            body = comment.get("body")
            if user and is_ours(body) and user.get("login") == self.login():
                return Existing(int(comment["id"]), body, str(comment["html_url"]))
        return None

    def write_comment(
        self, repository: str, pr: int, body: str, existing: Existing | None
    ) -> CommentResult:
        """Make ``body`` the PR's comment: edit ``existing`` (nothing is sent when its text is
        already ``body``), or create one when there is none, or it was deleted meanwhile."""
        what = "could not write the PR comment"
        if existing is not None:
            if existing.body == body:
                return CommentResult(existing.id, "unchanged", existing.url)
            path = f"/repos/{repository}/issues/comments/{existing.id}"
            edited = self._request("PATCH", path, {"body": body}, what=what)
            if edited.status == 200:
                return CommentResult(existing.id, "updated", existing.url)
            if edited.status != 404:
                raise GitHubError(f"{what} ({edited.reason})")
        path = f"/repos/{repository}/issues/{pr}/comments"
        created = self._request("POST", path, {"body": body}, what=what)
        if created.status != 201 or not isinstance(created.data, dict):
            raise GitHubError(f"{what} ({created.reason})")
        return CommentResult(int(created.data["id"]), "created", str(created.data["html_url"]))

    def prefetch_comment(
        self, repository: str, pr: int, is_ours: Callable[[str | None], bool]
    ) -> PendingComment:
        """Start looking for our comment now, in a thread, and write it later: the listing then
        overlaps the branch and its migrations, and the step waits only for the write."""
        return PendingComment(self, repository, pr, is_ours)

    # -- the pull request's Deployment (both front ends) ---------------------------------------
    # REST calls, as the comment's: the Action's step imports no PyGithub (module docstring).

    def deployments(self, repository: str, environment: str, *, limit: int) -> list[Deployed]:
        """The newest ``limit`` deployments to ``environment``, newest first, each with its
        latest state (None: it has no status yet): one call, and one more per deployment."""
        what = "could not list the deployments"
        wanted = f"environment={quote(environment, safe='')}&per_page={limit}"
        answer = self._request("GET", f"/repos/{repository}/deployments?{wanted}", what=what)
        if answer.status != 200 or not isinstance(answer.data, list):
            raise GitHubError(f"{what} ({_deploy_reason(answer)})")
        found = []
        for d in answer.data[:limit]:
            path = f"/repos/{repository}/deployments/{int(d['id'])}/statuses?per_page=1"
            statuses = self._request("GET", path, what=what)
            if statuses.status != 200 or not isinstance(statuses.data, list):
                raise GitHubError(f"{what} ({_deploy_reason(statuses)})")
            latest = str(statuses.data[0]["state"]) if statuses.data else None  # newest first
            found.append(Deployed(int(d["id"]), str(d["sha"]), latest))
        return found

    def create_deployment(
        self, repository: str, *, sha: str, environment: str, description: str
    ) -> int:
        """A deployment of ``sha`` to the transient ``environment``; its id. No merge of the
        default branch into the head (``auto_merge``), no wait on commit statuses (the
        listener's own `pgoverlay/branch` is pending then)."""
        what = "could not create the deployment"
        body = {
            "ref": sha,
            "environment": environment,
            "auto_merge": False,
            "required_contexts": [],
            "transient_environment": True,
            "production_environment": False,
            "description": _description(description),
        }
        made = self._request("POST", f"/repos/{repository}/deployments", body, what=what)
        if made.status != 201 or not isinstance(made.data, dict):
            raise GitHubError(f"{what} ({_deploy_reason(made)})")
        return int(made.data["id"])

    def deployment_status(
        self,
        repository: str,
        deployment: int,
        *,
        state: str,
        description: str,
        environment_url: str = "",
        log_url: str = "",
    ) -> None:
        """Give the deployment ``state``: ``success`` with the branch page as its
        ``environment_url``, ``failure``, or ``inactive``. ``auto_inactive`` is asked, though
        GitHub applies it to non-transient environments only (``deployment.py`` retires the
        earlier ones)."""
        what = "could not set the deployment's status"
        body: dict[str, Any] = {
            "state": state,
            "description": _description(description),
            "auto_inactive": True,
        }
        if environment_url:
            body["environment_url"] = environment_url
        if log_url:
            body["log_url"] = log_url
        path = f"/repos/{repository}/deployments/{deployment}/statuses"
        done = self._request("POST", path, body, what=what)
        if done.status != 201:
            raise GitHubError(f"{what} ({_deploy_reason(done)})")

    # -- used by the webhook listener -------------------------------------------------------

    def set_status(self, repository: str, sha: str, state: str, description: str) -> None:
        """The `pgoverlay/branch` commit status a repository can require."""
        from github import GithubException

        try:
            self._gh.get_repo(repository).get_commit(sha).create_status(
                state=state, description=_description(description), context=STATUS_CONTEXT
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
        if isinstance(self._token, str):
            headers["Authorization"] = f"token {self._token}"
            return
        # The listener's GitHub App auth: PyGithub's object makes (and refreshes) the token,
        # once its client has bound it to a requester.
        _ = self._gh
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
