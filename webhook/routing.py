"""Which ``pull_request`` deliveries become jobs, and what a job keeps of its delivery. Pure: the
validated delivery and the settings in; a job description (or the reason there is none) out."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from pgoverlay.action import event as events
from pgoverlay.action import when
from pgoverlay.webhook.payload import PullRequestEvent
from pgoverlay.webhook.settings import WebhookSettings


class JobEvent(BaseModel):
    """What a job keeps of its delivery, as JSON in the queue: the event parsed once at intake,
    who sent it (a label's approver), and the GitHub App installation it came through. A close
    that reconcile queues keeps none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: events.Event
    sender: str = ""
    installation: int | None = None


@dataclass(frozen=True)
class Routed:
    repository: str
    pr: int
    kind: events.Kind
    head_sha: str
    event: JobEvent


def job_event(delivery: PullRequestEvent) -> JobEvent:
    """The parts of a validated delivery a job needs."""
    return JobEvent(
        event=events.from_pull(
            delivery.action,
            delivery.pull_request.model_dump(),
            repository=delivery.repository.full_name,
            label=delivery.label.name if delivery.label else "",
        ),
        sender=delivery.sender.login if delivery.sender else "",
        installation=delivery.installation.id if delivery.installation else None,
    )


def route(delivery: PullRequestEvent, settings: WebhookSettings) -> Routed | str:
    """A job for a handled delivery, or why it is ignored."""
    kind = events.kind_of(delivery.action)
    if kind == "ignore":
        return f"pull_request {delivery.action} is not handled"
    repository = delivery.repository.full_name
    repo = settings.repo(repository)
    if repo is None:
        return f"repository {repository} is not in the allow-list"
    job = job_event(delivery)
    if kind in ("label", "unlabel"):
        # Adding the fork approval label, or adding or taking off the `branch-when` label
        approves = kind == "label" and job.event.label == repo.fork_label
        if not approves and not when.labelled(job.event, repo.request()):
            return "a label other than the fork approval label or the branch-when label"
    return Routed(
        repository=repository,
        pr=delivery.number,
        kind=kind,
        head_sha=delivery.pull_request.head.sha,
        event=job,
    )
