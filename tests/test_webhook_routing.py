"""Which deliveries become jobs (pure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pgoverlay.webhook.payload import PullRequestEvent, pull_request_event
from pgoverlay.webhook.routing import Routed, route
from pgoverlay.webhook.settings import WebhookSettings

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "github" / "webhooks"
SETTINGS = WebhookSettings(
    secret="s", token="t", repositories={"Codertocat/Hello-World": {"fork_label": "db-ok"}}
)


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def delivery(payload: dict[str, Any]) -> PullRequestEvent:
    return pull_request_event(payload)


def test_pull_request_actions_become_jobs_of_their_kind() -> None:
    for name, kind in (
        ("pull_request.opened", "open"),
        ("pull_request.reopened", "open"),
        ("pull_request.synchronize", "sync"),
        ("pull_request.closed", "close"),
    ):
        routed = route(delivery(load(name)), SETTINGS)
        assert isinstance(routed, Routed) and routed.kind == kind, name
        assert routed.repository == "Codertocat/Hello-World" and routed.pr == 2
        assert routed.head_sha == load(name)["pull_request"]["head"]["sha"]


def test_only_the_approval_label_makes_a_job() -> None:
    labeled = load("pull_request.labeled")
    assert isinstance(route(delivery(labeled), SETTINGS), str)
    labeled["label"]["name"] = "db-ok"
    routed = route(delivery(labeled), SETTINGS)
    assert isinstance(routed, Routed) and routed.kind == "label"


def test_other_actions_and_repositories_are_ignored_with_a_reason() -> None:
    edited = {**load("pull_request.opened"), "action": "edited"}
    assert route(delivery(edited), SETTINGS) == "pull_request edited is not handled"
    other = load("pull_request.opened")
    other["repository"]["full_name"] = "someone/else"
    assert "not in the allow-list" in str(route(delivery(other), SETTINGS))


def test_repository_names_compare_without_case() -> None:
    opened = load("pull_request.opened")
    opened["repository"]["full_name"] = "codertocat/hello-world"
    assert isinstance(route(delivery(opened), SETTINGS), Routed)


def test_bad_repository_settings_stop_the_listener_at_start() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="cannot read duration"):
        WebhookSettings(secret="s", token="t", repositories={"a/b": {"ttl": "seven days"}})
    with pytest.raises(ValidationError, match="not both"):
        WebhookSettings(
            secret="s",
            token="t",
            repositories={"a/b": {"migrations": "db", "migrate_command": "x"}},
        )


def test_a_repository_file_is_validated_and_limited_to_safe_keys(tmp_path: Path) -> None:
    import pytest

    from pgoverlay.action.request import Inputs
    from pgoverlay.errors import ConfigError
    from pgoverlay.webhook.worker import Worker

    (tmp_path / ".pgoverlay.yml").write_text(
        "migrations: db/changes\nmigrate-command: rm -rf /\nbase: prod\n"
    )
    inputs = Worker._repo_file(tmp_path, Inputs(migrations="db/migrations"))
    assert (inputs.migrations, inputs.base, inputs.migrate_command) == ("db/changes", "prod", None)
    (tmp_path / ".pgoverlay.yml").write_text("migrations-select: everything\n")
    with pytest.raises(ConfigError, match="migrations_select"):
        Worker._repo_file(tmp_path, Inputs())


def test_the_branch_when_label_added_or_taken_off_makes_a_job_and_no_other_label_does() -> None:
    settings = WebhookSettings(
        secret="s",
        token="t",
        repositories={"Codertocat/Hello-World": {"fork_label": "db-ok", "branch_when": "label:db"}},
    )
    labeled = load("pull_request.labeled")
    for action, name, kind in (
        ("labeled", "db", "label"),
        ("unlabeled", "db", "unlabel"),
        ("labeled", "db-ok", "label"),
    ):
        payload = {**labeled, "action": action, "label": {"name": name}}
        routed = route(delivery(payload), settings)
        assert isinstance(routed, Routed) and routed.kind == kind, (action, name)
        assert routed.event.event.label == name
    for action, name in (("unlabeled", "db-ok"), ("labeled", "bug"), ("unlabeled", "bug")):
        payload = {**labeled, "action": action, "label": {"name": name}}
        assert isinstance(route(delivery(payload), settings), str), (action, name)
    # Without `branch-when: label:...`, taking a label off is no job
    unlabeled = {**labeled, "action": "unlabeled", "label": {"name": "db-ok"}}
    assert isinstance(route(delivery(unlabeled), SETTINGS), str)
