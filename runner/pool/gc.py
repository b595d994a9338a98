"""Garbage collection and repair: finish or undo what a killed process left, reap expired
branches, restart ready branches whose server is gone, remove unreferenced base versions.

``gc`` only touches an object whose lock it can take, so it never races a live saga.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from pgoverlay.errors import LockBusyError, PgoverlayError
from pgoverlay.runner import branch as branches
from pgoverlay.runner import demo, safefs, seed
from pgoverlay.runner.branch import lifecycle, lookup, suspension, warm
from pgoverlay.runner.names import NAME_RE
from pgoverlay.runner.pool import Pool, flocks, mounts
from pgoverlay.runner.pool.registry import Branch
from pgoverlay.runner.postgres import postmaster
from pgoverlay.runner.runtime import table as runtimes
from pgoverlay.runner.seed import bases as base_removal

log = logging.getLogger(__name__)


@dataclass
class Collected:
    undone: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    expired_grants: list[str] = field(default_factory=list)
    reconciled: list[str] = field(default_factory=list)
    warmed: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    bases_removed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        for label, items in (
            ("undone half-created branches", self.undone),
            ("finished interrupted destroys/resets", self.finished),
            ("destroyed expired branches", self.expired),
            ("removed expired credentials", self.expired_grants),
            ("made roles what the registry says", self.reconciled),
            ("started warm branches", self.warmed),
            ("retired warm branches", self.retired),
            ("restarted branches", self.restarted),
            ("removed orphans", self.orphans),
            ("removed base versions", self.bases_removed),
            ("problems", self.problems),
            ("skipped", self.skipped),
        ):
            if items:
                out.append(f"{label}: {', '.join(items)}")
        return out or ["nothing to do"]


def collect(pool: Pool, *, now: float | None = None) -> Collected:
    report = Collected()
    now = time.time() if now is None else now
    # A row pgoverlay could not have written names paths and ports nobody vouches for: it is
    # reported, and nothing is done with it.
    report.problems += pool.registry.rejected()
    _removals(pool, report)
    _branches(pool, report, now)
    _grants(pool, report, now)
    _warm(pool, report)
    _runtime_leftovers(pool, report)
    _orphan_branch_dirs(pool, report)
    _bases(pool, report)
    _scratch(pool, report)
    return report


def _removals(pool: Pool, report: Collected) -> None:
    """Finish the base removals (`base rm`) a killed process left: their branches first."""
    for base in pool.registry.bases():
        if base.state != "removing":
            continue
        try:
            with flocks.locked(pool.lock_path("seed", base.name), timeout=0, what="seed rm"):
                base_removal.finish(pool, base.name, base.version)
            report.bases_removed.append(f"{base.name} v{base.version} (interrupted removal)")
        except LockBusyError:
            continue  # a live `base rm` is working on it
        except PgoverlayError as err:
            report.problems.append(f"base {base.name} v{base.version}: {err}")
            log.warning("gc could not finish removing base %s: %s", base.name, err)


def _branches(pool: Pool, report: Collected, now: float) -> None:
    for row in pool.registry.branches(warm=True):
        if row.warm:
            continue  # see _warm
        lock = pool.lock_path("branch", row.name)
        try:
            with flocks.locked(lock, timeout=0, what=f"branch {row.name}"):
                current = pool.registry.branch(row.name)
                if current is None:
                    continue
                if current.state in ("creating", "claiming"):
                    lifecycle.teardown(pool, current)
                    report.undone.append(current.name)
                elif current.state == "destroying":
                    lifecycle.teardown(pool, current)
                    report.finished.append(current.name)
                elif current.state == "resetting":
                    lifecycle.finish_reset(pool, current)
                    report.finished.append(current.name)
                elif current.state == "suspending":
                    suspension.finish_suspend(pool, current)
                    report.finished.append(current.name)
                elif current.state == "waking":
                    suspension.finish_wake(pool, current)
                    report.finished.append(current.name)
                elif current.expires_at is not None and current.expires_at <= now:
                    pool.registry.update_branch(current.name, state="destroying")
                    lifecycle.teardown(pool, current)
                    report.expired.append(current.name)
                elif current.state == "ready":
                    _restart_if_down(pool, current, report)
                # suspended: nothing runs, and nothing should
        except LockBusyError:
            continue  # a live process is working on it
        except PgoverlayError as err:
            report.problems.append(f"{row.name}: {err}")
            log.warning("gc could not repair branch %s: %s", row.name, err)


def _grants(pool: Pool, report: Collected, now: float) -> None:
    """Revoke the credentials past their expiry: their roles dropped in the branches that run
    (a login already failed there, by the role's VALID UNTIL), their rows forgotten; then each
    running branch's roles made what the registry says (``reconcile.sweep``)."""
    from pgoverlay.runner.branch import grants, reconcile

    done, problems = grants.expire(pool, now=now)
    report.expired_grants += done
    report.problems += problems
    # What the running branches' data says beside the registry: a role a killed revoke left,
    # a password changed in SQL (see branch.reconcile).
    changed, problems = reconcile.sweep(pool)
    report.reconciled += changed
    report.problems += problems


def _warm(pool: Pool, report: Collected) -> None:
    """Retire the warm branches that should go and start the ones the targets ask for."""
    done = warm.replenish(pool)
    report.warmed += done.started
    report.retired += done.retired
    report.problems += done.problems


def _restart_if_down(pool: Pool, branch: Branch, report: Collected) -> None:
    """Restart a ready branch whose server is gone; one whose runtime cannot tell is left
    alone (a Docker outage is not a stopped server)."""
    alive = lookup.liveness(pool, branch)
    if alive.state == "unknown":
        report.skipped.append(f"{branch.name} (could not tell whether it runs: {alive.reason})")
        log.warning("gc left branch %s alone: %s", branch.name, alive.reason)
    elif alive.state == "stopped":
        lifecycle.restart(pool, branch)
        report.restarted.append(branch.name)


def _runtime_leftovers(pool: Pool, report: Collected) -> None:
    """What each runtime made beside the pool (Docker's containers and volumes) that no
    branch claims. A runtime that cannot be asked (no Docker daemon) is a problem only when a
    branch runs on it (``in_use``): otherwise it has nothing of this pool."""
    used = {b.runtime for b in pool.registry.branches(warm=True)}
    for name, runtime in runtimes.rows():
        try:
            report.orphans += runtime.leftovers(
                pool,
                known=pool.registry.branch_keys(),
                may_remove=lambda kind, key: flocks.is_free(pool.lock_path(kind, key)),
                in_use=name in used,
            )
        except PgoverlayError as err:
            report.problems.append(str(err))


def _orphan_branch_dirs(pool: Pool, report: Collected) -> None:
    """Directories and mounts under branches/ that no registry row claims."""
    # Rows that fail validation still claim their directory: it is left for a person to judge.
    known = pool.registry.branch_keys() | pool.registry.branch_names()
    root = pool.root / "branches"
    for target in mounts.mounts_under(root):
        name = Path(target).relative_to(root).parts[0]
        if NAME_RE.match(name) and name not in known and _free(pool, name):
            postmaster.stop(
                root / name / "upper" / "postmaster.pid", timeout=pool.settings.stop_timeout
            )
            mounts.unmount(Path(target))
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if not NAME_RE.match(path.name):
            report.problems.append(f"{path}: not a branch pgoverlay made; left alone")
            continue
        if path.name in known or not _free(pool, path.name):
            continue
        postmaster.stop(path / "upper" / "postmaster.pid", timeout=pool.settings.stop_timeout)
        if mounts.is_mounted(path / "data"):
            mounts.unmount(path / "data")
        safefs.remove_tree(path)
        safefs.remove_tree(branches.layout(pool, path.name).socket_dir)
        report.orphans.append(f"branch dir {path.name}")


def _free(pool: Pool, name: str) -> bool:
    try:
        return flocks.is_free(pool.lock_path("branch", name))
    except PgoverlayError:
        return False  # a lock that is not root's file: leave the branch to a person


def _bases(pool: Pool, report: Collected) -> None:
    referenced = {(b.base_name, b.base_version) for b in pool.registry.branches(warm=True)}
    by_name: dict[str, list[int]] = {}
    for base in pool.registry.bases():
        if base.state == "ready":
            by_name.setdefault(base.name, []).append(base.version)
    for base in pool.registry.bases():
        key = (base.name, base.version)
        lock = pool.lock_path("seed", base.name)
        if base.state == "removing":
            continue  # see _removals
        if base.state != "ready":
            if flocks.is_free(lock):
                seed.remove_version(pool, base.name, base.version)
                report.bases_removed.append(f"{base.name} v{base.version} (interrupted seed)")
            continue
        latest = max(by_name[base.name])
        if base.version < latest and key not in referenced:
            with contextlib.suppress(PgoverlayError), flocks.locked(lock, timeout=0, what="seed"):
                seed.remove_version(pool, base.name, base.version)
                report.bases_removed.append(f"{base.name} v{base.version} (superseded)")


def _scratch(pool: Pool, report: Collected) -> None:
    """Leftovers in tmp/: demo sources and private server directories of dead processes."""
    for name in demo.leftover_sources(pool):
        demo.cleanup_source(pool, name)
        report.orphans.append(f"demo source {name}")
    for path in pool.tmp.glob("pgo-*-*"):
        pid = path.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            safefs.remove_tree(path)
            report.orphans.append(f"scratch {path.name}")
