"""The engine over the network: the ``Engine`` operations a workflow needs as HTTPS requests to
the pool's API (``https://HOST:PORT/api/v1``, served by the front door; docs/api.md), for a job
on any runner: no pool, no service socket, no group, no root.

``NetworkEngine`` is ``client.RemoteEngine`` with another transport: the same methods, request
bodies, answers and errors (an error answer is raised as the class the engine raised), each
request carrying a ``Credential``'s ``Authorization`` header:

- ``OidcCredential``: the job's GitHub Actions OIDC token, asked of the runner
  (``ACTIONS_ID_TOKEN_REQUEST_URL``, with ``permissions: id-token: write``) for the pool's
  audience, and asked again shortly before it expires;
- ``StaticCredential``: a token the pool's admin issued (the webhook listener's).

TLS is verified against ``ca_file`` (the door's certificate, or the CA that signed it), or the
system's trust store without one. A branch's ``connection`` is answered through the front door
over TLS: its ``sslrootcert`` is set here to the same trust, so psql, psycopg and a migrate
command verify the door as this client verified the API.

A job holds its pull request's branch for its whole run (``hold``): the door lets one job per
repository and branch name hold it at a time, so two jobs of one PR on two runners run one
after the other, whichever runner each landed on.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from pgoverlay.errors import ConfigError, LockBusyError, PgoverlayError, ServiceError
from pgoverlay.runner.service.client import RemoteEngine
from pgoverlay.runner.service.views import Connection

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
# A token is asked for again this long before the expiry it states.
TOKEN_MARGIN = 60.0
# GitHub's tokens state their expiry; one that does not is kept this long.
TOKEN_FALLBACK_SECONDS = 240.0
# A job's hold on its branch lasts this long unless renewed (a job that dies frees it then),
# and is renewed every third of it; each request to take it waits at most HOLD_WAIT seconds.
HOLD_SECONDS = 120
HOLD_WAIT = 25
MAX_TOKEN_ANSWER = 64 * 1024


class Credential(Protocol):
    def header(self) -> str:
        """The ``Authorization`` header's value for the next request."""
        ...


class StaticCredential:
    """A token the pool's admin issued (``pgoverlay api token issue``)."""

    def __init__(self, token: str) -> None:
        self._token = token.strip()

    def __repr__(self) -> str:
        return "StaticCredential(***)"

    def header(self) -> str:
        return f"Bearer {self._token}"


