"""The front door with the engine's network API on, for tests: the real `pgoverlay door`
(root prepares, then it runs as its own user), a test CA's certificate, a local OIDC issuer
(oidckit) and a policy file; and ``JobTokens``, the runner's token service a job asks for its
OIDC token (``ACTIONS_ID_TOKEN_REQUEST_URL``), minting them with that issuer."""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from doorkit import DoorCA, make_ca
from helpers import free_tcp_port, os_user, service_settings
from oidckit import AUDIENCE, Issuer, Key, claims, sign
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.service.serve import settings_environ


@dataclass
class Api:
    pool: Pool
    base: BaseVersion
    issuer: Issuer
    key: Key
    certs: DoorCA
    port: int
    door_port: int
    log: Path
    host: str = "localhost"
    audience: str = AUDIENCE

    def token(self, **overrides: Any) -> str:
        return sign(claims(self.issuer.url, now=time.time(), **overrides), self.key)

    def of(self, repository: str, repository_id: int, **overrides: Any) -> str:
        owner = repository.partition("/")[0]
        overrides.setdefault("aud", self.audience)
        return self.token(
            repository=repository,
            repository_owner=owner,
            repository_id=str(repository_id),
            job_workflow_ref=f"{repository}/.github/workflows/db.yml@refs/pull/42/merge",
            sub=f"repo:{repository}:pull_request",
            **overrides,
        )

    @property
    def server(self) -> str:
        return f"https://{self.host}:{self.port}"

    def call(
        self,
        method: str,
        path: str,
        *,
        token: str | None,
        body: object = None,
        authorization: str | None = None,
    ) -> tuple[int, Any, http.client.HTTPResponse]:
        context = ssl.create_default_context(cafile=os.fspath(self.certs.ca_file))
        conn = http.client.HTTPSConnection(self.host, self.port, context=context, timeout=300)
        sent: dict[str, str] = {}
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if authorization is not None:
            sent["Authorization"] = authorization
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        try:
            conn.request(method, f"/api/v1{path}", body=payload, headers=sent)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        return response.status, json.loads(raw) if raw else None, response


def _wait_https(port: int, door: subprocess.Popen[bytes], address: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if door.poll() is not None:
            raise AssertionError(f"the front door exited with {door.returncode}")
        try:
            with socket.create_connection((address, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the front door did not answer on port {port}")


@contextmanager
def running_door(
    pool: Pool,
    base: BaseVersion,
    folder: Path,
    *,
    policy: str,
    host: str = "localhost",
    address: str = "127.0.0.1",
    audience: str | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Api]:
    """`pgoverlay door` on ``address`` with the API on, its certificate naming ``host`` (the
    name its clients use), for ``audience`` (default: the oidckit's; ``"url"``: the door's own
    URL, as the Action asks for, its `server` input), until the block ends."""
    os.chmod(folder, 0o755)
    os_user("pgoverlay-door", groups=["pgoverlay"])
    try:
        ipaddress.ip_address(host)
        certs = make_ca(folder, names=("localhost",), addresses=("127.0.0.1", host))
    except ValueError:
        certs = make_ca(folder, names=(host,))
    (folder / "policy.yml").write_text(policy)
    key = Key.make("key-1")
    door_port, https_port = free_tcp_port(), free_tcp_port()
    if audience == "url":
        audience = f"https://{host}:{https_port}"
    with Issuer([key]) as issuer:
        environ = {
            **settings_environ(service_settings(pool)),
            "PGOVERLAY_DOOR_HOST": host,
            "PGOVERLAY_DOOR_ADDRESS": address,
            "PGOVERLAY_DOOR_PORT": str(door_port),
            "PGOVERLAY_DOOR_HTTPS_PORT": str(https_port),
            "PGOVERLAY_DOOR_CERT_FILE": os.fspath(certs.cert_file),
            "PGOVERLAY_DOOR_KEY_FILE": os.fspath(certs.key_file),
            "PGOVERLAY_API_ISSUER": issuer.url,
            "PGOVERLAY_API_AUDIENCE": audience or AUDIENCE,
            "PGOVERLAY_API_POLICY_FILE": os.fspath(folder / "policy.yml"),
            **(env or {}),
        }
        log = open(folder / "door.log", "wb")  # noqa: SIM115 - closed below
        door = subprocess.Popen(
            [sys.executable, "-P", "-m", "pgoverlay", "door"],
            env={**os.environ, **environ},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
        try:
            _wait_https(https_port, door, address)
            yield Api(
                pool,
                base,
                issuer,
                key,
                certs,
                https_port,
                door_port,
                folder / "door.log",
                host=host,
                audience=audience or AUDIENCE,
            )
        finally:
            door.terminate()
            door.wait(timeout=30)
            log.close()


@dataclass
class JobTokens:
    """The runner's OIDC token service: ``GET <url>&audience=X`` with ``Authorization: bearer
    <request_token>`` answers ``{"value": <JWT>}``, the job's claims (``claims``, set by the
    test per job) signed by ``api``'s issuer for audience X; another request token gets 401.
    ``asked`` counts the tokens handed out."""

    api: Api
    address: str = "127.0.0.1"
    request_token: str = "job-request-token-0123456789"
    claims: dict[str, Any] = field(default_factory=dict)
    asked: int = 0

    @contextmanager
    def serving(self) -> Iterator[JobTokens]:
        tokens = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                if self.headers.get("Authorization") != f"bearer {tokens.request_token}":
                    self._answer(401, {"message": "Bad credentials"})
                    return
                audience = query.get("audience", [""])[0]
                repository = str(tokens.claims.get("repository", "acme/shop"))
                repository_id = int(tokens.claims.get("repository_id", 2002))
                extra = {
                    k: v
                    for k, v in tokens.claims.items()
                    if k not in ("repository", "repository_id")
                }
                value = tokens.api.of(repository, repository_id, aud=audience, **extra)
                tokens.asked += 1
                self._answer(200, {"count": 1, "value": value})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer((self.address, 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.url = f"http://{self.address}:{server.server_address[1]}/_apis/token?api-version=2.0"
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()

    url: str = ""

    def environ(self) -> dict[str, str]:
        """What the runner sets for a job with `permissions: id-token: write`."""
        return {
            "ACTIONS_ID_TOKEN_REQUEST_URL": self.url,
            "ACTIONS_ID_TOKEN_REQUEST_TOKEN": self.request_token,
        }
