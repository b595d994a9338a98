"""The sagas of a branch that exists: its server mounted and started (a create's, a reset's and a
warm start's common steps), teardown and destroy, reset, and restart (a reboot, a crash, a wake).

Each saga holds the branch's lock and records its step in the registry before doing it, so a
process killed at any point leaves a row that ``gc`` can finish or undo."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from pgoverlay.errors import BranchStartError, PgoverlayError
from pgoverlay.runner import safefs
from pgoverlay.runner.branch.access import (
    check_ready,
    engine_connection,
    give_login,
    lock_login,
)
from pgoverlay.runner.branch.conf import server_options, write_conf
from pgoverlay.runner.branch.dirs import empty_workdir, layout, make_socket_dir, remove_dirs
from pgoverlay.runner.branch.lookup import base_of, get
from pgoverlay.runner.names import check_name
from pgoverlay.runner.pool import Pool, fault, flocks, release_freed
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.runtime.choose import runtime_for

if TYPE_CHECKING:
    from concurrent.futures import Future

    import psycopg

log = logging.getLogger(__name__)


def mount_and_start(
    pool: Pool,
    base: BaseVersion,
    branch: Branch,
    *,
    saga: str,
    secret: Future[str] | None = None,
    locked: bool = False,
) -> None:
    """Mount ``branch``'s layer over its base and start its server, recording each step (the
    fault points ``SAGA:mounted`` and ``SAGA:started``), then give its login role its password
    (``secret``: see ``give_login``) and check a client can log in; ``locked``: leave the role
    with no password at all instead (a warm branch's, until its claim)."""
    lay = layout(pool, branch.key)
    rt = runtime_for(pool, base, branch.runtime)
    rt.attach(lay, lower=pool.base_dir(base.name, base.version))
    # A step tells a person where a saga stopped; gc undoes or finishes by the state alone, so a
    # step need not wait for the disk (the state's own changes do).
    pool.registry.update_branch(branch.name, durable=False, step="mounted")
    fault(pool, f"{saga}:mounted")
    rt.start(lay, options=server_options(pool, lay, branch))
    pool.registry.update_branch(branch.name, durable=False, step="started")
    fault(pool, f"{saga}:started")
    # Before any login: the role still has the password the base was prepared with, which
    # nobody kept (a reset branch's own password, known to the pull request, is set next).
    _keep_base_schema(pool, base, branch)
    if locked:
        lock_login(pool, base, branch)  # its password comes with its claim
        return
    give_login(pool, base, branch, secret)
    check_ready(pool, branch)


def _keep_base_schema(pool: Pool, base: BaseVersion, branch: Branch) -> None:
    """Keep the base version's schema, read in this branch while it is fresh and nobody but
    the engine can log in (no PR code has run in it, nor can), for the diffs of every branch
    of that version (``trace.schema``); once per version. A failure only costs those diffs."""
    import psycopg

    from pgoverlay.runner.trace import schema

    try:
        if schema.keep_base(
            pool.schema_file(base.name, base.version),
            lambda: engine_connection(pool, branch, base),
        ):
            log.info(
                "base %s v%s: its schema was read in branch %s",
                base.name,
                base.version,
                branch.name,
            )
    except (psycopg.Error, OSError, PgoverlayError) as err:
        log.warning(
            "base %s v%s: its schema could not be read in branch %s (%s); a later branch "
            "tries again",
            base.name,
            base.version,
            branch.name,
            err,
        )


def teardown(pool: Pool, branch: Branch) -> None:
    """Stop, unmount and remove everything of ``branch``, then forget it. Idempotent."""
    from pgoverlay.runner.branch import primed

    lay = layout(pool, branch.key)
    primed.drop(os.fspath(lay.socket_dir))
    base = pool.registry.base(branch.base_name, branch.base_version)
    if base is not None:
        rt = runtime_for(pool, base, branch.runtime)
        rt.stop(lay, discard=True)
        rt.detach(lay)
    fault(pool, "destroy:stopped")
    remove_dirs(lay)
    _forget_grants(pool, branch)
    pool.registry.delete_branch(branch.name)
    release_freed(pool)


def _forget_grants(pool: Pool, branch: Branch) -> None:
    """The credentials granted in ``branch`` go with it (their rows with its row, their roles
    with its data): each is written to the audit log first. A log that cannot be written does
    not stop a destroy; it is said in the engine's log."""
    if not pool.registry.grants(branch.name):
        return
    from pgoverlay.runner.branch import grants

    try:
        grants.forget(pool, branch)
    except (OSError, PgoverlayError) as err:
        log.warning(
            "branch %s: its credentials' removal is not in the audit log: %s", branch.name, err
        )


def destroy(pool: Pool, name: str) -> bool:
    """Destroy ``name``; False if there was nothing to destroy."""
    check_name(name)
    with flocks.locked(
        pool.lock_path("branch", name), timeout=pool.settings.lock_wait, what=f"branch {name}"
    ):
        branch = pool.registry.branch(name)
        if branch is None:
            return False
        pool.registry.update_branch(name, state="destroying", step="")
        fault(pool, "destroy:marked")
        teardown(pool, branch)
    return True


def reset(pool: Pool, name: str) -> Branch:
    """Discard every change: back to the base version, same port and password."""
    check_name(name)
    with flocks.locked(
        pool.lock_path("branch", name), timeout=pool.settings.lock_wait, what=f"branch {name}"
    ):
        branch = get(pool, name)
        pool.registry.update_branch(name, state="resetting", step="")
        fault(pool, "reset:marked")
        finish_reset(pool, branch)
    return get(pool, name)


def finish_reset(pool: Pool, branch: Branch) -> None:
    base = base_of(pool, branch)
    lay = layout(pool, branch.key)
    rt = runtime_for(pool, base, branch.runtime)
    rt.stop(lay, discard=True)
    rt.detach(lay)
    empty_workdir(lay.work)
    safefs.remove_tree(lay.upper)
    safefs.make_dir(lay.upper, uid=pool.owner.uid, gid=pool.owner.gid, mode=0o700)
    safefs.remove_tree(lay.log_file)
    # Written again, so a branch made by an earlier release gets today's pg_hba.conf.
    write_conf(pool, lay, user=branch.user, superuser=base.superuser, database=branch.database)
    release_freed(pool)
    pool.registry.update_branch(branch.name, durable=False, step="wiped")
    fault(pool, "reset:wiped")
    mount_and_start(pool, base, branch, saga="reset")
    if pool.registry.grants(branch.name):
        from pgoverlay.runner.branch import grants

        grants.restore(pool, branch, base)
    pool.registry.update_branch(
        branch.name, state="ready", step="", ready_at=time.time(), suspended_at=None
    )


def restart(pool: Pool, branch: Branch) -> None:
    """Bring a ready branch whose server is gone (a reboot, a crash, a suspend) back up, with
    its password set again (a claim's did not wait for the WAL flush, see ``claim_login``)
    and its roles made what the registry says (``reconcile``: a credential revoked or expired
    meanwhile is dropped, a password changed in SQL set back) while its server admits the
    engine alone; then it admits its clients."""
    from pgoverlay.runner.branch import reconcile
    from pgoverlay.runner.postgres import sqlerror

    base = base_of(pool, branch)
    lay = layout(pool, branch.key)
    rt = runtime_for(pool, base, branch.runtime, check=True)
    make_socket_dir(pool, lay)
    names: dict[str, Any] = {
        "user": branch.user,
        "superuser": base.superuser,
        "database": branch.database,
    }
    write_conf(pool, lay, **names, engine_only=True)
    rt.attach(lay, lower=pool.base_dir(base.name, base.version))
    rt.start(lay, options=server_options(pool, lay, branch))

    def settle(conn: psycopg.Connection[Any]) -> None:
        fault(pool, "restart:password")
        with sqlerror.wrapped(
            BranchStartError,
            what=f"branch {branch.name} started but its roles could not be made what the "
            "registry says",
            fix="`pgoverlay gc` tries again; if it fails again, the base's superuser "
            f"{base.superuser} must be able to log in over the branch's socket",
        ):
            # its password was just set: only the credentials are to check
            reconcile.reconcile(pool, branch, base, conn, branch_password=False)
            write_conf(pool, lay, **names)
            conn.execute("SELECT pg_reload_conf()")

    give_login(pool, base, branch, None, fresh=False, then=settle)
    check_ready(pool, branch)