def expiry(token: str) -> float | None:
    """The ``exp`` a JWT states, read without checking its signature (the server checks it;
    this is only when to ask for the next one). None when it states none."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        exp = claims.get("exp")
    except (IndexError, ValueError, AttributeError):
        return None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


class OidcCredential:
    """The job's GitHub Actions OIDC token for ``audience`` (the pool's URL), asked of the runner
    as GitHub's toolkit does (``core.getIDToken``): ``GET $ACTIONS_ID_TOKEN_REQUEST_URL
    &audience=...`` with ``Authorization: bearer $ACTIONS_ID_TOKEN_REQUEST_TOKEN``."""

    def __init__(
        self, audience: str, environ: Mapping[str, str] | None = None, *, lazy: bool = False
    ) -> None:
        self.audience = audience
        self._environ = os.environ if environ is None else environ
        self._url = ""
        self._request_token = ""
        self._token = ""
        self._renew_at = 0.0
        self._lock = threading.Lock()
        if not lazy:  # else at the first request: a run that asks nothing needs no token
            self._where_to_ask()

    def _where_to_ask(self) -> None:
        env = self._environ
        url = env.get("ACTIONS_ID_TOKEN_REQUEST_URL", "")
        self._request_token = env.get("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "")
        if not url or not self._request_token:
            raise ConfigError(
                "the `server` input needs the job's OIDC token, and the runner offers none "
                "(ACTIONS_ID_TOKEN_REQUEST_URL is not set): give the job `permissions: "
                "id-token: write`. A fork's pull_request run gets no token: the pool cannot "
                "branch it through the network API"
            )
        if urllib.parse.urlsplit(url).scheme not in ("https", "http"):
            raise ConfigError(
                "ACTIONS_ID_TOKEN_REQUEST_URL is not an http(s) URL: the runner sets it; do not "
                "change it in the workflow"
            )
        joiner = "&" if "?" in url else "?"
        self._url = url + joiner + urllib.parse.urlencode({"audience": self.audience})

    def __repr__(self) -> str:
        return f"OidcCredential(audience={self.audience!r})"

    def header(self) -> str:
        with self._lock:
            if not self._url:
                self._where_to_ask()
            if not self._token or time.time() >= self._renew_at:
                self._token = self._fetch()
                stated = expiry(self._token)
                self._renew_at = (
                    stated - TOKEN_MARGIN if stated else time.time() + TOKEN_FALLBACK_SECONDS
                )
            return f"Bearer {self._token}"

    def _fetch(self) -> str:
        sent = {"Authorization": f"bearer {self._request_token}", "Accept": "application/json"}
        request = urllib.request.Request(self._url, headers=sent)  # noqa: S310 - http(s), checked
        where = urllib.parse.urlsplit(self._url).netloc
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - checked
                raw = answer.read(MAX_TOKEN_ANSWER + 1)
        except urllib.error.HTTPError as err:
            raise ServiceError(
                f"the runner refused this job an OIDC token (HTTP {err.code} from {where}): "
                "give the job `permissions: id-token: write`"
            ) from None
        except (OSError, http.client.HTTPException) as err:
            raise ServiceError(
                f"the runner's OIDC token service ({where}) could not be reached: {err}"
            ) from None
        try:
            value = json.loads(raw[:MAX_TOKEN_ANSWER]).get("value")
        except (ValueError, AttributeError):
            value = None
        if not isinstance(value, str) or value.count(".") != 2:
            raise ServiceError(
                f"the runner's OIDC token service ({where}) answered without a token"
            )
        return value


def trust_file(ca_file: Path | None) -> str:
    """The file libpq verifies the front door with: ``ca_file``, else the system's bundle (libpq
    before 16 knows no ``sslrootcert=system``). ConfigError when there is neither."""
    if ca_file is not None:
        return os.fspath(ca_file)
    paths = ssl.get_default_verify_paths()
    for found in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if found and os.path.isfile(found):
            return found
    raise ConfigError(
        "this runner has no bundle of trusted certificates for psql to verify the pool's front "
        "door with: set the `server-ca` input to the door's certificate (or its CA's)"
    )


class NetworkEngine(RemoteEngine):
    """The engine of the pool whose API is at ``server`` (``https://HOST[:PORT]``)."""

    def __init__(
        self,
        server: str,
        *,
        credential: Credential,
        ca_file: Path | None = None,
        timeout: float = 3600.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(Path(os.devnull), timeout=timeout, headers=dict(headers or {}))
        parts = urllib.parse.urlsplit(server.strip())
        if parts.scheme != "https" or not parts.hostname or parts.path.strip("/"):
            raise ConfigError(
                f"server: {server.strip()[:100]!r} is not the pool's URL: give its origin, "
                "https://HOST[:PORT] (the front door's HTTPS port; docs/api.md)"
            )
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ConfigError(
                "server: give the pool's origin alone, https://HOST[:PORT], with no user, "
                "password, query or fragment (the job's token is its credential)"
            )
        self.server = f"https://{parts.netloc}"
        self._host, self._port = parts.hostname, parts.port or 443
        self.credential = credential
        self.ca_file = ca_file
        try:
            self._context = ssl.create_default_context(
                cafile=os.fspath(ca_file) if ca_file is not None else None
            )
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(
                f"server-ca: {ca_file} is not a certificate to trust ({err}): give the front "
                "door's certificate (https://POOL/pgoverlay-door.crt) or its CA's, as PEM"
            ) from None

    @property
    def where(self) -> str:
        return f"the pool's server at {self.server}"

    imposter = "is the `server` input the pool's front door (its HTTPS port)?"

    def _send(self, method: str, url: str, payload: bytes | None, wait: float) -> tuple[int, bytes]:
        sent = {**self.headers, "Authorization": self.credential.header()}
        sent["Accept"] = "application/json"
        if payload is not None:
            sent["Content-Type"] = "application/json"
        conn = http.client.HTTPSConnection(
            self._host, self._port, context=self._context, timeout=wait
        )
        try:
            conn.request(method, PREFIX + url, body=payload, headers=sent)
            answer = conn.getresponse()
            return answer.status, answer.read()
        except http.client.HTTPException as err:
            raise ValueError(f"{type(err).__name__}: {err}") from None
        finally:
            conn.close()

    def _unreachable(self, err: OSError) -> ServiceError:
        if isinstance(err, ssl.SSLCertVerificationError):
            trusted = (
                f"the certificate in server-ca ({self.ca_file})"
                if self.ca_file
                else ("the system's trusted CAs")
            )
            return ServiceError(
                f"{self.where} is not who it says: its certificate is not signed by "
                f"{trusted} or does not name {self._host} ({err.verify_message}). Set "
                "`server-ca` to the front door's certificate (https://POOL/pgoverlay-door.crt; "
                "`pgoverlay doctor` on the pool host prints its SHA-256) or its CA's"
            )
        return ServiceError(
            f"{self.where} could not be reached ({err}): check the `server` input, that this "
            "runner can reach that host and port, and that the front door runs there "
            "(`pgoverlay doctor` on the pool host)"
        )

    # -- what the network adds ---------------------------------------------------------

    def connection(self, name: str) -> Connection:
        """Branch ``name``'s login, through the front door, verified as the API was."""
        given = super().connection(name)
        # Whatever the answer says: the door is verified as the API was, never less.
        return given.replace(sslmode="verify-full", sslrootcert=trust_file(self.ca_file))

    def pool(self) -> dict[str, Any]:
        """The pool's way in for people and programs (``GET /pool``): ``door_name``,
        ``door_port``, ``door_https_port`` and ``app_sslmode``."""
        answer = self._call("GET", "/pool")
        if not isinstance(answer, dict):
            raise ServiceError(f"{self.where} answered /pool with something that is not an object")
        return answer

    @contextlib.contextmanager
    def hold(
        self,
        name: str,
        *,
        wait: float,
        waiting: Callable[[str], None] | None = None,
        keep: Callable[[str], bool] | None = None,
    ) -> Iterator[None]:
        """Hold branch ``name`` (of this job's repository) while the block runs: another job
        holding it is waited for, up to ``wait`` seconds (LockBusyError after that), and
        ``waiting`` told so once. The hold is renewed in the background, and given back at the
        end, unless the block ended well and ``keep`` takes the hold's id over (it returns
        True: the job keeps its branch after this step, ``action.jobhold``); a job that dies
        without giving it back frees it within HOLD_SECONDS."""
        target = f"/branches/{quote(name)}/hold"
        deadline = time.monotonic() + wait
        told = False
        while True:
            # The first ask does not wait, so that a job told to wait hears it at once.
            now = int(max(0.0, min(HOLD_WAIT, deadline - time.monotonic()))) if told else 0
            body = json.dumps({"seconds": HOLD_SECONDS, "wait": now}).encode()
            try:
                held = self._call("POST", target, raw=body)
                break
            except LockBusyError:
                if time.monotonic() >= deadline:
                    raise LockBusyError(
                        f"another job of this pull request has held branch {name} for over "
                        f"{wait:.0f} s: let it finish, or cancel it, then re-run this job"
                    ) from None
                if not told and waiting is not None:
                    waiting(
                        f"another job of this pull request holds branch {name} until it ends: "
                        f"waiting for it (up to {wait:.0f} s)"
                    )
                told = True
        hold_id = str(held.get("hold", "")) if isinstance(held, dict) else ""
        if not hold_id:
            raise ServiceError(f"{self.where} answered a hold without its id")
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(HOLD_SECONDS / 3):
                try:
                    self.renew_hold(name, hold_id)
                except PgoverlayError as err:  # the job goes on; another may now hold it
                    log.warning("the hold on branch %s was not renewed: %s", name, err)

        renewer = threading.Thread(target=renew, name="pgoverlay-hold", daemon=True)
        renewer.start()
        kept = False
        try:
            yield
            kept = keep is not None and keep(hold_id)
        finally:
            stop.set()
            if not kept:
                with contextlib.suppress(Exception):
                    self.give_back(name, hold_id)

    def renew_hold(self, name: str, hold_id: str) -> None:
        """Renew this job's hold ``hold_id`` on branch ``name`` for HOLD_SECONDS more;
        LockBusyError when it lapsed."""
        self._call("POST", f"/branches/{quote(name)}/hold/{quote(hold_id)}/renew", raw=b"{}")

    def give_back(self, name: str, hold_id: str) -> None:
        self._call("DELETE", f"/branches/{quote(name)}/hold/{quote(hold_id)}")
