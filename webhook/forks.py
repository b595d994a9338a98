"""Whether a fork's pull request may run, decided per head SHA. Pure: what GitHub says now and
what the queue remembers in, a verdict out.

A maintainer approves a fork's code by adding the fork label. The approval holds for the head
that was labelled only: a push after it runs nothing until a maintainer labels again (the
listener takes the label off and says why). A label added by someone without write, maintain
or admin rights on the repository approves nothing and is taken off too. The label must also
still be on the pull request when a job runs, as the API says, not as a delivery said.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgoverlay.webhook.queue import Approval


@dataclass(frozen=True)
class Verdict:
    run: bool
    reason: str = ""  # why nothing runs, for the PR comment and the commit status
    remove_label: bool = False  # take the fork label off the pull request
    approver: str = ""  # record an approval of the current head by this login
    quiet: bool = False  # nothing to say on the PR (the reason goes to the log only)


def decide(
    *,
    kind: str,
    label: str,
    labels: list[str],
    head_sha: str,
    approval: Approval | None,
    labelled_sha: str = "",
    sender: str = "",
    sender_can_write: bool = False,
    label_job_pending: bool = False,
) -> Verdict:
    """The verdict for a job of ``kind`` on a fork's open pull request whose head is
    ``head_sha`` and whose labels are ``labels`` (both read from the API just now).

    For a ``label`` job, ``sender`` added the label when the head was ``labelled_sha``.
    ``label_job_pending``: a label job of this pull request is queued after this one (it will
    decide about the label itself).
    """
    labelled = label in labels
    if kind == "label":
        if not labelled:
            return Verdict(False, f"the label `{label}` is no longer on the PR", quiet=True)
        if not sender_can_write:
            return Verdict(
                False,
                f"the label `{label}` was added by @{sender}, who cannot write to this "
                "repository: only a maintainer's label (write, maintain or admin) approves a "
                "fork's code, so it was removed",
                remove_label=True,
            )
        if labelled_sha != head_sha:
            return Verdict(
                False,
                f"@{sender} labelled {labelled_sha[:7]}, but the head is now {head_sha[:7]}: a "
                f"maintainer must review the new commits and add `{label}` again",
                remove_label=True,
            )
        return Verdict(True, approver=sender)
    if approval is not None and approval.head_sha == head_sha and labelled:
        return Verdict(True)
    if labelled and label_job_pending:
        return Verdict(False, "the label's own job decides", quiet=True)
    if labelled and approval is not None:
        return Verdict(
            False,
            f"new commits since @{approval.approver} approved {approval.head_sha[:7]}: a "
            f"maintainer must review them and add the label `{label}` again",
            remove_label=True,
        )
    if labelled:
        return Verdict(
            False,
            f"the label `{label}` is on this pull request, but no maintainer's approval of its "
            f"head {head_sha[:7]} was recorded: a maintainer must add `{label}` again",
            remove_label=True,
        )
    return Verdict(
        False,
        "this pull request comes from a fork: a maintainer can allow a branch for its current "
        f"head by adding the label `{label}`",
    )
