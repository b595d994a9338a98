"""What one run of the PR workflow found: the data behind the PR comment, the job summary and
the step outputs. Plain data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pgoverlay.action.insight.model import MigrationInsight
from pgoverlay.action.insight.schemadiff import SchemaDiff
from pgoverlay.action.wayin import WayIn

MigrationStatus = Literal["applied", "skipped", "failed", "not run"]
RunStatus = Literal["ready", "migration failed", "failed", "destroyed", "not branched"]


@dataclass(frozen=True)
class MigrationRun:
    """One migration: a file of the PR (SQL folder mode) or the migrate command."""

    name: str  # repository-relative path of the file, or the command as written
    status: MigrationStatus
    seconds: float
    error: str = ""  # error excerpt (never contains the password)
    file: str | None = None  # repository-relative file the error came from
    line: int | None = None  # line in that file
    insight: MigrationInsight | None = None  # what it did to the branch, measured


@dataclass(frozen=True)
class BranchInfo:
    name: str
    host: str
    port: int
    database: str
    user: str
    base_name: str
    base_version: int
    base_seeded_at: float | None
    layer_logical_bytes: int
    layer_physical_bytes: int
    create_seconds: float | None = None
    runtime: str = "local"
    base_masked: bool | None = None  # None: unknown (a report saved by an older release)
    base_mask_rules: str = ""  # rules file name, when masked
    base_mask_sha256: str = ""  # its SHA-256
    # idle seconds before the engine suspends it (0: never; None: not said by the engine)
    suspend_after: float | None = None


@dataclass(frozen=True)
class Report:
    repository: str
    pr: int | None  # None for events that are not about a pull request
    branch_name: str  # set even when the branch could not be made
    head_sha: str
    status: RunStatus
    branch: BranchInfo | None
    migrations: list[MigrationRun] = field(default_factory=list)
    message: str = ""  # why the run failed, in one line
    merged: bool | None = None  # on close: was the PR merged
    # How a reader gets in: the branch's page and the front door (never a password)
    way_in: WayIn | None = None
    run_url: str = ""  # link to the workflow run, when known
    # The branch's schema after the migrations against its base's (None: not measured)
    schema_diff: SchemaDiff | None = None


def over_threshold(report: Report) -> list[MigrationRun]:
    """The migrations whose insight's verdict is "over": a lock or a rewrite past the
    thresholds (with ``fail-on-threshold``, they fail the step or the commit status).

    Only a report of migrations is judged. A close runs none: its report carries the branch's
    last run for the closing comment, and is never over. A run on a new head judges what it
    ran (a file skipped as already applied has no insight); a re-run of a head already done
    reports that head's runs again, verdicts included, so re-running a job does not turn a
    verdict it failed on into a pass.
    """
    if report.status not in ("ready", "migration failed"):
        return []
    return [
        m for m in report.migrations if m.insight is not None and m.insight.verdict.level == "over"
    ]


def result(status: RunStatus) -> str:
    """A run's result as the comment's title and the branch page's Result say it: "Ready",
    "Migration failed"."""
    return status.capitalize()
