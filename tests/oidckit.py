"""A real OIDC issuer for tests: an HTTP server on 127.0.0.1 (a thread) serving the discovery
document and the key set GitHub's token service serves, RSA keys made with ``cryptography``,
and tokens signed with PyJWT as GitHub signs them, with the claims GitHub puts in them."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


class Issuer:
    """The issuer at ``url``; ``keys`` is what its key set publishes (change it to rotate),
    ``requests`` every path asked, in order. ``issuer_named`` and ``jwks_uri_named`` are what
    its discovery document names (its own addresses unless a test says otherwise)."""

    def __init__(self, keys: list[Key]) -> None:
        self.keys = list(keys)
        self.requests: list[str] = []
        self.issuer_named: str | None = None
        self.jwks_uri_named: str | None = None
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                issuer.requests.append(self.path)
                if self.path == "/.well-known/openid-configuration":
                    body: Any = {
                        "issuer": issuer.issuer_named or issuer.url,
                        "jwks_uri": issuer.jwks_uri_named or f"{issuer.url}/.well-known/jwks",
                        "id_token_signing_alg_values_supported": ["RS256"],
                    }
                elif self.path == "/.well-known/jwks":
                    body = {"keys": [key.jwk() for key in issuer.keys]}
                else:
                    self.send_error(404)
                    return
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> Issuer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

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
