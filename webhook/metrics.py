"""/metrics: a Prometheus collector over the queue database's durable counts, so the numbers are
right whichever process did the work, and survive restarts. The exposition text is
``prometheus_client``'s. Every label value comes from a fixed list; anything else (an event
name a sender made up and that was refused) is counted as ``unknown``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from pgoverlay.action.event import JOB_KINDS
from pgoverlay.webhook.payload import KNOWN_EVENTS
from pgoverlay.webhook.queue import OUTCOMES, STATES, Queue

CONTENT_TYPE = CONTENT_TYPE_LATEST
EVENTS = KNOWN_EVENTS | {"reconcile"}  # reconcile: closes queued by reconcile itself
RESULTS = ("done", "failed", "retry")
RECONCILE_ACTIONS = ("closed", "expired")


def _known(value: str, allowed: frozenset[str] | tuple[str, ...]) -> str:
    return value if value in allowed else "unknown"


class QueueCollector(Collector):
    """Reads the queue on every scrape. ``worker_up`` says whether the worker process runs;
    ``branches`` counts the runner's branches by state; either is left out when not given."""

    def __init__(
        self,
        queue: Queue,
        *,
        worker_up: Callable[[], bool] | None = None,
        branches: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self.queue = queue
        self.worker_up = worker_up
        self.branches = branches

    def collect(self) -> Iterator[Metric]:
        yield self._deliveries()
        yield from self._jobs()
        yield from self._runs()
        reconcile = CounterMetricFamily(
            "pgoverlay_webhook_reconcile_actions",
            "What reconcile did: closed (a close queued for a PR no longer open), expired"
            " (a branch past its TTL destroyed).",
            labels=["action"],
        )
        done = self.queue.reconcile_count()
        for action in RECONCILE_ACTIONS:
            reconcile.add_metric([action], done.get(action, 0))
        yield reconcile
        if self.worker_up is not None:
            yield GaugeMetricFamily(
                "pgoverlay_webhook_worker_up",
                "1 while the worker process runs; 0 once it has exited (jobs then wait).",
                value=1 if self.worker_up() else 0,
            )
        if self.branches is not None:
            by_state = GaugeMetricFamily(
                "pgoverlay_branches", "Branches on this runner, by state.", labels=["state"]
            )
            for state, n in sorted(self.branches().items()):
                by_state.add_metric([state], n)
            yield by_state

    def _deliveries(self) -> Metric:
        family = CounterMetricFamily(
            "pgoverlay_webhook_deliveries",
            "Signed deliveries recorded, by event and outcome; a repeat of a recorded delivery"
            " (same id or same signed body) counts as duplicate.",
            labels=["event", "outcome"],
        )
        counts: Counter[tuple[str, str]] = Counter()
        for (event, outcome), n in self.queue.delivery_count().items():
            counts[(_known(event, EVENTS), _known(outcome, OUTCOMES))] += n
        for labels, n in sorted(counts.items()):
            family.add_metric(list(labels), n)
        return family

    def _jobs(self) -> Iterator[Metric]:
        counts = self.queue.job_count()
        family = GaugeMetricFamily(
            "pgoverlay_webhook_queue_jobs",
            "Jobs in the queue, by kind and state (every pair present).",
            labels=["kind", "state"],
        )
        for kind in JOB_KINDS:
            for state in STATES:
                family.add_metric([kind, state], counts.get((kind, state), 0))
        yield family
        yield GaugeMetricFamily(
            "pgoverlay_webhook_queue_depth",
            "Jobs waiting for a worker (queued, due now or waiting out a retry delay).",
            value=sum(n for (_, state), n in counts.items() if state == "queued"),
        )
        yield GaugeMetricFamily(
            "pgoverlay_webhook_oldest_queued_seconds",
            "How long the oldest queued job has waited since its delivery; 0 when none waits.",
            value=self.queue.oldest_queued_age(),
        )

    def _runs(self) -> Iterator[Metric]:
        runs = self.queue.runs()
        seconds = SummaryMetricFamily(
            "pgoverlay_webhook_job_seconds",
            "Time spent running jobs, by kind; every attempt counts.",
            labels=["kind"],
        )
        ended = CounterMetricFamily(
            "pgoverlay_webhook_jobs",
            "Job runs by kind and how they ended: done, failed, or retry (back to the queue).",
            labels=["kind", "result"],
        )
        for kind in JOB_KINDS:
            mine = [runs.get((kind, result), (0, 0.0)) for result in RESULTS]
            seconds.add_metric(
                [kind], count_value=sum(n for n, _ in mine), sum_value=sum(s for _, s in mine)
            )
            for result, (n, _) in zip(RESULTS, mine, strict=True):
                ended.add_metric([kind, result], n)
        yield seconds
        yield ended


def registry(collector: QueueCollector) -> CollectorRegistry:
    """A registry of its own (not the process-wide default) holding only ``collector``."""
    own = CollectorRegistry(auto_describe=False)
    own.register(collector)
    return own


def render(own: CollectorRegistry) -> bytes:
    return generate_latest(own)
