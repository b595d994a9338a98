"""The whole pool: take it down for maintenance (`pool down`), and remove it (`pool rm`).

``down`` marks the pool down in ``pool.json`` first, so no new command opens it (``Pool.open``
says to run ``pool init``), then takes every base's and branch's lock, waiting at most the lock
timeout for work in progress. Holding them, it stops every branch (local and Docker) and
unmounts every branch overlay and base bind mount; then, in image mode, the pool image. The
registry stays as it is: ``pool init`` clears the mark, mounts the image and the bases again,
and ``gc`` restarts every ready branch on its own port with its own password.

``remove`` takes the pool down and stops its engine service and its front door, then removes
this pool's Docker containers and volumes (found by label), the pool's tree, its image, the
service's log, the front door's folder (its private key and certificate, its pid file) and log,
the API token store, ``pool.json`` (last, so a killed removal can be run again) and its socket
directory in /run. It keeps one thing, and says so: the audit log (``audit/``), the record of
who was given access to what and who signed in, which an admin may need after the pool is gone
(``KEPT``); the pool's home stays while it holds it. Nothing is removed while anything is still
mounted under the pool, and trees are removed through file descriptors, following no link. A
pool made again at the same home starts with no token and no key of the old one
(``pool.init`` discards what an earlier release's ``pool rm`` left).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

from pgoverlay.errors import PoolError, TimeoutExpiredError
from pgoverlay.runner import branch as branches
from pgoverlay.runner import safefs
from pgoverlay.runner.door import control as door
from pgoverlay.runner.names import NAME_RE
from pgoverlay.runner.pool import (
    Pool,
    PoolInfo,
    flocks,
    mounts,
    read_info,
    require_root,
    write_info,
)
from pgoverlay.runner.postgres import postmaster
from pgoverlay.runner.runtime import table as runtimes
from pgoverlay.runner.runtime.choose import runtime_for
from pgoverlay.runner.service import serve
from pgoverlay.runner.service.address import SOCKET_ROOT, pool_id
from pgoverlay.runner.settings import Settings

log = logging.getLogger(__name__)

UNMOUNT_TIMEOUT = 30.0
LOCK_KINDS = ("branch", "seed")
# What `pool rm` removes besides the pool's tree and image, under its home: the service's log,
# the front door's folder (door.key, door.crt, door.pid) and log, the API token store.
REMOVED = ("service.log", "door", "door.log", "api")
# What it keeps, and why: said in its output.
KEPT = {
    "audit": "the audit log of who was given access to what and who signed in; remove it "
    "when no longer needed",
}


def down(settings: Settings) -> list[str]:
    """Take the pool down: every branch stopped, everything unmounted, the registry kept.
    Returns the branches it stopped. Safe to run again."""
    require_root()
    home = settings.home
    info = read_info(home)
    if info is None:
        raise PoolError(f"no pool at {home}: nothing to take down (PGOVERLAY_HOME names it)")
    root = home / "pool"
    # The engine service first: it holds the registry open (its mount would stay busy) and
    # would start warm branches again.
    serve.stop(settings, wait=settings.stop_timeout + 5)
    door.stop(settings, wait=settings.stop_timeout)
    write_info(home, PoolInfo(mode=info.mode, image_bytes=info.image_bytes, down=True))
    started = False  # once something is stopped, the pool stays marked down until `pool init`
    try:
        if info.mode == "image" and not mounts.is_mounted(root):
            return []  # nothing of it is mounted, so nothing runs
        pool = Pool(settings, info)
        try:
            with _every_lock(pool):
                started = True
                stopped = _stop_branches(pool)
                _stop_staging(pool)
                for point in mounts.mounts_under(root):  # the deepest first
                    _unmount(Path(point))
        finally:
            pool.close()  # the registry and the locks live in the image
        if info.mode == "image":
            _unmount(root)
    except BaseException:
        if not info.down and not started:
            write_info(home, info)  # nothing was touched: commands may use it again
        raise
    log.info("pool %s is down; stopped branches: %s", home, ", ".join(stopped) or "none")
    return stopped


def remove(settings: Settings) -> list[str]:
    """Remove the pool entirely: branches, bases, Docker objects, image, files. Returns what
    it removed, one line each."""
    require_root()
    home = settings.home
    if read_info(home) is None:
        raise PoolError(
            f"no pool at {home} (no {home / 'pool.json'}): nothing to remove; set "
            "PGOVERLAY_HOME to the pool you mean"
        )
    done = []
    if serve.stop(settings, wait=settings.stop_timeout + 5):
        done.append("stopped the engine service")
    if door.stop(settings, wait=settings.stop_timeout):
        done.append("stopped the front door")
    stopped = down(settings)
    if stopped:
        done.append(f"stopped branches: {', '.join(stopped)}")
    for _, runtime in runtimes.rows():
        done += runtime.remove_all(settings, pool_id(home))
    left = mounts.mounts_under(home)
    if left:
        raise PoolError(
            f"{', '.join(left)} still mounted under the pool: nothing was removed; unmount "
            "them (`umount PATH`), then run `pgoverlay pool rm` again"
        )
    for path in (
        home / "pool",
        home / "pool.img",
        *(home / name for name in REMOVED),
        SOCKET_ROOT / pool_id(home),
    ):
        if os.path.lexists(path):
            safefs.remove_tree(path)
            done.append(f"removed {path}")
    (home / "pool.json").unlink(missing_ok=True)
    for name, why in KEPT.items():
        if os.path.lexists(home / name):
            done.append(f"kept {home / name}: {why} (`rm -r {home / name}`)")
    with contextlib.suppress(OSError):
        home.rmdir()  # only when nothing else is in it
    log.info("pool %s removed", home)
    return done


@contextlib.contextmanager
def _every_lock(pool: Pool) -> Iterator[None]:
    """Hold the lock of every base and branch of the pool, and of every lock file in locks/
    (a seed takes its lock before its row exists)."""
    wanted: set[tuple[str, str]] = {("branch", name) for name in pool.registry.branch_names()}
    wanted |= {("seed", b.name) for b in pool.registry.bases()}
    with safefs.dir_under(pool.root, "locks") as fd:
        for entry in os.listdir(fd):
            kind, _, rest = entry.partition("-")
            wanted.add((kind, rest.removesuffix(".lock")))
    with ExitStack() as stack:
        for kind, name in sorted(wanted):
            if kind not in LOCK_KINDS or not NAME_RE.match(name):
                continue
            what = f"{'base' if kind == 'seed' else 'branch'} {name}"
            stack.enter_context(
                flocks.locked(
                    pool.lock_path(kind, name), timeout=pool.settings.lock_wait, what=what
                )
            )
        yield


def _stop_branches(pool: Pool) -> list[str]:
    """Stop every branch and undo its mount (or its Docker volume); the caller holds the
    locks. A directory no valid row claims gets its local server stopped."""
    stopped = []
    claimed = set()
    for b in pool.registry.branches(warm=True):
        claimed.add(b.key)
        base = pool.registry.base(b.base_name, b.base_version)
        if base is None:
            continue
        lay = branches.layout(pool, b.key)
        rt = runtime_for(pool, base, b.runtime)
        running = rt.liveness(lay).running
        rt.stop(lay)
        rt.detach(lay)
        if running:
            stopped.append(b.name)
    root = pool.root / "branches"
    for path in sorted(root.iterdir()):
        if path.name not in claimed and NAME_RE.match(path.name):
            postmaster.stop(path / "upper" / "postmaster.pid", timeout=pool.settings.stop_timeout)
    return stopped


def _stop_staging(pool: Pool) -> None:
    """The server a killed seed's prepare step may have left running in staging/."""
    for base in pool.registry.bases():
        if base.state == "seeding":
            staging = pool.staging_dir(base.name, base.version)
            postmaster.stop(staging / "postmaster.pid", timeout=pool.settings.stop_timeout)


def _unmount(point: Path) -> None:
    try:
        mounts.unmount(point, timeout=UNMOUNT_TIMEOUT)
    except TimeoutExpiredError:
        raise PoolError(
            f"{point} stays busy and cannot be unmounted: a process still uses it (`fuser -vm "
            f"{point}` names it; a webhook listener or another pgoverlay command keeps the "
            "pool open); stop it, then run the command again"
        ) from None
