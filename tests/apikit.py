"""The front door with the engine's network API on, for tests: the real `pgoverlay door`
(root prepares, then it runs as its own user), a test CA's certificate, a local OIDC issuer
(oidckit) and a policy file. A job's token endpoint is oidckit's ``TokenService``."""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doorkit import DoorCA, make_ca
from helpers import free_tcp_port, os_user, service_settings, service_with
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
    env: dict[str, str] = field(default_factory=dict)  # the door's PGOVERLAY_* settings

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
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any, http.client.HTTPResponse]:
        """A request to the API; ``headers`` beside the token's (a listener's names its
        repository)."""
        context = ssl.create_default_context(cafile=os.fspath(self.certs.ca_file))
        conn = http.client.HTTPSConnection(self.host, self.port, context=context, timeout=300)
        sent: dict[str, str] = dict(headers or {})
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
    engine: dict[str, Any] | None = None,
) -> Iterator[Api]:
    """`pgoverlay door` on ``address`` with the API on, its certificate naming ``host`` (the
    name its clients use), for ``audience`` (default: the oidckit's; ``"url"``: the door's own
    URL, as the Action asks for, its `server` input), until the block ends. The engine service
    runs meanwhile with the same API settings (it verifies the tokens the door forwards), and
    ``engine``'s."""
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
    with Issuer([key]) as issuer, service_with(
        pool,
        api_issuer=issuer.url,
        api_audience=audience or AUDIENCE,
        api_policy_file=folder / "policy.yml",
        **(engine or {}),
    ):
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
                env=environ,
            )
        finally:
            door.terminate()
            door.wait(timeout=30)
            log.close()
