"""Which deliveries become jobs. Pure: the event name, the payload and the settings in; a job
description (or the reason there is none) out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

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
    payload: str  # the delivery's JSON, kept for the worker


def route(event: str, payload: dict[str, Any], settings: WebhookSettings) -> Routed | str:
    """A job for a handled delivery, or why it is ignored."""
    if event != "pull_request":
        return f"event {event} is not handled"
    action = str(payload.get("action", ""))
    kind = _KINDS.get(action)
    if kind is None:
        return f"pull_request {action} is not handled"
    repository = str((payload.get("repository") or {}).get("full_name") or "")
    repo = settings.repo(repository)
    if repo is None:
        return f"repository {repository or '(none)'} is not in the allow-list"
    pull = payload.get("pull_request") or {}
    if kind == "label" and (payload.get("label") or {}).get("name") != repo.fork_label:
        return "a label other than the fork approval label"
    return Routed(
        repository=repository,
        pr=int(pull.get("number") or payload.get("number") or 0),
        kind=kind,
        head_sha=str((pull.get("head") or {}).get("sha") or ""),
        payload=json.dumps(payload, separators=(",", ":")),
    )
