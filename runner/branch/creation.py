"""The create saga, and the warm start: a branch registered, its directories made, its server
mounted and started, its login role given its password (or, warm, none until a claim); and a
claim of a warm branch, tried before a cold create.

Each step is recorded in the registry before it is done, under the branch's lock, so a process
killed at any point leaves a row that ``gc`` undoes."""

from __future__ import annotations

import dataclasses
import logging
import secrets
import sqlite3
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgoverlay.errors import BaseMissingError, BranchExistsError, PgoverlayError
from pgoverlay.runner.branch.access import claim_login
from pgoverlay.runner.branch.dirs import layout, make_dirs
from pgoverlay.runner.branch.lifecycle import mount_and_start, teardown
from pgoverlay.runner.branch.lookup import get, resolve_base
from pgoverlay.runner.branch.ports import pick_port
from pgoverlay.runner.names import check_name
from pgoverlay.runner.pool import Pool, fault, flocks
from pgoverlay.runner.pool.registry import WARM_PREFIX, BaseVersion, Branch
from pgoverlay.runner.runtime.choose import choose, runtime_for

if TYPE_CHECKING:
    from concurrent.futures import Future

    from pgoverlay.runner.branch.quota import Quota

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """What a cold create and a warm start do differently; every other step is the same."""

    saga: str  # its fault points' prefix: SAGA:registered, SAGA:dirs, SAGA:mounted, SAGA:started
    state: str  # the branch's state once it is started
    doing: str  # what its log says it was doing when it failed

    @property
    def locked(self) -> bool:
        """Started with no password for its login role: a warm branch, until its claim."""
        return self.state == "warm"


COLD = Start(saga="create", state="ready", doing="creating branch")
WARM = Start(saga="warm", state="warm", doing="starting warm branch")


def create(
    pool: Pool,
    name: str,
    *,
    base_name: str | None = None,
    ttl_seconds: int | None = None,
    runtime: str | None = None,
    repository: str = "",
    pr: int | None = None,
    owner_uid: int = 0,
    owner_repository_id: int | None = None,
    quota: Quota | None = None,
    suspend_after: float | None = None,
) -> Branch:
    """Create branch ``name`` of a base and wait until it accepts logins. ``repository``,
    ``pr``, ``owner_uid`` and ``owner_repository_id`` (the repository the front door vouched
    for) record who asked for it (the engine service fills them in), ``quota`` the limits it
    is held to, checked in the transaction that registers it, and ``suspend_after`` the
    seconds it may sit with no connection before the engine service suspends it (0: never;
    None: the pool's ``suspend_after``, read when it is idle).

    A warm branch of the base's current version on the chosen runtime is claimed when one is
    ready: its name, password and owner are bound to it in one registry transaction, then its
    password is set. Otherwise (or if the claim fails) the branch is created cold."""
    check_name(name)
    base = resolve_base(pool, base_name)
    chosen = choose(pool.settings, "branch", requested=runtime, major=base.pg_major or 0).name
    # Refuse a major-version mismatch (binaries or image) before touching anything.
    runtime_for(pool, base, chosen, check=True)
    from pgoverlay.runner.branch import primed

    password, secret = primed.password()  # being computed: a claim or a cold create sets it
    with flocks.locked(
        pool.lock_path("branch", name), timeout=pool.settings.lock_wait, what=f"branch {name}"
    ):
        now = time.time()
        asked: dict[str, Any] = {
            "name": name,
            "password": password,
            "created_at": now,
            "expires_at": now + ttl_seconds if ttl_seconds else None,
            "repository": repository,
            "pr": pr,
            "owner_uid": owner_uid,
            "owner_repository_id": owner_repository_id,
            "suspend_after": suspend_after,
        }
        # Not durable (see Registry.transaction): after a host crash a lost claim is a warm
        # branch again, whose stopped server gets it retired; a lost "ready" leaves it
        # claiming, which gc undoes.
        with pool.registry.transaction(durable=False) as db:
            _check_free(pool, db, base, name, quota=quota)
            claimed = pool.registry.claim_warm(db, base, chosen, **asked)
        if claimed is not None:
            try:
                return _finish_claim(pool, base, claimed, secret)
            except PgoverlayError as err:
                log.warning("claiming warm branch %s failed (%s); creating it cold", name, err)
                teardown(pool, claimed)
            except BaseException:
                teardown(pool, claimed)
                raise
        branch = _start(pool, base, asked, runtime=chosen, how=COLD, quota=quota, secret=secret)
    log.info("branch %s ready on port %s", name, branch.port)
    return get(pool, name)


