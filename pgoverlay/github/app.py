"""A GitHub App's installation tokens, for the listener: a JSON Web Token signed with the app's
private key (PyJWT) asks GitHub for an installation's token, through the same client as every
other call (``rest.Rest``); the token is kept and minted again a few minutes before it
expires (GitHub's last an hour)."""

from __future__ import annotations

import threading
import time
from datetime import datetime

import jwt

from pgoverlay.errors import GitHubError
from pgoverlay.github.rest import Rest

RENEW_BEFORE = 300.0  # seconds before its expiry a token is replaced
_JWT_LIFE = 540  # seconds; GitHub takes at most ten minutes
_CLOCK_SKEW = 60  # seconds the JWT is dated back, for a GitHub clock a little behind ours


class InstallationAuth:
    """The Authorization of one installation of the app ``app_id``: its token, minted when
    first asked and again near its expiry (thread-safe: the listener's workers share it)."""

    def __init__(self, app_id: int, private_key: str, installation: int, *, api_url: str) -> None:
        self.app_id = app_id
        self.installation = installation
        self._key = private_key
        self._minter = Rest(api_url, auth=None)
        self._token: str | None = None
        self._expires = 0.0
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never the key nor the token
        return f"InstallationAuth(app_id={self.app_id}, installation={self.installation})"

    def authorization(self) -> str:
        with self._lock:
            if self._token is None or time.time() > self._expires - RENEW_BEFORE:
                self._token, self._expires = self._mint()
            return f"Bearer {self._token}"

    def _mint(self) -> tuple[str, float]:
        now = int(time.time())
        claims = {"iat": now - _CLOCK_SKEW, "exp": now + _JWT_LIFE, "iss": str(self.app_id)}
        try:
            signed = jwt.encode(claims, self._key, algorithm="RS256")
        except (ValueError, TypeError, jwt.PyJWTError) as err:
            raise GitHubError(
                f"cannot sign as the GitHub App {self.app_id} ({type(err).__name__}): check "
                "its private key (the .pem file GitHub gave, PKCS#1 or PKCS#8)"
            ) from None
        what = f"could not get a token for the app's installation {self.installation}"
        path = f"/app/installations/{self.installation}/access_tokens"
        answer = self._minter.call("POST", path, what=what, token=signed)
        data = answer.data if isinstance(answer.data, dict) else {}
        token, expires = data.get("token"), data.get("expires_at")
        if answer.status != 201 or not isinstance(token, str) or not isinstance(expires, str):
            raise GitHubError(f"{what} ({answer.reason})")
        return token, datetime.fromisoformat(expires).timestamp()

    def close(self) -> None:
        self._minter.close()
