"""The pool's policy file: what loads, what is refused on load (naming the line and the field),
and who :meth:`Policy.admit` lets in: owners, repositories by name and id, workflows, forks."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pgoverlay.errors import ConfigError, UnsafeFileError
from pgoverlay.runner.callers import policy
from pgoverlay.runner.callers.oidc import Identity

POLICY = b"""\
# the pool serves acme's repositories and one of octo-org's
owners:
  - acme
  - {name: octo-org, id: 5}
repositories:
  - acme/*
  - {name: octo-org/shop, id: 2002, branches: 3}
limits:
  total: 40
  per_repository: 5
forks: false
workflows:
  - "acme/*/.github/workflows/pgoverlay.yml@*"
  - "octo-org/shop/.github/workflows/db.yml@refs/heads/main"
"""


def identity(**overrides: Any) -> Identity:
    """A pull_request run of octo-org/shop's db workflow, as a verified token names it."""
    base = Identity(
        repository="octo-org/shop",
        repository_id=2002,
        repository_owner="octo-org",
        repository_owner_id=5,
        event_name="pull_request",
        ref="refs/pull/7/merge",
        head_ref="feature",
        base_ref="main",
        job_workflow_ref="octo-org/shop/.github/workflows/db.yml@refs/heads/main",
        runner_environment="github-hosted",
        repository_visibility="private",
        actor="octocat",
        sub="repo:octo-org/shop:pull_request",
    )
    return dataclasses.replace(base, **overrides)


def acme(**overrides: Any) -> Identity:
    fields: dict[str, Any] = {
        "repository": "acme/app",
        "repository_id": 77,
        "repository_owner": "acme",
        "repository_owner_id": 1001,
        "job_workflow_ref": "acme/app/.github/workflows/pgoverlay.yml@refs/pull/9/merge",
        "ref": "refs/pull/9/merge",
        "sub": "repo:acme/app:pull_request",
    }
    return identity(**{**fields, **overrides})


@pytest.fixture
def pool_policy() -> policy.Policy:
    return policy.parse(POLICY, name="policy.yml")


def load_error(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        policy.parse(text.encode(), name="policy.yml")
    return str(caught.value)


# -- loading ----------------------------------------------------------------------------------


def test_a_valid_file_loads_with_its_short_and_long_forms(
    pool_policy: policy.Policy, tmp_path: Path
) -> None:
    assert [o.name for o in pool_policy.owners] == ["acme", "octo-org"]
    assert pool_policy.owners[1].id == 5
    assert pool_policy.repositories is not None
    assert [(r.name, r.id, r.branches) for r in pool_policy.repositories] == [
        ("acme/*", None, None),
        ("octo-org/shop", 2002, 3),
    ]
    assert pool_policy.limits == policy.Limits(total=40, per_repository=5)
    assert pool_policy.forks is False and pool_policy.fork_write_tokens is False
    path = tmp_path / "policy.yml"
    path.write_bytes(POLICY)
    assert policy.load(path) == pool_policy


def test_the_smallest_policy_is_its_owners() -> None:
    smallest = policy.parse(b"owners: [acme]\n", name="p.yml")
    assert smallest.repositories is None and smallest.workflows is None
    assert smallest.limits == policy.Limits()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "owners: [acme]\nrepositories:\n  - acme/shop\n  - {name: acme/bank, id: x}\n",
            "at line 4 (repositories.1.id): Input should be a valid integer",
        ),
        (
            "owners:\n  - acme\n  - acme corp\n",
            "at line 3 (owners.1.name): 'acme corp' is not a GitHub account name",
        ),
        ("forks: false\n", "(owners): Field required"),
        ("owners: []\n", "at line 1 (owners): List should have at least 1 item"),
        (
            "owners: [acme]\nrepositories: [acme/sh*p]\n",
            "at line 2 (repositories.0.name): 'acme/sh*p' is not owner/name or owner/*",
        ),
        (
            "owners: [acme]\nrepositories: [other/shop]\n",
            "at line 2 (repositories.0): other/shop is not of an owner listed in owners: "
            "add other there",
        ),
        (
            "owners: [acme]\nrepositories:\n  - {name: 'acme/*', id: 3}\n",
            "at line 3 (repositories.0.id): acme/* names many repositories: it takes no id",
        ),
        (
            "owners: [acme]\nworkflows:\n  - acme/shop/.github/workflows/db.yml\n",
            "at line 3 (workflows.0): 'acme/shop/.github/workflows/db.yml' cannot match a "
            "job_workflow_ref",
        ),
        ("owners: [acme]\nworkflows: []\n", "at line 2 (workflows): an empty list admits"),
        (
            "owners: [acme]\nlimits:\n  total: 0\n",
            "at line 3 (limits.total): Input should be greater than or equal to 1",
        ),
        (
            "owners: [acme]\nfork: true\n",
            "at line 2 (fork): Extra inputs are not permitted",
        ),
        ("owners: [acme]\nforks: maybe\n", "at line 2 (forks): Input should be a valid boolean"),
        ("owners: [acme, Acme]\n", "at line 1 (owners.1): Acme is listed twice"),
        (
            "owners: [acme]\nforks: false\nforks: true\n",
            "at line 3: the key 'forks' appears twice",
        ),
        ("owners: [acme\n", "is not valid YAML at line 2"),
        ("- acme\n", "must be a mapping with owners:"),
    ],
)
def test_each_invalid_file_is_refused_naming_the_line_and_the_field(
    text: str, expected: str
) -> None:
    message = load_error(text)
    assert message.startswith("the pool's policy file policy.yml")
    assert expected in message


