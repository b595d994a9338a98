"""The one client of GitHub's REST API, for the Action, the listener and the branch page.

Every call to GitHub goes through ``Rest.call`` (JSON), ``Rest.pages`` (a listing, page after
page) or ``Rest.download`` (a tarball), on urllib3, with urllib3's ``Retry`` as the one retry
and rate-limit path (``GitHubRetry``): 500, 502, 503 and 504 and a connection that fails are
tried again after a growing pause; a rate limit (a 403 or 429 with ``Retry-After``, or with
``X-RateLimit-Remaining: 0`` and its reset time, or a bare 429) after the wait GitHub asks for,
when that is at most ``max_wait`` seconds; a longer one is the caller's error at once ("rate
limited for N s more"), not minutes of a job or a page spent waiting. Any other answer comes
back to the caller, errors included, which words its own ``GitHubError``.

urllib3 (PyGithub's and requests' transport) rather than PyGithub: the Action's step would pay
PyGithub's import, with requests, about 0.2 s, more than everything else a closing step does
(docs/benchmarks.md, "process").

Honours ``GITHUB_API_URL`` (GitHub Enterprise works the same way: the caller passes the
address) and the usual proxy variables (``https_proxy``, ``no_proxy``). The token goes only
to the addresses the client was made for: a page a Link header names elsewhere is not
followed, and a redirect to another host (a tarball's, to its storage) drops the
Authorization header (urllib3's ``remove_headers_on_redirect``). No token, code or secret is
ever part of a message or a log line of this module.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self, cast
from urllib.parse import urlencode, urlsplit

import urllib3
from urllib3.connectionpool import ConnectionPool
from urllib3.exceptions import HTTPError, MaxRetryError, ResponseError
from urllib3.response import BaseHTTPResponse
from urllib3.util.retry import Retry

from pgoverlay.errors import GitHubError
from pgoverlay.github.grammar import API_VERSION

RETRY_STATUSES = frozenset({500, 502, 503, 504})
RATE_STATUSES = frozenset({403, 429})
MAX_RATE_WAIT = 120.0  # seconds a rate-limited call waits before it is an error
USER_AGENT = "pgoverlay"
_CHUNK = 1 << 16


def rate_wait(status: int, headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds GitHub asks a rate-limited caller to wait (``now``: the epoch's seconds), or
    None when the answer is not a rate limit: ``Retry-After``; else the reset time when no
    call remains; a 429 that says neither, a minute (what GitHub's documentation asks)."""
    if status not in RATE_STATUSES:
        return None
    after = headers.get("Retry-After")
    if after is not None and after.strip().isdigit():
        return float(after)
    if headers.get("X-RateLimit-Remaining") == "0":
        reset = headers.get("X-RateLimit-Reset", "")
        return max(0.0, float(reset) - now) if reset.isdigit() else 60.0
    return 60.0 if status == 429 else None


