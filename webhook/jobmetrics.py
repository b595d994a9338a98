"""The worker's side of /metrics: each job run counted in the queue database, where the intake
process (which serves /metrics, ``metrics.py``) reads it, across restarts."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pgoverlay.errors import QueueError
from pgoverlay.webhook.queue import Queue

log = logging.getLogger(__name__)


@dataclass
class Metrics:
    """Job runs for /metrics, counted in the queue database: the intake process, which serves
    /metrics, then reports what the worker process did, across restarts."""

    queue: Queue

    def job(self, kind: str, result: str, seconds: float) -> None:
        try:
            self.queue.count_run(kind=kind, result=result, seconds=seconds)
        except QueueError as err:  # a lost count must not fail the job it counts
            log.warning("could not count a %s job run: %s", kind, err)
