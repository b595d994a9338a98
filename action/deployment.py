"""The pull request's GitHub Deployment, for both front ends: environment ``pgoverlay/<branch>``
(transient, never production), whose URL is the branch's page, so the pull request shows
"View deployment"; ``inactive`` (GitHub shows a transient one as destroyed) when the branch is.

Which state a run's report gives is ``conclusion.deployment``'s, shared with the commit status
and the step's exit code. What is sent is never a secret: the environment, the head, the page's
address and a one-line description, passed through the comment's redaction.

A Deployment never fails a run: a token without ``deployments: write`` (GitHub's 403), or GitHub
failing, is said once (the Action's warning annotation, the listener's log) and the comment
stands alone.

The environment's newest deployments are looked for in a daemon thread from the moment the run
starts, as the comment is: the listing overlaps the branch and its migrations, and the step
waits only for the writes (REST calls, as the comment's: the step imports no PyGithub). Each
write keeps one invariant: the head's deployment is the environment's only one not
``inactive``. A new head's deployment retires the earlier ones (GitHub's ``auto_inactive``
leaves transient environments alone), a re-run of a head whose deployment already has its
state writes nothing, and a close retires them all; ``SCANNED`` deployments are looked at, as
the invariant leaves at most one active apart from a write that failed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

from pgoverlay.action.conclusion import DeploymentEnd
from pgoverlay.action.github import Deployed, GitHub

ENVIRONMENT_PREFIX = "pgoverlay/"
SCANNED = 10  # the environment's newest deployments a write looks at


def environment(branch: str) -> str:
    """The Deployment's environment for ``branch``: ``pgoverlay/<branch>``."""
    return ENVIRONMENT_PREFIX + branch


@dataclass(frozen=True)
class DeploymentResult:
    """What a write did: the head's deployment (None on a close) and what became of it, and
    how many earlier deployments it retired."""

    id: int | None
    action: Literal["created", "updated", "unchanged", "retired"]
    retired: int = 0


class PendingDeployment:
    """The environment's deployments, looked for in a daemon thread from the moment this is
    made; ``write`` waits for the search, then writes the state the run ended in. An error of
    the search is raised by ``write``, where the caller expects GitHub's errors."""

    def __init__(self, github: GitHub, repository: str, branch: str) -> None:
        self._github, self._repository = github, repository
        self.environment = environment(branch)
        self._found: list[Deployed] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._find, name="pgoverlay-deploy", daemon=True)
        self._thread.start()

    def _find(self) -> None:
        try:
            self._found = self._github.deployments(
                self._repository, self.environment, limit=SCANNED
            )
        except BaseException as err:  # handed to write(), in the caller's thread
            self._error = err

    def write(self, end: DeploymentEnd, *, sha: str, log_url: str = "") -> DeploymentResult:
        """Give the head ``sha``'s deployment the state ``end`` says (made when it has none),
        and retire the environment's others; on ``inactive``, retire every one."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        github, repository = self._github, self._repository
        if end.state == "inactive":
            retired = self._retire(self._found, end.description)
            return DeploymentResult(None, "retired", retired)
        mine = next((d for d in self._found if d.sha == sha), None)
        if mine is not None and mine.state == end.state:
            action: Literal["created", "updated", "unchanged"] = "unchanged"
            made = mine.id
        else:
            made = (
                mine.id
                if mine is not None
                else github.create_deployment(
                    repository, sha=sha, environment=self.environment, description=end.description
                )
            )
            github.deployment_status(
                repository,
                made,
                state=end.state,
                description=end.description,
                environment_url=end.url,
                log_url=log_url,
            )
            action = "created" if mine is None else "updated"
        others = [d for d in self._found if d.id != made]
        return DeploymentResult(made, action, self._retire(others, "a newer head is deployed"))

    def _retire(self, deployments: list[Deployed], description: str) -> int:
        """Mark each of ``deployments`` not yet ``inactive`` so; how many were."""
        active = [d for d in deployments if d.state != "inactive"]
        for d in active:
            self._github.deployment_status(
                self._repository, d.id, state="inactive", description=description
            )
        return len(active)
