"""The read-only views of branches: one by name, its base, its status, whether its server runs,
its writable layer's size, and the settings it runs with that differ from its base's."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pgoverlay.errors import (
    BaseMissingError,
    BranchError,
    BranchMissingError,
    BranchStartError,
    PgoverlayError,
)
from pgoverlay.runner.branch import sizes
from pgoverlay.runner.branch.access import engine_connection
from pgoverlay.runner.branch.dirs import layout
from pgoverlay.runner.names import check_name
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.runtime import Layout, Liveness
from pgoverlay.runner.runtime.choose import runtime_for


def get(pool: Pool, name: str) -> Branch:
    """Branch ``name``; BranchMissingError, saying how to find or make one, if there is none."""
    branch = pool.registry.branch(check_name(name))
    if branch is None:
        raise BranchMissingError(
            f"no branch named {name}: see `pgoverlay branch list`, or create it with "
            f"`pgoverlay branch create {name}`"
        )
    return branch


def resolve_base(pool: Pool, name: str | None) -> BaseVersion:
    if name is None:
        names = sorted({b.name for b in pool.registry.bases() if b.state == "ready"})
        if len(names) == 1:
            name = names[0]
        elif not names:
            raise BaseMissingError(
                "no base is seeded yet: run `pgoverlay base seed NAME --from DSN` "
                "(or `pgoverlay base seed demo --demo`)"
            )
        else:
            raise BaseMissingError(
                f"several bases exist ({', '.join(names)}): name one (`--base NAME`, or the "
                "Action's `base` input)"
            )
    base = pool.registry.latest_base(name)
    if base is None:
        known = ", ".join(sorted({b.name for b in pool.registry.bases() if b.state == "ready"}))
        raise BaseMissingError(
            f"no base named {name!r} (known: {known or 'none'}): seed it with "
            f"`pgoverlay base seed {name} --from DSN`"
        )
    return base


def base_of(pool: Pool, branch: Branch) -> BaseVersion:
    """The base version ``branch`` was made from; BaseMissingError if it is gone."""
    base = pool.registry.base(branch.base_name, branch.base_version)
    if base is None:
        raise BaseMissingError(
            f"base {branch.base_name} v{branch.base_version} of branch {branch.name} is gone"
        )
    return base


@dataclass(frozen=True)
class Status:
    branch: Branch
    liveness: Liveness
    host: str
    layer: sizes.LayerSize

    @property
    def running(self) -> bool:
        return self.liveness.running


# A suspended branch's layer, measured once: (its upper's path, when it was suspended) -> size.
# Nothing writes a suspended layer (no server runs on it and it is mounted nowhere), and the
# wake that ends the suspension changes both the state and ``suspended_at``, so the size stays
# right for as long as the key matches. Bounded: a pool holds a few thousand branches at most.
_SUSPENDED_SIZES: dict[tuple[str, float], sizes.LayerSize] = {}
_SUSPENDED_SIZES_MAX = 8192


def layer_size(pool: Pool, branch: Branch | str, *, lay: Layout | None = None) -> sizes.LayerSize:
    """The writable layer's size of ``branch`` (or of the branch of that name), at ``lay`` when
    the caller has its layout already. Walking a layer costs about a millisecond (each file's
    extents are asked for), which a list of a thousand branches cannot pay: a suspended
    branch's is measured once per suspension."""
    found = get(pool, branch) if isinstance(branch, str) else branch
    upper = (lay or layout(pool, found.key)).upper
    key = None
    if found.state == "suspended" and found.suspended_at is not None:
        key = (os.fspath(upper), found.suspended_at)
        known = _SUSPENDED_SIZES.get(key)
        if known is not None:
            return known
    if not upper.is_dir():
        return sizes.LayerSize(logical_bytes=0, physical_bytes=0)
    size = sizes.layer_size(upper)
    if key is not None:
        if len(_SUSPENDED_SIZES) >= _SUSPENDED_SIZES_MAX:
            _SUSPENDED_SIZES.clear()  # of branches long woken or destroyed, mostly
        _SUSPENDED_SIZES[key] = size
    return size


def liveness(pool: Pool, branch: Branch) -> Liveness:
    """Whether the branch's server runs, without measuring its layer (see ``status``):
    ``unknown``, with the reason, when its runtime cannot be asked."""
    return liveness_on(pool, branch, pool.registry.base(branch.base_name, branch.base_version))


def liveness_on(
    pool: Pool, branch: Branch, base: BaseVersion | None, *, lay: Layout | None = None
) -> Liveness:
    """``liveness`` with the branch's base version read already (None: it is gone), as a list
    of every branch reads them once for all, and its layout when the caller has it (each one
    resolves the pool's folders to check the path stays inside)."""
    if base is None:
        return Liveness("stopped", f"base {branch.base_name} v{branch.base_version} is gone")
    try:
        rt = runtime_for(pool, base, branch.runtime)
    except PgoverlayError as err:
        return Liveness("unknown", str(err))
    return rt.liveness(lay or layout(pool, branch.key))


def is_running(pool: Pool, branch: Branch) -> bool:
    return liveness(pool, branch).running


def status(pool: Pool, name: str) -> Status:
    """The branch, whether it runs, and its layer's size (which walks the whole layer)."""
    branch = get(pool, name)
    return Status(
        branch=branch,
        liveness=liveness(pool, branch),
        host=pool.settings.public_host,
        layer=layer_size(pool, branch),
    )


@dataclass(frozen=True)
class Override:
    name: str
    branch_value: str  # what the branch runs with
    base_value: str | None  # what the base's own files say; None: Postgres's default


def overrides(pool: Pool, name: str) -> list[Override]:
    """The settings pgoverlay imposes on the branch that differ from the base's own."""
    from pgoverlay.runner.postgres import sqlerror

    branch = get(pool, name)
    base = pool.registry.base(branch.base_name, branch.base_version)
    if base is None or not is_running(pool, branch):
        raise BranchStartError(
            f"branch {name} is not running: start it with `pgoverlay gc`, then ask again"
        )
    with (
        sqlerror.wrapped(
            BranchError,
            what=f"cannot read the settings of branch {name}",
            fix=f"check that it runs (`pgoverlay branch status {name}`), then ask again",
        ),
        engine_connection(pool, branch, base) as conn,
    ):
        imposed = conn.execute(
            "SELECT name, current_setting(name), setting, boot_val FROM pg_settings "
            "WHERE source = 'command line'"
        ).fetchall()
        # The base's files as they are (postgresql.conf, postgresql.auto.conf); last one wins.
        in_files: dict[str, str] = {}
        for setting_name, value in conn.execute(
            "SELECT name, setting FROM pg_file_settings WHERE setting IS NOT NULL ORDER BY seqno"
        ):
            in_files[str(setting_name)] = str(value)
    found = []
    for setting_name, shown, raw, boot in imposed:
        base_value = in_files.get(str(setting_name))
        if base_value is None and str(raw) == str(boot):
            continue  # Postgres's default anyway
        if base_value is not None and base_value in (str(shown), str(raw)):
            continue
        found.append(Override(str(setting_name), str(shown), base_value))
    return sorted(found, key=lambda o: o.name)
