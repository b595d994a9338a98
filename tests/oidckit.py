"""A real OIDC issuer for tests: an HTTP server on 127.0.0.1 (a thread) serving the discovery
document and the key set GitHub's token service serves, RSA keys made with ``cryptography``,
and tokens signed with PyJWT as GitHub signs them, with the claims GitHub puts in them.

``TokenService`` is the other half a job sees: the endpoint a running job asks for its token
(``ACTIONS_ID_TOKEN_REQUEST_URL`` with ``ACTIONS_ID_TOKEN_REQUEST_TOKEN``), answering with a
token of the issuer for the audience the job names, as GitHub's Actions runtime does."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

AUDIENCE = "https://pool.example.test"


@dataclass
class Key:
    kid: str
    private: rsa.RSAPrivateKey
    extra: dict[str, Any] = field(default_factory=dict)  # JWK members to add or override

    @classmethod
    def make(cls, kid: str, **extra: Any) -> Key:
        return cls(kid, rsa.generate_private_key(public_exponent=65537, key_size=2048), extra)

    def jwk(self) -> dict[str, Any]:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key()))
        return {**public, "kid": self.kid, "use": "sig", "alg": "RS256", **self.extra}


class _JsonServer:
    """A JSON service on ``host`` for a test, started by ``with``: each GET is answered with what
    ``_answer(path, authorization)`` gives, a status and a JSON body."""

    def __init__(self, *, host: str = "127.0.0.1") -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = server._answer(self.path, self.headers.get("Authorization"))
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def _answer(self, target: str, authorization: str | None) -> tuple[int, Any]:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class Issuer(_JsonServer):
    """The issuer at ``url``; ``keys`` is what its key set publishes (change it to rotate),
    ``requests`` every path asked, in order. ``issuer_named`` and ``jwks_uri_named`` are what
    its discovery document names (its own addresses unless a test says otherwise)."""

    def __init__(self, keys: list[Key]) -> None:
        self.keys = list(keys)
        self.requests: list[str] = []
        self.issuer_named: str | None = None
        self.jwks_uri_named: str | None = None
        super().__init__()

    def _answer(self, target: str, authorization: str | None) -> tuple[int, Any]:
        self.requests.append(target)
        if target == "/.well-known/openid-configuration":
            return 200, {
                "issuer": self.issuer_named or self.url,
                "jwks_uri": self.jwks_uri_named or f"{self.url}/.well-known/jwks",
                "id_token_signing_alg_values_supported": ["RS256"],
            }
        if target == "/.well-known/jwks":
            return 200, {"keys": [key.jwk() for key in self.keys]}
        return 404, {"message": f"no {target}"}

    def jwks_fetches(self) -> int:
        return self.requests.count("/.well-known/jwks")


def claims(issuer: str, *, now: float, **overrides: Any) -> dict[str, Any]:
    """The claims of a GitHub Actions token of a ``pull_request`` run of acme/shop (ids as
    GitHub sends them: decimal strings), issued at ``now``, valid five minutes."""
    base: dict[str, Any] = {
        "jti": "a7b1c6e0-0000-4000-8000-000000000001",
        "sub": "repo:acme/shop:pull_request",
        "aud": AUDIENCE,
        "ref": "refs/pull/42/merge",
        "sha": "0123456789abcdef0123456789abcdef01234567",
        "repository": "acme/shop",
        "repository_owner": "acme",
        "repository_owner_id": "1001",
        "repository_id": "2002",
        "repository_visibility": "private",
        "run_id": "1",
        "run_number": "1",
        "run_attempt": "1",
        "actor": "octocat",
        "actor_id": "3003",
        "workflow": "db",
        "head_ref": "feature/loyalty",
        "base_ref": "main",
        "event_name": "pull_request",
        "ref_type": "branch",
        "workflow_ref": "acme/shop/.github/workflows/db.yml@refs/pull/42/merge",
        "job_workflow_ref": "acme/shop/.github/workflows/db.yml@refs/pull/42/merge",
        "runner_environment": "github-hosted",
        "iss": issuer,
        "nbf": int(now) - 5,
        "exp": int(now) + 300,
        "iat": int(now),
    }
    base.update(overrides)
    return {name: value for name, value in base.items() if value is not None}


def sign(payload: dict[str, Any], key: Key, *, kid: str | None = None) -> str:
    return jwt.encode(
        payload, key.private, algorithm="RS256", headers={"kid": kid or key.kid, "typ": "JWT"}
    )


def pull_request_job(
    *,
    repository: str,
    repository_id: int,
    number: int,
    head_ref: str,
    runner_environment: str,
    workflow: str = ".github/workflows/db.yml",
) -> dict[str, Any]:
    """The claims GitHub gives a job of a ``pull_request`` run of ``repository``'s PR
    ``number`` (the merge ref), on a ``runner_environment`` runner (``self-hosted`` or
    ``github-hosted``); ``claims`` fills in the rest."""
    owner = repository.partition("/")[0]
    ref = f"refs/pull/{number}/merge"
    return {
        "sub": f"repo:{repository}:pull_request",
        "repository": repository,
        "repository_owner": owner,
        "repository_id": str(repository_id),
        "event_name": "pull_request",
        "ref": ref,
        "head_ref": head_ref,
        "workflow_ref": f"{repository}/{workflow}@{ref}",
        "job_workflow_ref": f"{repository}/{workflow}@{ref}",
        "runner_environment": runner_environment,
    }


@dataclass(frozen=True)
class Job:
    """A running job's way to its token: what act passes it as ``ACTIONS_ID_TOKEN_REQUEST_URL``
    and ``ACTIONS_ID_TOKEN_REQUEST_TOKEN``."""

    name: str
    request_url: str
    request_token: str

    def env(self) -> dict[str, str]:
        return {
            "ACTIONS_ID_TOKEN_REQUEST_URL": self.request_url,
            "ACTIONS_ID_TOKEN_REQUEST_TOKEN": self.request_token,
        }


class TokenService(_JsonServer):
    """The endpoint a job asks for its OIDC token, on ``host`` (an address the runner reaches).

    ``GET /_apis/idtoken/<job>?api-version=2.0&audience=<aud>`` with ``Authorization: bearer
    <the job's request token>`` answers ``{"value": "<JWT>"}``: a token of ``issuer``, signed by
    ``key``, with that job's claims (``add_job``) and the audience asked (GitHub's default, the
    owner's URL, when none is). Another request token, or none, is a 401 and no token.
    ``issued`` lists (job, audience, monotonic time) for each token handed out; request tokens
    are kept as digests only."""

    def __init__(self, issuer: Issuer, key: Key, *, host: str = "127.0.0.1") -> None:
        self.issuer = issuer
        self.key = key
        self.issued: list[tuple[str, str, float]] = []
        self.refused = 0
        self._jobs: dict[str, tuple[str, dict[str, Any]]] = {}  # id: (token digest, claims)
        self._lock = threading.Lock()
        super().__init__(host=host)

    def add_job(self, **job_claims: Any) -> Job:
        """A job whose tokens carry ``job_claims`` over ``claims``'s defaults
        (``pull_request_job`` gives a PR job's)."""
        job = secrets.token_hex(8)
        request_token = secrets.token_urlsafe(24)
        with self._lock:
            self._jobs[job] = (_digest(request_token), dict(job_claims))
        return Job(job, f"{self.url}/_apis/idtoken/{job}?api-version=2.0", request_token)

    def _answer(self, target: str, authorization: str | None) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(target)
        job = parts.path.removeprefix("/_apis/idtoken/")
        with self._lock:
            known = self._jobs.get(job) if job != parts.path else None
        if known is None:
            return 404, {"message": f"no job at {parts.path}"}
        scheme, _, presented = (authorization or "").partition(" ")
        digest, job_claims = known
        if scheme.lower() != "bearer" or not hmac.compare_digest(_digest(presented), digest):
            with self._lock:
                self.refused += 1
            return 401, {"message": "the request token is not this job's"}
        query = parse_qs(parts.query)
        owner = str(job_claims.get("repository_owner", "acme"))
        audience = query.get("audience", [f"https://github.com/{owner}"])[0]
        payload = claims(
            self.issuer.url,
            now=time.time(),
            **{**job_claims, "aud": audience, "jti": str(uuid.uuid4())},
        )
        with self._lock:
            self.issued.append((job, audience, time.monotonic()))
        return 200, {"count": 1, "value": sign(payload, self.key)}


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
