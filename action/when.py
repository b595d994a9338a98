"""When a pull request gets a branch: the request's `branch-when`, read, and asked of a pull
request. Pure: the request, the event and one fact the front end found in; a reason out.

``always``
    every pull request, as before this setting existed;
``migrations``
    a pull request that adds or changes a migration file: a ``.sql`` file under the request's
    `migrations` folder, exactly the files `migrations-select: changed` would apply. Only with
    `migrations`: a `migrate-command` gives no way to tell a migration from other code, so the
    request refuses the pair (:func:`request_problem`);
``label:NAME``
    a pull request that carries the label NAME: labelling it makes the branch, taking the label
    off destroys it.

A pull request that is not wanted gets no branch and runs nothing; one whose branch exists
loses it (its label was taken off; a push took its migration changes back out): a branch lives
while its pull request wants one. Events that are not about a pull request (a push, a manual
run) are branched whatever this says: there is no pull request to ask.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

from pgoverlay.errors import ConfigError

if TYPE_CHECKING:
    from pgoverlay.action.event import Event
    from pgoverlay.action.request import PrRequest

WhenKind = Literal["always", "migrations", "label"]


@dataclass(frozen=True)
class When:
    kind: WhenKind
    label: str = ""  # label: the label's name

    def __str__(self) -> str:
        return f"label:{self.label}" if self.kind == "label" else self.kind


# What a pull request that is not wanted is told, per kind: why it has no branch ('' when it is
# wanted). ``changes`` is whether it adds or changes a migration file (None: not known yet).
Rule = Callable[[When, "PrRequest", "Event", "bool | None"], str]


def _always(when: When, request: PrRequest, event: Event, changes: bool | None) -> str:
    return ""


def _migrations(when: When, request: PrRequest, event: Event, changes: bool | None) -> str:
    if changes is not False:
        return ""
    folder = posixpath.normpath(posixpath.join(request.working_directory, request.migrations or ""))
    return f"this pull request adds or changes no .sql file under {folder} (branch-when: {when})"


def _label(when: When, request: PrRequest, event: Event, changes: bool | None) -> str:
    if when.label in event.labels:
        return ""
    return f"this pull request does not carry the label `{when.label}` (branch-when: {when})"


RULES: dict[WhenKind, Rule] = {"always": _always, "migrations": _migrations, "label": _label}


def parse(text: str) -> When:
    """``always``, ``migrations`` or ``label:NAME`` as a :class:`When`; a ConfigError saying
    what may be written for anything else."""
    kind, colon, label = text.strip().partition(":")
    if kind == "label" and colon and label.strip():
        return When("label", label.strip())
    if not colon and kind in RULES and kind != "label":
        return When(cast("WhenKind", kind))
    raise ConfigError(
        f"branch-when {text!r} is not one of `always`, `migrations` or `label:NAME` (e.g. "
        "`label:database`, the label a pull request carries while it wants a branch)"
    )


def check(text: str) -> None:
    """The field's check (see ``request.option``)."""
    parse(text)


def request_problem(
    branch_when: str | None, migrations: str | None, migrate_command: str | None
) -> str | None:
    """What is wrong with `branch-when` given the rest of the request, or None."""
    if not branch_when or parse(branch_when).kind != "migrations" or migrations:
        return None
    if migrate_command:
        return (
            "`branch-when: migrations` needs `migrations` (a folder of .sql files): with "
            "`migrate-command`, pgoverlay cannot tell which files are migrations. Use "
            "`branch-when: label:NAME` to branch only the pull requests a label marks, or "
            "`always`"
        )
    return "`branch-when: migrations` needs `migrations`, the folder of .sql files to look at"


def labelled(event: Event, request: PrRequest) -> bool:
    """Whether ``event`` added or took off the label `branch-when` names."""
    when = parse(request.branch_when)
    return when.kind == "label" and event.label == when.label


def unwanted(request: PrRequest, event: Event, *, changes: bool | None) -> str:
    """Why the pull request of ``event`` is not to have a branch, or '' when it is (and for
    events that are not about a pull request). ``changes``: whether it adds or changes a
    migration file, None when not known (then it is taken as wanted)."""
    if event.pr is None:
        return ""
    when = parse(request.branch_when)
    return RULES[when.kind](when, request, event, changes)


def needs_changes(request: PrRequest, event: Event) -> bool:
    """Whether :func:`unwanted` needs to know if the pull request changes migrations."""
    return event.pr is not None and parse(request.branch_when).kind == "migrations"
