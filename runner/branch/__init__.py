"""Branches: a base's data mounted read-only under a writable layer, with a Postgres of its own.

The package's modules, in the order they use each other: ``dirs`` (where a branch's files live),
``ports``, ``access`` (the engine's connection, the login role's password, the readiness
checks, a client's connection details), ``lookup`` (read-only: get, status, sizes, liveness,
overrides), ``lifecycle`` (start, teardown, destroy, reset, restart), ``creation`` (the create
saga, a warm start and a claim), ``suspension`` (suspend, wake). What most callers use is
named here.
"""

from __future__ import annotations

from pgoverlay.runner.branch.access import connection
from pgoverlay.runner.branch.creation import create
from pgoverlay.runner.branch.dirs import layout
from pgoverlay.runner.branch.lifecycle import destroy, reset
from pgoverlay.runner.branch.lookup import get, layer_size, status
from pgoverlay.runner.branch.suspension import suspend, wake

__all__ = [
    "connection",
    "create",
    "destroy",
    "get",
    "layer_size",
    "layout",
    "reset",
    "status",
    "suspend",
    "wake",
]
