"""What the engine's two HTTP APIs share, the socket's (``service.app``) and the network's
(``web.api``): a branch name in a path, and the HTTP status of each kind of error. Imported by
the front door's web application, so it imports nothing that runs as root.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

from pgoverlay import errors
from pgoverlay.errors import PgoverlayError
from pgoverlay.runner.names import NAME_RE

# A branch name in a path, checked before any route runs.
Name = Annotated[str, StringConstraints(pattern=NAME_RE.pattern, max_length=63)]

# The HTTP status of each kind of error; anything else the engine raises on purpose is 500.
STATUS: list[tuple[type[PgoverlayError], int]] = [
    (errors.NotOwnerError, 403),  # DoorForbiddenError too
    (errors.UnmaskedAccessError, 403),
    (errors.PolicyError, 403),
    (errors.TokenError, 401),
    (errors.GitHubError, 503),
    (errors.AccessError, 409),
    (errors.BranchMissingError, 404),
    (errors.BaseMissingError, 404),
    (errors.LimitReachedError, 429),
    (errors.PortsExhaustedError, 429),
    (errors.BranchExistsError, 409),  # BranchOwnedError too
    (errors.LockBusyError, 409),
    (errors.BranchStateError, 409),
    (errors.SettingsDifferError, 409),
    (errors.TraceError, 409),
    (errors.InvalidNameError, 422),
    (errors.ConfigError, 422),
    (errors.PoolFullError, 507),
]


def status_of(err: PgoverlayError) -> int:
    return next((code for cls, code in STATUS if isinstance(err, cls)), 500)
