"""Turn a GitHub event into what the PR workflow must do. Pure: dicts in, a dataclass out."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pgoverlay.errors import ConfigError

Kind = Literal["open", "sync", "close", "ref", "ignore"]

_PR_ACTIONS: dict[str, Kind] = {
    "opened": "open",
    "reopened": "open",
    "ready_for_review": "open",
    "synchronize": "sync",
    "closed": "close",
}


@dataclass(frozen=True)
class Event:
    kind: Kind
    repository: str  # owner/name
    pr: int | None
    head_sha: str
    base_sha: str | None
    merged: bool | None
    from_fork: bool
    draft: bool
    ref_name: str  # the branch or tag, for events that are not about a pull request
    action: str


def _repo_name(repo: Any) -> str | None:
    if isinstance(repo, dict):
        name = repo.get("full_name")
        return str(name) if name else None
    return None


def is_fork(pull: dict[str, Any]) -> bool:
    """A PR is from a fork when its head repository is not its base repository.

    A deleted fork has a null head repository: still a fork. ``repository.fork`` says whether
    the *base* is itself a fork and does not answer this.
    """
    head = _repo_name(pull.get("head", {}).get("repo"))
    base = _repo_name(pull.get("base", {}).get("repo"))
    return head is None or base is None or head.lower() != base.lower()


def parse(name: str, payload: dict[str, Any], *, repository: str, sha: str, ref: str) -> Event:
    """``name`` is GITHUB_EVENT_NAME; ``sha`` and ``ref`` are GITHUB_SHA and GITHUB_REF."""
    if name in ("pull_request", "pull_request_target"):
        pull = payload.get("pull_request")
        if not isinstance(pull, dict):
            raise ConfigError(
                f"the {name} event has no pull_request object: is the event file right?"
            )
        action = str(payload.get("action", ""))
        return Event(
            kind=_PR_ACTIONS.get(action, "ignore"),
            repository=_repo_name(payload.get("repository")) or repository,
            pr=int(pull["number"]),
            head_sha=str(pull["head"]["sha"]),
            base_sha=str(pull["base"]["sha"]),
            merged=bool(pull.get("merged")) if action == "closed" else None,
            from_fork=is_fork(pull),
            draft=bool(pull.get("draft")),
            ref_name=str(pull["head"].get("ref", "")),
            action=action,
        )
    short = re.sub(r"^refs/(heads|tags)/", "", ref)
    return Event(
        kind="ref",
        repository=repository,
        pr=None,
        head_sha=sha,
        base_sha=None,
        merged=None,
        from_fork=False,
        draft=False,
        ref_name=short,
        action=name,
    )


def branch_name(event: Event, template: str | None) -> str:
    """The branch for this event: the template if given ({number} and {ref} are filled in),
    else ``pr-<number>``, or the ref made into a valid name for other events."""
    if template:
        # Outside a pull request there is no number: the ref stands in for it.
        number = str(event.pr) if event.pr is not None else slug(event.ref_name)
        repo = slug(event.repository.rsplit("/", 1)[-1])
        return (
            template.replace("{number}", number)
            .replace("{ref}", slug(event.ref_name))
            .replace("{repo}", repo)
        )
    if event.pr is not None:
        return f"pr-{event.pr}"
    return slug(event.ref_name) or "default"


def slug(text: str) -> str:
    """Lowercase, [a-z0-9-] only, at most 63 characters, starting with a letter or digit."""
    cleaned = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return cleaned[:63].rstrip("-")
