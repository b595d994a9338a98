"""Removing a base (`pgoverlay base rm`): every version of a name, or one.

A removal is a saga, like a seed. Under the base's lock it marks the versions ``removing`` in the
same registry transaction that finds the branches using them, so no branch of them can be made
after that check (``branch.create`` refuses a base that is not ``ready``). It then destroys those
branches through the branch saga, unmounts ``bases/NAME/V``, removes ``store/NAME/V`` (through
file descriptors, following no link) and deletes the row. A process killed at any step leaves a
``removing`` row, and ``gc`` finishes the removal once it can take the base's lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field

from pgoverlay.errors import BaseInUseError, BaseMissingError, RegistryRowError, SeedBusyError
from pgoverlay.runner import branch as branches
from pgoverlay.runner import seed
from pgoverlay.runner.branch import warm
from pgoverlay.runner.names import check_name
from pgoverlay.runner.pool import Pool, fault, flocks, mounts, require_root

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Removed:
    """What ``remove`` took away."""

    name: str
    versions: list[int]
    branches: list[str] = field(default_factory=list)  # destroyed with the base


def remove(
    pool: Pool, name: str, *, version: int | None = None, destroy_branches: bool = False
) -> Removed:
    """Remove every version of base ``name`` (or only ``version``). Refused while branches use
    it, unless ``destroy_branches``: they are then destroyed first."""
    check_name(name, what="base")
    require_root()  # the base is bind-mounted
    with flocks.locked(
        pool.lock_path("seed", name), timeout=0, what=f"base {name}", busy=SeedBusyError
    ):
        found = pool.registry.bases(name)
        if version is not None:
            found = [b for b in found if b.version == version]
        if not found:
            raise BaseMissingError(_missing(pool, name, version))
        versions = [b.version for b in found]
        users = pool.registry.mark_removing(name, versions, allow_branches=destroy_branches)
        if users and not destroy_branches:
            raise BaseInUseError(_in_use(name, version, users))
        fault(pool, "seed-rm:marked")
        destroyed = []
        for v in versions:
            destroyed += finish(pool, name, v)
    return Removed(name=name, versions=versions, branches=destroyed)


def finish(pool: Pool, name: str, version: int) -> list[str]:
    """Destroy the branches of version ``version`` of base ``name`` (marked ``removing``), then
    remove the version. Idempotent; the caller holds the base's lock. Returns the branches."""
    destroyed = []
    for b in pool.registry.branches(warm=True):
        if (b.base_name, b.base_version) == (name, version):
            if b.warm and warm.retire(pool, b):
                continue  # nobody's yet: not reported as destroyed
            if branches.destroy(pool, b.name) and not b.warm:
                destroyed.append(b.name)
    fault(pool, "seed-rm:branches")
    left = pool.registry.branches_of(name, version)
    if left:  # rows that fail validation: nothing is done with them
        raise RegistryRowError(
            f"base {name} v{version} is still used by branch rows pgoverlay cannot act on "
            f"({', '.join(left)}; `pgoverlay gc` says why): remove them with `sqlite3` (as "
            f"root), then run `pgoverlay base rm {name}` again"
        )
    mounts.unmount(pool.base_dir(name, version))
    fault(pool, "seed-rm:unmounted")
    seed.remove_version(pool, name, version)
    if not pool.registry.bases(name):
        pool.registry.forget_warm_targets(name)
        for parent in (
            pool.store_dir(name, version).parent,
            pool.base_dir(name, version).parent,
            pool.schema_file(name, version).parent,
            pool.workload_file(name, version).parent,
        ):
            with contextlib.suppress(OSError):
                os.rmdir(parent)  # only when empty
    log.info("removed base %s version %s", name, version)
    return destroyed


def _missing(pool: Pool, name: str, version: int | None) -> str:
    versions = [b.version for b in pool.registry.bases(name)]
    if versions:
        listed = ", ".join(str(v) for v in versions)
        return f"base {name} has no version {version} (it has: {listed}): see `pgoverlay base list`"
    known = ", ".join(sorted({b.name for b in pool.registry.bases()}))
    return f"no base named {name!r} (known: {known or 'none'}): see `pgoverlay base list`"


def _in_use(name: str, version: int | None, users: dict[int, list[str]]) -> str:
    listed = "; ".join(f"v{v}: {', '.join(names)}" for v, names in sorted(users.items()))
    which = f"--version {version} " if version is not None else ""
    return (
        f"base {name} is used by branches ({listed}): destroy them first "
        f"(`pgoverlay branch destroy NAME`), or run `pgoverlay base rm {name} {which}"
        "--destroy-branches` to destroy them with the base"
    )