def test_an_owner_whose_login_is_digits_is_read_as_a_name() -> None:
    digits = policy.parse(b"owners: [1234]\nrepositories: [1234/app]\n", name="p.yml")
    assert digits.owners[0].name == "1234"
    assert "owners.0" in load_error("owners: [true]\n")


def test_a_policy_file_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafeFileError, match="policy file"):
        policy.load(tmp_path)  # a directory
    with pytest.raises(UnsafeFileError, match="policy file"):
        policy.load(tmp_path / "missing.yml")


# -- admitting ---------------------------------------------------------------------------------


def test_a_listed_repository_is_admitted_with_its_limits(pool_policy: policy.Policy) -> None:
    assert pool_policy.admit(identity()) == policy.Decision(
        allowed=True, branch_limit=3, total_limit=40
    )
    # a wildcard's repository gets the policy's per-repository limit
    assert pool_policy.admit(acme()) == policy.Decision(
        allowed=True, branch_limit=5, total_limit=40
    )


def test_an_owner_not_listed_is_refused(pool_policy: policy.Policy) -> None:
    decision = pool_policy.admit(
        identity(repository="mallory/shop", repository_owner="mallory", repository_owner_id=66)
    )
    assert not decision.allowed and decision.rule == "owners"
    assert decision.reason.startswith("the owner mallory is not one this pool serves")


def test_an_owner_recreated_under_a_pinned_name_is_refused(pool_policy: policy.Policy) -> None:
    decision = pool_policy.admit(identity(repository_owner_id=6))
    assert decision.rule == "owners"
    assert "has id 6, but the policy pins octo-org to id 5" in decision.reason


def test_a_renamed_owner_is_refused_saying_so(pool_policy: policy.Policy) -> None:
    decision = pool_policy.admit(identity(repository="octo-new/shop", repository_owner="octo-new"))
    assert decision.rule == "owners"
    assert "which list that id as octo-org: the account was renamed" in decision.reason


def test_a_repository_not_listed_is_refused(pool_policy: policy.Policy) -> None:
    decision = pool_policy.admit(identity(repository="octo-org/bank", repository_id=3003))
    assert decision.rule == "repositories"
    assert decision.reason.startswith("the repository octo-org/bank is not one this pool serves")


def test_a_recreated_repository_of_a_pinned_name_is_refused(pool_policy: policy.Policy) -> None:
    """Deleted and made again under the same name: a new id, refused."""
    decision = pool_policy.admit(identity(repository_id=9999))
    assert not decision.allowed and decision.rule == "repositories"
    assert decision.reason.startswith(
        "the repository octo-org/shop has id 9999, but the policy pins octo-org/shop to id 2002"
    )


def test_a_renamed_repository_of_a_pinned_id_is_refused_saying_so(
    pool_policy: policy.Policy,
) -> None:
    decision = pool_policy.admit(identity(repository="octo-org/store"))
    assert decision.rule == "repositories"
    assert "which list that id as octo-org/shop: it was renamed" in decision.reason


def test_names_compare_without_case(pool_policy: policy.Policy) -> None:
    assert pool_policy.admit(identity(repository="Octo-Org/Shop", repository_owner="Octo-Org"))


def test_without_repositories_every_repository_of_an_owner_is_admitted() -> None:
    loose = policy.parse(b"owners: [acme]\n", name="p.yml")
    assert loose.admit(acme(repository="acme/anything", repository_id=12345)).allowed
    assert loose.admit(acme()).branch_limit is None  # the pool's setting holds


