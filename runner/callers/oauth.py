"""Signing a reader in with GitHub, and what that reader may do on a pull request's repository.

The branch page (``web/page.py``) uses GitHub's OAuth web flow: the browser is sent to
``{github_web_url}/login/oauth/authorize`` with the admin's client id, a redirect back to the
page's ``/oauth/callback`` and a random ``state``; GitHub sends it back with a one-time
``code``, which the page exchanges here, server to server, for the reader's token (the client
secret goes in the POST body, never in a URL). The token then answers two questions:
``GET /user`` (who is this?) and ``GET /repos/{owner}/{repo}`` (what may they do there? its
``permissions`` object, present when a user's token asks). The page keeps the answer and drops
the token.

Who counts as a reader: GitHub gives every account ``pull`` on a public repository (and every
member of the enterprise on an internal one), so there the read role says nothing about the
person: only a role above it (triage or more, which only the repository's people hold) counts.
On a private repository read is someone's access. ``access_read_permission`` raises the least
role that counts everywhere; ``access_write_permission`` is the least that gets read-write. The
collaborator permission endpoint would tell a public repository's read collaborators apart, but
it answers only a caller with push access, which a reader's own token need not have.

No scope is asked for. A GitHub App's user token has none to ask for: it sees what both the
app's installation and the user may see, so a GitHub App is how private repositories are
checked. An OAuth App's token without a scope reads public information only: a private
repository is then invisible (404), and its readers are refused. The one scope that would show
it, ``repo``, grants write access to every repository the reader has, which a page that only
needs to read a permission must not hold.

Blocking calls (the standard library's ``urllib``, a timeout on each): the page runs them in a
thread. Redirects are not followed, so a token is never sent on to another host. An error
names the call and GitHub's answer, never the token, the code or the client secret.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from http.client import HTTPResponse
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlencode, urlsplit

from pgoverlay.errors import ConfigError, GitHubError
from pgoverlay.runner import safefs

Access = Literal["read-write", "read-only"]
WritePermission = Literal["write", "maintain", "admin", "never"]
ReadPermission = Literal["read", "triage", "write", "maintain", "admin"]

# GitHub's repository roles, weakest first, and the flag of ``permissions`` each one sets:
# a role sets its own flag and every weaker one's.
ROLES: dict[str, str] = {
    "read": "pull",
    "triage": "triage",
    "write": "push",
    "maintain": "maintain",
    "admin": "admin",
}
API_VERSION = "2022-11-28"
TIMEOUT = 10.0  # seconds for each call to GitHub
_SECRET_BYTES = 4096
_JSON_BYTES = 1 << 20  # the most read of one answer


def role(permissions: Mapping[str, object]) -> str | None:
    """The strongest role GitHub's ``permissions`` object gives (None: not even read)."""
    held = [name for name, flag in ROLES.items() if permissions.get(flag) is True]
    return held[-1] if held else None


def access(
    permissions: Mapping[str, object],
    *,
    write_permission: WritePermission,
    read_permission: ReadPermission = "read",
    everyone_reads: bool = False,
) -> Access | None:
    """What a reader with these ``permissions`` gets: read-write at ``write_permission`` or
    above (``never``: nobody), read-only below it from ``read_permission`` up, else None
    (refused). On a repository ``everyone_reads`` (public, or internal), read is every
    account's: there the least role that counts is triage, whatever ``read_permission``."""
    held = role(permissions)
    if held is None:
        return None
    order = list(ROLES)
    least = max(order.index(read_permission), order.index("triage") if everyone_reads else 0)
    if order.index(held) < least:
        return None
    if write_permission != "never" and order.index(held) >= order.index(write_permission):
        return "read-write"
    return "read-only"


def everyone_reads(repository: Mapping[str, object]) -> bool:
    """Whether GitHub's answer for a repository says every account (public) or every member of
    the enterprise (internal) may read it: anything but a plain private repository."""
    visibility = repository.get("visibility")
    if isinstance(visibility, str):
        return visibility != "private"
    return repository.get("private") is not True


def authorize_url(web_url: str, *, client_id: str, redirect_uri: str, state: str) -> str:
    """Where the browser signs in: GitHub's authorize page for this client, asking no scope."""
    query = urlencode(
        {"client_id": client_id, "redirect_uri": redirect_uri, "state": state, "scope": ""}
    )
    return f"{web_url.rstrip('/')}/login/oauth/authorize?{query}"


def read_client_secret(path: Path | None) -> str:
    """The OAuth client's secret from the admin's file (one line; read once, at start)."""
    if path is None:
        raise ConfigError(
            "the branch page signs readers in with GitHub and needs the OAuth client's secret: "
            "put it in a file readable by root only and set PGOVERLAY_OAUTH_CLIENT_SECRET_FILE"
        )
    what = f"the OAuth client secret file {path} (PGOVERLAY_OAUTH_CLIENT_SECRET_FILE)"
    raw = safefs.read_regular(path, limit=_SECRET_BYTES, what=what)
    try:
        secret = raw.decode().strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{what} is not text: it must hold the client secret alone") from None
    if not secret or any(c.isspace() for c in secret):
        raise ConfigError(
            f"{what} must hold the client secret alone, on one line "
            "(GitHub shows it once, under the app's 'Client secrets')"
        )
    return secret


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are answers, not followed: a token must not travel to another host."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


