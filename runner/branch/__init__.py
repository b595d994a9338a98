"""Branches: create, reset and destroy as sagas, plus the read-only views (list, status, size).

Each saga holds the branch's lock and records its step in the registry before doing it, so a
process killed at any point leaves a row that ``gc`` can finish or undo.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgoverlay.errors import (
    BaseMissingError,
    BranchError,
    BranchExistsError,
    BranchMissingError,
    BranchStartError,
    BranchStateError,
    PgoverlayError,
    PoolFullError,
    PortsExhaustedError,
    TimeoutExpiredError,
)
from pgoverlay.runner import polling, safefs
from pgoverlay.runner.branch import sizes
from pgoverlay.runner.branch.conf import server_options, write_conf
from pgoverlay.runner.names import check_name
from pgoverlay.runner.pool import Pool, fault, flocks, release_freed
from pgoverlay.runner.pool.registry import WAKEABLE, WARM_PREFIX, BaseVersion, Branch
from pgoverlay.runner.runtime import Layout, Liveness
from pgoverlay.runner.runtime.choose import choose, runtime_for
from pgoverlay.runner.service.views import Connection

# psycopg, and the login role's SQL (postgres/roles.py), are imported where a server is
# talked to: `branch list` and the other views start without them.
if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Future

    import psycopg

    from pgoverlay.runner.branch.quota import Quota

log = logging.getLogger(__name__)


# -- layout and runtime -------------------------------------------------------------------


def layout(pool: Pool, key: str) -> Layout:
    """Where the branch whose files go by ``key`` (``Branch.key``: its slot, else its name)
    lives."""
    return Layout(root=pool.branch_dir(key), socket_dir=pool.socket_root / key)


def layouts(pool: Pool, keys: list[str]) -> dict[str, Layout]:
    """``layout`` of each key, the pool's folders checked once for all of them."""
    dirs = pool.branch_dirs(keys)
    return {key: Layout(root=dirs[key], socket_dir=pool.socket_root / key) for key in keys}


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


def _make_dirs(pool: Pool, lay: Layout, *, user: str, superuser: str, database: str) -> None:
    """The branch's directory is root's, so the branches' user cannot swap what root mounts
    or reads there; that user owns only what its Postgres writes: upper, work, log, sockets."""
    uid, gid = pool.owner.uid, pool.owner.gid
    try:
        safefs.make_dir(lay.root, uid=0, gid=0, mode=0o711)
        for path, owner, mode in (
            (lay.upper, (uid, gid), 0o700),
            (lay.work, (uid, gid), 0o700),
            (lay.data, (0, 0), 0o700),
            (lay.conf, (0, 0), 0o755),
            (lay.log, (uid, gid), 0o700),
        ):
            safefs.make_dir(path, uid=owner[0], gid=owner[1], mode=mode)
        _make_socket_dir(pool, lay)
    except OSError as err:
        if err.errno == 28:  # ENOSPC
            raise PoolFullError("the pool is full: destroy branches or grow the pool") from None
        raise
    write_conf(pool, lay, user=user, superuser=superuser, database=database)


def _make_socket_dir(pool: Pool, lay: Layout) -> None:
    pool.make_socket_root()
    safefs.make_dir(
        lay.socket_dir, uid=pool.owner.uid, gid=pool.owner.gid, mode=0o700, exist_ok=True
    )


def _empty_workdir(work: Path) -> None:
    """Empty OverlayFS's work directory (the kernel leaves root-owned, mode 000 directories in
    it), without following any link the branches' user put there."""
    safefs.empty_dir(work)


def _remove_dirs(lay: Layout) -> None:
    safefs.remove_tree(lay.root)
    safefs.remove_tree(lay.socket_dir)


# -- ports and passwords ------------------------------------------------------------------


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(pool: Pool, used: set[int]) -> int:
    s = pool.settings
    hosts = [h.strip() for h in s.listen_address.split(",") if h.strip()]
    hosts = ["0.0.0.0" if h == "*" else h for h in hosts] or ["127.0.0.1"]
    for port in range(s.port_min, s.port_max + 1):
        if port not in used and all(_port_free(h, port) for h in hosts):
            return port
    raise PortsExhaustedError(
        f"every port from {s.port_min} to {s.port_max} is taken: destroy unused branches "
        "(`pgoverlay branch list`) or widen PGOVERLAY_PORT_MIN/PGOVERLAY_PORT_MAX"
    )


