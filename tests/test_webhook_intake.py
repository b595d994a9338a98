"""The intake process's HTTP edge, served by a real uvicorn on loopback (no worker process, no
pool): what each signed delivery gets, what is recorded, replays, /metrics and its token."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import requests
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from test_webhook_payload import MALFORMED, nested

from helpers import free_tcp_port
from pgoverlay.action.event import JOB_KINDS
from pgoverlay.runner.polling import wait_for
from pgoverlay.webhook.app import create_app
from pgoverlay.webhook.payload import MAX_DEPTH, pull_request_event
from pgoverlay.webhook.routing import JobEvent, job_event
from pgoverlay.webhook.settings import WebhookSettings
from pgoverlay.webhook.signature import sign

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "github" / "webhooks"
SECRET = "intake-test-secret"
REPO = "Codertocat/Hello-World"
TOKEN = "metrics-token-0123456789"


def opened() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "pull_request.opened.json").read_text())
    return data


def compact(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


class Intake:
    """The app on a real uvicorn server in a thread, and the means to talk to it."""

    def __init__(self, settings: WebhookSettings, queue: Path) -> None:
        self.queue = queue
        self.url = f"http://127.0.0.1:{free_tcp_port()}"
        port = int(self.url.rsplit(":", 1)[1])
        app = create_app(settings, queue)
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Intake:
        self.thread.start()
        wait_for(lambda: self.server.started, timeout=30, what="uvicorn to start")
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def post(
        self,
        body: bytes,
        *,
        event: str | None = "pull_request",
        delivery: str | None = None,
        secret: str | None = SECRET,
    ) -> requests.Response:
        headers = {"Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/test"}
        if event is not None:
            headers["X-GitHub-Event"] = event
        headers["X-GitHub-Delivery"] = delivery if delivery is not None else str(uuid.uuid4())
        if not headers["X-GitHub-Delivery"]:
            del headers["X-GitHub-Delivery"]
        if secret is not None:
            headers["X-Hub-Signature-256"] = sign(secret, body)
        return requests.post(f"{self.url}/webhook", data=body, headers=headers, timeout=30)

    def rows(self, query: str) -> list[tuple[Any, ...]]:
        with closing(sqlite3.connect(f"file:{self.queue}?mode=ro", uri=True, timeout=30)) as db:
            return db.execute(query).fetchall()

    def deliveries(self) -> list[tuple[Any, ...]]:
        """(delivery id, event, outcome, reason, repeats), oldest first."""
        return self.rows(
            "SELECT delivery_id, event, outcome, reason, repeats FROM deliveries"
            " ORDER BY received_at"
        )

    def jobs(self) -> int:
        return int(self.rows("SELECT count(*) FROM jobs")[0][0])

    def metrics(self, **headers: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        """Every sample of /metrics, by sample name and labels, parsed by prometheus_client."""
        response = requests.get(f"{self.url}/metrics", headers=headers, timeout=30)
        assert response.status_code == 200, response.text
        samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for family in text_string_to_metric_families(response.text):
            for s in family.samples:
                samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
        return samples


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Intake]]:
    running: list[Intake] = []

    def start(**overrides: Any) -> Intake:
        settings = WebhookSettings(secret=SECRET, token="t", repositories={REPO: {}}, **overrides)
        intake = Intake(settings, tmp_path / f"queue-{len(running)}.db").__enter__()
        running.append(intake)
        return intake

    yield start
    for intake in running:
        intake.__exit__()


@pytest.fixture
def intake(serve: Callable[..., Intake]) -> Intake:
    return serve()


def _malformed_cases() -> dict[str, tuple[bytes, dict[str, Any], str]]:
    """name: (body, headers for post(), words the 400 must say)."""
    cases: dict[str, tuple[bytes, dict[str, Any], str]] = {}
    for name, (mangle, words) in MALFORMED.items():
        payload = opened()
        mangle(payload)
        cases[name] = (compact(payload), {}, words)
    good = compact(opened())
    cases.update(
        {
            "nested too deep": (nested(MAX_DEPTH + 1), {}, f"deeper than {MAX_DEPTH} levels"),
            "nested past the parser": (b"[" * 100_000 + b"]" * 100_000, {}, "deeper than"),
            "not JSON": (b"payload=%7B%7D", {}, "the body is not JSON"),
            "a JSON array": (b"[]", {}, "not an object (list)"),
            "no X-GitHub-Event": (good, {"event": None}, "missing X-GitHub-Event"),
            "an unknown event": (good, {"event": "pull_requests"}, "not an event pgoverlay"),
            "no X-GitHub-Delivery": (good, {"delivery": ""}, "missing X-GitHub-Delivery"),
            "a delivery id GitHub never sends": (
                good,
                {"delivery": "d" * 101},
                "not a delivery id",
            ),
        }
    )
    return cases


MALFORMED_DELIVERIES = _malformed_cases()


@pytest.mark.parametrize("name", sorted(MALFORMED_DELIVERIES))
def test_each_malformed_signed_delivery_gets_400_with_its_message_and_is_recorded(
    intake: Intake, name: str
) -> None:
    body, headers, words = MALFORMED_DELIVERIES[name]
    response = intake.post(body, **headers)
    assert response.status_code == 400, response.text
    message = response.json()["message"]
    assert words in message
    [(_, _, outcome, reason, repeats)] = intake.deliveries()
    assert (outcome, reason, repeats) == ("rejected", message, 0)
    assert intake.jobs() == 0
    again = intake.post(body, **headers)
    assert again.status_code == 400 and again.json()["message"] == message
    [(_, _, _, _, repeats)] = intake.deliveries()
    assert repeats == 1, "a repeat is counted on the first record, not added as a row"


def test_a_signed_body_replayed_under_new_delivery_ids_queues_nothing(intake: Intake) -> None:
    body = compact(opened())
    first = intake.post(body, delivery="d-original")
    assert first.status_code == 202, first.text
    for replay in ("d-replay-1", "d-replay-2", "d-original"):
        response = intake.post(body, delivery=replay)
        assert response.status_code == 200, response.text
        assert response.json()["message"] == "already received"
    assert intake.jobs() == 1
    assert intake.deliveries() == [("d-original", "pull_request", "queued", "", 3)]
    deliveries = intake.metrics()["pgoverlay_webhook_deliveries_total"]
    assert deliveries[(("event", "pull_request"), ("outcome", "queued"))] == 1
    assert deliveries[(("event", "pull_request"), ("outcome", "duplicate"))] == 3


def test_a_replay_under_another_event_name_is_refused_and_adds_no_row(intake: Intake) -> None:
    body = compact(opened())
    assert intake.post(body).status_code == 202
    assert intake.post(body, event="push").status_code == 200  # the body was seen: a replay
    assert intake.post(body, event="forged").status_code == 400
    assert intake.jobs() == 1 and len(intake.deliveries()) == 1


def test_a_forged_event_name_gets_400_and_leaves_metrics_well_formed(intake: Intake) -> None:
    forged = 'pull_request",outcome="done"} 99\nevil_metric{a="b"} 1\n# TYPE x counter'
    for i, name in enumerate([forged.replace("\n", " "), "x" * 300, "Pull_Request"]):
        body = compact({**opened(), "padding": i})
        response = intake.post(body, event=name)
        assert response.status_code == 400
        assert "not an event pgoverlay knows" in response.json()["message"]
    samples = intake.metrics()
    assert not any("evil" in name for name in samples)
    deliveries = samples["pgoverlay_webhook_deliveries_total"]
    assert deliveries == {(("event", "unknown"), ("outcome", "rejected")): 3}
    assert {event for event, *_ in intake.deliveries()} != {"unknown"}, "the record keeps it"


def test_unsigned_and_wrongly_signed_requests_get_401_and_are_not_recorded(
    intake: Intake,
) -> None:
    body = compact(opened())
    assert intake.post(body, secret=None).status_code == 401
    assert intake.post(body, secret="not the secret").status_code == 401
    assert intake.post(b"[" * 100_000, secret=None).status_code == 401
    assert intake.deliveries() == [] and intake.jobs() == 0


def test_ping_answers_pong_and_other_known_events_are_recorded_and_ignored(
    intake: Intake,
) -> None:
    ping = (FIXTURES / "ping.json").read_bytes()
    response = intake.post(ping, event="ping")
    assert response.status_code == 200 and response.json()["message"] == "pong"
    assert intake.post(b'{"ref":"refs/heads/main"}', event="push").status_code == 204
    edited = compact({**opened(), "action": "edited"})
    assert intake.post(edited).status_code == 204
    outcomes = sorted((event, outcome) for _, event, outcome, _, _ in intake.deliveries())
    assert outcomes == [("pull_request", "ignored"), ("push", "ignored")]
    assert intake.jobs() == 0


def test_metrics_come_from_the_queue_with_every_kind_and_state(intake: Intake) -> None:
    assert intake.post(compact(opened())).status_code == 202
    [(accepted,)] = intake.rows("SELECT created_at FROM jobs")
    before = time.time()
    samples = intake.metrics()
    after = time.time()
    jobs = samples["pgoverlay_webhook_queue_jobs"]
    assert jobs[(("kind", "open"), ("state", "queued"))] == 1
    assert len(jobs) == len(JOB_KINDS) * 6 and sum(jobs.values()) == 1
    assert samples["pgoverlay_webhook_queue_depth"][()] == 1
    # The job's age when the scrape read it: between the clock before and after the scrape.
    age = samples["pgoverlay_webhook_oldest_queued_seconds"][()]
    assert before - accepted <= age <= after - accepted
    assert samples["pgoverlay_webhook_job_seconds_count"][(("kind", "open"),)] == 0
    assert samples["pgoverlay_webhook_reconcile_actions_total"][(("action", "closed"),)] == 0


def test_healthz_and_metrics_need_the_bearer_token_when_one_is_set(
    serve: Callable[..., Intake],
) -> None:
    intake = serve(metrics_token=TOKEN)
    for path in ("/healthz", "/metrics"):
        url = f"{intake.url}{path}"
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": f"Bearer {TOKEN}x"},
            {"Authorization": f"bearer {TOKEN}"},
            {"Authorization": TOKEN},
        ):
            refused = requests.get(url, headers=headers, timeout=30)
            assert refused.status_code == 401, (path, headers)
            assert refused.headers["WWW-Authenticate"] == "Bearer"
            assert TOKEN not in refused.text
        allowed = requests.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert allowed.status_code == 200, (path, allowed.text)
    assert intake.post(compact(opened())).status_code == 202, "deliveries need no token"


def test_without_a_token_healthz_and_metrics_are_open(intake: Intake) -> None:
    assert requests.get(f"{intake.url}/healthz", timeout=30).json() == {"ok": True, "detail": "ok"}
    assert requests.get(f"{intake.url}/metrics", timeout=30).status_code == 200


def test_a_job_keeps_the_event_parsed_from_its_body_in_whatever_json_encoding_it_came(
    intake: Intake,
) -> None:
    plain = compact(opened())
    assert intake.post(plain).status_code == 202
    with_bom = b"\xef\xbb\xbf" + compact({**opened(), "action": "reopened"})
    assert intake.post(with_bom).status_code == 202
    utf16 = json.dumps({**opened(), "action": "synchronize"}).encode("utf-16")
    assert intake.post(utf16).status_code == 202
    stored = [
        JobEvent.model_validate_json(row[0])
        for row in intake.rows("SELECT payload FROM jobs ORDER BY id")
    ]
    assert stored[0] == job_event(pull_request_event(opened()))  # not GitHub's JSON
    assert [(s.event.action, s.event.kind) for s in stored] == [
        ("opened", "open"),
        ("reopened", "open"),
        ("synchronize", "sync"),
    ]
