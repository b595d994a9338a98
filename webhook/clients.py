"""The listener's GitHub clients: one per GitHub App installation, or one for its token."""

from __future__ import annotations

import threading

from pgoverlay.action.github import GitHub
from pgoverlay.errors import PgoverlayError
from pgoverlay.github.app import InstallationAuth
from pgoverlay.github.rest import Auth, Token
from pgoverlay.webhook.settings import WebhookSettings


class GitHubClients:
    """One client per installation (GitHub App) or one for the token; made on first use."""

    def __init__(self, settings: WebhookSettings) -> None:
        self.settings = settings
        self._clients: dict[int | None, GitHub] = {}
        self._installations: dict[str, int] = {}  # repository -> installation id
        self._warned: set[tuple[str, str]] = set()  # (repository, what) said once
        self._lock = threading.Lock()

    def remember(self, repository: str, installation: int | None) -> None:
        """The installation a delivery of ``repository`` came through (None: not an App's)."""
        if installation:
            with self._lock:
                self._installations[repository.lower()] = int(installation)

    def first_warning(self, repository: str, what: str) -> bool:
        """True the first time ``what`` (e.g. "deployment") fails for ``repository`` in this
        listener's life: a token without a permission fails every job the same way, and its
        warning is logged once, not once a job."""
        key = (repository.lower(), what)
        with self._lock:
            if key in self._warned:
                return False
            self._warned.add(key)
            return True

    def for_repo(self, repository: str) -> GitHub:
        with self._lock:
            installation = (
                self._installations.get(repository.lower())
                if self.settings.app_id is not None
                else None
            )
            if self.settings.app_id is not None and installation is None:
                raise PgoverlayError(
                    f"no GitHub App installation known for {repository} yet: it is learnt "
                    "from the repository's deliveries"
                )
            if installation not in self._clients:
                self._clients[installation] = GitHub(
                    self._auth(installation), api_url=self.settings.api_url
                )
            return self._clients[installation]

    def _auth(self, installation: int | None) -> Auth:
        if self.settings.app_id is not None and installation is not None:
            # Installation tokens are minted when first needed and renewed before they expire.
            return InstallationAuth(
                self.settings.app_id,
                self.settings.app_key(),
                installation,
                api_url=self.settings.api_url,
            )
        assert self.settings.token is not None
        return Token(self.settings.token.get_secret_value())

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