def _engine_connection(pool: Pool, branch: Branch, base: BaseVersion) -> psycopg.Connection[Any]:
    """The engine's own access: the base's superuser, through the branch's private socket.

    Its search_path holds only the catalog: the branch's role may create schemas and objects
    (one named like the superuser, or in public), and a superuser session must never resolve
    a name to something the role made. It logs no statement (one sets a password)."""
    import psycopg

    return psycopg.connect(
        host=os.fspath(layout(pool, branch.key).socket_dir),
        port=branch.port,
        user=base.superuser,
        dbname=base.database,
        autocommit=True,
        connect_timeout=10,
        options="-c search_path=pg_catalog,pg_temp -c log_statement=none",
    )


def _role_password(
    pool: Pool,
    base: BaseVersion,
    branch: Branch,
    secret: Future[str] | None,
    *,
    what: str,
    fix: str,
    keep: bool = False,
    flush: bool = True,
) -> None:
    """Give the branch's login role the password whose SCRAM verifier ``secret`` yields (None:
    no password at all) and its rights, in one statement on the engine's connection: the one
    this process holds for the branch (see ``held``) if it still answers, else a new one.
    With ``keep``, the connection is held afterwards for the branch's claim; ``flush``: see
    ``roles.set_password``."""
    import psycopg

    from pgoverlay.runner.branch import held
    from pgoverlay.runner.postgres import sqlerror

    key = os.fspath(layout(pool, branch.key).socket_dir)
    try:
        with sqlerror.wrapped(BranchStartError, what=what, fix=fix):
            kept = held.take(key)
            if kept is not None:
                try:
                    with kept:
                        _alter_role(pool, kept, branch, secret, flush=flush)
                    return
                except psycopg.Error:
                    pass  # its server restarted or ended the session: a new one tries again
            conn = _engine_connection(pool, branch, base)
            try:
                _alter_role(pool, conn, branch, secret, flush=flush)
            except BaseException:
                conn.close()
                raise
            if keep:
                held.keep(key, conn)
            else:
                conn.close()
    except BranchStartError as err:
        if "No space left on device" in str(err):
            # The engine's session is the branch's first: it copies a catalog file up into the
            # layer, which a full pool refuses (as _check_ready says for a client's session).
            raise PoolFullError(
                f"the pool is full, so branch {branch.name} could not serve its first "
                "connection: destroy branches (`pgoverlay branch list` shows their sizes) or "
                "grow the pool"
            ) from None
        raise


def _alter_role(
    pool: Pool,
    conn: psycopg.Connection[Any],
    branch: Branch,
    secret: Future[str] | None,
    *,
    flush: bool,
) -> None:
    from pgoverlay.runner.postgres import roles

    roles.set_password(
        conn,
        user=branch.user,
        secret=None if secret is None else secret.result(),
        superuser=pool.settings.branch_superuser,
        createrole=pool.settings.branch_createrole,
        flush=flush,
    )


def _lock_login(pool: Pool, base: BaseVersion, branch: Branch) -> None:
    """A warm branch's login role has no password at all until it is claimed: nobody can log
    in to it, whatever the base was prepared with."""
    _role_password(
        pool,
        base,
        branch,
        None,
        what=f"warm branch {branch.name} started but its login role {branch.user} could not "
        "be locked",
        fix="it is undone; the base's superuser must be able to log in over the branch's "
        "socket (seed the base again)",
        keep=True,
    )
    _check_listening(pool, branch)


def _claim_login(pool: Pool, base: BaseVersion, branch: Branch, secret: Future[str]) -> None:
    """A claimed warm branch's password (``secret``: its verifier, being computed).

    Its commit does not wait for the branch's WAL flush (a user waits for the claim): if the
    server dies before the WAL writer wrote it, the role is back to no password, which lets
    nobody in, and ``restart``, which brings every ready branch back, sets the password
    again from the registry."""
    _role_password(
        pool,
        base,
        branch,
        secret,
        what=f"warm branch {branch.slot} was claimed as {branch.name} but its login role "
        f"{branch.user} could not be given the branch's password",
        fix="it is undone and the branch created cold; if warm claims keep failing, retire "
        f"the warm branches (`pgoverlay base warm {base.name} --count 0`)",
        flush=False,
    )


