"""Which ``pull_request`` deliveries become jobs. Pure: the validated delivery and the settings
in; a job description (or the reason there is none) out."""

from __future__ import annotations

from dataclasses import dataclass

from pgoverlay.webhook.payload import PullRequestEvent
from pgoverlay.webhook.settings import WebhookSettings

_KINDS = {
    "opened": "open",
    "reopened": "open",
    "ready_for_review": "open",
    "synchronize": "sync",
    "closed": "close",
    "labeled": "label",
}


@dataclass(frozen=True)
class Routed:
    repository: str
    pr: int
    kind: str
    head_sha: str


def route(delivery: PullRequestEvent, settings: WebhookSettings) -> Routed | str:
    """A job for a handled delivery, or why it is ignored."""
    kind = _KINDS.get(delivery.action)
    if kind is None:
        return f"pull_request {delivery.action} is not handled"
    repository = delivery.repository.full_name
    repo = settings.repo(repository)
    if repo is None:
        return f"repository {repository} is not in the allow-list"
    if kind == "label" and (delivery.label is None or delivery.label.name != repo.fork_label):
        return "a label other than the fork approval label"
    return Routed(
        repository=repository,
        pr=delivery.number,
        kind=kind,
        head_sha=delivery.pull_request.head.sha,
    )
