"""Default branch names: one repository's pull request never takes another's name on a shared
runner, and a name too long for Postgres stays stable and distinct."""

from __future__ import annotations

import pytest

from pgoverlay.action.event import Event, branch_name
from pgoverlay.errors import ConfigError
from pgoverlay.runner.names import NAME_RE, parse_seconds


def pr(repository: str, number: int) -> Event:
    return Event(
        kind="open",
        repository=repository,
        pr=number,
        head_sha="a" * 40,
        base_sha="b" * 40,
        merged=None,
        from_fork=False,
        draft=False,
        ref_name="feature",
        action="opened",
    )


def test_two_repositories_pr_7_get_two_names() -> None:
    assert branch_name(pr("acme/widgets", 7), None) == "widgets-pr-7"
    assert branch_name(pr("acme/gadgets", 7), None) == "gadgets-pr-7"


def test_a_long_name_is_shortened_with_a_stable_hash_of_the_whole() -> None:
    long_a = "acme/" + "very-long-repository-name-" * 3 + "alpha"
    long_b = "acme/" + "very-long-repository-name-" * 3 + "bravo"
    a, b = branch_name(pr(long_a, 12345), None), branch_name(pr(long_b, 12345), None)
    assert NAME_RE.match(a) and NAME_RE.match(b)
    assert len(a) == len(b) == 63 and a != b
    assert branch_name(pr(long_a, 12345), None) == a  # the same PR always gets the same name


def test_a_template_is_filled_and_made_a_valid_name() -> None:
    assert branch_name(pr("acme/Shop_API", 3), "{repo}-{number}") == "shop-api-3"
    assert branch_name(pr("acme/widgets", 3), "pr-{number}") == "pr-3"
    # two owners' repositories of one name, on one runner
    assert branch_name(pr("Acme/shop", 3), "{owner}-{repo}-pr-{number}") == "acme-shop-pr-3"


def test_one_duration_reader_for_ttls_and_lock_times() -> None:
    assert parse_seconds("500ms") == 0.5
    assert parse_seconds("1.5s") == 1.5
    assert parse_seconds(" 2M ") == 120
    assert parse_seconds("7d", whole=True) == 7 * 86400
    assert parse_seconds("1.5h", whole=True) == 5400
    for ttl in ("500ms", "1.5s", "0s", "forever", "7 d"):
        with pytest.raises(ConfigError, match="unit s, m, h, d or w"):
            parse_seconds(ttl, whole=True)
    with pytest.raises(ConfigError, match="cannot read duration '0ms'"):
        parse_seconds("0ms")
