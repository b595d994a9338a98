"""The engine's own check of the credentials the front door forwards (``vouch.Evidence``).

The door is the part that faces the internet; if it were taken, its uid on the engine's socket
must get no more than the requests in its hands prove. So the engine does not take a
repository, a limit or a person on the door's word. It verifies, itself:

- a GitHub Actions job's OIDC token, with its own ``oidc.Verifier`` (the settings' issuer and
  audience, the issuer's published keys), then asks the pool's policy (the same file the door
  reads) of the token's identity: the repository, its id, the limits and the pull request a
  ``pull_request`` run's token names are the token's;
- a listener's API token, against the token store (``tokens.check``, root's), for the
  repository the listener names, then the policy's ``admit_listener``: the repository is the
  listener's word, within its token's scope, as on the door;
- a reader's GitHub token, for a grant to a person (``Reader``): GitHub says, at the grant,
  who the token's user is and what they may do on the branch's repository.

What a door that is taken can still do: act for the callers whose credentials pass through it
while they are good (a job's token lives minutes, a listener's until revoked, a reader's
GitHub token for their session), and nothing for anyone else (docs/security.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pgoverlay.errors import GitHubError, NotOwnerError, PolicyError, RequestError, TokenError
from pgoverlay.runner.service import tokens
from pgoverlay.runner.service.vouch import Evidence, Vouched, admitted

if TYPE_CHECKING:
    from pgoverlay.runner.callers.oauth import Access
    from pgoverlay.runner.callers.oidc import Verifier
    from pgoverlay.runner.callers.policy import Policy
    from pgoverlay.runner.settings import Settings


class Reader:
    """The person signed in on a branch page, as GitHub tells it from their token: asked at
    each grant, for the branch's repository (never the one a request names)."""

    def __init__(self, token: str, settings: Settings) -> None:
        self._token = token
        self._settings = settings

    def __repr__(self) -> str:  # never the token
        return "Reader()"

    def check(self, repository: str) -> tuple[str, Access | None]:
        """The reader's GitHub login, and their access to ``repository`` (None: none)."""
        from pgoverlay.runner.callers.oauth import GitHubSignIn

        s = self._settings
        # The reader's token makes its own calls: no client id or secret is needed for them.
        github = GitHubSignIn(
            web_url=s.page.github_web_url,
            api_url=s.page.github_api_url,
            client_id="",
            client_secret="",
        )
        try:
            login = github.login(self._token)
        except GitHubError as err:
            raise NotOwnerError(
                f"the reader's sign-in is not one GitHub knows ({err}): they sign in again"
            ) from None
        return login, github.access(
            self._token,
            repository,
            write_permission=s.page.write_permission,
            read_permission=s.page.read_permission,
        )


class Witness:
    """Verifies forwarded credentials for the service, with its ``settings`` and the policy
    ``policy()`` returns (the socket's, reloaded on SIGHUP)."""

    def __init__(self, settings: Settings, policy: Callable[[], Policy | None]) -> None:
        self._settings = settings
        self._policy = policy
        self._lock = threading.Lock()
        self._verifier: Verifier | None = None

    def _oidc(self) -> Verifier:
        """One verifier for the service's life: it keeps the issuer's keys, fetched when the
        first token comes (thread-safe)."""
        with self._lock:
            if self._verifier is None:
                from pgoverlay.runner.callers.oidc import Verifier

                s = self._settings
                if s.api.audience is None:
                    raise NotOwnerError(
                        "the engine service has no network API audience (PGOVERLAY_API_AUDIENCE"
                        " is unset for it), so it verifies no job's token: give the service and "
                        "the front door the same settings (/etc/pgoverlay/pgoverlay.env) and "
                        "restart both"
                    )
                self._verifier = Verifier(s.api.issuer, s.api.audience, leeway=s.api.leeway)
            return self._verifier

    def _rules(self) -> Policy:
        found = self._policy()
        if found is None:
            raise PolicyError(
                "the engine service has no policy file (PGOVERLAY_API_POLICY_FILE is unset "
                "for it), so it admits no caller of the network API: give the service and the "
                "front door the same settings and restart both"
            )
        return found

    def vouched(self, evidence: Evidence, *, home: Path) -> Vouched | None:
        """What ``evidence``'s API credential proves (None: it holds none); TokenError when
        the credential is not good, PolicyError when the policy refuses its caller."""
        token = evidence.token
        if token is None:
            return None
        if tokens.looks_like(token):
            named = evidence.named
            if named is None:
                raise RequestError(
                    "an API token is forwarded with the repository its listener names "
                    "(x-pgoverlay-repository, -repository-id, -owner-id)"
                )
            tokens.check(home, token, repository=named.repository)
            decision = self._rules().admit_listener(
                repository=named.repository,
                repository_id=named.repository_id,
                owner_id=named.owner_id,
                from_fork=named.from_fork,
            )
            return admitted(
                named.repository,
                named.repository_id,
                decision,
                who="the listener's request",
                listener=True,
                from_fork=named.from_fork,
            )
        if evidence.named is not None:
            raise TokenError(
                "a job's OIDC token names its own repository: forward it without another"
            )
        identity = self._oidc().verify(token)
        return admitted(
            identity.repository,
            identity.repository_id,
            self._rules().admit(identity),
            who="job",
            pull_request=identity.pull_request,
        )

    def reader(self, evidence: Evidence) -> Reader | None:
        return Reader(evidence.reader, self._settings) if evidence.reader is not None else None
