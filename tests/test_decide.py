"""What the PR workflow decides for each event and state of its branch: a table, no I/O. And how
a run's report concludes (the Action's exit code, the listener's commit status)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
from pydantic import ValidationError

from pgoverlay.action import record
from pgoverlay.action.conclusion import conclude, refusal
from pgoverlay.action.decide import (
    Decision,
    decide,
    fingerprint,
    fork_refusal,
    rerun_fields,
)
from pgoverlay.action.event import Event, Kind
from pgoverlay.action.insight.model import MigrationInsight, Verdict, Volume
from pgoverlay.action.report import BranchInfo, MigrationRun, Report, RunStatus
from pgoverlay.action.request import Inputs, PrRequest
from pgoverlay.errors import RequestError
from pgoverlay.runner.service.views import BranchView, Record
from pgoverlay.webhook.settings import RepoSettings

HEAD, OTHER = "a" * 40, "c" * 40
ASKED = Inputs(migrations="db/migrations")


def an_event(kind: Kind = "sync", *, fork: bool = False, head: str = HEAD) -> Event:
    return Event(
        kind=kind,
        repository="acme/shop",
        pr=5,
        head_sha=head,
        base_sha="b" * 40,
        merged=True if kind == "close" else None,
        from_fork=fork,
        draft=False,
        ref_name="feature",
        action={"open": "opened", "sync": "synchronize", "close": "closed"}.get(kind, "labeled"),
    )


def a_branch(
    *, repository: str = "acme/shop", state: str = "ready", running: bool = True
) -> BranchView:
    return BranchView(
        name="shop-pr-5",
        state=state,
        running=running,
        liveness="running" if running else "stopped",
        base="app",
        base_version=1,
        runtime="local",
        host="127.0.0.1",
        port=5500,
        database="app",
        user="app",
        created_at=0.0,
        ready_at=1.0,
        expires_at=None,
        repository=repository,
        pr=5,
        owner_uid=0,
    )


def a_report(
    status: RunStatus = "ready", *, migrations: list[MigrationRun] | None = None
) -> Report:
    return Report(
        repository="acme/shop",
        pr=5,
        branch_name="shop-pr-5",
        head_sha=HEAD,
        status=status,
        branch=BranchInfo(
            name="shop-pr-5",
            host="127.0.0.1",
            port=5500,
            database="app",
            user="app",
            base_name="app",
            base_version=1,
            base_seeded_at=None,
            layer_logical_bytes=0,
            layer_physical_bytes=0,
        ),
        migrations=migrations or [],
    )


def a_record(
    status: RunStatus = "ready", *, head: str = HEAD, asked: PrRequest | None = ASKED
) -> record.PrRecord:
    options = fingerprint(asked) if asked is not None else ""
    return record.PrRecord(head, status, a_report(status), inputs=options)


FORK_REFUSED = "forks are not branched here"
HALF_MADE = (
    "branch shop-pr-5 is creating (an earlier run was interrupted): run `pgoverlay gc` on the "
    "runner, then re-run this job"
)
CHANGED = dataclasses.replace(ASKED, max_blocking_lock="1s")
KEEP = dataclasses.replace(ASKED, reset_on_push=False)

# (what happens, the event, its branch, the branch's record, the request, the policy's refusal)
# -> what the workflow does
CASES = [
    (
        "a label",
        an_event("label"),
        a_branch(),
        a_record(),
        ASKED,
        "",
        Decision("skip", why="a labeled event needs no branch"),
    ),
    ("opened, no branch", an_event("open"), None, None, ASKED, "", Decision("create")),
    ("pushed, no branch", an_event(), None, None, ASKED, "", Decision("create")),
    (
        "pushed, branch at another head",
        an_event(),
        a_branch(),
        a_record(head=OTHER),
        ASKED,
        "",
        Decision("reset"),
    ),
    (
        "pushed, branch at another head, kept",
        an_event(),
        a_branch(),
        a_record(head=OTHER, asked=KEEP),
        KEEP,
        "",
        Decision("migrate"),
    ),
    (
        "same head, same inputs",
        an_event(),
        a_branch(),
        a_record(),
        ASKED,
        "",
        Decision("report", ran=True),
    ),
    (
        "same head, changed inputs",
        an_event(),
        a_branch(),
        a_record(),
        CHANGED,
        "",
        Decision("reset"),
    ),
    (
        "same head, changed inputs, kept",
        an_event(),
        a_branch(),
        a_record(asked=KEEP),
        dataclasses.replace(KEEP, insight=False),
        "",
        Decision("migrate"),
    ),
    (
        "same head, a record without inputs",
        an_event(),
        a_branch(),
        a_record(asked=None),
        ASKED,
        "",
        Decision("reset"),
    ),
    (
        "same head, branch stopped",
        an_event(),
        a_branch(running=False),
        a_record(),
        ASKED,
        "",
        Decision("migrate"),
    ),
    (
        "same head, its migrations failed",
        an_event(),
        a_branch(),
        a_record("migration failed"),
        ASKED,
        "",
        Decision("reset", ran=True),
    ),
    (
        "same head, failed, kept",
        an_event(),
        a_branch(),
        a_record("migration failed", asked=KEEP),
        KEEP,
        "",
        Decision("migrate", ran=True),
    ),
    ("branch with no record", an_event(), a_branch(), None, ASKED, "", Decision("reset")),
    (
        "branch left half-made",
        an_event(),
        a_branch(state="creating"),
        a_record(),
        ASKED,
        "",
        Decision("fail", why=HALF_MADE),
    ),
    ("closed", an_event("close"), a_branch(), a_record(), ASKED, "", Decision("destroy")),
    (
        "closed, no branch",
        an_event("close"),
        None,
        None,
        ASKED,
        "",
        Decision("skip", why="no branch"),
    ),
    (
        "closed fork, refused by policy",
        an_event("close", fork=True),
        a_branch(),
        a_record(),
        ASKED,
        FORK_REFUSED,
        Decision("destroy"),
    ),
    (
        "fork refused",
        an_event("open", fork=True),
        None,
        None,
        ASKED,
        FORK_REFUSED,
        Decision("refuse", why=FORK_REFUSED, status="not branched"),
    ),
    (
        "fork refused, branch done",
        an_event(fork=True),
        a_branch(),
        a_record(),
        ASKED,
        FORK_REFUSED,
        Decision("refuse", why=FORK_REFUSED, status="not branched"),
    ),
]


@pytest.mark.parametrize(
    ("event", "branch", "last", "asked", "refused", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_each_event_and_branch_state_gets_one_decision(
    event: Event,
    branch: BranchView | None,
    last: record.PrRecord | None,
    asked: PrRequest,
    refused: str,
    expected: Decision,
) -> None:
    assert decide(event, branch, last, asked, refused=refused) == expected


@pytest.mark.parametrize("kind", ["open", "sync", "close"])
def test_a_branch_another_repository_holds_is_refused_whatever_the_event(kind: Kind) -> None:
    theirs = a_branch(repository="other/blog")
    decision = decide(an_event(kind), theirs, a_record(), ASKED)
    assert decision.action == "refuse" and decision.status == "failed"
    assert "belongs to other/blog#5" in decision.why and "`branch-name`" in decision.why
    same_owner = a_branch(repository="ACME/Shop")
    assert decide(an_event(kind), same_owner, a_record(), ASKED).action != "refuse"


def test_the_actions_fork_policy_refuses_forks_until_allowed_and_never_a_close() -> None:
    refused = fork_refusal(an_event("open", fork=True), Inputs())
    assert "`allow-forks: true`" in refused
    assert fork_refusal(an_event("open", fork=True), Inputs(allow_forks=True)) == ""
    assert fork_refusal(an_event("close", fork=True), Inputs()) == ""
    assert fork_refusal(an_event("open"), Inputs()) == ""


def test_every_request_field_is_a_run_option_or_says_why_not() -> None:
    for f in dataclasses.fields(Inputs):
        rerun = f.metadata["rerun"]
        assert rerun is True or (isinstance(rerun, str) and len(rerun) > 10), f.name
    assert {"migrations", "migrate_command", "insight", "allow_fork_commands"} <= set(
        rerun_fields()
    )
    assert not {"ttl", "comment", "branch_name"} & set(rerun_fields())


def test_run_options_change_with_what_runs_and_hold_no_value() -> None:
    secret = "psql postgres://app:hunter2@db/app -f up.sql"
    asked = Inputs(migrate_command=secret)
    kept = fingerprint(asked)
    assert kept.startswith("sha256:") and "hunter2" not in kept
    assert kept == fingerprint(Inputs(migrate_command=secret, comment=False, ttl="2h"))
    for name, value in [
        ("migrate_command", "make migrate"),
        ("insight", False),
        ("max_rewrite", "2GiB"),
        ("fail_on_threshold", True),
        ("assume_long_transaction", "30s"),
        ("allow_fork_commands", True),
    ]:
        changed: dict[str, Any] = {name: value}
        assert fingerprint(dataclasses.replace(asked, **changed)) != kept, name
    # The listener's request, for the same settings, is the same run
    settings = RepoSettings.model_validate({"migrations": "db/migrations"})
    assert fingerprint(settings.request()) == fingerprint(PrRequest(migrations="db/migrations"))


def test_a_record_keeps_its_run_options_and_one_without_them_still_reads() -> None:
    kept = a_record()
    back = record.loads(record.dumps(kept))
    assert back.inputs == fingerprint(ASKED) and back == kept
    older = json.loads(record.dumps(kept))
    del older["inputs"]
    old = record.read(Record(data=json.dumps(older), updated_at=0.0), branch="shop-pr-5")
    assert old is not None and old.inputs == "" and old.report == kept.report
    assert decide(an_event(), a_branch(), old, ASKED).action == "reset"


def test_the_refusal_report_names_the_branch_a_later_run_would_use() -> None:
    report = refusal(an_event("open", fork=True), None, "no forks", status="not branched")
    assert (report.branch_name, report.status, report.message) == (
        "shop-pr-5",
        "not branched",
        "no forks",
    )
    assert report.branch is None and report.pr == 5 and report.head_sha == HEAD
    named = refusal(an_event(), "pr-{number}", "taken", status="failed")
    assert named.branch_name == "pr-5"


def over(name: str) -> MigrationRun:
    verdict = Verdict(level="over", text=f"{name} holds a lock for 9 s")
    insight = MigrationInsight(
        seconds=9.0,
        locks=[],
        rewrites=[],
        scans=[],
        volume=Volume(),
        statements=[],
        findings=[],
        verdict=verdict,
        interval=0.1,
    )
    return MigrationRun(name, "applied", 1.0, insight=insight)


@pytest.mark.parametrize(
    ("report", "fail_on_threshold", "fail_on_migration_error", "cause", "line"),
    [
        (a_report(), False, True, "", "branch shop-pr-5 ready on port 5500"),
        (
            dataclasses.replace(a_report("failed"), message="no base"),
            False,
            True,
            "branch",
            "no base",
        ),
        (a_report("migration failed"), False, True, "migration", "migration failed"),
        (a_report("migration failed"), False, False, "", "migration failed"),
        (
            a_report(migrations=[over("1.sql")]),
            True,
            True,
            "threshold",
            "1.sql: 1.sql holds a lock for 9 s",
        ),
        (
            a_report(migrations=[over("1.sql")]),
            False,
            True,
            "",
            "branch shop-pr-5 ready on port 5500",
        ),
        (
            a_report("migration failed", migrations=[over("1.sql")]),
            True,
            True,
            "migration",
            "migration failed",
        ),
        (a_report("destroyed", migrations=[over("1.sql")]), True, True, "", "destroyed"),
    ],
)
def test_a_report_passes_unless_its_branch_migrations_or_thresholds_fail(
    report: Report,
    fail_on_threshold: bool,
    fail_on_migration_error: bool,
    cause: str,
    line: str,
) -> None:
    end = conclude(
        report,
        fail_on_threshold=fail_on_threshold,
        fail_on_migration_error=fail_on_migration_error,
    )
    assert (end.cause, end.line, end.passed) == (cause, line, not cause)


# -- branch-when: which pull requests get a branch ---------------------------------------------

BY_LABEL = Inputs(migrations="db/migrations", branch_when="label:db")
BY_MIGRATIONS = Inputs(migrations="db/migrations", branch_when="migrations")
NO_LABEL = "this pull request does not carry the label `db` (branch-when: label:db)"
NO_MIGRATIONS = (
    "this pull request adds or changes no .sql file under db/migrations (branch-when: migrations)"
)


def labelled(
    kind: Kind = "sync", *, labels: tuple[str, ...] = (), label: str = "", fork: bool = False
) -> Event:
    """``an_event`` with the pull request's ``labels``; ``label``: the one a `labeled`
    (``kind`` label) or `unlabeled` (``unlabel``) event added or took off."""
    action = {"label": "labeled", "unlabel": "unlabeled"}.get(kind)
    ev = an_event(kind, fork=fork)
    return dataclasses.replace(ev, labels=labels, label=label, action=action or ev.action)


def not_wanted(why: str) -> Decision:
    return Decision("unwanted", why=f"no branch: {why}", status="not branched")


# (what happens, the event, its branch, its record, the request, the policy's refusal, whether
# the pull request changes migrations) -> what the workflow does
WHEN_CASES = [
    (
        "always, no migration changed",
        an_event("open"),
        None,
        None,
        ASKED,
        "",
        False,
        Decision("create"),
    ),
    ("label: opened without it", labelled("open"), None, None, BY_LABEL, "", None, NO_LABEL),
    (
        "label: opened with it",
        labelled("open", labels=("db", "ui")),
        None,
        None,
        BY_LABEL,
        "",
        None,
        Decision("create"),
    ),
    (
        "label: added (a payload listing it or not)",
        labelled("label", label="db"),
        None,
        None,
        BY_LABEL,
        "",
        None,
        Decision("create"),
    ),
    (
        "label: added again to a head already done",
        labelled("label", labels=("db",), label="db"),
        a_branch(),
        a_record(asked=BY_LABEL),
        BY_LABEL,
        "",
        None,
        Decision("report", ran=True),
    ),
    (
        "label: another label added",
        labelled("label", labels=("ui",), label="ui"),
        None,
        None,
        BY_LABEL,
        "",
        None,
        Decision("skip", why="a labeled event needs no branch"),
    ),
    (
        "label: taken off its branch (a payload still listing it or not)",
        labelled("unlabel", labels=("db", "ui"), label="db"),
        a_branch(),
        a_record(asked=BY_LABEL),
        BY_LABEL,
        "",
        None,
        Decision("destroy", why=NO_LABEL),
    ),
    (
        "label: taken off, no branch",
        labelled("unlabel", label="db"),
        None,
        None,
        BY_LABEL,
        "",
        None,
        NO_LABEL,
    ),
    (
        "label: another label taken off",
        labelled("unlabel", labels=("db",), label="ui"),
        a_branch(),
        a_record(asked=BY_LABEL),
        BY_LABEL,
        "",
        None,
        Decision("skip", why="a unlabeled event needs no branch"),
    ),
    (
        "label: pushed without it, branch made before",
        labelled(),
        a_branch(),
        a_record(asked=BY_LABEL),
        BY_LABEL,
        "",
        None,
        Decision("destroy", why=NO_LABEL),
    ),
    (
        "label: pushed with it, at another head",
        labelled(labels=("db",)),
        a_branch(),
        a_record(head=OTHER, asked=BY_LABEL),
        BY_LABEL,
        "",
        None,
        Decision("reset"),
    ),
    (
        "label: closed without it",
        labelled("close"),
        a_branch(),
        a_record(),
        BY_LABEL,
        "",
        None,
        Decision("destroy"),
    ),
    (
        "label: taken off, the name another repository's",
        labelled("unlabel", label="db"),
        a_branch(repository="other/blog"),
        None,
        BY_LABEL,
        "",
        None,
        NO_LABEL,
    ),
    (
        "label: a fork without it, refused",
        labelled("open", fork=True),
        None,
        None,
        BY_LABEL,
        FORK_REFUSED,
        None,
        NO_LABEL,
    ),
    (
        "label: a fork with it, refused",
        labelled("label", label="db", fork=True),
        None,
        None,
        BY_LABEL,
        FORK_REFUSED,
        None,
        Decision("refuse", why=FORK_REFUSED, status="not branched"),
    ),
    (
        "migrations: none changed",
        an_event("open"),
        None,
        None,
        BY_MIGRATIONS,
        "",
        False,
        NO_MIGRATIONS,
    ),
    (
        "migrations: one changed",
        an_event("open"),
        None,
        None,
        BY_MIGRATIONS,
        "",
        True,
        Decision("create"),
    ),
    (
        "migrations: not known yet",
        an_event("open"),
        None,
        None,
        BY_MIGRATIONS,
        "",
        None,
        Decision("create"),
    ),
    (
        "migrations: a push took them back out",
        an_event(head=OTHER),
        a_branch(),
        a_record(asked=BY_MIGRATIONS),
        BY_MIGRATIONS,
        "",
        False,
        Decision("destroy", why=NO_MIGRATIONS),
    ),
    (
        "migrations: a push changes more",
        an_event(head=OTHER),
        a_branch(),
        a_record(asked=BY_MIGRATIONS),
        BY_MIGRATIONS,
        "",
        True,
        Decision("reset"),
    ),
    (
        "migrations: closed",
        an_event("close"),
        a_branch(),
        a_record(),
        BY_MIGRATIONS,
        "",
        False,
        Decision("destroy"),
    ),
    (
        "migrations: under a working directory",
        an_event("open"),
        None,
        None,
        dataclasses.replace(BY_MIGRATIONS, working_directory="./app"),
        "",
        False,
        NO_MIGRATIONS.replace("db/migrations", "app/db/migrations"),
    ),
]


@pytest.mark.parametrize(
    ("event", "branch", "last", "asked", "refused", "changes", "expected"),
    [case[1:] for case in WHEN_CASES],
    ids=[case[0] for case in WHEN_CASES],
)
def test_branch_when_decides_which_pull_requests_have_a_branch(
    event: Event,
    branch: BranchView | None,
    last: record.PrRecord | None,
    asked: PrRequest,
    refused: str,
    changes: bool | None,
    expected: Decision | str,
) -> None:
    want = expected if isinstance(expected, Decision) else not_wanted(expected)
    assert decide(event, branch, last, asked, refused=refused, changes=changes) == want


def test_a_push_outside_a_pull_request_is_branched_whatever_branch_when_says() -> None:
    push = dataclasses.replace(an_event(), kind="ref", pr=None, base_sha=None, action="push")
    for asked in (BY_LABEL, BY_MIGRATIONS):
        assert decide(push, None, None, asked, changes=False) == Decision("create")


def test_the_actions_fork_policy_asks_about_a_label_that_makes_a_branch() -> None:
    """Adding the `branch-when` label to a fork's pull request is an open: `allow-forks`
    still decides; other labels ask nothing of it."""
    label = labelled("label", label="db", fork=True)
    assert "`allow-forks: true`" in fork_refusal(label, BY_LABEL)
    assert fork_refusal(label, ASKED) == ""
    assert fork_refusal(labelled("label", label="ui", fork=True), BY_LABEL) == ""


@pytest.mark.parametrize(
    ("written", "problem"),
    [
        ("sometimes", "branch_when: branch-when 'sometimes' is not one of `always`"),
        ("label:", "branch_when: branch-when 'label:' is not one of"),
        ("migrations:db", "branch_when: branch-when 'migrations:db' is not one of"),
        ("label", "branch_when: branch-when 'label' is not one of"),
    ],
)
def test_branch_when_refuses_what_it_cannot_read(written: str, problem: str) -> None:
    with pytest.raises(RequestError, match=f"^{re.escape(problem)}"):
        Inputs(branch_when=written)
    with pytest.raises(ValidationError, match=re.escape(problem.partition(": ")[2])):
        RepoSettings.model_validate({"branch_when": written})


def test_branch_when_migrations_needs_a_migrations_folder() -> None:
    with pytest.raises(RequestError, match=r"^`branch-when: migrations` needs `migrations` \("):
        Inputs(migrate_command="alembic upgrade head", branch_when="migrations")
    with pytest.raises(RequestError, match="needs `migrations`, the folder of .sql files"):
        Inputs(branch_when="migrations")
    with pytest.raises(ValidationError, match="cannot tell which files are migrations"):
        RepoSettings.model_validate({"migrate_command": "make", "branch_when": "migrations"})
    assert Inputs(branch_when=" label: db ").branch_when == " label: db "
    assert decide(labelled("open", labels=("db",)), None, None, Inputs(branch_when=" label: db "))
    assert RepoSettings.model_validate({}).request().branch_when == "always"
