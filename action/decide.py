"""What the PR workflow does for one event: the one decision the Action and the listener share.

Pure: an event, the branch as the engine has it, the record the last run kept with it and the
request in; a :class:`Decision` out. No I/O, so each case is a line of a table test
(tests/test_decide.py). The front ends act on the decision: ``workflow.handle`` does the work;
the listener also asks first, before it fetches the pull request's sources, so that a
redelivery of a head already done costs nothing.

In order:

1. an event that asks for no branch work (a label `branch-when` does not name, an ignored
   action): **skip**;
2. a pull request `branch-when` does not want (``when.unwanted``) and that has no branch of its
   own: **unwanted**, "not branched", and nothing is written on the pull request;
3. a pull request the front end's own policy does not branch (the Action's `allow-forks`, the
   listener's fork and draft rules; closing is never refused): **refuse**, "not branched";
4. a branch name another repository's branch holds: **refuse**, "failed";
5. a close, or a pull request no longer wanted: **destroy** the branch, or **skip** when there is
   none;
6. no branch: **create** it; a branch an earlier run left half-made: **fail**, saying how to
   clear it;
7. the same head, run with the same run options (:func:`fingerprint`), ready and running:
   **report** that run again;
8. otherwise, with `reset-on-push`: **reset** it for a new head, changed run options, or a
   last run that did not end ready; else **migrate** the branch as it stands.

A record without run options (kept by an older release) counts as run with other options: its
head is run again once, and from then on its record has them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pgoverlay.action import when
from pgoverlay.action.event import WORK_KINDS, Event
from pgoverlay.action.request import Inputs, reruns

if TYPE_CHECKING:
    from pgoverlay.action.record import PrRecord
    from pgoverlay.action.report import RunStatus
    from pgoverlay.action.request import PrRequest
    from pgoverlay.runner.service.views import BranchView

Action = Literal[
    "skip", "unwanted", "refuse", "destroy", "create", "fail", "report", "reset", "migrate"
]



def rerun_fields() -> tuple[str, ...]:
    """The request's fields that change what a run does or what its report says (declared with
    ``rerun=True``, see ``request.option``): a change to any of them makes a head already done
    run again. Every other field says, where it is declared, why it does not."""
    return tuple(f.name for f in dataclasses.fields(Inputs) if reruns(f))


def fingerprint(request: PrRequest) -> str:
    """A fingerprint of ``request``'s run options (:func:`rerun_fields`): kept with the run's
    record, never the values themselves (a migrate command may hold a secret)."""
    values = {name: getattr(request, name, None) for name in rerun_fields()}
    text = json.dumps(values, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Decision:
    action: Action
    # unwanted, refuse, fail, destroy of a branch no longer wanted: the reason, for the report;
    # skip: for the log
    why: str = ""
    # unwanted, refuse: the report's status ("not branched": `branch-when` or a policy)
    status: RunStatus = "failed"
    # This head already ran with these options on the branch as it stands (report; or reset or
    # migrate again when its migrations failed). The Action re-runs a failed head, as a user's
    # "Re-run job" asks; the listener takes it as a redelivery and stops.
    ran: bool = False


def owner_refusal(branch: BranchView | None, repository: str) -> str:
    """Why ``branch`` is not ``repository``'s to use, or ''."""
    if branch is None or not branch.repository:
        return ""
    if branch.repository.lower() == repository.lower():
        return ""
    where = f"{branch.repository}#{branch.pr}" if branch.pr else branch.repository
    return (
        f"branch {branch.name} on this runner belongs to {where}: set the `branch-name` input "
        "to a name unique on this runner (the default, '{repo}-pr-{number}', is)"
    )


def as_work(event: Event, request: PrRequest) -> Event:
    """``event`` as the work it asks for under the request's `branch-when`: adding the label
    that `branch-when: label:NAME` names is an open (it makes the branch), taking it off a push
    of a pull request without it (it is no longer wanted: its branch is destroyed). The labels
    are the event's with that change made, whatever a stale payload said. Every other event is
    itself."""
    if event.kind not in ("label", "unlabel") or not when.labelled(event, request):
        return event
    others = tuple(x for x in event.labels if x != event.label)
    if event.kind == "label":
        return dataclasses.replace(event, kind="open", labels=(*others, event.label))
    return dataclasses.replace(event, kind="sync", labels=others)


def fork_refusal(event: Event, inputs: Inputs) -> str:
    """The Action's policy: why a pull request from a fork gets no branch, or '' when it may
    have one (the listener's policy is its own: forks and drafts settings, a maintainer's
    label). Closing is never refused: a branch made while forks were allowed is destroyed."""
    kind = as_work(event, inputs).kind
    if not event.from_fork or inputs.allow_forks or kind not in ("open", "sync"):
        return ""
    return (
        "this pull request comes from a fork, and this workflow does not branch forks: no "
        "branch was made and none of the fork's migrations or commands ran. To branch pull "
        "requests from forks, set `allow-forks: true` on the pgoverlay step (their SQL then "
        "runs against their own branch; `migrate-command` also needs `allow-fork-commands: true`)"
    )


def decide(
    event: Event,
    branch: BranchView | None,
    record: PrRecord | None,
    request: PrRequest,
    *,
    refused: str = "",
    changes: bool | None = None,
) -> Decision:
    """What to do for ``event``, given its ``branch`` (None: there is none), the ``record`` its
    last run kept, and the ``request``. ``refused`` is why the front end's own policy does not
    branch this pull request ('' when it may). ``changes``: whether the pull request adds or
    changes a migration file, for `branch-when: migrations` (None: not known, taken as yes; the
    listener asks before it has the sources, and ``workflow.handle`` asks again with them)."""
    event = as_work(event, request)
    if event.kind not in WORK_KINDS:
        return Decision("skip", why=f"a {event.action or event.kind} event needs no branch")
    unwanted = "" if event.kind == "close" else when.unwanted(request, event, changes=changes)
    taken = owner_refusal(branch, event.repository)
    if unwanted and (branch is None or taken):
        # Nothing of this pull request's to destroy; another repository's branch is not ours.
        return Decision("unwanted", why=f"no branch: {unwanted}", status="not branched")
    if refused and event.kind != "close" and not unwanted:
        return Decision("refuse", why=refused, status="not branched")
    if taken:
        return Decision("refuse", why=taken, status="failed")
    if unwanted:
        return Decision("destroy", why=unwanted)
    if event.kind == "close":
        return Decision("destroy") if branch is not None else Decision("skip", why="no branch")
    if branch is None:
        return Decision("create")
    if branch.state not in ("ready", "suspended"):  # a suspended one wakes when it is asked
        return Decision(
            "fail",
            why=f"branch {branch.name} is {branch.state} (an earlier run was interrupted): run "
            "`pgoverlay gc` on the runner, then re-run this job",
        )
    same = (
        record is not None
        and record.head_sha == event.head_sha
        and record.inputs == fingerprint(request)
    )
    done = same and record is not None and record.status == "ready"
    if done and branch.running:
        return Decision("report", ran=True)
    ran = same and branch.running and record is not None and record.status == "migration failed"
    if request.reset_on_push and not done:
        return Decision("reset", ran=ran)
    return Decision("migrate", ran=ran)
