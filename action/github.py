"""The GitHub side of the PR workflow: the one sticky comment and the pull request's Deployment
(the Action and the listener), and what the listener alone asks (commit statuses, pulls,
labels, permissions, tarballs).

Every call goes through GitHub's one client, ``pgoverlay.github.rest`` (its retry and rate
limits, the addresses a token may go to); this module says what each call is and words its
failure as a ``GitHubError`` naming the call and GitHub's answer, never the token. It is the
PR workflow's view of its forge: a second forge would be a module with these methods
(docs/architecture.md, "GitHub, and a second forge").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from pgoverlay.action.markdown import inert
from pgoverlay.errors import GitHubError
from pgoverlay.github.grammar import ACTIONS_BOT, WRITERS
from pgoverlay.github.rest import Answer, Auth, Rest, Token

STATUS_CONTEXT = "pgoverlay/branch"
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


def _deploy_reason(answer: Answer) -> str:
    """GitHub's answer; for a 403, what the workflow must grant."""
    if answer.status == 403:
        return f"{answer.reason}: the token needs the `deployments: write` permission"
    return answer.reason


class GitHub:
    """The PR workflow's calls to GitHub, as ``token`` (a workflow's or a person's token) or
    ``auth`` (the listener's GitHub App installation)."""

    def __init__(
        self,
        token: str | Auth,
        *,
        api_url: str,
        retries: int = 4,
        backoff: float = 1.0,
        timeout: float = 30.0,
    ) -> None:
        auth = Token(token) if isinstance(token, str) else token
        self._rest = Rest(api_url, auth=auth, retries=retries, backoff=backoff, timeout=timeout)
        self._login: str | None = None

    def close(self) -> None:
        self._rest.close()

    # -- the sticky comment (both front ends) ----------------------------------------------

    def login(self) -> str:
        """Who we comment as. The job's token cannot read /user: it acts as github-actions[bot]
        (GitHub answers 403, a normal answer for it, not logged as a failure)."""
        if self._login is None:
            what = "cannot tell who the token belongs to"
            answer = self._rest.call("GET", "/user", what=what)
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
        for comment in self._rest.pages(path, what="could not read the PR's comments"):
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
            edited = self._rest.call("PATCH", path, what=what, json_body={"body": body})
            if edited.status == 200:
                return CommentResult(existing.id, "updated", existing.url)
            if edited.status != 404:
                raise GitHubError(f"{what} ({edited.reason})")
        path = f"/repos/{repository}/issues/{pr}/comments"
        created = self._rest.call("POST", path, what=what, json_body={"body": body})
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

    def deployments(self, repository: str, environment: str, *, limit: int) -> list[Deployed]:
        """The newest ``limit`` deployments to ``environment``, newest first, each with its
        latest state (None: it has no status yet): one call, and one more per deployment."""
        what = "could not list the deployments"
        wanted = f"environment={quote(environment, safe='')}&per_page={limit}"
        answer = self._rest.call("GET", f"/repos/{repository}/deployments?{wanted}", what=what)
        if answer.status != 200 or not isinstance(answer.data, list):
            raise GitHubError(f"{what} ({_deploy_reason(answer)})")
        found = []
        for d in answer.data[:limit]:
            path = f"/repos/{repository}/deployments/{int(d['id'])}/statuses?per_page=1"
            statuses = self._rest.call("GET", path, what=what)
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
        made = self._rest.call(
            "POST", f"/repos/{repository}/deployments", what=what, json_body=body
        )
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
        done = self._rest.call("POST", path, what=what, json_body=body)
        if done.status != 201:
            raise GitHubError(f"{what} ({_deploy_reason(done)})")

    # -- used by the webhook listener -------------------------------------------------------

    def set_status(self, repository: str, sha: str, state: str, description: str) -> None:
        """The `pgoverlay/branch` commit status a repository can require."""
        what = "could not set the commit status"
        body = {"state": state, "description": _description(description), "context": STATUS_CONTEXT}
        done = self._rest.call(
            "POST", f"/repos/{repository}/statuses/{sha}", what=what, json_body=body
        )
        if done.status != 201:
            raise GitHubError(f"{what} ({done.reason})")

    def open_pulls(self, repository: str) -> list[int]:
        """Numbers of every open pull request (all pages)."""
        path = f"/repos/{repository}/pulls?state=open&per_page=100"
        pulls = self._rest.pages(path, what="could not list open pull requests")
        return [int(p["number"]) for p in pulls]

    def pull(self, repository: str, number: int) -> dict[str, Any] | None:
        """The pull request as the API has it now (state, head, base, labels, draft), or None
        if it is gone: what a worker acts on, rather than on a delivery that may be stale."""
        what = f"could not read pull request #{number}"
        answer = self._rest.call("GET", f"/repos/{repository}/pulls/{number}", what=what)
        if answer.status == 404:
            return None
        if answer.status != 200 or not isinstance(answer.data, dict):
            raise GitHubError(f"{what} ({answer.reason})")
        return dict(answer.data)

    def labels(self, repository: str, number: int) -> list[str]:
        """The names of the labels on the pull request now."""
        path = f"/repos/{repository}/issues/{number}/labels?per_page=100"
        found = self._rest.pages(path, what=f"could not list the labels of #{number}")
        return [str(label["name"]) for label in found]

    def remove_label(self, repository: str, number: int, label: str) -> None:
        """Take ``label`` off the pull request (already gone is fine)."""
        what = f"could not remove the label {label!r}"
        path = f"/repos/{repository}/issues/{number}/labels/{quote(label, safe='')}"
        answer = self._rest.call("DELETE", path, what=what)
        if answer.status not in (200, 204, 404):
            raise GitHubError(f"{what} ({answer.reason})")

    def can_write(self, repository: str, login: str) -> bool:
        """Whether ``login`` has write, maintain or admin rights on the repository."""
        what = f"could not read {login}'s permission"
        path = f"/repos/{repository}/collaborators/{quote(login, safe='')}/permission"
        answer = self._rest.call("GET", path, what=what)
        if answer.status == 404:
            return False
        if answer.status != 200 or not isinstance(answer.data, dict):
            raise GitHubError(f"{what} ({answer.reason})")
        return answer.data.get("permission") in WRITERS

    def download_tarball(self, repository: str, ref: str, dest: Path) -> None:
        """The repository at ``ref`` as a tarball, through the API (no git credentials)."""
        what = f"could not download {repository}@{ref[:7]}"
        self._rest.download(f"/repos/{repository}/tarball/{ref}", dest, what=what)


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
