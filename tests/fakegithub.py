"""A fake GitHub REST API for tests: real HTTP, in-memory state, checked against GitHub's OpenAPI.

GitHub is unreachable from the test machines, so this stands in for it. It speaks HTTP (the
standard library's `ThreadingHTTPServer`), keeps repositories, pulls, issue comments, commit
and commit statuses in memory, and checks every request to an operation of
`tests/fixtures/github/github_openapi_subset.json`, and its own answer, with openapi-core. A
request that fails the check gets GitHub's 422 and is recorded in `violations`; so is an answer of
the fake that does not match the schema. Tests end with `assert fake.violations == []`.

In a test::

    with FakeGitHub() as gh:
        gh.add_token("ghp_alice", "alice")
        gh.add_pull("octo/app", 7, "a" * 40, "b" * 40)
        Github(auth=Auth.Token("ghp_alice"), base_url=gh.url).get_repo("octo/app")

As a process, for a workflow run by `act`::

    python tests/fakegithub.py --port 0 --state state.json    # prints its URL, then serves

The branch page's sign-in (GitHub's OAuth web flow) is served too, on the same address: see
"OAuth web flow" below. `sign_in(login)` is who the fake's browser session is.

It loads `state.json` if present (seed one with `FakeGitHub(state_file=...)` and the `add_*`
methods) and rewrites it after every change, request log included. Token values are never kept:
tokens are stored as SHA-256 digests and the log leaves out the Authorization header.
"""
# fmt: off
# (GitHub's JSON shapes are wide and shallow: kept dense on purpose, one field group a line.)

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import os
import re
import secrets
import signal
import sys
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, cast
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from openapi_core import OpenAPI
from openapi_core.exceptions import OpenAPIError
from openapi_core.templating.paths.exceptions import PathError
from openapi_core.templating.responses.exceptions import ResponseNotFound
from openapi_core.testing import MockRequest, MockResponse

SPEC = Path(__file__).resolve().parent / "fixtures" / "github" / "github_openapi_subset.json"
SPEC_SERVER = "https://api.github.com"  # requests are checked as if they had been sent there
WEB = "https://github.com"
DOCS = "https://docs.github.com/rest"
Json = dict[str, Any]
Kind = Literal["user", "installation", "app"]

_USER_URLS = ("events followers following gists organizations received_events repos starred "
              "subscriptions")
_REPO_URLS = ("archive assignees blobs branches collaborators comments commits compare contents "
              "contributors deployments downloads events forks git_commits git_refs git_tags "
              "hooks issue_comment issue_events issues keys labels languages merges milestones "
              "notifications pulls releases stargazers statuses subscribers subscription tags "
              "teams trees")
_APP_PERMISSIONS = {"checks": "write", "issues": "write", "metadata": "read",
                    "pull_requests": "write", "statuses": "write"}
_NOT_JSON = object()
_R = r"/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)"
# Parameters match anything: openapi-core, not the router, rejects a bad one (with a 422).
ROUTES = [(method, re.compile(pattern), name) for method, pattern, name in [
    ("POST", _R + r"/issues/(?P<number>[^/]+)/comments", "create_comment"),
    ("GET", _R + r"/issues/(?P<number>[^/]+)/comments", "list_comments"),
    ("PATCH", _R + r"/issues/comments/(?P<id>[^/]+)", "update_comment"),
    ("POST", _R + r"/statuses/(?P<sha>[^/]+)", "create_status"),
    ("GET", _R + r"/pulls", "list_pulls"),
    ("GET", _R + r"/pulls/(?P<number>[^/]+)", "get_pull"),
    ("GET", _R + r"/issues/(?P<number>[^/]+)/labels", "list_labels"),
    ("DELETE", _R + r"/issues/(?P<number>[^/]+)/labels/(?P<name>[^/]+)", "remove_label"),
    ("GET", _R + r"/collaborators/(?P<username>[^/]+)/permission", "get_permission"),
    ("POST", r"/app/installations/(?P<id>[^/]+)/access_tokens", "create_token"),
    # -- deployments: begin --
    ("POST", _R + r"/deployments", "create_deployment"),
    ("GET", _R + r"/deployments", "list_deployments"),
    ("POST", _R + r"/deployments/(?P<id>[^/]+)/statuses", "create_deployment_status"),
    ("GET", _R + r"/deployments/(?P<id>[^/]+)/statuses", "list_deployment_statuses"),
    # -- deployments: end --
    # users/get-authenticated and repos/get: who signed in to the branch page, and their
    # permissions on the pull request's repository (and what PyGithub fetches on the way).
    ("GET", r"/user", "get_user"),
    ("GET", _R, "get_repo"),
    # Outside the subset, so unchecked: what PyGithub fetches on the way.
    ("GET", _R + r"/commits/(?P<sha>[^/]+)", "get_commit"),
    ("GET", _R + r"/tarball/(?P<ref>[^/]+)", "get_tarball"),
]]

# -- OAuth web flow (the branch page's sign-in) ----------------------------------------------
# github.com's pages, not REST API operations, so not in the OpenAPI subset. As GitHub documents
# them ("Authorizing OAuth apps", and "Troubleshooting OAuth app access token request errors"):
#
# 1. GET /login/oauth/authorize?client_id=&redirect_uri=&state=&scope= : GitHub signs the user
#    in and asks them to authorize the app, then redirects to redirect_uri (which must be on the
#    host and port of the app's registered callback URL) with `code` and the `state` unchanged.
#    The code lasts ten minutes. The fake asks nothing: it redirects at once for the login of
#    `sign_in()`, and answers 401 when nobody is signed in.
# 2. POST /login/oauth/access_token with client_id, client_secret, code and redirect_uri (form
#    fields or JSON): with `Accept: application/json`, {"access_token", "token_type": "bearer",
#    "scope"}; else the same form-encoded. A failure is still a 200, with `error`:
#    incorrect_client_credentials, redirect_uri_mismatch or bad_verification_code (a code that
#    is wrong, expired or used: a code is good once).
# The token is a user's token ("gho_..."): GET /user and GET /repos/{owner}/{repo} answer for it.
WEB_FLOW = {("GET", "/login/oauth/authorize"): "_authorize",
            ("POST", "/login/oauth/access_token"): "_access_token"}
