"""What a signed delivery must be before the listener acts on it. Pure: header values and the
body's bytes in; a validated model out, or a :class:`DeliveryError` saying what is wrong.

The event name must be one of a fixed list (:data:`KNOWN_EVENTS`), so no name a sender makes up
reaches the records or the metrics. The body must be a JSON object nested no deeper than
:data:`MAX_DEPTH` (GitHub's payloads stay under 10 levels). A ``pull_request`` body must hold,
with their JSON types, the fields :class:`PullRequestEvent` lists: the parts of the event that
pgoverlay reads. A bool is not a number, a string is not an object, and a missing ``head`` is
an error here rather than a failed job later.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pgoverlay.errors import DeliveryError, config_error, dotted
from pgoverlay.github.grammar import REPOSITORY_MAX, REPOSITORY_RE

HANDLED = "pull_request"
# Events a GitHub App or a repository webhook subscribed to more than pull requests may send:
# acknowledged (204) and recorded, never acted on.
IGNORED_EVENTS = frozenset(
    {
        "check_run",
        "check_suite",
        "create",
        "delete",
        "github_app_authorization",
        "installation",
        "installation_repositories",
        "installation_target",
        "issue_comment",
        "issues",
        "label",
        "member",
        "meta",
        "pull_request_review",
        "pull_request_review_comment",
        "pull_request_review_thread",
        "push",
        "repository",
        "status",
        "workflow_job",
        "workflow_run",
    }
)
KNOWN_EVENTS = frozenset({HANDLED, "ping"}) | IGNORED_EVENTS
MAX_DEPTH = 32
# GitHub's delivery ids are GUIDs; anything else (a newline, say) would end up in the logs.
_DELIVERY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SHA = r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$"


class _Part(BaseModel):
    """Strict types (no "7" for 7, no true for 1); fields pgoverlay does not read are ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class Account(_Part):
    id: int = Field(ge=1)


class Repository(_Part):
    """A repository: its name, and its id and its owner's (which GitHub keeps through a rename:
    a pool on another host owns a branch by the id)."""

    full_name: str = Field(pattern=REPOSITORY_RE.pattern, max_length=REPOSITORY_MAX)
    id: int | None = Field(default=None, ge=1)
    owner: Account | None = None


class Label(_Part):
    name: str


class Ref(_Part):
    """A pull request's head or base: the commit, its branch, its repository (null once the
    fork it came from is deleted)."""

    sha: str = Field(pattern=_SHA)
    ref: str = ""
    repo: Repository | None = None


class PullRequest(_Part):
    number: int = Field(ge=1)
    state: Literal["open", "closed"]
    draft: bool = False
    merged: bool | None = None
    head: Ref
    base: Ref
    labels: list[Label] = Field(default_factory=list)


class Installation(_Part):
    id: int = Field(ge=1)


class Sender(_Part):
    login: str


class PullRequestEvent(_Part):
    """The parts of a ``pull_request`` delivery that pgoverlay reads."""

    action: str = Field(max_length=64)
    number: int = Field(ge=1)
    pull_request: PullRequest
    repository: Repository
    label: Label | None = None  # labeled and unlabeled only
    installation: Installation | None = None  # GitHub App deliveries only
    sender: Sender | None = None

    @model_validator(mode="after")
    def _one_number(self) -> PullRequestEvent:
        if self.number != self.pull_request.number:
            raise ValueError("number and pull_request.number differ")
        return self


def check_headers(event: str | None, delivery_id: str | None) -> tuple[str, str]:
    """The event name and delivery id, if GitHub could have sent them."""
    if not event:
        raise DeliveryError(
            "missing X-GitHub-Event: GitHub names the event in this header on every delivery;"
            " send it"
        )
    if event not in KNOWN_EVENTS:
        raise DeliveryError(
            f"X-GitHub-Event {event[:40]!r} is not an event pgoverlay knows: it acts on"
            f" {HANDLED}, answers ping and acknowledges the other GitHub events listed in"
            " docs/webhook.md; subscribe the webhook to pull requests only"
        )
    if not delivery_id:
        raise DeliveryError(
            "missing X-GitHub-Delivery: GitHub identifies every delivery in this header; send it"
        )
    if not is_delivery_id(delivery_id):
        raise DeliveryError(
            "X-GitHub-Delivery is not a delivery id: GitHub sends a GUID (letters, digits and"
            " dashes, at most 100 characters)"
        )
    return event, delivery_id


def is_delivery_id(text: str) -> bool:
    return _DELIVERY_ID.fullmatch(text) is not None


def decode(body: bytes) -> dict[str, Any]:
    """The body as a JSON object nested at most :data:`MAX_DEPTH` levels deep."""
    too_deep = DeliveryError(
        f"the body nests JSON deeper than {MAX_DEPTH} levels, which GitHub never sends"
    )
    try:
        data = json.loads(body)
    except RecursionError:  # the parser's own limit, far above ours: refused all the same
        raise too_deep from None
    except ValueError:  # UnicodeDecodeError included
        raise DeliveryError(
            "the body is not JSON: set the webhook's content type to application/json"
        ) from None
    if not isinstance(data, dict):
        raise DeliveryError(f"the body is JSON but not an object ({type(data).__name__})")
    if depth(data) > MAX_DEPTH:
        raise too_deep
    return data


def depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


def pull_request_event(payload: dict[str, Any]) -> PullRequestEvent:
    """The ``pull_request`` delivery's fields pgoverlay reads, checked."""
    try:
        return PullRequestEvent.model_validate(payload)
    except ValidationError as err:
        raise config_error(
            err,
            what="not a pull_request event as GitHub sends it:",
            where=lambda loc: dotted(loc) or "the body",
            error=DeliveryError,
        ) from None


def action_of(payload: dict[str, Any]) -> str:
    """The delivery's ``action``, for the records ("" when it has none)."""
    action = payload.get("action")
    return action[:64] if isinstance(action, str) else ""
