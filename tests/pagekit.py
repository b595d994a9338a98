"""The branch page as its tests serve it: a real uvicorn server over TLS (a test CA), the fake
GitHub's OAuth web flow and API over HTTP, and a test double of the engine that keeps the grants
it is asked for and answers with a fresh password each time (the front door's end-to-end test
uses the real engine)."""

from __future__ import annotations

import secrets
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from doorkit import make_ca
from fakegithub import FakeGitHub
from pgoverlay.action import record as pr_record
from pgoverlay.action.insight.model import LockUse, MigrationInsight, Verdict, Volume
from pgoverlay.action.insight.schemadiff import (
    SchemaAttribute,
    SchemaChange,
    SchemaCount,
    SchemaDiff,
)
from pgoverlay.action.report import BranchInfo, MigrationRun, Report
from pgoverlay.errors import ServiceError, UnmaskedAccessError
from pgoverlay.runner.service.models import GrantRequest
from pgoverlay.runner.service.views import BaseView, BranchView, GrantView, Layer, Record
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.web import page

HOST = "localhost"
CLIENT_ID = "Iv1.pagetest"
CLIENT_SECRET = "s3cret-of-the-oauth-client"
SESSION_SECONDS = 3600.0
FINGERPRINT = "AB:CD:" + ":".join(["00"] * 30)


def report(branch: str, repository: str) -> Report:
    lock = LockUse(
        relation="public.orders",
        kind="table",
        mode="ACCESS EXCLUSIVE",
        blocks="reads and writes",
        held_seconds=0.409,
        table="public.orders",
        source="exact",
    )
    insight = MigrationInsight(
        seconds=0.46,
        locks=[lock],
        rewrites=[],
        scans=[],
        volume=Volume(),
        statements=[],
        findings=[],
        verdict=Verdict("notice", "takes ACCESS EXCLUSIVE on `public.orders` for 409 ms"),
        interval=0.01,
    )
    info = BranchInfo(
        name=branch,
        host="127.0.0.1",
        port=55432,
        database="app",
        user="pr_12",
        base_name="prod",
        base_version=3,
        base_seeded_at=None,
        layer_logical_bytes=1 << 20,
        layer_physical_bytes=1 << 19,
        base_masked=False,
    )
    return Report(
        repository=repository,
        pr=12,
        branch_name=branch,
        head_sha="9f1c2e7d4b0a8c3f",
        status="migration failed",
        branch=info,
        migrations=[
            MigrationRun("db/0041_<orders>_index.sql", "applied", 0.46, insight=insight),
            MigrationRun("db/0042_email.sql", "failed", 0.03, error="ERROR: <b>boom</b>", line=3),
        ],
        schema_diff=SchemaDiff(
            base_taken_at=1.0,
            changes=[
                SchemaChange(
                    "index",
                    "public.orders_amount_idx",
                    "added",
                    table="public.orders",
                    attributes=[SchemaAttribute("definition", after="... USING btree (amount)")],
                ),
                SchemaChange(
                    "column",
                    "public.orders.note<i>",
                    "changed",
                    table="public.orders",
                    attributes=[SchemaAttribute("type", "integer", "bigint")],
                ),
            ],
            counts=[SchemaCount("index", "added", 1), SchemaCount("column", "changed", 1)],
        ),
    )


def view(name: str, repository: str, *, record: bool = True) -> BranchView:
    now = time.time()
    saved = pr_record.PrRecord(
        head_sha="9f1c2e7d4b0a8c3f", status="migration failed", report=report(name, repository)
    )
    return BranchView(
        name=name,
        state="ready",
        running=True,
        liveness="running",
        base="prod",
        base_version=3,
        runtime="local",
        host="127.0.0.1",
        port=55432,
        database="app",
        user="pr_12",
        created_at=now,
        ready_at=now,
        expires_at=now + 86400,
        repository=repository,
        pr=12,
        owner_uid=1000,
        layer=Layer(logical_bytes=48_234_496, physical_bytes=3_221_504),
        record=Record(data=pr_record.dumps(saved), updated_at=now) if record else None,
    )