CODE_SECONDS = 600
_TOKEN_ERRORS = {
    "incorrect_client_credentials": "The client_id and/or client_secret passed are incorrect.",
    "redirect_uri_mismatch": "The redirect_uri MUST match the registered callback URL for this "
                             "application.",
    "bad_verification_code": "The code passed is incorrect or expired."}
# -- end OAuth web flow ----------------------------------------------------------------------


def now(delta: timedelta = timedelta()) -> str:
    return (datetime.now(UTC) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


def error(message: str, **extra: Any) -> Json:
    """GitHub's error body."""
    return {"message": message, "documentation_url": DOCS, **extra}


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def jwt_issuer(token: str) -> str:
    """The `iss` claim of a JWT, signature unchecked; "" when the token is no JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return ""
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return ""
    return str(claims.get("iss", "")) if isinstance(claims, dict) else ""


def describe(exc: Exception) -> str:
    """One line from an openapi-core validation error, with the schema's complaints."""
    schema_errors = getattr(exc.__cause__, "schema_errors", None)
    if not schema_errors:
        return f"{exc} ({exc.__cause__})" if exc.__cause__ else str(exc)
    details = [(f"{where}: " if (where := ".".join(map(str, e.absolute_path))) else "")
               + e.message for e in schema_errors]
    return str(exc).split(": Value ")[0] + ": " + "; ".join(details)


def allow_null_in_nullable_enums(node: Any) -> None:
    """Add null to every `enum` of a `nullable` schema.

    openapi-schema-validator follows OpenAPI 3.0.3's reading that `enum` must list null itself,
    but GitHub means null (its own examples have null there)."""
    if isinstance(node, dict):
        if node.get("nullable") and None not in node.get("enum", [None]):
            node["enum"].append(None)
        for value in node.values():
            allow_null_in_nullable_enums(value)
    elif isinstance(node, list):
        for value in node:
            allow_null_in_nullable_enums(value)


@cache
def load_spec(path: Path) -> OpenAPI:
    spec = json.loads(path.read_text())
    allow_null_in_nullable_enums(spec)
    return OpenAPI.from_dict(spec)


@dataclass
class Reply:
    status: int
    body: Any = None  # JSON-ready; None sends no body
    headers: dict[str, str] = field(default_factory=dict)


class Fail(Exception):
    """Raised by a route to answer with GitHub's error shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.reply = Reply(status, error(message))


@dataclass(frozen=True)
class Caller:
    login: str
    kind: Kind


@dataclass
class Call:
    caller: Caller
    path: str
    params: dict[str, str]
    query: dict[str, str]
    body: Any


@dataclass
class State:
    """Everything the fake knows, JSON-ready: what `save` writes and `--state` loads."""

    next_id: int = 1000
    users: dict[str, int] = field(default_factory=dict)  # login -> id
    tokens: dict[str, Json] = field(default_factory=dict)  # sha256(token) -> {login, kind}
    apps: dict[str, str] = field(default_factory=dict)  # app id -> slug
    repos: dict[str, Json] = field(default_factory=dict)  # full name -> {id, fork}
    issues: dict[str, list[int]] = field(default_factory=dict)  # full name -> numbers
    pulls: list[Json] = field(default_factory=list)
    comments: list[Json] = field(default_factory=list)
    statuses: list[Json] = field(default_factory=list)
    # -- deployments: begin --
    deployments: list[Json] = field(default_factory=list)
    deployment_statuses: list[Json] = field(default_factory=list)  # oldest first
    # -- deployments: end --
    faults: list[Json] = field(default_factory=list)
    tarballs: dict[str, str] = field(default_factory=dict)  # "owner/name@ref" -> base64 .tar.gz
    # "owner/name" -> {login: "admin" | "maintain" | "write" | "triage" | "read"}
    collaborators: dict[str, dict[str, str]] = field(default_factory=dict)
    requests: list[Json] = field(default_factory=list)
    violations: list[Json] = field(default_factory=list)
    # -- OAuth web flow (the branch page's sign-in) ------------------------------------------
    oauth_apps: dict[str, Json] = field(default_factory=dict)  # client id -> {secret, callback}
    signed_in: str | None = None  # the login the fake's browser session is (None: nobody)
    codes: dict[str, Json] = field(default_factory=dict)  # sha256(code) -> {login, client_id, ...}
    # -- end OAuth web flow ----------------------------------------------------------------------


class FakeGitHub:
    """The fake API. Seed it with the `add_*` methods, `start()` it, point a client at `url`."""

    def __init__(self, *, port: int = 0, state_file: Path | None = None, spec: Path = SPEC,
                 host: str = "127.0.0.1") -> None:
        self.port = port
        self.host = host  # the address it listens on and names in its URL
        self.state_file = state_file
        self.state = State()
        if state_file is not None and state_file.exists() and state_file.stat().st_size:
            self.state = State(**json.loads(state_file.read_text()))
        self._spec = load_spec(spec)
        self._lock = threading.RLock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle and records ----------------------------------------------------------------
    def start(self) -> FakeGitHub:
        self._server = _Server(self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name="fakegithub")
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> FakeGitHub:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeGitHub is not started: call start() or use it in a with block")
        return f"http://{self.host}:{self.port}"

    @property
    def requests(self) -> list[Json]:
        """One record a request: method, path, query, json, status, headers, login, injected."""
        with self._lock:
            return list(self.state.requests)

    @property
    def violations(self) -> list[Json]:
        """Requests and answers that failed the OpenAPI check: kind, method, path, error."""
        with self._lock:
            return list(self.state.violations)

    def save(self, path: Path | None = None) -> None:
        target = path or self.state_file
        if target is None:
            raise ValueError("no path given and no state_file set")
        with self._lock:
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_text(json.dumps(asdict(self.state), indent=1))
            os.replace(tmp, target)

    # -- seeding ----------------------------------------------------------------------------
    def add_token(self, token: str, login: str, *, kind: Kind = "user") -> None:
        """Accept `token` as `login`. An installation acts as `<slug>[bot]`, of type Bot."""
        if kind == "installation" and not login.endswith("[bot]"):
            login += "[bot]"
        with self._lock:
            self.state.tokens[digest(token)] = {"login": login, "kind": kind}
            self._user_id(login)
            self._changed()

    def add_app(self, app_id: int, slug: str) -> None:
        """Accept JWTs whose `iss` is `app_id` (signature unchecked) as the GitHub App `slug`."""
        with self._lock:
            self.state.apps[str(app_id)] = slug
            self._changed()

    def add_repo(self, repo: str, *, fork: bool = False, private: bool = False) -> None:
        """A repository; a ``private`` one is seen only by its collaborators and installations
        (anyone else's token gets 404, as on GitHub)."""
        with self._lock:
            self.state.repos.setdefault(repo, {"id": self._next_id(), "fork": fork,
                                               "private": private})
            self._changed()

    def add_issue(self, repo: str, number: int) -> None:
        self.add_repo(repo)
        with self._lock:
            if number not in (numbers := self.state.issues.setdefault(repo, [])):
                numbers.append(number)
            self._changed()

    def add_pull(self, repo: str, number: int, head_sha: str, base_sha: str, *,
                 head_repo: str | None = None, state: Literal["open", "closed"] = "open",
                 draft: bool = False, labels: Iterable[str] = (), head_ref: str = "feature",
                 base_ref: str = "main", title: str = "A change", body: str | None = None,
                 login: str = "octocat", merged: bool = False) -> None:
        head_repo = head_repo or repo
        self.add_issue(repo, number)
        self.add_repo(head_repo, fork=head_repo != repo)
        with self._lock:
            self._user_id(login)
            t = now()
            self.state.pulls.append({
                "id": self._next_id(), "repo": repo, "number": number, "head_sha": head_sha,
                "base_sha": base_sha, "head_repo": head_repo, "head_ref": head_ref,
                "base_ref": base_ref, "state": state, "draft": draft, "labels": list(labels),
                "title": title, "body": body, "login": login, "merged": merged,
                "created_at": t, "updated_at": t, "closed_at": None if state == "open" else t})
            self._changed()

    def add_collaborator(self, repo: str, login: str, role: str) -> None:
        """Give `login` a role on `repo`: admin, maintain, write, triage or read."""
        self.add_repo(repo)
        with self._lock:
            self._user_id(login)
            self.state.collaborators.setdefault(repo, {})[login] = role
            self._changed()

    def pull(self, repo: str, number: int) -> Json:
        """The stored pull (change it in place, under `locked()`, to move its head or labels)."""
        with self._lock:
            return next(p for p in self.state.pulls if p["repo"] == repo and p["number"] == number)

    def locked(self) -> threading.RLock:
        return self._lock

    def add_comment(self, repo: str, issue: int, body: str, login: str) -> int:
        """Seed a comment on an issue or pull (made if missing); returns the comment's id."""
        self.add_issue(repo, issue)
        with self._lock:
            comment = self._new_comment(repo, issue, body, login)
            self._changed()
            return int(comment["id"])

    def fail_next(self, method: str, path_regex: str, status: int, *, times: int = 1,
                  headers: dict[str, str] | None = None, body: Any = None) -> None:
        """Answer the next `times` requests whose path matches (re.search) with `status`.

        Checked before authentication, like a failure at GitHub's edge. The body defaults to
        GitHub's error shape with the status's reason phrase."""
        body = error(HTTPStatus(status).phrase) if body is None else body
        with self._lock:
            self.state.faults.append({"method": method.upper(), "path": path_regex,
                                      "status": status, "times": times,
                                      "headers": headers or {}, "body": body})
            self._changed()

    # -- OAuth web flow (the branch page's sign-in) -------------------------------------------
    def add_oauth_app(self, client_id: str, secret: str, *, callback: str | None = None) -> None:
        """An OAuth client (an OAuth App's, or a GitHub App's) with its secret (kept as a
        digest) and, when given, its registered callback URL."""
        with self._lock:
            self.state.oauth_apps[client_id] = {"secret": digest(secret), "callback": callback}
            self._changed()

    def sign_in(self, login: str | None) -> None:
        """Who the fake's browser session is: the login /login/oauth/authorize signs in."""
        with self._lock:
            if login is not None:
                self._user_id(login)
            self.state.signed_in = login
            self._changed()

    def _authorize(self, query: dict[str, str], headers: dict[str, str], raw: bytes) -> Reply:
        app = self.state.oauth_apps.get(query.get("client_id", ""))
        if app is None:
            return Reply(404, error("Not Found"))
        redirect = query.get("redirect_uri") or app["callback"]
        if not redirect or (app["callback"] and urlsplit(redirect).netloc
                            != urlsplit(app["callback"]).netloc):
            return Reply(400, error("The redirect_uri is not associated with this application."))
        if self.state.signed_in is None:
            return Reply(401, error("Nobody is signed in to the fake: call sign_in(login)"))
        code = secrets.token_hex(10)
        self.state.codes[digest(code)] = {
            "login": self.state.signed_in, "client_id": query["client_id"],
            "redirect_uri": query.get("redirect_uri"),
            "expires": (datetime.now(UTC) + timedelta(seconds=CODE_SECONDS)).timestamp()}
        back = {"code": code} | ({"state": query["state"]} if "state" in query else {})
        joiner = "&" if urlsplit(redirect).query else "?"
        return Reply(302, None, {"Location": f"{redirect}{joiner}{urlencode(back)}"})

    def _access_token(self, query: dict[str, str], headers: dict[str, str], raw: bytes) -> Reply:
        kind = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
        try:
            form = (json.loads(raw) if "json" in kind
                    else dict(parse_qsl(raw.decode(), keep_blank_values=True)))
        except ValueError:
            return Reply(400, error("Problems parsing the request body"))
        app = self.state.oauth_apps.get(str(form.get("client_id", "")))
        found = self.state.codes.pop(digest(str(form.get("code", ""))), None)
        problem = None
        if app is None or app["secret"] != digest(str(form.get("client_secret", ""))):
            problem = "incorrect_client_credentials"
        elif (found is None or found["client_id"] != form["client_id"]
              or found["expires"] < datetime.now(UTC).timestamp()):
            problem = "bad_verification_code"
        elif found["redirect_uri"] and form.get("redirect_uri") != found["redirect_uri"]:
            problem = "redirect_uri_mismatch"
        if problem is not None:
            answer: Json = {"error": problem, "error_description": _TOKEN_ERRORS[problem],
                            "error_uri": f"{DOCS}/oauth#{problem}"}
        else:
            assert found is not None
            token = "gho_" + secrets.token_urlsafe(27)
            self.state.tokens[digest(token)] = {"login": found["login"], "kind": "user"}
            answer = {"access_token": token, "token_type": "bearer", "scope": ""}
        accept = next((v for k, v in headers.items() if k.lower() == "accept"), "")
        if "application/json" in accept:
            return Reply(200, answer)
        return Reply(200, urlencode(answer).encode(),
                     {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
    # -- end OAuth web flow ----------------------------------------------------------------------

    # -- HTTP -------------------------------------------------------------------------------
    def respond(self, method: str, target: str, headers: dict[str, str], raw: bytes) -> Reply:
        """Answer one request and log it, less its Authorization header."""
        split = urlsplit(target)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        auth = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
        record: Json = {
            "method": method, "path": split.path, "query": query, "json": None, "status": 0,
            "login": None, "injected": False,
            "headers": {k: v for k, v in headers.items() if k.lower() != "authorization"}}
        with self._lock:
            if (method, split.path) in WEB_FLOW:
                record["query"] = {k: v for k, v in query.items() if k != "code"}
                flow = cast(Callable[[dict[str, str], dict[str, str], bytes], Reply],
                            getattr(self, WEB_FLOW[method, split.path]))
                reply = flow(query, headers, raw)
            else:
                reply = self._answer(method, split.path, query, auth, raw, record)
            record["status"] = reply.status
            self.state.requests.append(record)
            self._changed()
        return reply

    def _answer(self, method: str, path: str, query: dict[str, str], auth: str | None,
                raw: bytes, record: Json) -> Reply:
        try:
            record["json"] = body = json.loads(raw) if raw else None
        except ValueError:
            body = _NOT_JSON
        for fault in self.state.faults:
            if fault["method"] == method and re.search(fault["path"], path):
                fault["times"] -= 1
                if fault["times"] <= 0:
                    self.state.faults.remove(fault)
                record["injected"] = True
                return Reply(fault["status"], fault["body"], dict(fault["headers"]))
        if body is _NOT_JSON:
            self._violation("request", method, path, "the body is not JSON")
            return Reply(400, error("Problems parsing JSON"))
        caller = self._caller(auth)
        if caller is None:
            return Reply(401, error("Bad credentials" if auth else "Requires authentication"))
        record["login"] = caller.login
        route = next(((n, m) for v, p, n in ROUTES if v == method and (m := p.fullmatch(path))),
                     None)
        if route is None:
            return Reply(404, error("Not Found"))
        request = MockRequest(SPEC_SERVER, method, path, args=query, data=raw)
        checked, rejected = True, ""
        try:
            self._spec.validate_request(request)
        except PathError:
            checked = False  # not an operation of the subset: answered unchecked
        except OpenAPIError as exc:
            rejected = describe(exc)
        if rejected:
            self._violation("request", method, path, rejected)
            reply = Reply(422, error(f"Invalid request.\n\n{rejected}",
                                     errors=[{"code": "invalid", "message": rejected}]))
        else:
            name, match = route
            params = {k: unquote(v) for k, v in match.groupdict().items()}
            handler = cast(Callable[[Call], Reply], getattr(self, "_" + name))
            try:
                reply = handler(Call(caller, path, params, query, body))
            except Fail as exc:
                reply = exc.reply
            except Exception as exc:  # a bug in the fake: answer, and make the test fail
                self._violation("fake", method, path, repr(exc))
                reply = Reply(500, error(f"the fake failed: {exc!r}"))
        if checked:
            data = b"" if reply.body is None else json.dumps(reply.body).encode()
            try:
                self._spec.validate_response(request,
                                             MockResponse(data, reply.status, reply.headers))
            except ResponseNotFound:
                pass  # GitHub documents few error statuses per operation (no 401, rarely 403)
            except OpenAPIError as exc:
                self._violation("response", method, path, describe(exc))
        return reply

    def _caller(self, auth: str | None) -> Caller | None:
        scheme, _, token = (auth or "").partition(" ")
        token = token.strip()
        if scheme.lower() not in ("token", "bearer") or not token:
            return None
        if known := self.state.tokens.get(digest(token)):
            return Caller(known["login"], known["kind"])
        slug = self.state.apps.get(jwt_issuer(token))
        return Caller(slug, "app") if slug else None

    def _violation(self, kind: str, method: str, path: str, detail: str) -> None:
        self.state.violations.append({"kind": kind, "method": method, "path": path,
                                      "error": detail})

    def _changed(self) -> None:
        if self.state_file is not None:
            self.save()

    def _next_id(self) -> int:
        self.state.next_id += 1
        return self.state.next_id

    def _user_id(self, login: str) -> int:
        if login not in self.state.users:
            self.state.users[login] = self._next_id()
        return self.state.users[login]

    def _new_comment(self, repo: str, issue: int, body: str, login: str) -> Json:
        self._user_id(login)
        t = now()
        comment = {"id": self._next_id(), "repo": repo, "issue": issue, "body": body,
                   "login": login, "created_at": t, "updated_at": t}
        self.state.comments.append(comment)
        return comment

    # -- routes -----------------------------------------------------------------------------
    def _repo(self, call: Call) -> str:
        wanted = f"{call.params['owner']}/{call.params['repo']}".lower()
        for name in self.state.repos:
            if name.lower() == wanted:  # GitHub's names are case-insensitive
                return name
        raise Fail(404, "Not Found")

    def _issue(self, call: Call) -> tuple[str, int]:
        repo, number = self._repo(call), int(call.params["number"])
        if number not in self.state.issues.get(repo, []):
            raise Fail(404, "Not Found")
        return repo, number

    def _own_comment(self, call: Call) -> Json:
        repo, cid = self._repo(call), int(call.params["id"])
        found = [c for c in self.state.comments if c["id"] == cid and c["repo"] == repo]
        if not found:
            raise Fail(404, "Not Found")
        if found[0]["login"] != call.caller.login:
            raise Fail(403, "Resource not accessible by integration"
                       if call.caller.kind == "installation" else "Must have admin rights")
        return found[0]

    def _create_comment(self, call: Call) -> Reply:
        repo, number = self._issue(call)
        comment = self._new_comment(repo, number, call.body["body"], call.caller.login)
        out = self._comment_json(comment)
        return Reply(201, out, {"Location": out["url"]})

    def _list_comments(self, call: Call) -> Reply:
        repo, number = self._issue(call)
        since = call.query.get("since", "")
        items = [c for c in self.state.comments
                 if c["repo"] == repo and c["issue"] == number and c["updated_at"] >= since]
        return self._page(sorted(items, key=lambda c: c["id"]), call, self._comment_json)

    def _update_comment(self, call: Call) -> Reply:
        comment = self._own_comment(call)
        comment.update(body=call.body["body"], updated_at=now())
        return Reply(200, self._comment_json(comment))

    def _create_status(self, call: Call) -> Reply:
        b, t = call.body, now()
        status = {"id": self._next_id(), "repo": self._repo(call), "sha": call.params["sha"],
                  "state": b["state"], "target_url": b.get("target_url"),
                  "description": b.get("description"), "context": b.get("context", "default"),
                  "login": call.caller.login, "created_at": t, "updated_at": t}
        self.state.statuses.append(status)
        out = self._status_json(status)
        return Reply(201, out, {"Location": out["url"]})

    def _list_pulls(self, call: Call) -> Reply:
        repo, q = self._repo(call), call.query
        state, sort = q.get("state", "open"), q.get("sort", "created")

        def wanted(p: Json) -> bool:
            head = f"{p['head_repo'].split('/')[0]}:{p['head_ref']}"
            return (p["repo"] == repo and state in ("all", p["state"]) and q.get("head", head)
                    == head and q.get("base", p["base_ref"]) == p["base_ref"])

        items = sorted(filter(wanted, self.state.pulls),
                       key=lambda p: p["updated_at" if sort == "updated" else "id"],
                       reverse=q.get("direction", "desc" if sort == "created" else "asc") == "desc")
        return self._page(items, call, lambda p: self._pull_json(p, full=False))

    def _get_pull(self, call: Call) -> Reply:
        repo, number = self._repo(call), int(call.params["number"])
        for p in self.state.pulls:
            if p["repo"] == repo and p["number"] == number:
                return Reply(200, self._pull_json(p, full=True))
        raise Fail(404, "Not Found")

    def _stored_pull(self, call: Call) -> Json:
        repo, number = self._issue(call)
        for p in self.state.pulls:
            if p["repo"] == repo and p["number"] == number:
                return p
        raise Fail(404, "Not Found")

    def _list_labels(self, call: Call) -> Reply:
        repo, number = self._issue(call)
        pull = next((p for p in self.state.pulls if p["repo"] == repo and p["number"] == number),
                    None)
        names = pull["labels"] if pull else []
        return self._page([{"name": n} for n in names], call,
                          lambda x: self._label(repo, x["name"]))

    def _remove_label(self, call: Call) -> Reply:
        pull, name = self._stored_pull(call), call.params["name"]
        if name not in pull["labels"]:
            raise Fail(404, "Label does not exist")
        pull["labels"].remove(name)
        pull["updated_at"] = now()
        return Reply(200, [self._label(pull["repo"], n) for n in pull["labels"]])

    def _get_permission(self, call: Call) -> Reply:
        """GitHub's answer: `permission` is admin, write, read or none (maintain reads as write,
        triage as read); `role_name` is the role itself."""
        repo, login = self._repo(call), call.params["username"]
        if login not in self.state.users:
            raise Fail(404, "Not Found")
        role = self.state.collaborators.get(repo, {}).get(login)
        permission = {"admin": "admin", "maintain": "write", "write": "write",
                      "triage": "read", "read": "read"}.get(role or "", "none")
        user = self._user(login) | {"permissions": {
            "admin": role == "admin", "maintain": role in ("admin", "maintain"),
            "push": permission in ("admin", "write"), "triage": role is not None,
            "pull": role is not None}, "role_name": role or "none"}
        return Reply(200, {"permission": permission, "role_name": role or "none", "user": user})

    def _create_token(self, call: Call) -> Reply:
        if call.caller.kind != "app":
            raise Fail(401, "A JSON web token could not be decoded")
        token = "ghs_" + secrets.token_urlsafe(27)
        self.state.tokens[digest(token)] = {"login": f"{call.caller.login}[bot]",
                                            "kind": "installation"}
        permissions = (call.body or {}).get("permissions") or _APP_PERMISSIONS
        return Reply(201, {"token": token, "expires_at": now(timedelta(hours=1)),
                           "permissions": permissions, "repository_selection": "all"})

    def _get_user(self, call: Call) -> Reply:
        """The signed-in user as `public-user` (the profile a token without a scope reads)."""
        if call.caller.kind != "user":
            raise Fail(403, "Resource not accessible by integration")
        t = now()
        profile = {"user_view_type": "public", "name": None, "company": None, "blog": "",
                   "location": None, "email": None, "hireable": None, "bio": None,
                   "public_repos": 0, "public_gists": 0, "followers": 0, "following": 0,
                   "created_at": t, "updated_at": t}
        return Reply(200, self._user(call.caller.login) | profile)

    def _get_repo(self, call: Call) -> Reply:
        """`full-repository`; a user's token also gets `permissions` (what GitHub adds for an
        authenticated user): a collaborator's role, else read on a public repository. A
        private repository the user does not collaborate on is a 404."""
        repo = self._repo(call)
        role = self.state.collaborators.get(repo, {}).get(call.caller.login)
        private = bool(self.state.repos[repo].get("private"))
        if private and call.caller.kind == "user" and role is None:
            raise Fail(404, "Not Found")
        out = self._repo_json(repo) | {"has_discussions": False, "network_count": 0,
                                       "subscribers_count": 0}
        if call.caller.kind == "user":
            order = ["read", "triage", "write", "maintain", "admin"]
            level = order.index(role) if role else (0 if not private else -1)
            out["permissions"] = {flag: level >= i for i, flag in enumerate(
                ("pull", "triage", "push", "maintain", "admin"))}
        return Reply(200, out)

    def add_tarball(self, repo: str, ref: str, data: bytes) -> None:
        """What GET /repos/{repo}/tarball/{ref} answers (GitHub redirects to codeload; the
        fake answers with the archive itself)."""
        with self._lock:
            self.state.tarballs[f"{repo}@{ref}"] = base64.b64encode(data).decode()
            self._changed()

    def _get_tarball(self, call: Call) -> Reply:
        key = f"{self._repo(call)}@{call.params['ref']}"
        if key not in self.state.tarballs:
            raise Fail(404, "Not Found")
        return Reply(200, base64.b64decode(self.state.tarballs[key]))

    def _get_commit(self, call: Call) -> Reply:
        repo, sha = self._repo(call), call.params["sha"]
        return Reply(200, {"sha": sha, "node_id": f"C_{sha}", "parents": [],
                           "url": f"{self.url}/repos/{repo}/commits/{sha}",
                           "html_url": f"{WEB}/{repo}/commit/{sha}"})

    def _page(self, items: list[Json], call: Call, render: Callable[[Json], Json]) -> Reply:
        """GitHub's pagination: `per_page` (30, at most 100), `page`, and a Link header."""
        per_page = min(max(int(call.query.get("per_page", 30)), 1), 100)
        page = max(int(call.query.get("page", 1)), 1)
        last = max(1, math.ceil(len(items) / per_page))

        def link(n: int, rel: str) -> str:
            query = urlencode({**call.query, "per_page": per_page, "page": n})
            return f'<{self.url}{call.path}?{query}>; rel="{rel}"'

        rels = [link(page - 1, "prev")] if page > 1 else []
        rels += [link(page + 1, "next"), link(last, "last")] if page < last else []
        rels += [link(1, "first")] if page > 1 else []
        chunk = items[(page - 1) * per_page : page * per_page]
        return Reply(200, [render(i) for i in chunk], {"Link": ", ".join(rels)} if rels else {})

    # -- deployments: begin --------------------------------------------------------------------
    def deployments(self, repo: str) -> list[Json]:
        """The stored deployments of `repo`, oldest first, each with its `statuses` (oldest
        first): what a test asserts on."""
        with self._lock:
            return [d | {"statuses": [s for s in self.state.deployment_statuses
                                      if s["deployment"] == d["id"]]}
                    for d in self.state.deployments if d["repo"] == repo]

    def _deployment(self, call: Call) -> Json:
        repo, did = self._repo(call), call.params["id"]
        found = [d for d in self.state.deployments if str(d["id"]) == did and d["repo"] == repo]
        if not found:
            raise Fail(404, "Not Found")
        return found[0]

    def _create_deployment(self, call: Call) -> Reply:
        """GitHub's rules that bite a client: `auto_merge` (default true) merges the default
        branch into a ref behind it and creates no deployment (202); `required_contexts`
        omitted means every commit status of the ref must be a success (else 409)."""
        repo, b, t = self._repo(call), call.body, now()
        ref = b["ref"]
        pull = next((p for p in self.state.pulls if p["repo"] == repo
                     and ref in (p["head_sha"], p["head_ref"])), None)
        sha = pull["head_sha"] if pull else ref
        if b.get("auto_merge", True) and pull is not None:
            return Reply(202, {"message": f"Auto-merged {pull['base_ref']} into {ref} on "
                                          "deployment."})
        if "required_contexts" not in b:
            failing = sorted({s["context"] for s in self.state.statuses
                              if s["repo"] == repo and s["sha"] == sha and s["state"] != "success"})
            if failing:
                raise Fail(409, f"Conflict: Commit status checks failed for {ref}.")
        environment = b.get("environment", "production")
        deployment = {"id": self._next_id(), "repo": repo, "sha": sha, "ref": ref,
                      "task": b.get("task", "deploy"), "payload": b.get("payload", {}) or {},
                      "environment": environment, "original_environment": environment,
                      "description": b.get("description", ""),
                      "transient_environment": b.get("transient_environment", False),
                      "production_environment": b.get("production_environment",
                                                      environment == "production"),
                      "login": call.caller.login, "created_at": t, "updated_at": t}
        self.state.deployments.append(deployment)
        out = self._deployment_json(deployment)
        return Reply(201, out, {"Location": out["url"]})

    def _list_deployments(self, call: Call) -> Reply:
        repo, q = self._repo(call), call.query
        items = [d for d in self.state.deployments if d["repo"] == repo
                 and all(q.get(k, d[k]) == d[k] for k in ("sha", "ref", "task", "environment"))]
        return self._page(items[::-1], call, self._deployment_json)  # newest first

    def _create_deployment_status(self, call: Call) -> Reply:
        """`log_url` sets `target_url` too; `auto_inactive` (default true) adds an `inactive`
        status to the environment's earlier non-transient, non-production deployments whose
        latest state is `success`, as GitHub does."""
        deployment, b, t = self._deployment(call), call.body, now()
        if "environment" in b:
            deployment["environment"] = b["environment"]
        log_url = b.get("log_url", b.get("target_url", ""))
        status = self._new_deployment_status(deployment, b["state"], t, log_url=log_url,
                                             description=b.get("description", ""),
                                             environment_url=b.get("environment_url", ""),
                                             login=call.caller.login)
        if b.get("auto_inactive", True):
            for d in self.state.deployments:
                latest = self._latest_state(d)
                if (d["repo"] == deployment["repo"] and d["id"] < deployment["id"]
                        and d["environment"] == deployment["environment"] and latest == "success"
                        and not d["transient_environment"] and not d["production_environment"]):
                    self._new_deployment_status(d, "inactive", t, log_url="", description="",
                                                environment_url="", login=call.caller.login)
        out = self._deployment_status_json(status)
        return Reply(201, out, {"Location": out["url"]})

    def _new_deployment_status(self, d: Json, state: str, t: str, *, log_url: str,
                               description: str, environment_url: str, login: str) -> Json:
        status = {"id": self._next_id(), "deployment": d["id"], "repo": d["repo"], "state": state,
                  "environment": d["environment"], "log_url": log_url,
                  "description": description, "environment_url": environment_url,
                  "login": login, "created_at": t, "updated_at": t}
        self.state.deployment_statuses.append(status)
        d["updated_at"] = t
        return status

    def _latest_state(self, d: Json) -> str | None:
        states = [s["state"] for s in self.state.deployment_statuses if s["deployment"] == d["id"]]
        return states[-1] if states else None

    def _list_deployment_statuses(self, call: Call) -> Reply:
        deployment = self._deployment(call)
        items = [s for s in self.state.deployment_statuses if s["deployment"] == deployment["id"]]
        return self._page(items[::-1], call, self._deployment_status_json)  # newest first

    def _deployment_json(self, d: Json) -> Json:
        api = f"{self.url}/repos/{d['repo']}"
        url = f"{api}/deployments/{d['id']}"
        return {"url": url, "id": d["id"], "node_id": f"DE_{d['id']}", "sha": d["sha"],
                "ref": d["ref"], "task": d["task"], "payload": d["payload"],
                "original_environment": d["original_environment"],
                "environment": d["environment"], "description": d["description"],
                "creator": self._user(d["login"]), "created_at": d["created_at"],
                "updated_at": d["updated_at"], "statuses_url": f"{url}/statuses",
                "repository_url": api, "transient_environment": d["transient_environment"],
                "production_environment": d["production_environment"],
                "performed_via_github_app": None}

    def _deployment_status_json(self, s: Json) -> Json:
        api = f"{self.url}/repos/{s['repo']}"
        return {"url": f"{api}/deployments/{s['deployment']}/statuses/{s['id']}",
                "id": s["id"], "node_id": f"DES_{s['id']}", "state": s["state"],
                "creator": self._user(s["login"]), "description": s["description"],
                "environment": s["environment"], "target_url": s["log_url"],
                "log_url": s["log_url"], "environment_url": s["environment_url"],
                "created_at": s["created_at"], "updated_at": s["updated_at"],
                "deployment_url": f"{api}/deployments/{s['deployment']}",
                "repository_url": api, "performed_via_github_app": None}
    # -- deployments: end ----------------------------------------------------------------------

    # -- GitHub's JSON: every field the schema requires, with its type --------------------------
    def _user(self, login: str) -> Json:
        uid, api = self._user_id(login), f"{self.url}/users/{quote(login)}"
        return {"login": login, "id": uid, "node_id": f"U_{uid}", "gravatar_id": "",
                "type": "Bot" if login.endswith("[bot]") else "User", "site_admin": False,
                "avatar_url": f"https://avatars.githubusercontent.com/u/{uid}?v=4",
                "url": api, "html_url": f"{WEB}/{quote(login)}",
                **{f"{k}_url": f"{api}/{k}" for k in _USER_URLS.split()}}

    def _repo_json(self, repo: str) -> Json:
        rid, api, t = self.state.repos[repo]["id"], f"{self.url}/repos/{repo}", now()
        return {"id": rid, "node_id": f"R_{rid}", "name": repo.split("/")[1], "full_name": repo,
                "owner": self._user(repo.split("/")[0]),
                "private": bool(self.state.repos[repo].get("private")),
                "fork": self.state.repos[repo]["fork"], "url": api, "html_url": f"{WEB}/{repo}",
                **{f"{k}_url": f"{api}/{k}" for k in _REPO_URLS.split()},
                "clone_url": f"{WEB}/{repo}.git", "git_url": f"git://github.com/{repo}.git",
                "ssh_url": f"git@github.com:{repo}.git", "svn_url": f"{WEB}/{repo}",
                "description": None, "homepage": None, "language": None, "mirror_url": None,
                "license": None, "default_branch": "main", "size": 0,
                "visibility": "private" if self.state.repos[repo].get("private") else "public",
                **dict.fromkeys(("forks", "forks_count", "stargazers_count", "watchers",
                                 "watchers_count", "open_issues", "open_issues_count"), 0),
                **dict.fromkeys(("has_issues", "has_projects", "has_wiki", "has_downloads"), True),
                "has_pages": False, "archived": False, "disabled": False,
                "pushed_at": t, "created_at": t, "updated_at": t}

    def _pull_json(self, p: Json, *, full: bool) -> Json:
        repo, n, api = p["repo"], p["number"], f"{self.url}/repos/{p['repo']}"
        url, html = f"{api}/pulls/{n}", f"{WEB}/{repo}/pull/{n}"
        links = {"self": url, "html": html, "issue": f"{api}/issues/{n}",
                 "comments": f"{api}/issues/{n}/comments", "review_comments": f"{url}/comments",
                 "review_comment": f"{api}/pulls/comments{{/number}}",
                 "commits": f"{url}/commits", "statuses": f"{api}/statuses/{p['head_sha']}"}
        out = {"url": url, "id": p["id"], "node_id": f"PR_{p['id']}", "html_url": html,
               "diff_url": f"{html}.diff", "patch_url": f"{html}.patch",
               "issue_url": links["issue"], "commits_url": links["commits"],
               "review_comments_url": links["review_comments"],
               "review_comment_url": links["review_comment"],
               "comments_url": links["comments"], "statuses_url": links["statuses"],
               "number": n, "state": p["state"], "locked": False, "title": p["title"],
               "user": self._user(p["login"]), "body": p["body"], "draft": p["draft"],
               "labels": [self._label(repo, name) for name in p["labels"]], "milestone": None,
               "active_lock_reason": None, "created_at": p["created_at"],
               "updated_at": p["updated_at"], "closed_at": p["closed_at"],
               "merged_at": p["closed_at"] if p["merged"] else None, "merge_commit_sha": None,
               "assignee": None, "assignees": [], "requested_reviewers": [],
               "requested_teams": [], "auto_merge": None,
               "author_association": "CONTRIBUTOR" if p["head_repo"] != repo else "MEMBER",
               "head": self._branch(p["head_repo"], p["head_ref"], p["head_sha"]),
               "base": self._branch(repo, p["base_ref"], p["base_sha"]),
               "_links": {k: {"href": v} for k, v in links.items()}}
        if full:
            comments = sum(c["repo"] == repo and c["issue"] == n for c in self.state.comments)
            out |= {"merged": p["merged"], "mergeable": True, "rebaseable": True,
                    "mergeable_state": "clean", "merged_by": None, "maintainer_can_modify": False,
                    "comments": comments, "review_comments": 0, "commits": 1, "additions": 0,
                    "deletions": 0, "changed_files": 0}
        return out

    def _branch(self, repo: str, ref: str, sha: str) -> Json:
        owner = repo.split("/")[0]
        return {"label": f"{owner}:{ref}", "ref": ref, "sha": sha, "user": self._user(owner),
                "repo": self._repo_json(repo)}

    def _label(self, repo: str, name: str) -> Json:
        lid = zlib.crc32(f"{repo}#{name}".encode())
        return {"id": lid, "node_id": f"LA_{lid}", "name": name, "description": "",
                "url": f"{self.url}/repos/{repo}/labels/{quote(name)}", "color": "ededed",
                "default": False}

    def _comment_json(self, c: Json) -> Json:
        api = f"{self.url}/repos/{c['repo']}"
        url = f"{api}/issues/comments/{c['id']}"
        kind = "pull" if any(p["repo"] == c["repo"] and p["number"] == c["issue"]
                             for p in self.state.pulls) else "issues"
        reactions = dict.fromkeys(("+1", "-1", "laugh", "confused", "heart", "hooray", "eyes",
                                   "rocket", "total_count"), 0)
        return {"id": c["id"], "node_id": f"IC_{c['id']}", "url": url, "body": c["body"],
                "html_url": f"{WEB}/{c['repo']}/{kind}/{c['issue']}#issuecomment-{c['id']}",
                "issue_url": f"{api}/issues/{c['issue']}", "user": self._user(c["login"]),
                "created_at": c["created_at"], "updated_at": c["updated_at"],
                "author_association": "NONE", "performed_via_github_app": None,
                "reactions": {"url": f"{url}/reactions", **reactions}}

    def _status_json(self, s: Json) -> Json:
        creator = self._user(s["login"])
        return {"id": s["id"], "node_id": f"SC_{s['id']}", "state": s["state"],
                "url": f"{self.url}/repos/{s['repo']}/statuses/{s['sha']}",
                "avatar_url": creator["avatar_url"], "description": s["description"],
                "target_url": s["target_url"], "context": s["context"], "creator": creator,
                "created_at": s["created_at"], "updated_at": s["updated_at"]}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fake: FakeGitHub) -> None:
        super().__init__((fake.host, fake.port), _Handler)
        self.fake = fake


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = -1  # one send a reply (flushed by the base class), not one a header line
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fake = cast(_Server, self.server).fake
        reply = fake.respond(self.command, self.path, dict(self.headers.items()), raw)
        raw_body = isinstance(reply.body, bytes)
        data = reply.body if raw_body else (
            b"" if reply.body is None else json.dumps(reply.body).encode())
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if data and "Content-Type" not in reply.headers:
            self.send_header("Content-Type", "application/gzip" if raw_body
                             else "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # the fake keeps its own log
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a fake GitHub REST API for tests.")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--state", type=Path, required=True,
                        help="JSON state: loaded if present, rewritten after every change")
    args = parser.parse_args(argv)
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # the server thread inherits this
    fake = FakeGitHub(port=args.port, state_file=args.state).start()
    fake.save()
    sys.stdout.write(fake.url + "\n")  # the one line a caller waits for
    sys.stdout.flush()
    signal.sigwait(stop_signals)
    fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
