"""The ways into a branch: the engine's own connection over the branch's socket, its login
role's password (set on a create, a reset, a claim and a restart; none while warm), the checks that
a client can log in, and a client's connection details."""

from __future__ import annotations

import os
import secrets
from typing import TYPE_CHECKING, Any

from pgoverlay.errors import BranchStartError, PoolFullError, TimeoutExpiredError
from pgoverlay.runner import polling
from pgoverlay.runner.branch.dirs import layout
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.service.views import Connection

# psycopg, and the login role's SQL (postgres/roles.py), are imported where a server is
# talked to: `branch list` and the other views start without them.
if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Future

    import psycopg


def engine_connection(pool: Pool, branch: Branch, base: BaseVersion) -> psycopg.Connection[Any]:
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


def role_password(
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
    this process holds for the branch (see ``primed``) if it still answers, else a new one.
    With ``keep``, the connection is held afterwards for the branch's claim; ``flush``: see
    ``roles.set_password``."""
    import psycopg

    from pgoverlay.runner.branch import primed
    from pgoverlay.runner.postgres import sqlerror

    def verifier() -> str | None:
        return None if secret is None else secret.result()

    key = os.fspath(layout(pool, branch.key).socket_dir)
    try:
        with sqlerror.wrapped(BranchStartError, what=what, fix=fix):
            kept = primed.take(key)
            if kept is not None:
                try:
                    with kept:
                        alter_role(pool, kept, user=branch.user, secret=verifier(), flush=flush)
                    return
                except psycopg.Error:
                    pass  # its server restarted or ended the session: a new one tries again
            conn = engine_connection(pool, branch, base)
            try:
                alter_role(pool, conn, user=branch.user, secret=verifier(), flush=flush)
            except BaseException:
                conn.close()
                raise
            if keep:
                primed.keep(key, conn)
            else:
                conn.close()
    except BranchStartError as err:
        if "No space left on device" in str(err):
            # The engine's session is the branch's first: it copies a catalog file up into the
            # layer, which a full pool refuses (as check_ready says for a client's session).
            raise _full(branch) from None
        raise


def _full(branch: Branch) -> PoolFullError:
    """A branch's first session failed for want of space: it copies a catalog file up into the
    layer, which a full pool refuses."""
    return PoolFullError(
        f"the pool is full, so branch {branch.name} could not serve its first connection: "
        "destroy branches (`pgoverlay branch list` shows their sizes) or grow the pool"
    )


def alter_role(
    pool: Pool,
    conn: psycopg.Connection[Any],
    *,
    user: str,
    secret: str | None,
    flush: bool = True,
) -> None:
    """Give the branch's login role ``user`` the rights the pool's settings give it and the
    password whose SCRAM verifier is ``secret`` (``roles.set_password``)."""
    from pgoverlay.runner.postgres import roles

    roles.set_password(
        conn,
        user=user,
        secret=secret,
        superuser=pool.settings.branch_superuser,
        createrole=pool.settings.branch_createrole,
        flush=flush,
    )


def lock_login(pool: Pool, base: BaseVersion, branch: Branch) -> None:
    """A warm branch's login role has no password at all until it is claimed: nobody can log
    in to it, whatever the base was prepared with."""
    role_password(
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


def claim_login(pool: Pool, base: BaseVersion, branch: Branch, secret: Future[str]) -> None:
    """A claimed warm branch's password (``secret``: its verifier, being computed).

    Its commit does not wait for the branch's WAL flush (a user waits for the claim): if the
    server dies before the WAL writer wrote it, the role is back to no password, which lets
    nobody in, and ``restart``, which brings every ready branch back, sets the password
    again from the registry."""
    role_password(
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


def check_ready(pool: Pool, branch: Branch) -> None:
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
            raise _full(branch) from None
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


def give_login(
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
        engine_connection(pool, branch, base) as conn,
    ):
        given = False
        if verifier is not None:
            try:
                alter_role(pool, conn, user=branch.user, secret=verifier, flush=False)
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
