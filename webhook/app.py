"""The intake process's HTTP edge: POST /webhook, GET /healthz, GET /metrics and
GET /jobs/{id}/report. Routes hold no business logic: they read the request, call intake (or the
collector, or the queue), and shape the answer. The jobs run in the worker process, which this
app starts and stops with itself."""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from starlette.concurrency import run_in_threadpool

from pgoverlay.errors import PgoverlayError
from pgoverlay.runner.service import client as service
from pgoverlay.runner.service.engine import Engine
from pgoverlay.runner.settings import Settings
from pgoverlay.webhook import metrics
from pgoverlay.webhook.intake import Intake
from pgoverlay.webhook.process import WorkerProcess
from pgoverlay.webhook.queue import Queue
from pgoverlay.webhook.settings import WebhookSettings

log = logging.getLogger(__name__)

INTAKE_CHECKPOINT = 25_000  # pages of 4 KiB: ~100 MB of WAL, some 4,000 deliveries


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"message": message}, status_code=status)


@dataclass(frozen=True, kw_only=True)
class Listening:
    """What the intake app's routes share, made once by ``create_app`` (``app.state.listening``)."""

    settings: WebhookSettings
    queue: Queue
    intake: Intake
    worker: WorkerProcess | None
    engine: Engine | None
    registry: CollectorRegistry
    token: str | None  # the bearer token /healthz, /metrics and the reports ask for


class _Unauthorised(Exception):
    """Private control flow: a request without the bearer token a route asks for (answered 401
    by the app's handler)."""


def _listening(request: Request) -> Listening:
    found: Listening = request.app.state.listening
    return found


def _authorised(listening: Annotated[Listening, Depends(_listening)], request: Request) -> None:
    token = listening.token
    if token is None:
        return
    sent = request.headers.get("authorization", "").encode()
    if not hmac.compare_digest(sent, f"Bearer {token}".encode()):
        raise _Unauthorised


State = Annotated[Listening, Depends(_listening)]
Authorised = Depends(_authorised)

router = APIRouter()


def create_app(
    settings: WebhookSettings,
    queue_path: Path,
    *,
    worker: WorkerProcess | None = None,
    runner: Settings | None = None,
) -> FastAPI:
    """The intake app on the queue at ``queue_path``. With ``worker``, the app starts it and
    stops it, and /healthz fails while it is down; with ``runner``, /healthz also asks the
    engine service and /metrics counts the runner's branches."""
    # Copying the WAL into the database (and syncing it) is left to the worker process's
    # commits: on intake's, it stalls every delivery behind it. The limit is a backstop for a
    # dead worker process.
    queue = Queue(
        queue_path, max_attempts=settings.max_attempts, checkpoint_pages=INTAKE_CHECKPOINT
    )
    engine = service.client(runner) if runner is not None else None
    collector = metrics.QueueCollector(
        queue,
        worker_up=worker.alive if worker is not None else None,
        branches=_branch_counter(engine) if engine is not None else None,
    )
    listening = Listening(
        settings=settings,
        queue=queue,
        intake=Intake(settings, queue),
        worker=worker,
        engine=engine,
        registry=metrics.registry(collector),
        token=settings.metrics_token.get_secret_value() if settings.metrics_token else None,
    )
    app = FastAPI(
        title="pgoverlay webhook",
        lifespan=partial(_lifespan, listening),
        docs_url=None,
        redoc_url=None,
    )
    app.state.queue = queue
    app.state.listening = listening
    app.add_exception_handler(_Unauthorised, _unauthorised)
    app.include_router(router)
    return app


@asynccontextmanager
async def _lifespan(listening: Listening, _: FastAPI) -> AsyncIterator[None]:
    worker, engine = listening.worker, listening.engine
    if worker is not None:
        worker.start()  # in the main thread: it gets SIGTERM when this process dies
    try:
        yield
    finally:
        if worker is not None:
            await run_in_threadpool(worker.stop)
        if engine is not None:
            engine.close()
        listening.intake.close()
        listening.queue.close()


async def _unauthorised(_: Request, __: Exception) -> JSONResponse:
    return JSONResponse(
        {"message": "missing or wrong bearer token: send Authorization: Bearer <token>"},
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


@router.post("/webhook")
async def receive(request: Request, listening: State) -> Response:
    cap = listening.settings.max_body_bytes
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > cap:
        return _error(413, f"payload larger than {cap} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > cap:
            return _error(413, f"payload larger than {cap} bytes")
    try:
        answer = await run_in_threadpool(
            listening.intake.receive,
            bytes(body),
            signed=request.headers.get("x-hub-signature-256"),
            event=request.headers.get("x-github-event"),
            delivery_id=request.headers.get("x-github-delivery"),
        )
    except PgoverlayError as err:  # the queue cannot store it: GitHub marks it failed
        log.error("delivery not stored: %s", err)
        return _error(503, f"the delivery could not be stored ({err}); redeliver it later")
    if answer.status == 204:
        return Response(status_code=204)
    return _error(answer.status, answer.message)


@router.get("/healthz", dependencies=[Authorised])
async def healthz(listening: State) -> Response:
    problem = await run_in_threadpool(_health, listening.queue, listening.worker, listening.engine)
    return JSONResponse(
        {"ok": problem is None, "detail": problem or "ok"},
        status_code=200 if problem is None else 503,
    )


@router.get("/metrics", dependencies=[Authorised])
async def scrape(listening: State) -> Response:
    try:
        text = await run_in_threadpool(metrics.render, listening.registry)
    except PgoverlayError as err:
        return _error(503, f"metrics unavailable: {err}")
    return Response(text, media_type=metrics.CONTENT_TYPE)


@router.get("/jobs/{job_id}/report")
async def job_report(job_id: int, request: Request, listening: State) -> Response:
    # A report holds the pull request's statements: never served without the token.
    if listening.token is None:
        return _error(
            403,
            "job reports are served only when metrics_token is set: set it, and send "
            "Authorization: Bearer <token>",
        )
    _authorised(listening, request)
    try:
        text = await run_in_threadpool(listening.queue.report, job_id)
    except PgoverlayError as err:
        return _error(503, f"queue unreadable: {err}")
    if text is None:
        return _error(404, f"job {job_id} is unknown, or kept no report")
    return Response(text, media_type="application/json")


def _health(queue: Queue, worker: WorkerProcess | None, engine: Engine | None) -> str | None:
    """None when all is well, else the first problem found."""
    try:
        queue.depth()
    except PgoverlayError as err:
        return f"queue unreadable: {err}"
    problem = worker.problem() if worker is not None else None
    if problem:
        return problem
    if engine is not None:
        try:
            engine.bases()
        except PgoverlayError as err:
            return str(err)
    return None


def _branch_counter(engine: Engine) -> Callable[[], Mapping[str, int]]:
    def count() -> Mapping[str, int]:
        by_state: dict[str, int] = {}
        for b in engine.branches():
            by_state[b.state] = by_state.get(b.state, 0) + 1
        return by_state

    return count