def _check_free(
    pool: Pool, db: sqlite3.Connection, base: BaseVersion, name: str, *, quota: Quota | None = None
) -> None:
    """In the create's transaction: the base version is still usable, ``name`` is free, and
    one more branch is within ``quota``."""
    current = pool.registry.base(base.name, base.version)
    if current is None or current.state != "ready":
        raise BaseMissingError(
            f"base {base.name} v{base.version} is being removed (`pgoverlay base rm`): "
            "create the branch from another base (`pgoverlay base list`)"
        )
    existing = pool.registry.branch(name)
    if existing is not None:
        raise BranchExistsError(
            f"branch {name} already exists (state {existing.state}): pick another name, "
            f"or `pgoverlay branch reset {name}` / `pgoverlay branch destroy {name}`"
        )
    if pool.registry.name_taken(db, name):
        raise BranchExistsError(
            f"the name {name} is taken by the files of another branch (a claimed warm "
            "branch keeps its first name for them): pick another name"
        )
    if quota is not None:
        quota.check(
            pool.registry.usage(
                db,
                repository=quota.repository,
                owner_uid=quota.owner_uid,
                repository_id=quota.repository_id,
            )
        )


def _finish_claim(pool: Pool, base: BaseVersion, claimed: Branch, secret: Future[str]) -> Branch:
    """The claim's remaining step: the branch's password; then it is ready."""
    fault(pool, "claim:bound")
    claim_login(pool, base, claimed, secret)
    fault(pool, "claim:password")
    # No login over TCP here, unlike a cold create: the server has just answered the engine,
    # and its port answered with this role's SCRAM exchange when it became warm.
    ready_at = time.time()
    pool.registry.update_branch(
        claimed.name, durable=False, state="ready", step="", ready_at=ready_at
    )
    log.info("branch %s claimed warm on port %s", claimed.name, claimed.port)
    return dataclasses.replace(claimed, state="ready", step="", ready_at=ready_at)


def start_warm(pool: Pool, base: BaseVersion, runtime: str) -> Branch:
    """Start one warm branch of ``base`` on ``runtime``: a branch like any other, named after
    its own slot, whose login role has no password until ``create`` claims it."""
    slot = WARM_PREFIX + secrets.token_hex(6)
    with flocks.locked(
        pool.lock_path("branch", slot), timeout=pool.settings.lock_wait, what=f"branch {slot}"
    ):
        unclaimed = {"name": slot, "password": "", "created_at": time.time(), "expires_at": None}
        _start(pool, base, unclaimed, runtime=runtime, how=WARM)
    return get(pool, slot)


def _start(
    pool: Pool,
    base: BaseVersion,
    fields: dict[str, Any],
    *,
    runtime: str,
    how: Start,
    quota: Quota | None = None,
    secret: Future[str] | None = None,
) -> Branch:
    """The saga of a branch started from nothing, under its lock (the caller's): registered
    (``fields``: its name and what was asked of it), its directories made, its server mounted
    and started, then its state ``how.state``. A failure at any step tears it down; a kill
    leaves it ``creating``, which gc undoes."""
    name = fields["name"]
    with pool.registry.transaction() as db:
        _check_free(pool, db, base, name, quota=quota)
        branch = Branch(
            **fields,
            base_name=base.name,
            base_version=base.version,
            state="creating",
            step="registered",
            port=pick_port(pool, pool.registry.used_ports(db)),
            runtime=runtime,
            user=pool.settings.branch_user,
            database=base.database,
            ready_at=None,
            slot=name,
        )
        pool.registry.insert_branch(db, branch)
    fault(pool, f"{how.saga}:registered")
    try:
        make_dirs(
            pool,
            layout(pool, name),
            user=branch.user,
            superuser=base.superuser,
            database=branch.database,
        )
        pool.registry.update_branch(name, durable=False, step="dirs")
        fault(pool, f"{how.saga}:dirs")
        mount_and_start(pool, base, branch, saga=how.saga, secret=secret, locked=how.locked)
    except BaseException:
        log.warning("%s %s failed; undoing", how.doing, name)
        teardown(pool, branch)
        raise
    pool.registry.update_branch(name, state=how.state, step="", ready_at=time.time())
    return branch
