"""The pool's policy as the engine service holds it for the callers on its socket.

When ``api_policy_file`` is set, the service reads the same policy the front door reads for
its network API (``callers.policy``), checked as strictly: a policy with a problem stops the
service from starting, with the line and field named. ``reload`` reads it again (the service
calls it on SIGHUP, ``systemctl reload pgoverlay``); a changed file with a problem is logged and
the policy already held stays in force, so a typo cannot open the pool to everyone or close it
to all.

What the engine asks of it is ``LocalEngine.create``'s: only the rules a caller's word can be
held to (see ``Policy.admit_repository``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from pgoverlay.errors import PgoverlayError

if TYPE_CHECKING:  # the policy module (and YAML) is imported only when a policy file is set
    from pgoverlay.runner.callers.policy import Policy

log = logging.getLogger("pgoverlay.service")


class SocketPolicy:
    """The policy in ``path`` (None: there is none, and the socket's callers are held to the
    pool's settings alone), read now and again by ``reload``."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        # Replaced whole, never changed: a request reads one policy or the other (no lock,
        # which SIGHUP's handler, run on the thread that serves, could wait on for ever).
        self.current: Policy | None = _read(path) if path is not None else None

    def reload(self) -> bool:
        """Read the file again; True when its policy is now the one held. A file with a problem
        leaves the policy held as it was, and says so in the log."""
        if self.path is None:
            log.info("reload: no policy file (api_policy_file is unset), nothing to read")
            return False
        try:
            self.current = _read(self.path)
        except PgoverlayError as err:
            log.error("reload: the policy held stays in force: %s", err)
            return False
        log.info("reload: the policy in %s is in force on the socket", self.path)
        return True


def _read(path: Path) -> Policy:
    from pgoverlay.runner.callers import policy

    return policy.load(path)
