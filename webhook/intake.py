"""Intake: what happens to a delivery between its arrival and its answer. Verify the signature,
check the headers and the body, dedupe, record, queue; nothing slower. The HTTP edge is
``app.py``; the work is the worker process's (``service.py``).

Every signed delivery is recorded in the queue's ``deliveries`` table with its outcome, the
ones that cannot be acted on with the reason they got a 400. Unsigned or oversized requests are
not: anyone can send those, and recording them would let anyone fill the disk.
"""

from __future__ import annotations

import hashlib
import logging
import queue as queues
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from pgoverlay.errors import DeliveryError, QueueError
from pgoverlay.webhook import payload, signature
from pgoverlay.webhook.queue import Accepted, Delivery, NewJob, Queue, pr_label
from pgoverlay.webhook.routing import Routed, route
from pgoverlay.webhook.settings import WebhookSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    status: int
    message: str = ""  # none for 204


class Committer:
    """Group commit: one thread stores deliveries for every request thread, taking all that
    wait at once into one transaction, so a burst shares one disk sync instead of queueing for
    one each. Answers still wait for their delivery's commit."""

    MOST = 64  # deliveries in one transaction at most
    WAIT = 60.0  # seconds a request waits for its commit (the queue's busy timeout is 30)

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self._waiting: queues.SimpleQueue[tuple[Delivery, Future[Accepted]] | None] = (
            queues.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name="pgoverlay-commit", daemon=True)
        self._thread.start()

    def accept(self, delivery: Delivery) -> Accepted:
        done: Future[Accepted] = Future()
        self._waiting.put((delivery, done))
        try:
            return done.result(timeout=self.WAIT)
        except FutureTimeout:
            raise QueueError(
                f"job queue {self.queue.path}: no commit within {self.WAIT:.0f} s; look for a"
                " process holding the database"
            ) from None

    def _run(self) -> None:
        while (first := self._waiting.get()) is not None:
            batch = [first]
            while len(batch) < self.MOST:
                try:
                    item = self._waiting.get_nowait()
                except queues.Empty:
                    break
                if item is None:
                    self._waiting.put(None)  # stop after this batch
                    break
                batch.append(item)
            try:
                outcomes = self.queue.accept_all([delivery for delivery, _ in batch])
            except Exception as err:  # the edge of this thread: each request gets the error
                for _, done in batch:
                    done.set_exception(err)
                continue
            for (_, done), outcome in zip(batch, outcomes, strict=True):
                done.set_result(outcome)

    def close(self) -> None:
        self._waiting.put(None)
        self._thread.join(timeout=self.WAIT)


class Intake:
    def __init__(self, settings: WebhookSettings, queue: Queue) -> None:
        self.settings = settings
        self.queue = queue
        self.committer = Committer(queue)
        self._secret = settings.secret.get_secret_value()

    def close(self) -> None:
        self.committer.close()

    def receive(
        self, body: bytes, *, signed: str | None, event: str | None, delivery_id: str | None
    ) -> Answer:
        """Answer one delivery: ``signed`` is its X-Hub-Signature-256, ``event`` its
        X-GitHub-Event and ``delivery_id`` its X-GitHub-Delivery header (None when missing)."""
        if not signature.verify(self._secret, body, signed):
            return Answer(401, "missing or wrong X-Hub-Signature-256")
        digest = hashlib.sha256(body).hexdigest()
        action = ""
        try:
            event, delivery_id = payload.check_headers(event, delivery_id)
            data = payload.decode(body)
            action = payload.action_of(data)
            if event == "ping":
                return Answer(200, "pong")
            job = self._job(event, data)
        except DeliveryError as err:
            self._reject(err, event=event, delivery_id=delivery_id, action=action, digest=digest)
            return Answer(400, str(err))
        outcome = self.committer.accept(
            Delivery(
                delivery_id=delivery_id,
                event=event,
                action=action,
                job=job if isinstance(job, NewJob) else None,
                body_sha256=digest,
            )
        )
        pr = pr_label(job.repository, job.pr) if isinstance(job, NewJob) else "-"
        extra = {"delivery_id": delivery_id, "pr": pr}
        if outcome == "duplicate":
            log.info("duplicate delivery acknowledged", extra=extra)
            return Answer(200, "already received")
        if outcome == "ignored":
            log.info("ignored: %s", job, extra=extra)
            return Answer(204)
        return Answer(202, "queued")

    def _job(self, event: str, data: dict[str, Any]) -> NewJob | str:
        """The job a valid delivery asks for, or why it needs none. The job keeps the event as
        parsed here, not the body: the worker reads no GitHub JSON from the queue."""
        if event != payload.HANDLED:
            return f"event {event} is not handled"
        routed = route(payload.pull_request_event(data), self.settings)
        if not isinstance(routed, Routed):
            return routed
        return NewJob(
            repository=routed.repository,
            pr=routed.pr,
            kind=routed.kind,
            head_sha=routed.head_sha,
            payload=routed.event.model_dump_json(),
        )

    def _reject(
        self,
        err: DeliveryError,
        *,
        event: str | None,
        delivery_id: str | None,
        action: str,
        digest: str,
    ) -> None:
        """Record a signed delivery that gets a 400. One whose id is missing or unusable is
        recorded under its body's digest; a repeat of a recorded one only counts."""
        if not delivery_id or not payload.is_delivery_id(delivery_id):
            delivery_id = None
        first = self.queue.reject(
            delivery_id=delivery_id or f"unnamed-{digest}",
            event=(event or "")[:64],
            action=action,
            reason=str(err),
            body_sha256=digest,
        )
        log.warning(
            "refused%s: %s",
            "" if first else " (again)",
            err,
            extra={"delivery_id": delivery_id or "-", "pr": "-"},
        )
