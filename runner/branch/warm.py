"""Warm branches: started ahead of time, so ``branch create`` only claims one.

Nothing about a branch depends on who claims it except its name, its password and its owner,
so a configured number per base and runtime (``pgoverlay base warm NAME --count N``) is kept
started: unclaimed, reachable by nobody (its login role has no password), named after its own
slot (``warm-…``), which its directories and container keep after a claim renames it.

Whatever long-running part the pool has keeps them topped up (the engine service after each
create and every ``warm_interval`` seconds; otherwise ``pgoverlay gc``): :func:`replenish`
retires the warm branches of a superseded base version, of a runtime or base no longer asked
for, or whose server is gone, and starts new ones up to the target. Retiring takes a branch
out of the warm set in one registry transaction (``Registry.unwarm``) before tearing it down, so
it never races a claim: whichever commits first wins.

One top-up runs at a time (a lock). A top-up reads the target again before each branch it
starts, so a lowered target stops it after the branch it is starting; :func:`set_target` waits
for a running top-up to end and then retires what it started beyond the new target: when it
returns, the count it set holds (0: no warm branch of that base on that runtime is left).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from pgoverlay.errors import LockBusyError, PgoverlayError
from pgoverlay.runner import branch as branches
from pgoverlay.runner.branch import creation, lifecycle, lookup
from pgoverlay.runner.pool import Pool, flocks
from pgoverlay.runner.pool.registry import Branch
from pgoverlay.runner.postgres import postmaster
from pgoverlay.runner.runtime.choose import runtime_for

log = logging.getLogger(__name__)


@dataclass
class Replenished:
    started: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    busy: bool = False  # another process was replenishing: nothing was done


@dataclass(frozen=True)
class WarmState:
    """One base's warm branches on one runtime: how many are wanted, how many are ready, and
    what each idle one costs."""

    base_name: str
    runtime: str
    target: int
    ready: int
    pss_bytes: list[int]  # per ready warm branch whose server could be measured

    @property
    def memory_each(self) -> int | None:
        """The median memory of one warm branch, None when none could be measured."""
        if not self.pss_bytes:
            return None
        ordered = sorted(self.pss_bytes)
        return ordered[len(ordered) // 2]


def warm_branches(pool: Pool) -> list[Branch]:
    return [b for b in pool.registry.branches(warm=True) if b.warm]


def _why_retire(pool: Pool, b: Branch, wanted: dict[tuple[str, str], int]) -> str | None:
    """Why warm branch ``b`` should go, or None if it is one to keep."""
    latest = pool.registry.latest_base(b.base_name)
    if latest is None or latest.version != b.base_version:
        return f"base {b.base_name} v{b.base_version} is superseded"
    if wanted.get((b.base_name, b.runtime), 0) == 0:
        return f"no warm branches of {b.base_name} are wanted on {b.runtime}"
    alive = lookup.liveness(pool, b)
    if alive.state == "stopped":
        return "its server is gone"
    return None


def retire(pool: Pool, b: Branch) -> bool:
    """Tear warm branch ``b`` down, unless a claim or another process got it first."""
    try:
        with flocks.locked(pool.lock_path("branch", b.name), timeout=0, what=f"branch {b.name}"):
            if not pool.registry.unwarm(b.name):
                return False
            lifecycle.teardown(pool, replace(b, state="destroying"))
    except LockBusyError:
        return False
    return True


def replenish(pool: Pool, *, start: bool = True, wait: float = 0) -> Replenished:
    """Retire the warm branches that should go, then start new ones up to each target (unless
    ``start`` is false). One process at a time: a caller that finds another one at it for
    ``wait`` seconds returns ``busy``, having done nothing."""
    done = Replenished()
    try:
        with flocks.locked(pool.lock_path("warm", "replenish"), timeout=wait, what="warm branches"):
            _replenish(pool, done, start=start)
    except LockBusyError:
        done.busy = True
    return done


def set_target(pool: Pool, base_name: str, runtime: str, count: int) -> Replenished:
    """Keep ``count`` warm branches of ``base_name`` on ``runtime`` (0: none), and make it so
    now: after the top-up another process (the engine service) may be running, which the new
    target stops after the branch it is starting, retire what is beyond the target and start
    what is missing. ``busy`` if that top-up did not end within the time one branch may take
    to start and stop (the target is set; the next top-up meets it)."""
    pool.registry.set_warm_target(base_name, runtime, count)
    wait = pool.settings.start_timeout + pool.settings.stop_timeout
    return replenish(pool, wait=wait)


def _replenish(pool: Pool, done: Replenished, *, start: bool) -> None:
    targets = pool.registry.warm_targets()
    wanted = {(t.base_name, t.runtime): t.count for t in targets}
    have: dict[tuple[str, str], int] = {}
    for b in warm_branches(pool):
        key = (b.base_name, b.runtime)
        why = _why_retire(pool, b, wanted)
        if why is None and have.get(key, 0) >= wanted[key]:
            why = "more are warm than wanted"
        if why is None:
            have[key] = have.get(key, 0) + 1
        elif retire(pool, b):
            done.retired.append(f"{b.name} ({why})")
    if not start:
        return
    for target in targets:
        base = pool.registry.latest_base(target.base_name)
        if base is None:
            continue
        key = (target.base_name, target.runtime)
        # The target as it is now, before each start: one lowered meanwhile (`base warm NAME
        # --count 0`) stops this top-up rather than being met by one more branch to retire.
        while have.get(key, 0) < _targets(pool).get(key, 0):
            try:
                runtime_for(pool, base, target.runtime, check=True)
                made = creation.start_warm(pool, base, target.runtime)
            except PgoverlayError as err:
                done.problems.append(f"warm branch of {base.name} on {target.runtime}: {err}")
                log.warning("could not start a warm branch of %s: %s", base.name, err)
                break
            have[key] = have.get(key, 0) + 1
            done.started.append(made.name)


def _targets(pool: Pool) -> dict[tuple[str, str], int]:
    return {(t.base_name, t.runtime): t.count for t in pool.registry.warm_targets()}


def states(pool: Pool, *, measure: bool = True) -> list[WarmState]:
    """Each warm target with its ready warm branches and (with ``measure``) their memory."""
    found: dict[tuple[str, str], list[Branch]] = {}
    for b in warm_branches(pool):
        found.setdefault((b.base_name, b.runtime), []).append(b)
    keys = {(t.base_name, t.runtime): t.count for t in pool.registry.warm_targets()}
    result = []
    for key in sorted(set(keys) | set(found)):
        ready = found.get(key, [])
        pss = [u for b in ready if measure and (u := memory(pool, b)) is not None]
        result.append(WarmState(key[0], key[1], keys.get(key, 0), len(ready), pss))
    return result


def memory(pool: Pool, b: Branch) -> int | None:
    """The proportional set size of branch ``b``'s server processes, None if it cannot be
    measured (its server is not running, or its runtime cannot be asked)."""
    found = usage(pool, b)
    return found.pss_bytes if found is not None else None


def usage(pool: Pool, b: Branch) -> postmaster.Usage | None:
    base = pool.registry.base(b.base_name, b.base_version)
    if base is None:
        return None
    try:
        pid = runtime_for(pool, base, b.runtime).server_pid(branches.layout(pool, b.key))
    except Exception:  # docker raises many kinds; a measurement never fails the caller
        return None
    return postmaster.usage(pid) if pid else None
