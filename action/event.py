"""Turn a GitHub event into what the PR workflow must do. Pure: dicts in, a dataclass out."""

from __future__ import annotations

import hashlib
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
    """The branch for this event: the template if given ({number}, {ref}, {repo} and {owner}
    are filled in), else ``{repo}-pr-{number}``, so that two repositories' pull requests on one
    runner never share a name; the ref made into a name for other events. A name too long
    for Postgres's 63 characters keeps its start and ends with a stable hash of the whole."""
    owner, _, name = event.repository.rpartition("/")
    repo = slug(name)
    # Outside a pull request there is no number: the ref stands in for it.
    number = str(event.pr) if event.pr is not None else slug(event.ref_name)
    if not template:
        template = "{repo}-pr-{number}" if event.pr is not None else "{repo}-{ref}"
    name = (
        template.replace("{number}", number)
        .replace("{ref}", slug(event.ref_name))
        .replace("{repo}", repo)
        .replace("{owner}", slug(owner))
    )
    return shorten(slug(name) or "default", whole=f"{event.repository}:{name}")


def shorten(name: str, *, whole: str, limit: int = 63) -> str:
    """``name`` if it fits in ``limit`` characters, else its start, a dash and 8 hex digits of
    the SHA-256 of ``whole`` (stable: the same PR always gets the same name)."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(whole.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def slug(text: str) -> str:
    """Lowercase, [a-z0-9-] only, starting and ending with a letter or digit."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
