"""Where a pool's sockets live: the engine service's, and each branch's directory beside it.

Its own module, with nothing but the standard library, so that a command that only asks the
service finds it without importing the pool.
"""

from __future__ import annotations

import os
from pathlib import Path

from pgoverlay.runner.digest import sha256_hex
from pgoverlay.runner.service.access import SOCKET_ROOT as SOCKET_ROOT  # where it is defined


def pool_id(home: Path) -> str:
    """A short id of the pool at ``home``, for socket paths and Docker labels."""
    return sha256_hex(os.fspath(home.resolve()).encode())[:8]


def socket_path(home: Path) -> Path:
    """The engine service's socket for the pool at ``home``."""
    return SOCKET_ROOT / f"{pool_id(home)}.sock"
