"""Turn a GitHub event into what the PR workflow must do. Pure: dicts in, a dataclass out."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Literal

from pgoverlay.errors import ConfigError

Kind = Literal["open", "sync", "close", "label", "unlabel", "ref", "ignore"]

# What each `pull_request` action asks for: the one table the Action's event reading, the
# listener's routing and its metrics share. Other actions are `ignore`. `label` is the listener's
# fork approval (a maintainer's label); `label` and `unlabel` of the label a `branch-when:
# label:NAME` request names make and destroy the branch (``decide.work_kind``); any other label
# asks for nothing.
PR_KINDS: dict[str, Kind] = {
    "opened": "open",
    "reopened": "open",
    "ready_for_review": "open",
    "synchronize": "sync",
    "closed": "close",
    "labeled": "label",
    "unlabeled": "unlabel",
}
# The kinds of the table, each once, in order: the listener's job kinds.
JOB_KINDS: tuple[Kind, ...] = tuple(dict.fromkeys(PR_KINDS.values()))
# What the PR workflow acts on: a pull request's kinds but the labels', and other events' refs.
WORK_KINDS: frozenset[Kind] = frozenset({"open", "sync", "close", "ref"})


def kind_of(action: str) -> Kind:
    """The kind of a `pull_request` action (``ignore`` for those pgoverlay does not act on)."""
    return PR_KINDS.get(action, "ignore")


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
    labels: tuple[str, ...] = ()  # the pull request's labels (as its event or the API says)
    label: str = ""  # the label a `labeled` or `unlabeled` event added or took off


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
        return from_pull(
            str(payload.get("action", "")),
            pull,
            repository=_repo_name(payload.get("repository")) or repository,
            label=_label_name(payload.get("label")),
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


def _label_name(label: Any) -> str:
    return str(label.get("name") or "") if isinstance(label, dict) else ""


def from_pull(action: str, pull: dict[str, Any], *, repository: str, label: str = "") -> Event:
    """The event of a `pull_request` ``action`` on ``pull`` (a pull request object, as a
    delivery or the API has it) in ``repository``; ``label`` is the label a `labeled` or
    `unlabeled` action added or took off."""
    labels = pull.get("labels")
    return Event(
        kind=kind_of(action),
        repository=repository,
        pr=int(pull["number"]),
        head_sha=str(pull["head"]["sha"]),
        base_sha=str(pull["base"]["sha"]),
        merged=bool(pull.get("merged")) if action == "closed" else None,
        from_fork=is_fork(pull),
        draft=bool(pull.get("draft")),
        ref_name=str(pull["head"].get("ref", "")),
        action=action,
        labels=tuple(_label_name(x) for x in labels if _label_name(x))
        if isinstance(labels, list)
        else (),
        label=label,
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