class GitHubSignIn:
    """The server-to-server half of the web flow, for one OAuth client."""

    def __init__(
        self,
        *,
        web_url: str,
        api_url: str,
        client_id: str,
        client_secret: str,
        timeout: float = TIMEOUT,
    ) -> None:
        for setting, url in (("GITHUB_WEB_URL", web_url), ("GITHUB_API_URL", api_url)):
            if urlsplit(url).scheme not in ("https", "http") or not urlsplit(url).netloc:
                raise ConfigError(
                    f"PGOVERLAY_{setting} is {url!r}: it must be an https:// address "
                    "(https://github.com and https://api.github.com, or your GitHub Enterprise's)"
                )
        self.web_url = web_url.rstrip("/")
        self.api_url = api_url.rstrip("/")
        self.client_id = client_id
        self._client_secret = client_secret
        self.timeout = timeout

    def __repr__(self) -> str:  # never the secret
        return f"GitHubSignIn(web_url={self.web_url!r}, client_id={self.client_id!r})"

    def exchange(self, code: str, *, redirect_uri: str) -> str:
        """The reader's token for the one-time ``code`` GitHub sent back."""
        form = {
            "client_id": self.client_id,
            "client_secret": self._client_secret,
            "code": code,
            "redirect_uri": redirect_uri,
        }
        what = "exchanging the sign-in code (POST /login/oauth/access_token)"
        status, body = self._call(
            "POST",
            f"{self.web_url}/login/oauth/access_token",
            what=what,
            data=urlencode(form).encode(),
            headers={"Accept": "application/json"},
        )
        if status != 200:
            raise GitHubError(f"{what}: GitHub answered {status} {_message(body)}")
        if "error" in body:  # GitHub answers 200 with an error field
            raise GitHubError(
                f"{what}: GitHub refused it ({body.get('error')}: "
                f"{body.get('error_description', '')}); sign in again"
            )
        token = body.get("access_token")
        if not isinstance(token, str) or not token:
            raise GitHubError(f"{what}: GitHub's answer holds no access_token")
        return token

    def login(self, token: str) -> str:
        """Who the token's user is (``GET /user``)."""
        status, body = self._api("GET /user", "/user", token)
        if status != 200 or not isinstance(body.get("login"), str):
            raise GitHubError(f"GET /user: GitHub answered {status} {_message(body)}")
        return str(body["login"])

    def access(
        self,
        token: str,
        repository: str,
        *,
        write_permission: WritePermission,
        read_permission: ReadPermission = "read",
    ) -> Access | None:
        """What the token's user may do on ``repository`` ("owner/name"): None when GitHub
        does not show it to them (404: private, or gone) or their role there is below what
        counts (``access``: on a public repository, read is anyone's)."""
        owner, _, name = repository.partition("/")
        path = f"/repos/{quote(owner, safe='')}/{quote(name, safe='')}"
        status, body = self._api(f"GET {path}", path, token)
        if status in (403, 404):
            return None
        if status != 200:
            raise GitHubError(f"GET {path}: GitHub answered {status} {_message(body)}")
        permissions = body.get("permissions")
        if not isinstance(permissions, dict):  # not a user's token: it says nothing of the user
            return None
        return access(
            permissions,
            write_permission=write_permission,
            read_permission=read_permission,
            everyone_reads=everyone_reads(body),
        )

    def _api(self, what: str, path: str, token: str) -> tuple[int, dict[str, Any]]:
        headers = {
            "Accept": "application/vnd.github+json",
            "Authorization": f"Bearer {token}",
            "X-GitHub-Api-Version": API_VERSION,
        }
        return self._call("GET", f"{self.api_url}{path}", what=what, headers=headers)

    def _call(
        self,
        method: str,
        url: str,
        *,
        what: str,
        headers: dict[str, str],
        data: bytes | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """Status and JSON object of one call; a GitHubError when GitHub cannot be reached or
        answers something that is not a JSON object."""
        # both addresses were checked to be http(s) in __init__ (S310)
        request = urllib.request.Request(url, data=data, method=method)  # noqa: S310
        request.add_header("User-Agent", "pgoverlay")
        for name, value in headers.items():
            request.add_header(name, value)
        try:
            response: HTTPResponse = _OPENER.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read(_JSON_BYTES)
            err.close()
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise GitHubError(
                f"{what}: cannot reach GitHub at {urlsplit(url).netloc} ({reason}); check "
                "PGOVERLAY_GITHUB_WEB_URL / PGOVERLAY_GITHUB_API_URL and this host's network"
            ) from None
        else:
            with response:
                status, raw = response.status, response.read(_JSON_BYTES)
        if 300 <= status < 400:
            return status, {}
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise GitHubError(f"{what}: GitHub answered {status} with something not JSON")
        return status, body


def _message(body: Mapping[str, object]) -> str:
    message = body.get("message")
    return f"({message})" if isinstance(message, str) else ""
