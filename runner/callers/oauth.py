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

Blocking calls, through GitHub's one client (``pgoverlay.github.rest``: its timeout, retry and
rate-limit path): the page runs them in a thread. Redirects are not followed, so a token is
never sent on to another host. An error names the call and GitHub's answer, never the token,
the code or the client secret. GitHub's roles are ``pgoverlay.github.grammar``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlencode, urlsplit

from pgoverlay.errors import ConfigError, GitHubError
from pgoverlay.github.grammar import ReadPermission, WritePermission, at_least, role
from pgoverlay.github.rest import Answer, Rest
from pgoverlay.runner import safefs

Access = Literal["read-write", "read-only"]
TIMEOUT = 10.0  # seconds for each call to GitHub
RETRIES = 2  # a reader waits: fewer tries than a job's
MAX_RATE_WAIT = 10.0  # seconds a reader waits out a rate limit; longer is an error at once
_SECRET_BYTES = 4096


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
    if held is None or not at_least(held, read_permission):
        return None
    if everyone_reads and not at_least(held, "triage"):
        return None
    if write_permission != "never" and at_least(held, write_permission):
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
        self._rest = Rest(
            self.api_url,
            auth=None,  # the reader's token, per call; the code's exchange sends none
            also=(self.web_url,),
            setting="PGOVERLAY_GITHUB_WEB_URL / PGOVERLAY_GITHUB_API_URL",
            retries=RETRIES,
            backoff=0.5,
            timeout=timeout,
            max_wait=MAX_RATE_WAIT,
            follow_redirects=False,
        )

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
        status, body = self._json(
            self._rest.call(
                "POST",
                f"{self.web_url}/login/oauth/access_token",
                what=what,
                form=form,
                accept="application/json",
            ),
            what=what,
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
        return self._json(self._rest.call("GET", path, what=what, token=token), what=what)

    def _json(self, answer: Answer, *, what: str) -> tuple[int, dict[str, Any]]:
        """Status and JSON object of an answer; a GitHubError when it is not a JSON object."""
        if 300 <= answer.status < 400:
            return answer.status, {}
        if not isinstance(answer.data, dict):
            raise GitHubError(f"{what}: GitHub answered {answer.status} with something not JSON")
        return answer.status, answer.data


def _message(body: Mapping[str, object]) -> str:
    message = body.get("message")
    return f"({message})" if isinstance(message, str) else ""