def test_a_workflow_matching_no_pattern_is_refused(pool_policy: policy.Policy) -> None:
    stray = "octo-org/shop/.github/workflows/db.yml@refs/heads/feature"
    decision = pool_policy.admit(identity(job_workflow_ref=stray))
    assert decision.rule == "workflows"
    assert decision.reason.startswith(f"the workflow {stray} matches none")
    other_file = "acme/app/.github/workflows/deploy.yml@refs/heads/main"
    assert pool_policy.admit(acme(job_workflow_ref=other_file)).rule == "workflows"
    # a reusable workflow of another repository, called from a listed one
    called = "acme/ci/.github/workflows/pgoverlay.yml@refs/tags/v1"
    assert pool_policy.admit(acme(job_workflow_ref=called)).allowed


def test_a_fork_pull_request_is_refused_when_forks_are_off(pool_policy: policy.Policy) -> None:
    decision = pool_policy.admit(identity(), from_fork=True)
    assert decision.rule == "forks"
    assert "from a fork" in decision.reason
    assert pool_policy.admit(identity(), from_fork=False).allowed


def test_a_pull_request_run_of_unknown_origin_is_admitted_where_forks_get_no_token(
    pool_policy: policy.Policy,
) -> None:
    assert pool_policy.admit(identity()).allowed  # private, fork_write_tokens: false
    assert pool_policy.admit(identity(repository_visibility="public")).allowed


def test_a_private_repository_sending_forks_write_tokens_is_refused_unless_forks_are_on() -> None:
    text = POLICY.replace(b"forks: false\n", b"forks: false\nfork_write_tokens: true\n")
    strict = policy.parse(text, name="p.yml")
    decision = strict.admit(identity())
    assert decision.rule == "forks"
    assert "may be a fork's, which it cannot tell" in decision.reason
    # a public repository never sends them, whatever the setting says
    assert strict.admit(identity(repository_visibility="public")).allowed
    assert strict.admit(identity(), from_fork=False).allowed
    # a push is no pull request
    push = identity(event_name="push", ref="refs/heads/main", head_ref="", base_ref="")
    assert strict.admit(push).allowed


def test_pull_request_target_is_refused_when_forks_are_off_unless_the_origin_is_known(
    pool_policy: policy.Policy,
) -> None:
    target = identity(event_name="pull_request_target", ref="refs/heads/main")
    decision = pool_policy.admit(target)
    assert decision.rule == "forks"
    assert "whether or not its pull request comes from a fork" in decision.reason
    assert pool_policy.admit(target, from_fork=False).allowed
    assert not pool_policy.admit(target, from_fork=True).allowed


def test_forks_on_admits_forks_of_every_event() -> None:
    text = POLICY.replace(b"forks: false\n", b"forks: true\n")
    open_policy = policy.parse(text, name="p.yml")
    target = identity(event_name="pull_request_target", ref="refs/heads/main")
    assert open_policy.admit(target).allowed
    assert open_policy.admit(identity(), from_fork=True).allowed


def test_the_owner_rule_is_asked_before_the_others(pool_policy: policy.Policy) -> None:
    stranger = identity(
        repository="mallory/shop",
        repository_owner="mallory",
        repository_owner_id=66,
        job_workflow_ref="mallory/shop/.github/workflows/x.yml@refs/heads/main",
    )
    assert pool_policy.admit(stranger, from_fork=True).rule == "owners"


# -- a name alone, as a caller on the engine's socket gives it --------------------------------


def test_a_repository_named_on_the_socket_is_asked_its_owner_and_name_only(
    pool_policy: policy.Policy,
) -> None:
    """No id comes with the name, so a pinned entry admits its name; no workflow or event
    either, so neither rule is asked (the policy's `workflows` would refuse every name)."""
    pinned = pool_policy.admit_repository("Octo-Org/Shop")
    assert pinned.allowed and pinned.branch_limit == 3 and pinned.total_limit == 40
    wildcard = pool_policy.admit_repository("acme/anything")
    assert wildcard.allowed and wildcard.branch_limit == 5
    owner = pool_policy.admit_repository("mallory/shop")
    assert owner.rule == "owners" and "add it to owners" in owner.reason
    repository = pool_policy.admit_repository("octo-org/other")
    assert repository.rule == "repositories"
    assert "add it (or octo-org/*) to repositories" in repository.reason
    assert "(id" not in owner.reason + repository.reason
