"""The FastAPI app: receive, verify, dedupe, queue; health and metrics. Routes hold no
business logic: they check the request and hand it to the queue or the service."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from pgoverlay.runner.settings import Settings
from pgoverlay.webhook import signature
from pgoverlay.webhook.queue import NewJob
from pgoverlay.webhook.routing import Routed, route
from pgoverlay.webhook.service import Service
from pgoverlay.webhook.settings import WebhookSettings

log = logging.getLogger(__name__)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"message": message}, status_code=status)


def create_app(settings: WebhookSettings, runner: Settings, *, start: bool = True) -> FastAPI:
    service = Service(settings, runner)
    secret = settings.secret.get_secret_value()
    cap = settings.max_body_bytes

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if start:
            await run_in_threadpool(service.start)
        try:
            yield
        finally:
            await run_in_threadpool(service.stop)
            service.close()

    app = FastAPI(title="pgoverlay webhook", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service

    @app.post("/webhook")
    async def receive(request: Request) -> Response:
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > cap:
            return _error(413, f"payload larger than {cap} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > cap:
                return _error(413, f"payload larger than {cap} bytes")
        if not signature.verify(secret, bytes(body), request.headers.get("x-hub-signature-256")):
            return _error(401, "missing or wrong X-Hub-Signature-256")
        event = request.headers.get("x-github-event", "")
        delivery = request.headers.get("x-github-delivery", "")
        if event == "ping":
            return JSONResponse({"message": "pong"})
        if not delivery:
            return _error(400, "missing X-GitHub-Delivery")
        try:
            payload = json.loads(body)
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(payload, dict):
            return _error(400, "the body is not a JSON object")
        routed = route(event, payload, settings)
        job = None
        if isinstance(routed, Routed):
            job = NewJob(
                repository=routed.repository,
                pr=routed.pr,
                kind=routed.kind,
                head_sha=routed.head_sha,
                payload=routed.payload,
            )
        outcome = await run_in_threadpool(
            service.queue.accept,
            delivery_id=delivery,
            event=event,
            action=str(payload.get("action", "")),
            job=job,
        )
        extra = {"delivery_id": delivery, "pr": f"{job.repository}#{job.pr}" if job else "-"}
        if outcome == "duplicate":
            log.info("duplicate delivery acknowledged", extra=extra)
            return JSONResponse({"message": "already received"}, status_code=200)
        if outcome == "ignored":
            log.info("ignored: %s", routed, extra=extra)
            return Response(status_code=204)
        return JSONResponse({"message": "queued"}, status_code=202)

    @app.get("/healthz")
    async def healthz() -> Response:
        ok, detail = await run_in_threadpool(service.healthy)
        return JSONResponse({"ok": ok, "detail": detail}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        text = await run_in_threadpool(service.metrics_text)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    return app
