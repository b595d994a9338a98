"""The listener's `branch_when`: the listener as it runs in production (see test_webhook_e2e.py,
whose listener, fake GitHub and real branches these tests share) branches only the pull requests
the repository's setting wants, says why the others have none in their commit status alone, and
destroys a branch its pull request no longer wants."""

from __future__ import annotations

from typing import Any

from test_webhook_e2e import (
    BASE_SHA,
    REPO,
    Listener,
    comments,
    eventually,
    listener,
    move_head,
    pr_payload,
    tarball,
)

from fakegithub import FakeGitHub

__all__ = ["listener"]  # the fixture, used by name

OLD = {"db/migrations/000_old.sql": "SELECT 1;\n"}  # the base's migrations (see `listener`)
NEW = {**OLD, "db/migrations/001_widgets.sql": "CREATE TABLE widgets (id int);\n"}


def descriptions(github: FakeGitHub, sha: str) -> list[tuple[str, str]]:
    """The commit statuses of ``sha``: (state, description), oldest first."""
    return [
        (str(s["state"]), str(s["description"]))
        for s in github.state.statuses
        if s.get("sha") == sha
    ]


def restarted_with(service: Listener, **changes: str) -> None:
    service.stop()
    service.configure(REPO, **changes)
    service.start()


def unlabeled(head: str, *, number: int, label: str) -> dict[str, Any]:
    payload = pr_payload("labeled", head, number=number)
    payload["action"] = "unlabeled"
    payload["label"] = {"name": label}
    return payload


def test_a_pull_request_has_a_branch_while_it_carries_the_branch_when_label(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    service, github = listener
    restarted_with(service, branch_when="label:needs-db")
    head, pr, name = "6" * 40, 21, "shop-pr-21"
    github.add_pull(REPO, pr, head, BASE_SHA)
    github.add_tarball(REPO, head, tarball(head, NEW))
    why = "this pull request does not carry the label `needs-db` (branch-when: label:needs-db)"

    assert service.send(pr_payload("opened", head, number=pr)).status_code == 202
    eventually(lambda: descriptions(github, head), what="the opened PR's commit status")
    assert descriptions(github, head) == [("success", f"no branch: {why}"[:140])]
    assert comments(github, pr) == [], "no comment on a pull request never branched"
    assert service.pool.registry.branch(name) is None

    other = pr_payload("labeled", head, number=pr, labels=("ui",))
    assert service.send(other).status_code == 204, "another label makes no job"

    with github.locked():
        github.pull(REPO, pr)["labels"].append("needs-db")
    labelled = pr_payload("labeled", head, number=pr, labels=("needs-db",))
    assert service.send(labelled).status_code == 202
    eventually(lambda: service.pool.registry.branch(name), what="the labelled PR's branch")
    eventually(
        lambda: comments(github, pr) and "**Ready**" in comments(github, pr)[0]["body"],
        what="the ready comment",
    )
    assert "001_widgets.sql" in comments(github, pr)[0]["body"]

    with github.locked():
        github.pull(REPO, pr)["labels"].remove("needs-db")
    assert service.send(unlabeled(head, number=pr, label="needs-db")).status_code == 202
    eventually(
        lambda: service.pool.registry.branch(name) is None or None, what="the branch destroyed"
    )
    eventually(
        lambda: "**Destroyed**" in comments(github, pr)[0]["body"], what="the destroyed comment"
    )
    [body] = [c["body"] for c in comments(github, pr)]
    assert f"was destroyed: {why}." in body.replace("\\", ""), body
    eventually(
        lambda: descriptions(github, head)[-1] == ("success", why[:140]) or None,
        what="a success status saying why the branch went",
    )


def test_a_pull_request_has_a_branch_while_its_head_changes_migrations(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    service, github = listener
    restarted_with(service, branch_when="migrations")
    docs, adds, pr, name = "7" * 40, "8" * 40, 22, "shop-pr-22"
    github.add_pull(REPO, pr, docs, BASE_SHA)
    github.add_tarball(REPO, docs, tarball(docs, {**OLD, "README.md": "docs only\n"}))
    github.add_tarball(REPO, adds, tarball(adds, NEW))
    why = (
        "this pull request adds or changes no .sql file under db/migrations "
        "(branch-when: migrations)"
    )

    assert service.send(pr_payload("opened", docs, number=pr)).status_code == 202
    eventually(
        lambda: ("success", f"no branch: {why}") in descriptions(github, docs) or None,
        what="a success status saying why there is no branch",
    )
    assert comments(github, pr) == [] and service.pool.registry.branch(name) is None

    move_head(github, REPO, pr, adds)
    assert service.send(pr_payload("synchronize", adds, number=pr)).status_code == 202
    eventually(lambda: service.pool.registry.branch(name), what="the branch of a migration")
    eventually(
        lambda: comments(github, pr) and "**Ready**" in comments(github, pr)[0]["body"],
        what="the ready comment",
    )
    eventually(
        lambda: descriptions(github, adds)[-1][0] == "success" or None, what="a success status"
    )
