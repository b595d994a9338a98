"""Suspend and wake: a branch's server stopped and its data unmounted while nobody uses it, its
writable layer, port, password and record kept; started again on the next connection."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from pgoverlay.errors import BranchStateError
from pgoverlay.runner.branch.dirs import layout
from pgoverlay.runner.branch.lifecycle import restart
from pgoverlay.runner.branch.lookup import base_of, get
from pgoverlay.runner.names import check_name
from pgoverlay.runner.pool import Pool, fault, flocks
from pgoverlay.runner.pool.registry import WAKEABLE, Branch
from pgoverlay.runner.runtime.choose import runtime_for

if TYPE_CHECKING:
    from collections.abc import Callable


SUSPENDABLE = ("ready",)


def suspend(
    pool: Pool,
    name: str,
    *,
    lock_wait: float | None = None,
    unless: Callable[[Branch], bool] | None = None,
) -> Branch:
    """Stop branch ``name``'s server cleanly (a fast shutdown: a checkpoint, then exit) and
    unmount its data: what is left is its writable layer, with its port, password, credentials
    and record, and it costs no memory and no process. State ``suspended``; a branch already
    suspended is left as it is. A kill at any point leaves ``suspending``, which gc finishes.

    ``lock_wait``: the seconds to wait for the branch's lock (default the pool's; 0: a busy
    branch raises LockBusyError at once). ``unless`` is asked once the branch is marked
    ``suspending``, under its lock: when it says the branch is in use, the branch is marked
    ``ready`` again and left up (the idle watcher's last look; a front door connection that
    arrives meanwhile sees ``suspending`` and waits on the lock, to find the branch up)."""
    check_name(name)
    wait = pool.settings.lock_wait if lock_wait is None else lock_wait
    with flocks.locked(pool.lock_path("branch", name), timeout=wait, what=f"branch {name}"):
        branch = get(pool, name)
        if branch.state == "suspended":
            return branch
        if branch.state not in (*SUSPENDABLE, "suspending"):
            raise BranchStateError(
                f"branch {name} is {branch.state}, not ready: it can be suspended once it is "
                "(`pgoverlay gc` finishes what an interrupted command left)"
            )
        pool.registry.update_branch(name, state="suspending", step="")
        fault(pool, "suspend:marked")
        if unless is not None and branch.state == "ready" and unless(branch):
            pool.registry.update_branch(name, state="ready", step="")
            return get(pool, name)
        finish_suspend(pool, branch)
    return get(pool, name)


def finish_suspend(pool: Pool, branch: Branch) -> None:
    """Stop and unmount ``branch`` (marked ``suspending``), then mark it ``suspended``."""
    from pgoverlay.runner.branch import primed

    base = base_of(pool, branch)
    lay = layout(pool, branch.key)
    primed.drop(os.fspath(lay.socket_dir))
    rt = runtime_for(pool, base, branch.runtime)
    rt.stop(lay)  # not discard: the layer is kept, so its shutdown checkpoint is worth writing
    fault(pool, "suspend:stopped")
    rt.detach(lay)
    pool.registry.update_branch(branch.name, state="suspended", step="", suspended_at=time.time())


def wake(pool: Pool, name: str) -> Branch:
    """Start suspended branch ``name`` again (mount, start, its password set again) and mark it
    ``ready``; a branch that is not suspended is returned as it is. Concurrent wakes start it
    once: the branch's lock makes the others wait, and they find it ready. A kill leaves
    ``waking``, which the next wake, or gc, finishes."""
    check_name(name)
    branch = get(pool, name)
    if branch.state not in WAKEABLE:
        return branch
    with flocks.locked(
        pool.lock_path("branch", name), timeout=pool.settings.lock_wait, what=f"branch {name}"
    ):
        branch = get(pool, name)
        if branch.state not in WAKEABLE:
            return branch
        if branch.state == "suspending":  # a suspend was killed: finish it, then wake
            finish_suspend(pool, branch)
        pool.registry.update_branch(name, state="waking", step="")
        fault(pool, "wake:marked")
        finish_wake(pool, branch)
    return get(pool, name)


def finish_wake(pool: Pool, branch: Branch) -> None:
    """Start ``branch`` (marked ``waking``) and mark it ``ready``."""
    base = pool.registry.base(branch.base_name, branch.base_version)
    if base is not None:  # a killed wake may have left its server up: it starts anew
        runtime_for(pool, base, branch.runtime).stop(layout(pool, branch.key))
    restart(pool, branch)
    fault(pool, "wake:started")
    # ready since now: the idle watcher counts a woken branch's idle time from its wake
    pool.registry.update_branch(
        branch.name, state="ready", step="", suspended_at=None, ready_at=time.time()
    )