def _check_listening(pool: Pool, branch: Branch) -> None:
    """A warm branch answers on its TCP port and refuses its role any password there: what
    a claim relies on, checked before the branch counts as warm."""
    import psycopg

    kwargs = {**connection(pool, branch).connect_kwargs(), "password": secrets.token_hex(8)}
    try:
        with psycopg.connect(**kwargs, connect_timeout=10):
            pass
    except psycopg.OperationalError as err:
        if "password authentication failed" in str(err):
            return
        raise BranchStartError(
            f"warm branch {branch.name} started but a client connection failed: {err}"
        ) from None
    raise BranchStartError(
        f"warm branch {branch.name} let its role {branch.user} log in with a made-up password: "
        "it is undone; check the pool's pg_hba.conf handling (`pgoverlay doctor`)"
    )


# A server told to read its pg_hba.conf again (``restart``) may still refuse a login it is about
# to admit: Postgres 16's postmaster reads it in its main loop, not at the signal.
RELOAD_WAIT = 5.0


def _check_ready(pool: Pool, branch: Branch) -> None:
    """Ready means a real connection, over TCP with the branch password, succeeded."""
    import psycopg

    def logged_in(*, last: bool = False) -> bool | None:
        try:
            with psycopg.connect(
                **connection(pool, branch).connect_kwargs(), connect_timeout=10
            ) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError as err:
            if "pg_hba.conf rejects" in str(err) and not last:
                return None
            raise
        return True

    try:
        try:
            polling.wait_for(logged_in, timeout=RELOAD_WAIT, what=f"branch {branch.name}'s login")
        except TimeoutExpiredError:
            logged_in(last=True)  # once more: its refusal is the error
    except psycopg.Error as err:
        if "No space left on device" in str(err):
            # The first session copies a catalog file up into the layer: on a full pool that
            # fails here rather than while the server starts (runtime.local says the same).
            raise PoolFullError(
                f"the pool is full, so branch {branch.name} could not serve its first "
                "connection: destroy branches (`pgoverlay branch list` shows their sizes) or "
                "grow the pool"
            ) from None
        raise BranchStartError(
            f"branch {branch.name} started but a client connection failed: {err}"
        ) from None


def connection(pool: Pool, branch: Branch) -> Connection:
    """How a client logs in to ``branch``: over TCP at the pool's public host, as the branch's
    login role with its password. The one place a branch's connection details are put together
    (the service, the CLI, the demo and the migrations all take them from here)."""
    return Connection(
        host=pool.settings.public_host,
        port=branch.port,
        database=branch.database,
        user=branch.user,
        password=branch.password,
    )


# -- sagas --------------------------------------------------------------------------------


def _give_login(
    pool: Pool,
    base: BaseVersion,
    branch: Branch,
    secret: Future[str] | None,
    *,
    fresh: bool = True,
    then: Callable[[psycopg.Connection[Any]], None] | None = None,
) -> None:
    """A created or reset branch's password: one ``ALTER ROLE`` with its SCRAM verifier
    (``secret``, computed while the server started; None: computed here), whose commit does not
    wait for the WAL flush, as a claim's does not (``restart`` sets every ready branch's
    password again after a crash). A base prepared for another login role name has no role of
    this one: in a ``fresh`` branch (the base's files, no PR code run yet) it is then made in
    full (``roles.set_login``, whose DDL would fire event triggers); in a restarted one, whose
    role existed, that is refused: the engine runs no DDL where PR code has run. ``then`` is
    called with the same connection afterwards (a restart's ``reconcile``: one session, not
    two, before the branch admits clients)."""
    import psycopg

    from pgoverlay.runner.postgres import roles, sqlerror

    try:
        verifier = secret.result() if secret is not None else roles.scram_verifier(branch.password)
    except ValueError:  # a password of another form (an older release's): libpq hashes it
        verifier = None
    with (
        sqlerror.wrapped(
            BranchStartError,
            what=f"branch {branch.name} started but its login role {branch.user} could not be "
            "given the branch's password",
            fix="a create is undone, and `pgoverlay gc` finishes a reset; if it fails again, "
            f"the base's superuser {base.superuser} must be able to log in over the branch's "
            "socket (seed the base again)",
        ),
        _engine_connection(pool, branch, base) as conn,
    ):
        given = False
        if verifier is not None:
            try:
                roles.set_password(
                    conn,
                    user=branch.user,
                    secret=verifier,
                    superuser=pool.settings.branch_superuser,
                    createrole=pool.settings.branch_createrole,
                    flush=False,
                )
                given = True
            except psycopg.errors.UndefinedObject:
                if not fresh:
                    raise BranchStartError(
                        f"branch {branch.name} started but its login role {branch.user} is gone "
                        f"from it: reset the branch (`pgoverlay branch reset {branch.name}`)"
                    ) from None
                # no such role in this base: made below
        if not given:
            roles.set_login(
                conn,
                user=branch.user,
                password=branch.password,
                superuser=pool.settings.branch_superuser,
                createrole=pool.settings.branch_createrole,
                refresh=False,
            )
        if then is not None:
            then(conn)


