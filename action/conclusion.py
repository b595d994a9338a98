"""How a run ends, said once for both front ends: the report of a pull request that gets no
branch, whether a run's report passes (the Action's exit code, the listener's commit status)
with the one line that says why, and the state it gives the pull request's GitHub Deployment.
Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pgoverlay.action import markdown as md
from pgoverlay.action.event import Event, branch_name
from pgoverlay.action.report import MigrationRun, Report, RunStatus, over_threshold


def refusal(
    event: Event, name: str | None, reason: str, *, status: RunStatus, run_url: str = ""
) -> Report:
    """The report of a pull request that gets no branch, and why. ``name`` is the request's
    `branch-name` (None: the default): the report names the branch it would have had, so a
    later run writes the same PR comment."""
    return Report(
        repository=event.repository,
        pr=event.pr,
        branch_name=branch_name(event, name),
        head_sha=event.head_sha,
        status=status,
        branch=None,
        message=reason,
        run_url=run_url,
    )


Cause = Literal["", "branch", "migration", "threshold"]  # what failed the run ('': none)


@dataclass(frozen=True)
class Conclusion:
    cause: Cause
    line: str  # why, in one line (the commit status's description)
    over: list[MigrationRun] = field(default_factory=list)  # migrations over a threshold

    @property
    def passed(self) -> bool:
        """The step exits 0; the commit status is success."""
        return not self.cause


def conclude(
    report: Report, *, fail_on_threshold: bool, fail_on_migration_error: bool = True
) -> Conclusion:
    """Whether ``report`` passes: not when the branch could not be made, nor when a migration
    failed (unless ``fail_on_migration_error`` is off), nor when a migration is over a
    threshold and ``fail_on_threshold`` is on."""
    over = over_threshold(report)
    why = report.message or report.status
    if report.status == "failed":
        return Conclusion("branch", why, over)
    if report.status == "migration failed" and fail_on_migration_error:
        return Conclusion("migration", why, over)
    if over and fail_on_threshold:
        first = over[0]
        assert first.insight is not None
        return Conclusion("threshold", f"{first.name}: {first.insight.verdict.text}", over)
    if report.status == "ready" and report.branch is not None:
        why = f"branch {report.branch_name} ready on port {report.branch.port}"
    return Conclusion("", why, over)


DeploymentState = Literal["success", "failure", "inactive"]


@dataclass(frozen=True)
class DeploymentEnd:
    """The state a run's report gives the pull request's GitHub Deployment, the line that says
    why, and the environment's URL (the branch's page; '' but for ``success``)."""

    state: DeploymentState
    description: str
    url: str = ""


def deployment(report: Report) -> DeploymentEnd | None:
    """The Deployment's state for ``report``: ``success`` while the branch is up (a failed
    migration included: the branch is there to look into), ``failure`` when it could not be
    made, ``inactive`` once destroyed; None for a pull request that gets no branch. The
    description is one redacted line of at most 140 characters, GitHub's limit."""
    name = report.branch_name
    page = report.way_in.page if report.way_in is not None else ""
    if report.status == "destroyed":
        return retired(name)
    if report.status == "ready" and report.branch is not None:
        return DeploymentEnd("success", _line(f"branch {name} ready"), page)
    if report.status == "migration failed" and report.branch is not None:
        return DeploymentEnd("success", _line(f"branch {name} up; a migration failed"), page)
    if report.status == "failed":
        return DeploymentEnd("failure", _line(report.message or f"branch {name} not ready"))
    return None


def retired(name: str) -> DeploymentEnd:
    """The Deployment's end once branch ``name`` is gone: on its close, or on a close that
    finds it destroyed already (its ttl, a person)."""
    return DeploymentEnd("inactive", _line(f"branch {name} destroyed"))


def _line(text: str) -> str:
    return md.line(text, 140)