class GitHubRetry(Retry):
    """urllib3's ``Retry`` with GitHub's rate limits: a 403 or 429 is tried again after
    ``rate_wait`` when it is a rate limit of at most ``max_wait`` seconds; else the answer is
    the caller's (``raise_on_status`` is off: an answer that used up its tries is returned)."""

    def __init__(self, *args: Any, max_wait: float = MAX_RATE_WAIT, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_wait = max_wait

    def new(self, **kw: Any) -> Self:
        made = super().new(**kw)
        made.max_wait = self.max_wait
        return made

    def get_retry_after(self, response: BaseHTTPResponse) -> float | None:
        wait = rate_wait(response.status, response.headers, now=time.time())
        return wait if wait is not None else super().get_retry_after(response)

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> Self:
        if response is not None and response.status in RATE_STATUSES:
            wait = rate_wait(response.status, response.headers, now=time.time())
            if wait is None or wait > self.max_wait:  # not a limit, or one not worth waiting
                raise MaxRetryError(
                    cast("ConnectionPool", _pool), url or "", ResponseError("not waited out")
                )
        return super().increment(method, url, response, error, _pool, _stacktrace)


def retry(*, retries: int, backoff: float, max_wait: float = MAX_RATE_WAIT) -> GitHubRetry:
    """The one retry policy of every call to GitHub."""
    return GitHubRetry(
        total=retries,
        backoff_factor=backoff,
        status_forcelist=sorted(RETRY_STATUSES | RATE_STATUSES),
        # Writes too, as the comment's calls always were: a 5xx seldom means it was done (a
        # comment GitHub made and then answered 502 for would be made twice).
        allowed_methods=None,
        raise_on_status=False,
        respect_retry_after_header=True,
        max_wait=max_wait,
    )


class Auth(Protocol):
    """How a client proves who it is: the value of the Authorization header of its next call."""

    def authorization(self) -> str: ...

    def close(self) -> None: ...


class Token:
    """A token: a workflow's, a person's, a reader's, or one the listener was given."""

    def __init__(self, token: str) -> None:
        self._token = token

    def __repr__(self) -> str:  # never the token
        return "Token()"

    def authorization(self) -> str:
        return f"Bearer {self._token}"

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Answer:
    """One answer: its status, its JSON (None when it has none, or is not JSON), its head."""

    status: int
    data: Any
    headers: Mapping[str, str]

    @property
    def reason(self) -> str:
        message = self.data.get("message") if isinstance(self.data, dict) else None
        return f"HTTP {self.status}: {message or 'no message'}"

    @property
    def next_url(self) -> str | None:
        """The rel="next" address of the Link header."""
        for part in (self.headers.get("Link") or "").split(","):
            address, _, params = part.partition(";")
            if 'rel="next"' in params:
                return address.strip().removeprefix("<").removesuffix(">")
        return None


def check_url(url: str, *, setting: str) -> str:
    """``url`` without its trailing slash, if it is an http(s) address; else a GitHubError
    that names the ``setting`` to fix."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.netloc:
        raise GitHubError(f"the GitHub address {url!r} is not http(s): check {setting}")
    return url.rstrip("/")


def _cause(err: BaseException) -> str:
    """The innermost reason urllib3 gives for a failed call: ``IncompleteRead``,
    ``ConnectionRefusedError``, ``ReadTimeoutError`` ... (a type's name, never a URL's text)."""
    inner: BaseException = err
    for _ in range(8):
        following = getattr(inner, "reason", None)
        if not isinstance(following, BaseException):
            following = next((a for a in inner.args if isinstance(a, BaseException)), None)
        if following is None:
            following = inner.__cause__ or inner.__context__
        if following is None:
            break
        inner = following
    return type(inner).__name__


class Rest:
    """A client of one GitHub: its API at ``api_url`` (and ``also``, other addresses of the
    same GitHub its callers may name whole, such as the web address of the OAuth flow),
    signed by ``auth`` (None: each call says, or none is sent)."""

    def __init__(
        self,
        api_url: str,
        *,
        auth: Auth | None,
        also: tuple[str, ...] = (),
        setting: str = "GITHUB_API_URL",
        retries: int = 4,
        backoff: float = 1.0,
        timeout: float = 30.0,
        max_wait: float = MAX_RATE_WAIT,
        follow_redirects: bool = True,
    ) -> None:
        self.api_url = check_url(api_url, setting=setting)
        self._bases = (self.api_url, *also)
        self.auth = auth
        self.retry = retry(retries=retries, backoff=backoff, max_wait=max_wait)
        self.timeout = urllib3.Timeout(connect=timeout, read=timeout)
        self._follow = follow_redirects
        self._setting = setting
        self._managers: dict[str | None, urllib3.PoolManager] = {}
        self._lock = threading.Lock()  # the Action's comment thread and its main thread

    def __repr__(self) -> str:  # never the auth
        return f"Rest({self.api_url!r})"

    def _manager(self, url: str) -> urllib3.PoolManager:
        """A pool per proxy: the proxy variables name one for this host, or none."""
        parts = urlsplit(url)
        proxy = urllib.request.getproxies_environment().get(parts.scheme)
        if proxy and urllib.request.proxy_bypass(parts.hostname or ""):  # no_proxy
            proxy = None
        with self._lock:
            if proxy not in self._managers:
                common: dict[str, Any] = {"retries": self.retry, "timeout": self.timeout}
                self._managers[proxy] = (
                    urllib3.ProxyManager(proxy, **common)
                    if proxy
                    else urllib3.PoolManager(**common)
                )
            return self._managers[proxy]

    def _url(self, target: str, *, what: str) -> str:
        url = target if "://" in target else f"{self.api_url}{target}"
        if not any(url.startswith(f"{base}/") for base in self._bases):
            raise GitHubError(f"{what} (GitHub sent a page outside {self.api_url}: not followed)")
        return url

    def _headers(self, token: str | None, accept: str) -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": USER_AGENT}
        if accept == "application/vnd.github+json":
            headers["X-GitHub-Api-Version"] = API_VERSION
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        elif self.auth is not None:
            headers["Authorization"] = self.auth.authorization()
        return headers

    def _open(
        self,
        method: str,
        url: str,
        *,
        what: str,
        headers: dict[str, str],
        body: bytes | None = None,
        stream: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        try:
            return self._manager(url).request(
                method,
                url,
                body=body,
                headers=headers,
                redirect=self._follow,
                preload_content=not stream,
            )
        except HTTPError as err:  # refused, reset, timed out, bad TLS, an answer cut short
            raise self._unreachable(err, url, what=what) from None

    def _unreachable(self, err: BaseException, url: str, *, what: str) -> GitHubError:
        parts = urlsplit(url)
        host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
        return GitHubError(
            f"{what} (GitHub unreachable: {_cause(err)}): cannot reach GitHub at {host}, "
            f"check {self._setting} and this host's network"
        )

    def call(
        self,
        method: str,
        target: str,
        *,
        what: str,
        json_body: Any = None,
        form: Mapping[str, str] | None = None,
        token: str | None = None,
        accept: str = "application/vnd.github+json",
    ) -> Answer:
        """One call (``target``: a path under the API, or a whole address at one of the
        client's), retried as the module says; signed with ``token`` when given, else the
        client's ``auth``. Any answer comes back, errors included; failing to reach GitHub is a
        GitHubError that starts with ``what``."""
        url = self._url(target, what=what)
        headers = self._headers(token, accept)
        body = None
        if json_body is not None:
            body = json.dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        elif form is not None:
            body = urlencode(form).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        response = self._open(method, url, what=what, headers=headers, body=body)
        try:
            decoded = json.loads(response.data) if response.data else None
        except ValueError:
            decoded = None
        answer = Answer(response.status, decoded, response.headers)  # case-blind
        self.rate_limited(answer, what=what)
        return answer

    def rate_limited(self, answer: Answer, *, what: str) -> None:
        """A GitHubError when ``answer`` is a rate limit the retry would not wait out."""
        wait = rate_wait(answer.status, answer.headers, now=time.time())
        if wait is not None and wait > self.retry.max_wait:
            raise GitHubError(f"{what} (rate limited for {wait:.0f} s more: try again later)")

    def pages(self, path: str, *, what: str) -> Iterator[Any]:
        """Every item of a listing, page after page (Link: rel="next")."""
        target: str | None = path
        while target is not None:
            answer = self.call("GET", target, what=what)
            if answer.status != 200 or not isinstance(answer.data, list):
                raise GitHubError(f"{what} ({answer.reason})")
            yield from answer.data
            target = answer.next_url

    def download(self, path: str, dest: Path, *, what: str) -> None:
        """What ``path`` answers (a tarball), into ``dest``; GitHub's redirect to its storage
        is followed without the token."""
        url = self._url(path, what=what)
        headers = self._headers(None, "application/vnd.github+json")
        response = self._open("GET", url, what=what, headers=headers, stream=True)
        try:
            if response.status != 200:
                raise GitHubError(f"{what} (HTTP {response.status})")
            with dest.open("wb") as handle:
                for chunk in response.stream(_CHUNK):
                    handle.write(chunk)
        except HTTPError as err:
            raise self._unreachable(err, url, what=what) from None
        finally:
            response.release_conn()

    def close(self) -> None:
        """Close the connections kept open, and those of ``auth`` (an app's token minter)."""
        with self._lock:
            for manager in self._managers.values():
                manager.clear()
            self._managers.clear()
        if self.auth is not None:
            self.auth.close()