def _mount_and_start(
    pool: Pool,
    base: BaseVersion,
    branch: Branch,
    *,
    saga: str,
    secret: Future[str] | None = None,
) -> None:
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
    _record_schema(pool, base, branch)
    if saga == "warm":
        _lock_login(pool, base, branch)  # its password comes with its claim
        return
    _give_login(pool, base, branch, secret)
    _check_ready(pool, branch)


def _record_schema(pool: Pool, base: BaseVersion, branch: Branch) -> None:
    """Keep the base version's schema, read in this branch while it is fresh and nobody but
    the engine can log in (no PR code has run in it, nor can), for the diffs of every branch
    of that version (``trace.schema``); once per version. A failure only costs those diffs."""
    import psycopg

    from pgoverlay.runner.trace import schema

    try:
        if schema.record_base(
            pool.schema_file(base.name, base.version),
            lambda: _engine_connection(pool, branch, base),
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
    from pgoverlay.runner.branch import held

    password, secret = held.password()  # being computed: a claim or a cold create sets it
    with flocks.hold(
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
        with pool.registry.transaction() as db:
            _check_free(pool, db, base, name, quota=quota)
            branch = Branch(
                **asked,
                base_name=base.name,
                base_version=base.version,
                state="creating",
                step="registered",
                port=pick_port(pool, pool.registry.used_ports(db)),
                runtime=chosen,
                user=pool.settings.branch_user,
                database=base.database,
                ready_at=None,
                slot=name,
            )
            pool.registry.insert_branch(db, branch)
        fault(pool, "create:registered")
        try:
            _make_dirs(
                pool,
                layout(pool, name),
                user=branch.user,
                superuser=base.superuser,
                database=branch.database,
            )
            pool.registry.update_branch(name, durable=False, step="dirs")
            fault(pool, "create:dirs")
            _mount_and_start(pool, base, branch, saga="create", secret=secret)
        except BaseException:
            log.warning("creating branch %s failed; undoing", name)
            teardown(pool, branch)
            raise
        pool.registry.update_branch(name, state="ready", step="", ready_at=time.time())
    log.info("branch %s ready on port %s", name, branch.port)
    return _get(pool, name)


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
    _claim_login(pool, base, claimed, secret)
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
    with flocks.hold(
        pool.lock_path("branch", slot), timeout=pool.settings.lock_wait, what=f"branch {slot}"
    ):
        with pool.registry.transaction() as db:
            _check_free(pool, db, base, slot)
            branch = Branch(
                name=slot,
                slot=slot,
                base_name=base.name,
                base_version=base.version,
                state="creating",
                step="registered",
                port=pick_port(pool, pool.registry.used_ports(db)),
                runtime=runtime,
                user=pool.settings.branch_user,
                password="",
                database=base.database,
                created_at=time.time(),
                ready_at=None,
                expires_at=None,
            )
            pool.registry.insert_branch(db, branch)
        fault(pool, "warm:registered")
        try:
            _make_dirs(
                pool,
                layout(pool, slot),
                user=branch.user,
                superuser=base.superuser,
                database=branch.database,
            )
            pool.registry.update_branch(slot, durable=False, step="dirs")
            _mount_and_start(pool, base, branch, saga="warm")
        except BaseException:
            log.warning("starting warm branch %s failed; undoing", slot)
            teardown(pool, branch)
            raise
        pool.registry.update_branch(slot, state="warm", step="", ready_at=time.time())
    return _get(pool, slot)


def teardown(pool: Pool, branch: Branch) -> None:
    """Stop, unmount and remove everything of ``branch``, then forget it. Idempotent."""
    from pgoverlay.runner.branch import held

    lay = layout(pool, branch.key)
    held.drop(os.fspath(lay.socket_dir))
    base = pool.registry.base(branch.base_name, branch.base_version)
    if base is not None:
        rt = runtime_for(pool, base, branch.runtime)
        rt.stop(lay, discard=True)
        rt.detach(lay)
    fault(pool, "destroy:stopped")
    _remove_dirs(lay)
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
    with flocks.hold(
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
    with flocks.hold(
        pool.lock_path("branch", name), timeout=pool.settings.lock_wait, what=f"branch {name}"
    ):
        branch = _get(pool, name)
        pool.registry.update_branch(name, state="resetting", step="")
        fault(pool, "reset:marked")
        finish_reset(pool, branch)
    return _get(pool, name)


def base_of(pool: Pool, branch: Branch) -> BaseVersion:
    """The base version ``branch`` was made from; BaseMissingError if it is gone."""
    base = pool.registry.base(branch.base_name, branch.base_version)
    if base is None:
        raise BaseMissingError(
            f"base {branch.base_name} v{branch.base_version} of branch {branch.name} is gone"
        )
    return base


def finish_reset(pool: Pool, branch: Branch) -> None:
    base = base_of(pool, branch)
    lay = layout(pool, branch.key)
    rt = runtime_for(pool, base, branch.runtime)
    rt.stop(lay, discard=True)
    rt.detach(lay)
    _empty_workdir(lay.work)
    safefs.remove_tree(lay.upper)
    safefs.make_dir(lay.upper, uid=pool.owner.uid, gid=pool.owner.gid, mode=0o700)
    safefs.remove_tree(lay.log_file)
    # Written again, so a branch made by an earlier release gets today's pg_hba.conf.
    write_conf(pool, lay, user=branch.user, superuser=base.superuser, database=branch.database)
    release_freed(pool)
    pool.registry.update_branch(branch.name, durable=False, step="wiped")
    fault(pool, "reset:wiped")
    _mount_and_start(pool, base, branch, saga="reset")
    if pool.registry.grants(branch.name):
        from pgoverlay.runner.branch import grants

        grants.restore(pool, branch, base)
    pool.registry.update_branch(
        branch.name, state="ready", step="", ready_at=time.time(), suspended_at=None
    )


def restart(pool: Pool, branch: Branch) -> None:
    """Bring a ready branch whose server is gone (a reboot, a crash, a suspend) back up, with
    its password set again (a claim's did not wait for the WAL flush, see ``_claim_login``)
    and its roles made what the registry says (``reconcile``: a credential revoked or expired
    meanwhile is dropped, a password changed in SQL set back) while its server admits the
    engine alone; then it admits its clients."""
    from pgoverlay.runner.branch import reconcile
    from pgoverlay.runner.postgres import sqlerror

    base = base_of(pool, branch)
    lay = layout(pool, branch.key)
    rt = runtime_for(pool, base, branch.runtime, check=True)
    _make_socket_dir(pool, lay)
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

    _give_login(pool, base, branch, None, fresh=False, then=settle)
    _check_ready(pool, branch)


# -- suspend and wake ----------------------------------------------------------------------

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
    with flocks.hold(pool.lock_path("branch", name), timeout=wait, what=f"branch {name}"):
        branch = _get(pool, name)
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
            return _get(pool, name)
        finish_suspend(pool, branch)
    return _get(pool, name)


def finish_suspend(pool: Pool, branch: Branch) -> None:
    """Stop and unmount ``branch`` (marked ``suspending``), then mark it ``suspended``."""
    from pgoverlay.runner.branch import held

    base = base_of(pool, branch)
    lay = layout(pool, branch.key)
    held.drop(os.fspath(lay.socket_dir))
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
    branch = _get(pool, name)
    if branch.state not in WAKEABLE:
        return branch
    with flocks.hold(
        pool.lock_path("branch", name), timeout=pool.settings.lock_wait, what=f"branch {name}"
    ):
        branch = _get(pool, name)
        if branch.state not in WAKEABLE:
            return branch
        if branch.state == "suspending":  # a suspend was killed: finish it, then wake
            finish_suspend(pool, branch)
        pool.registry.update_branch(name, state="waking", step="")
        fault(pool, "wake:marked")
        finish_wake(pool, branch)
    return _get(pool, name)


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


# -- views --------------------------------------------------------------------------------


def _get(pool: Pool, name: str) -> Branch:
    branch = pool.registry.branch(check_name(name))
    if branch is None:
        raise BranchMissingError(
            f"no branch named {name}: see `pgoverlay branch list`, or create it with "
            f"`pgoverlay branch create {name}`"
        )
    return branch


def get(pool: Pool, name: str) -> Branch:
    return _get(pool, name)


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
    found = _get(pool, branch) if isinstance(branch, str) else branch
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
    branch = _get(pool, name)
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

    branch = _get(pool, name)
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
        _engine_connection(pool, branch, base) as conn,
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