@dataclass
class Engine:
    """The engine as the page sees it: its branches, one base (``masked`` or not), grants
    kept."""

    branches: dict[str, BranchView] = field(default_factory=dict)
    grants: list[tuple[str, GrantRequest]] = field(default_factory=list)
    passwords: list[str] = field(default_factory=list)
    readers: list[str | None] = field(default_factory=list)  # the GitHub token forwarded
    failing: bool = False  # the engine's service does not answer
    measured: list[str] = field(default_factory=list)  # branches whose layer was walked
    masked: bool = False  # the base's data
    refuse_unmasked: bool = False  # as the engine does when the admin does not allow it

    def branch(self, name: str, *, layer: bool = False) -> BranchView | None:
        if self.failing:
            raise ServiceError("the engine service is not running")
        if layer:
            self.measured.append(name)
        return self.branches.get(name)

    def bases(self) -> list[BaseView]:
        return [
            BaseView(
                name="prod",
                version=3,
                state="ready",
                pg_major=15,
                size_bytes=1 << 30,
                database="app",
                created_at=0.0,
                prepared_at=0.0,
                masked=self.masked,
                mask_rules="",
                mask_sha256="",
                locked_down=True,
                branches=2,
            )
        ]

    def grant(self, name: str, request: GrantRequest, *, reader: str | None = None) -> GrantView:
        if self.refuse_unmasked and not self.masked and not request.app:
            raise UnmaskedAccessError(
                f"branch {name} is of base prod v3, which is not masked: ... allow them with "
                "PGOVERLAY_ACCESS_UNMASKED=true"
            )
        password = secrets.token_urlsafe(18)
        self.grants.append((name, request))
        self.readers.append(reader)
        self.passwords.append(password)
        return GrantView(
            branch=name,
            login=request.login or "",
            role=request.login or "",
            read_only=request.read_only,
            expires_at=time.time() + 8 * 3600,
            password=password,
            dsn_host=HOST,
            dsn_port=6543,
            database=name,
        )


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


# -- TLS: a test CA and the page's certificate ---------------------------------------------------
@dataclass(frozen=True)
class Tls:
    ca: Path
    cert: Path
    key: Path
    spki_sha256: str  # base64, as Chromium's --ignore-certificate-errors-spki-list takes it


def make_tls(folder: Path) -> Tls:
    made = make_ca(folder)
    return Tls(made.ca_file, made.cert_file, made.key_file, made.spki_sha256)


# -- the server ----------------------------------------------------------------------------------
@dataclass
class Site:
    fake: FakeGitHub
    engine: Engine
    clock: Clock
    tls: Tls
    origin: str
    audit: list[dict[str, object]]  # the lines the page wrote to its audit log

    def client(self) -> httpx.Client:
        return httpx.Client(verify=ssl.create_default_context(cafile=str(self.tls.ca)), timeout=10)


@contextmanager
def running_page(
    folder: Path,
    engine: Engine,
    *,
    port: int,
    tls: Tls | None = None,
    **settings: Any,
) -> Iterator[Site]:
    """The page for ``engine`` on ``port`` of 127.0.0.1 (``https://localhost:PORT``), signing
    readers in at a fake GitHub that knows its OAuth client (add repositories and their people
    to ``site.fake``); ``settings`` are the page's others. Its certificate is ``tls`` (made in
    ``folder`` when not given), shown as the door's own (``FINGERPRINT``); its audit lines are kept
    in ``site.audit``. The fake's violations of GitHub's API description fail the test."""
    tls = tls or make_tls(folder)

    audit: list[dict[str, object]] = []

    def write(event: str, **fields: object) -> None:
        audit.append({"event": event, **fields})

    origin = f"https://{HOST}:{port}"
    secret_file = folder / "client-secret"
    secret_file.write_text(CLIENT_SECRET + "\n")
    with FakeGitHub() as fake:
        fake.add_oauth_app(CLIENT_ID, CLIENT_SECRET, callback=f"{origin}/oauth/callback")
        clock = Clock()
        app = page.create_page(
            Settings(
                door_host=HOST,
                door_https_port=port,
                github_web_url=fake.url,
                github_api_url=fake.url,
                oauth_client_id=CLIENT_ID,
                oauth_client_secret_file=secret_file,
                page_session_seconds=SESSION_SECONDS,
                **settings,
            ),
            engine,
            secret=secrets.token_bytes(32),
            fingerprint=FINGERPRINT,
            certificate=tls.cert.read_text(),
            clock=clock,
            audit=write,
        )
        page.quiet_access_log()
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_config=None,
            ssl_certfile=str(tls.cert),
            ssl_keyfile=str(tls.key),
            lifespan="off",
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="page")
        thread.start()
        try:
            deadline = time.monotonic() + 20
            while not server.started:  # uvicorn says when it listens
                assert thread.is_alive() and time.monotonic() < deadline, "the page did not start"
                time.sleep(0.02)
            yield Site(fake, engine, clock, tls, origin, audit)
        finally:
            server.should_exit = True
            thread.join(timeout=10)
        assert fake.violations == []


def sign_in(site: Site, client: httpx.Client, login: str, branch: str) -> httpx.Response:
    """``login`` opens ``branch``'s page in ``client`` and signs in at the fake GitHub."""
    site.fake.sign_in(login)
    return client.get(f"{site.origin}/b/{branch}", follow_redirects=True)
