"""What a signed delivery must be before the listener acts on it (pure): headers, JSON, depth,
and the parts of a pull_request event pgoverlay reads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgoverlay.errors import DeliveryError
from pgoverlay.webhook.payload import (
    KNOWN_EVENTS,
    MAX_DEPTH,
    check_headers,
    decode,
    depth,
    pull_request_event,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "github" / "webhooks"
PULL_REQUESTS = sorted(FIXTURES.glob("pull_request.*.json"))


def opened() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "pull_request.opened.json").read_text())
    return data


def nested(levels: int) -> bytes:
    """A JSON object ``levels`` deep: {"a": {"a": ... {} ...}}."""
    return b'{"a":' * (levels - 1) + b"{}" + b"}" * (levels - 1)


# Each malformed pull_request payload, and the words its refusal must carry.
MALFORMED: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "no pull_request object": (lambda p: p.pop("pull_request"), "pull_request: Field required"),
    "pull_request a string": (
        lambda p: p.update(pull_request="#2"),
        "pull_request: Input should be a valid dictionary",
    ),
    "no head": (lambda p: p["pull_request"].pop("head"), "pull_request.head: Field required"),
    "head a list": (
        lambda p: p["pull_request"].update(head=[p["pull_request"]["head"]]),
        "pull_request.head: Input should be a valid dictionary",
    ),
    "repository a string": (
        lambda p: p.update(repository="Codertocat/Hello-World"),
        "repository: Input should be a valid dictionary",
    ),
    "number a bool": (lambda p: p.update(number=True), "number: Input should be a valid integer"),
    "number a string": (lambda p: p.update(number="2"), "number: Input should be a valid integer"),
    "number a float": (lambda p: p.update(number=2.0), "number: Input should be a valid integer"),
    "pull_request.number a bool": (
        lambda p: p["pull_request"].update(number=True),
        "pull_request.number: Input should be a valid integer",
    ),
    "numbers that differ": (
        lambda p: p.update(number=3),
        "number and pull_request.number differ",
    ),
    "head sha not a commit": (
        lambda p: p["pull_request"]["head"].update(sha="../../etc"),
        "pull_request.head.sha: String should match pattern",
    ),
    "repository name with a path": (
        lambda p: p["repository"].update(full_name="a/b/../c"),
        "repository.full_name: String should match pattern",
    ),
    "labels an object": (
        lambda p: p["pull_request"].update(labels={"name": "x"}),
        "pull_request.labels: Input should be a valid list",
    ),
}


@pytest.mark.parametrize("path", PULL_REQUESTS, ids=lambda p: p.stem)
def test_githubs_own_pull_request_payloads_are_accepted(path: Path) -> None:
    data = decode(path.read_bytes())
    event = pull_request_event(data)
    assert event.number == event.pull_request.number == data["number"]
    assert event.repository.full_name == "Codertocat/Hello-World"
    assert depth(data) < MAX_DEPTH


def test_a_deleted_forks_null_head_repository_is_accepted() -> None:
    payload = opened()
    payload["pull_request"]["head"]["repo"] = None
    assert pull_request_event(payload).pull_request.head.repo is None


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_each_malformed_pull_request_payload_is_refused_with_what_is_wrong(name: str) -> None:
    mangle, words = MALFORMED[name]
    payload = opened()
    mangle(payload)
    with pytest.raises(DeliveryError, match="not a pull_request event as GitHub sends it") as err:
        pull_request_event(payload)
    assert words in str(err.value)


def test_json_nested_deeper_than_the_limit_is_refused_and_at_the_limit_is_not() -> None:
    assert depth(decode(nested(MAX_DEPTH))) == MAX_DEPTH
    with pytest.raises(DeliveryError, match=f"deeper than {MAX_DEPTH} levels"):
        decode(nested(MAX_DEPTH + 1))


def test_json_deep_enough_to_overflow_the_parser_is_refused_the_same_way() -> None:
    with pytest.raises(DeliveryError, match=f"deeper than {MAX_DEPTH} levels"):
        decode(b"[" * 200_000 + b"]" * 200_000)
    with pytest.raises(DeliveryError, match=f"deeper than {MAX_DEPTH} levels"):
        decode(b'{"a":' + b"[" * 200_000 + b"]" * 200_000 + b"}")


def test_depth_counts_lists_and_objects_without_recursing() -> None:
    assert depth(3) == 0 and depth({}) == 1 and depth([[], {"a": [1]}]) == 3
    deep: list[Any] = []
    for _ in range(50_000):  # far past Python's recursion limit
        deep = [deep]
    assert depth(deep) == 50_001


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{not json", "the body is not JSON"),
        (b"\xff\xfe\x00", "the body is not JSON"),
        (b"[1, 2]", "not an object (list)"),
        (b'"a string"', "not an object (str)"),
        (b"", "the body is not JSON"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_refused(body: bytes, words: str) -> None:
    with pytest.raises(DeliveryError, match=words.replace("(", r"\(").replace(")", r"\)")):
        decode(body)


def test_headers_must_name_a_known_event_and_a_delivery() -> None:
    assert check_headers("pull_request", "72d3162e-cc78-11e3-81ab-4c9367dc0958") == (
        "pull_request",
        "72d3162e-cc78-11e3-81ab-4c9367dc0958",
    )
    with pytest.raises(DeliveryError, match="missing X-GitHub-Event"):
        check_headers(None, "d-1")
    with pytest.raises(DeliveryError, match="missing X-GitHub-Event"):
        check_headers("", "d-1")
    with pytest.raises(DeliveryError, match="missing X-GitHub-Delivery"):
        check_headers("pull_request", None)
    with pytest.raises(DeliveryError, match="not a delivery id"):
        check_headers("pull_request", "d-1\ninjected log line")


def test_an_event_name_outside_the_fixed_list_is_refused_and_not_echoed_whole() -> None:
    forged = 'pull_request"} 1\nevil_metric 1\n# ' + "x" * 500
    with pytest.raises(DeliveryError, match="not an event pgoverlay knows") as err:
        check_headers(forged, "d-1")
    assert "\n" not in str(err.value) and "x" * 50 not in str(err.value)
    assert "pull_request" in KNOWN_EVENTS and "ping" in KNOWN_EVENTS
    assert all(name.isidentifier() and name.islower() for name in KNOWN_EVENTS)
