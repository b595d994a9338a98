"""Fork approvals per head SHA: the pure verdict, and approvals kept by the queue across
restarts."""

from __future__ import annotations

from pathlib import Path

from pgoverlay.runner.listener import next_free, ranges
from pgoverlay.webhook.forks import Verdict, decide
from pgoverlay.webhook.queue import Approval, Queue

LABEL = "db-ok"
A, B = "a" * 40, "b" * 40


def _label_job(
    *,
    labels: list[str] | None = None,
    head_sha: str = A,
    sender: str = "maintainer",
    sender_can_write: bool = True,
) -> Verdict:
    """The verdict on a label job for the label put on head A (by a writer, unless told)."""
    return decide(
        kind="label",
        label=LABEL,
        labels=[LABEL] if labels is None else labels,
        head_sha=head_sha,
        approval=None,
        labelled_sha=A,
        sender=sender,
        sender_can_write=sender_can_write,
    )


def test_a_writers_label_approves_the_labelled_head() -> None:
    verdict = _label_job()
    assert verdict.run and verdict.approver == "maintainer" and not verdict.remove_label


def test_a_label_from_someone_without_write_permission_is_removed_and_approves_nothing() -> None:
    verdict = _label_job(sender="triager", sender_can_write=False)
    assert not verdict.run and verdict.remove_label and not verdict.approver
    assert "@triager" in verdict.reason and "cannot write" in verdict.reason


def test_a_label_on_an_older_head_approves_nothing() -> None:
    verdict = _label_job(head_sha=B)
    assert not verdict.run and verdict.remove_label and not verdict.approver
    assert A[:7] in verdict.reason and B[:7] in verdict.reason


def test_a_label_job_whose_label_is_gone_does_nothing_quietly() -> None:
    verdict = _label_job(labels=[])
    assert not verdict.run and verdict.quiet and not verdict.remove_label


def test_an_approval_runs_its_head_only() -> None:
    approval = Approval(head_sha=A, approver="maintainer", approved_at=0.0)
    same = decide(kind="sync", label=LABEL, labels=[LABEL], head_sha=A, approval=approval)
    assert same.run
    pushed = decide(kind="sync", label=LABEL, labels=[LABEL], head_sha=B, approval=approval)
    assert not pushed.run and pushed.remove_label
    assert "new commits" in pushed.reason and "@maintainer" in pushed.reason


def test_an_approval_needs_the_label_still_on_the_pull_request() -> None:
    approval = Approval(head_sha=A, approver="maintainer", approved_at=0.0)
    verdict = decide(kind="open", label=LABEL, labels=[], head_sha=A, approval=approval)
    assert not verdict.run and not verdict.remove_label and f"`{LABEL}`" in verdict.reason


def test_a_label_with_no_recorded_approval_is_removed_unless_its_own_job_is_queued() -> None:
    waiting = decide(
        kind="open", label=LABEL, labels=[LABEL], head_sha=A, approval=None, label_job_pending=True
    )
    assert not waiting.run and waiting.quiet and not waiting.remove_label
    stray = decide(kind="open", label=LABEL, labels=[LABEL], head_sha=A, approval=None)
    assert not stray.run and stray.remove_label


def test_approvals_are_kept_per_pull_request_across_a_restart(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "queue.db")
    assert queue.approval("acme/shop", 7) is None
    queue.approve("acme/shop", 7, head_sha=A, approver="maintainer", now=1.0)
    queue.approve("Acme/Shop", 7, head_sha=B, approver="other", now=2.0)
    queue.approve("acme/shop", 8, head_sha=A, approver="maintainer", now=3.0)
    queue.close()
    again = Queue(tmp_path / "queue.db")
    assert again.approval("acme/shop", 7) == Approval(B, "other", 2.0)
    again.revoke("ACME/shop", 7)
    assert again.approval("acme/shop", 7) is None
    assert again.approval("acme/shop", 8) == Approval(A, "maintainer", 3.0)
    again.close()


def test_a_new_subordinate_range_starts_above_every_taken_one() -> None:
    taken = ranges("pgtest:300000:65536\n# a comment\nbroken line\nother:100000:65536\n")
    assert taken == [("pgtest", 300000, 65536), ("other", 100000, 65536)]
    assert next_free(taken) == 365536
    assert next_free([]) == 100000
