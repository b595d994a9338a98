"""Credentials granted in a running branch: a login role for one person (named after their
GitHub login), for the pull request's preview app, or for a job on another runner
(``grant_job``: the way in the network API gives a verified job instead of the branch role's
password), with a fresh password valid until an expiry, made by the engine as the base's
superuser on the branch's private socket.

Invariants:

- A role is pgoverlay's only if it is a member of the marker role ``ACCESS_ROLE`` (NOLOGIN,
  made by the engine, recognised by its comment). A role of the same name that is not (a
  production role copied with the base, the branch's own login role, the base's superuser) is
  never altered, granted or dropped: the grant is refused, naming it. A base that already has
  a role named ``ACCESS_ROLE`` without the engine's comment is refused the same way.
- The password is made here (``secrets.token_urlsafe``) and only its SCRAM verifier, computed
  in this process, reaches the server (in a statement the session does not log) and the
  registry; a person's password itself is returned once, to be shown once, and never logged.
  The preview app's is kept in the registry (root's, as the branch's own password is), so that
  each job of the pull request renews the deployed credential rather than replacing it; a
  job's is not (each ask mints a new one).
- Every grant is in the registry's ``grants`` table (who, which role, read-only or not, until
  when, who asked), so `access list`, gc and the audit know it without starting the branch;
  the rows go with their branch (``ON DELETE CASCADE``), as the roles go with its data. A reset
  gives the roles back from those rows (same verifier and expiry): the reviewers' passwords
  keep working across a pull request's pushes.
- Each grant, revoke and expiry is a line of the audit log (``audit.ENGINE_LOG``): who asked,
  the login, the branch, read-only or not, the expiry. Never a password or a verifier.
- A grant, a revoke and an expiry each hold the branch's file lock, so none of them races a
  reset or a destroy of the same branch. A grant is recorded before its role is made, and a
  revoke forgets it before its role is dropped: the registry is the truth, and a branch's
  roles are made what it says (``reconcile``) before its server admits anyone after a start
  (a wake, a restart), when a job asks for its password, and at every gc. So a revoke or an
  expiry while the branch is suspended, or a process killed between the steps, never leaves a
  login the registry does not know past the branch's next start or the next gc.

The branch's pg_hba.conf admits the members of ``ACCESS_ROLE`` to the branch's database over
TCP with SCRAM (``conf.hba``); a branch whose file predates that line gets today's file and a
reload at its first grant.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pgoverlay.errors import (
    AccessError,
    LockBusyError,
    PgoverlayError,
    RequestError,
    UnmaskedAccessError,
)
from pgoverlay.github.grammar import is_login
from pgoverlay.runner import branch as branches
from pgoverlay.runner.branch import access, conf, lookup
from pgoverlay.runner.names import ACCESS_ROLE
from pgoverlay.runner.pool import Pool, fault, flocks
from pgoverlay.runner.pool.registry import BaseVersion, Branch, StoredGrant

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

# What the marker role's comment says: a role of that name without it is not pgoverlay's.
MARKER_COMMENT = "pgoverlay: members are the credentials pgoverlay grants in this branch"
# How long a revoke waits for each session of the role to end after it is told to.
TERMINATE_WAIT_MS = 5000
# How long a job's credential lasts (``grant_job``): GitHub ends a job on a hosted runner after
# 6 hours.
JOB_SECONDS = 6 * 3600.0


@dataclass(frozen=True)
class Granted:
    """A grant as made: its registry row, and the password, to be shown once."""

    grant: StoredGrant
    password: str = field(repr=False)
    renewed: bool = False  # the preview app's credential, as deployed, given a new expiry


def role_for_login(login: str) -> str:
    """The role of GitHub user ``login``: the login, lower-cased (GitHub's logins are
    case-insensitive; Postgres's names are not). A RequestError when it is not a GitHub login."""
    if not is_login(login):
        shown = login if len(login) <= 40 else f"{login[:40]}... ({len(login)} characters)"
        raise RequestError(
            f"login: {shown!r} is not a GitHub login: 1-39 letters, digits and single hyphens, "
            "not first or last (e.g. octo-cat)"
        )
    return login.lower()


def app_role(branch: Branch) -> str:
    """The preview app's role of ``branch``: ``app_pr_<n>`` for a pull request's branch, else
    ``app_<branch name>`` with every character a role name should not hold made ``_``. A GitHub
    login has no ``_``: no person's role can be named so."""
    if branch.pr:
        return f"app_pr_{branch.pr}"
    return "app_" + re.sub(r"[^a-z0-9_]", "_", branch.name.lower())[:59]


def job_role(branch: Branch) -> str:
    """The role a job on another runner logs in to ``branch`` with (``grant_job``):
    ``job_pr_<n>``, else ``job_<branch name>`` as ``app_role`` makes it. No GitHub login has
    ``_``, nor does any preview app's role start so."""
    if branch.pr:
        return f"job_pr_{branch.pr}"
    return "job_" + re.sub(r"[^a-z0-9_]", "_", branch.name.lower())[:59]


def _ttl(pool: Pool, ttl: float | None) -> float:
    s = pool.settings
    seconds = s.access_ttl if ttl is None else float(ttl)
    if seconds > s.access_max_ttl:
        raise RequestError(
            f"ttl: {seconds:g} s is longer than a credential may last ({s.access_max_ttl:g} s, "
            "PGOVERLAY_ACCESS_MAX_TTL): ask for a shorter one, or raise that setting"
        )
    return seconds


def _running(pool: Pool, name: str) -> tuple[Branch, BaseVersion]:
    b = branches.get(pool, name)
    base = pool.registry.base(b.base_name, b.base_version)
    if b.state != "ready" or base is None or not lookup.is_running(pool, b):
        raise AccessError(
            f"branch {name} is not running (state {b.state}): its credentials live in its "
            "server; start it with `pgoverlay gc`, then ask again"
        )
    return b, base


def _lock(pool: Pool, name: str, *, timeout: float | None = None) -> Any:
    wait = pool.settings.lock_wait if timeout is None else timeout
    return flocks.locked(pool.lock_path("branch", name), timeout=wait, what=f"branch {name}")


def _sql_failed(name: str, what: str) -> Any:
    from pgoverlay.runner.postgres import sqlerror

    return sqlerror.wrapped(
        AccessError,
        what=f"branch {name}: {what}",
        fix=f"check that it runs (`pgoverlay branch status {name}`), then ask again",
    )


# -- grant --------------------------------------------------------------------------------


def grant(
    pool: Pool,
    name: str,
    *,
    login: str | None,
    read_only: bool = False,
    ttl: float | None = None,
    app: bool = False,
    rotate: bool = False,
    uid: int = 0,
    vouched_by: str | None = None,
) -> Granted:
    """Give ``login`` (a GitHub login; with ``app``, none: the preview app's role) a role in
    running branch ``name`` with a fresh password valid for ``ttl`` seconds (the default
    ``access_ttl``, at most ``access_max_ttl``). Granting a login again replaces its password,
    expiry and read-only-ness. ``uid`` asked for it, on behalf of ``vouched_by`` when the front
    door did (``github:LOGIN``).

    The preview app's credential is the one a deployment holds (the Action's `database-url`):
    it lasts as long as the branch (until the branch's expiry, at most ``access_max_ttl``; a
    ``ttl`` asks for less), and asking for it again (each job of the pull request, or an
    admin's ``--app``) renews that one: same password, a new expiry. Only ``rotate`` mints a
    new password, which the deployed preview loses (its open sessions stay until they end).

    Read-write: the role is a member of the branch's login role (INHERIT), so it may do what a
    migration may. Read-only: a member of ``pg_read_all_data`` (Postgres 14 and later), with
    ``default_transaction_read_only`` on. That stops writes to what the role reads through
    ``pg_read_all_data``: it holds no privilege to write any table, and its transactions start
    read-only. It does not stop what PUBLIC may do in the base, which every role may: a table,
    schema or function granted to PUBLIC (a base from a cluster made before Postgres 15 lets
    PUBLIC create in schema ``public``), temporary tables (PUBLIC's TEMP on the database), or
    a session that turns ``default_transaction_read_only`` off for itself, then writes where
    PUBLIC may.

    A personal credential on a branch of an unmasked base is refused unless the admin allows
    it (``access_unmasked``): that branch holds production's personal data. The preview app's
    role is not refused there: it is the pull request's own code, which already runs against
    the branch as its login role (its migrations), and a person gets nothing through it that
    the workflow's owner does not already have (the branch's password, `branch connect`)."""
    s = pool.settings
    if app:
        if login is not None:
            raise RequestError("login: an app credential names no login (its role is the app's)")
    elif login is None:
        raise RequestError("login: name the GitHub login to grant to (or ask for an app role)")
    elif rotate:
        raise RequestError(
            "rotate: only the preview app's credential is renewed when asked again; a person's "
            "gets a new password at each grant (ask without rotate)"
        )
    seconds = _ttl(pool, ttl if ttl is not None or not app else s.access_max_ttl)
    with _lock(pool, name):
        b, base = _running(pool, name)
        role = app_role(b) if app else role_for_login(str(login))
        if not app and not base.masked and not s.access_unmasked:
            raise UnmaskedAccessError(
                f"branch {name} is of base {base.name} v{base.version}, which is not masked: "
                "its data is production's, personal data included, and personal credentials "
                "to unmasked bases are off. Seed the base with masking rules (`pgoverlay base "
                "seed --mask RULES.yml`), or allow them with PGOVERLAY_ACCESS_UNMASKED=true"
            )
        if read_only and (base.pg_major or 0) < 14:
            raise AccessError(
                f"branch {name} runs Postgres {base.pg_major}: a read-only credential needs "
                "pg_read_all_data (Postgres 14 and later); grant a read-write one instead"
            )
        from pgoverlay.runner.postgres import roles

        now = time.time()
        until = now + seconds
        if app and ttl is None and b.expires_at is not None:
            until = min(until, max(b.expires_at, now))  # as long as the branch
        kept = None if rotate else _renewable(pool.registry.grant(name, role), now=now)
        if kept is not None and kept.read_only == read_only:
            password, verifier = kept.password, kept.verifier
        else:
            password = secrets.token_urlsafe(24)
            verifier = roles.scram_verifier(password)
        made = StoredGrant(
            branch=name,
            role=role,
            login=role,
            read_only=read_only,
            app=app,
            verifier=verifier,
            # whole seconds: the role's VALID UNTIL says the same instant as the registry
            expires_at=float(int(until)),
            granted_by=vouched_by or f"uid:{uid}",
            granted_at=now,
            password=password if app else "",
        )
        renewed = kept is not None and kept.verifier == verifier
        _record_and_apply(pool, b, base, made)
    _audit_granted(pool, made, uid=uid, vouched_by=vouched_by, renewed=renewed)
    return Granted(grant=made, password=password, renewed=renewed)


def _record_and_apply(pool: Pool, b: Branch, base: BaseVersion, made: StoredGrant) -> None:
    """Keep ``made`` in the registry, then make its role in running branch ``b`` (the
    branch's lock is held). Recorded first: a role the branch may hold is one the registry
    knows (gc revokes it at its expiry, whatever became of this process). A grant that fails
    puts the row back as it was."""
    name, role = made.branch, made.role
    before = pool.registry.grant(name, role)
    if not pool.registry.save_grant(made):  # cannot happen under the branch's lock
        raise AccessError(f"branch {name} was destroyed while {role} was granted")
    try:
        fault(pool, "grant:recorded")
        with (
            _sql_failed(name, f"the role {role} could not be granted"),
            access.engine_connection(pool, b, base) as conn,
        ):
            _admit_members(pool, b, base, conn)
            _apply(conn, made, branch_user=b.user)
    except BaseException:
        if before is None:
            pool.registry.delete_grant(name, role)
        else:
            pool.registry.save_grant(before)
        raise
    fault(pool, "grant:applied")


def grant_job(pool: Pool, name: str, *, granted_by: str, uid: int = 0) -> Granted:
    """The credential a job on another runner logs in with, through the front door, in running
    branch ``name``: the network API's answer to a verified job (or listener) asking for the
    branch's connection, instead of the branch role's own password (which PR SQL can change,
    so the door never admits that role). ``granted_by``: the caller the engine verified
    (``job:OWNER/REPO``, ``listener:OWNER/REPO``).

    One role per branch (``job_pr_<n>``), read-write: a member of the branch's login role with
    INHERIT, whose sessions start as that role (``ALTER ROLE ... SET role``), so what the job's
    migrations create is owned by the branch role, as when they run on the pool's host with its
    own password. Each ask mints a new password (the job before it loses its way in; the
    branch's hold keeps one job of a pull request at a time) valid for ``JOB_SECONDS`` at most,
    the longest a GitHub job runs. Only its verifier is kept: the password is in the answer
    alone."""
    from pgoverlay.runner.postgres import roles

    seconds = min(JOB_SECONDS, pool.settings.access_max_ttl)
    with _lock(pool, name):
        b, base = _running(pool, name)
        role = job_role(b)
        now = time.time()
        password = secrets.token_urlsafe(24)
        made = StoredGrant(
            branch=name,
            role=role,
            login=role,
            read_only=False,
            app=False,
            verifier=roles.scram_verifier(password),
            expires_at=float(int(now + seconds)),
            granted_by=granted_by,
            granted_at=now,
            job=True,
        )
        _record_and_apply(pool, b, base, made)
    _audit_granted(pool, made, uid=uid, vouched_by=granted_by, job=True)
    return Granted(grant=made, password=password)


def _renewable(found: StoredGrant | None, *, now: float) -> StoredGrant | None:
    """``found`` when it is a preview app's credential that asking again renews: unexpired,
    and its password kept (one granted by an earlier release is replaced)."""
    if found is None or not found.app or not found.password or found.expires_at <= now:
        return None
    return found


def _marker(conn: psycopg.Connection[Any], name: str) -> None:
    """Make the marker role, or check that the one there is pgoverlay's."""
    from psycopg import sql

    # Ours: made with the engine's comment, and administered by superusers alone. On Postgres
    # 16 a branch role with CREATEROLE could make a role of that name (and would administer
    # it, so could comment it as the engine does): it is not taken for the engine's.
    row = conn.execute(
        "SELECT shobj_description(g.oid, 'pg_authid'), EXISTS (SELECT 1 FROM pg_auth_members m "
        "JOIN pg_roles r ON r.oid = m.member WHERE m.roleid = g.oid AND m.admin_option "
        "AND NOT r.rolsuper) FROM pg_roles g WHERE g.rolname = %s",
        (ACCESS_ROLE,),
    ).fetchone()
    if row is None:
        conn.execute(
            sql.SQL("CREATE ROLE {} NOLOGIN NOINHERIT").format(sql.Identifier(ACCESS_ROLE))
        )
        conn.execute(
            sql.SQL("COMMENT ON ROLE {} IS {}").format(
                sql.Identifier(ACCESS_ROLE), sql.Literal(MARKER_COMMENT)
            )
        )
    elif row[0] != MARKER_COMMENT or row[1]:
        raise AccessError(
            f"branch {name} has a role named {ACCESS_ROLE} that pgoverlay did not make (the "
            "base's, or one the branch's own code made): no credential is granted beside it. "
            "Rename that role in the source and seed the base again, or reset the branch"
        )


def _ours(conn: psycopg.Connection[Any], role: str) -> bool | None:
    """Whether ``role`` is a member of the marker role; None when there is no such role."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid "
        "WHERE m.member = r.oid AND g.rolname = %s) FROM pg_roles r WHERE r.rolname = %s",
        (ACCESS_ROLE, role),
    ).fetchone()
    return None if row is None else bool(row[0])


def _apply(conn: psycopg.Connection[Any], made: StoredGrant, *, branch_user: str) -> None:
    """Make ``made``'s role as it says, in one transaction (the session logs no statement)."""
    from psycopg import sql

    role = sql.Identifier(made.role)
    with conn.transaction():
        conn.execute("SET LOCAL log_statement = 'none'")
        _marker(conn, made.branch)
        ours = _ours(conn, made.role)
        if ours is False:
            raise AccessError(
                f"branch {made.branch} has a role named {made.role} that pgoverlay did not make "
                "(a role of the base, such as production's): it is never taken over. Grant "
                "the credential to another login"
            )
        attributes = sql.SQL(
            "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT "
            "PASSWORD {} VALID UNTIL {}"
        ).format(sql.Literal(made.verifier), sql.Literal(_iso(made.expires_at)))
        verb = sql.SQL("ALTER ROLE" if ours else "CREATE ROLE")
        conn.execute(sql.SQL("{} {} {}").format(verb, role, attributes))
        grant_to = sql.SQL("GRANT {} TO {}")
        conn.execute(grant_to.format(sql.Identifier(ACCESS_ROLE), role))
        branch_role = sql.Identifier(branch_user)
        reader = sql.Identifier("pg_read_all_data")
        # A read-write login made read-only: its open sessions go too, as one of them may have
        # SET ROLE to the branch role, which outlives the membership it was checked against.
        downgraded = bool(ours) and made.read_only and _member(conn, made.role, branch_user)
        if made.read_only:
            conn.execute(sql.SQL("REVOKE {} FROM {}").format(branch_role, role))
            conn.execute(grant_to.format(reader, role))
            conn.execute(
                sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(role)
            )
        else:
            conn.execute(sql.SQL("REVOKE {} FROM {}").format(reader, role))
            conn.execute(grant_to.format(branch_role, role))
            conn.execute(sql.SQL("ALTER ROLE {} RESET default_transaction_read_only").format(role))
        if made.job:
            # Its sessions act as the branch role (a session may say otherwise, `SET ROLE
            # NONE`): what a job's migrations make is the branch role's, as in a local run.
            conn.execute(sql.SQL("ALTER ROLE {} SET role = {}").format(role, branch_role))
    if downgraded:
        conn.execute(
            "SELECT pg_terminate_backend(pid, %s) FROM pg_stat_activity "
            "WHERE usename = %s AND pid <> pg_backend_pid()",
            (TERMINATE_WAIT_MS, made.role),
        )


def _member(conn: psycopg.Connection[Any], role: str, of: str) -> bool:
    """Whether ``role`` is a direct member of ``of``."""
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_auth_members m "
        "JOIN pg_roles r ON r.oid = m.roleid JOIN pg_roles u ON u.oid = m.member "
        "WHERE r.rolname = %s AND u.rolname = %s)",
        (of, role),
    ).fetchone()
    return bool(row and row[0])


def _admit_members(pool: Pool, b: Branch, base: BaseVersion, conn: psycopg.Connection[Any]) -> None:
    """A branch made before its pg_hba.conf admitted ``ACCESS_ROLE`` gets today's file, and
    its server reloads it."""
    lay = branches.layout(pool, b.key)
    wanted = conf.hba(user=b.user, superuser=base.superuser, database=b.database)
    try:
        with open(lay.conf / "pg_hba.conf", "rb") as current:  # root's file in root's folder
            if current.read() == wanted.encode():
                return
    except FileNotFoundError:
        pass
    conf.write_conf(pool, lay, user=b.user, superuser=base.superuser, database=b.database)
    conn.execute("SELECT pg_reload_conf()")
    log.info("branch %s: pg_hba.conf rewritten to admit %s", b.name, ACCESS_ROLE)


# -- revoke, expire, restore --------------------------------------------------------------


def revoke(
    pool: Pool,
    name: str,
    login: str,
    *,
    uid: int = 0,
    event: str = "access.revoke",
    lock_wait: float | None = None,
) -> bool:
    """Take ``login``'s credential (a GitHub login, or the app role's name) out of branch
    ``name``: it is forgotten first, then, in a running branch, its open sessions end and its
    role is dropped, what it owned given to the branch's login role. False when it had none.

    Whatever the branch's state, a credential that is forgotten is gone at the next login: a
    branch that is not running drops the role before its server admits anyone again
    (``reconcile``, at its wake or restart), and a revoke killed after forgetting, or whose
    drop failed, leaves a role that the next gc, a revoke again or the next wake drops."""
    role = login.lower()
    with _lock(pool, name, timeout=lock_wait):
        found = pool.registry.grant(name, role)
        b = branches.get(pool, name)
        if found is not None:
            pool.registry.delete_grant(name, role)
            fault(pool, "revoke:forgotten")
        base = pool.registry.base(b.base_name, b.base_version)
        if b.state == "ready" and base is not None and lookup.is_running(pool, b):
            with (
                _sql_failed(
                    name,
                    f"the credential {role} is forgotten, but its role could not be dropped "
                    "(the next gc drops it)",
                ),
                access.engine_connection(pool, b, base) as conn,
            ):
                dropped = _drop(conn, role, branch_user=b.user)
            if found is None and dropped:  # a revoke killed after forgetting: finished here
                log.info("%s: %s in branch %s (a role its grant had left)", event, role, name)
                return True
    if found is None:
        return False
    _audit_gone(pool, event, found, branch=name, uid=uid)
    log.info("%s: %s in branch %s", event, role, name)
    return True


def _drop(conn: psycopg.Connection[Any], role: str, *, branch_user: str) -> bool:
    """Drop pgoverlay's ``role``: no new login first, then its sessions are ended (and waited
    for), then what it owns goes to ``branch_user`` and the role goes. False when there was no
    such role of pgoverlay's."""
    from psycopg import sql

    if not _ours(conn, role):
        return False  # gone already, or never ours: left alone
    ident = sql.Identifier(role)
    conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(ident))
    conn.execute(
        "SELECT pg_terminate_backend(pid, %s) FROM pg_stat_activity "
        "WHERE usename = %s AND pid <> pg_backend_pid()",
        (TERMINATE_WAIT_MS, role),
    )
    with conn.transaction():
        conn.execute(
            sql.SQL("REASSIGN OWNED BY {} TO {}").format(ident, sql.Identifier(branch_user))
        )
        conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        conn.execute(sql.SQL("DROP ROLE {}").format(ident))
    return True


def listed(pool: Pool, name: str) -> list[StoredGrant]:
    """The credentials granted in branch ``name`` (from the registry: the branch need not run)."""
    branches.get(pool, name)
    return pool.registry.grants(name)


def expire(pool: Pool, *, now: float | None = None) -> tuple[list[str], list[str]]:
    """Revoke every grant past its expiry (gc): ``(done, problems)``. A branch another process
    holds is left for the next gc."""
    now = time.time() if now is None else now
    done: list[str] = []
    problems: list[str] = []
    for g in pool.registry.grants():
        if g.expires_at > now:
            continue
        try:
            if revoke(pool, g.branch, g.role, event="access.expire", lock_wait=0):
                done.append(f"{g.role} in {g.branch}")
        except LockBusyError:
            continue
        except PgoverlayError as err:
            problems.append(f"credential {g.role} in {g.branch}: {err}")
            log.warning("gc could not remove credential %s of %s: %s", g.role, g.branch, err)
    return done, problems


def restore(pool: Pool, b: Branch, base: BaseVersion) -> None:
    """Give a reset branch its credentials back (the reset's lock is held): each unexpired
    grant's role as the registry keeps it, same verifier and expiry. One that cannot be given
    back does not fail the reset: its grant is forgotten, said in the audit log and the
    engine's log (grant it again)."""
    for g in pool.registry.grants(b.name):
        try:
            if g.expires_at <= time.time():
                raise AccessError("it expired")
            with (
                _sql_failed(b.name, f"the role {g.role} could not be given back after the reset"),
                access.engine_connection(pool, b, base) as conn,
            ):
                _apply(conn, g, branch_user=b.user)
        except PgoverlayError as err:
            log.warning(
                "branch %s: credential %s not given back after its reset: %s", b.name, g.role, err
            )
            pool.registry.delete_grant(b.name, g.role)
            _audit_gone(
                pool,
                "access.revoke",
                g,
                branch=b.name,
                reason=f"not given back after the branch's reset: {err}",
            )


def forget(pool: Pool, b: Branch) -> None:
    """The audit lines of the credentials a destroyed branch takes with it (its registry rows
    go with its own, its roles with its data)."""
    kept = pool.registry.grants(b.name)
    for g in kept:
        _audit_gone(pool, "access.revoke", g, branch=b.name, reason="branch destroyed")


# -- audit --------------------------------------------------------------------------------


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def _audit_gone(
    pool: Pool, event: str, g: StoredGrant, *, branch: str, uid: int = 0, **extra: object
) -> None:
    """The line of a credential that is gone (revoked, expired, or taken with its branch)."""
    _audit(
        pool,
        event,
        uid=uid,
        login=g.login,
        role=g.role,
        branch=branch,
        read_only=g.read_only,
        app=g.app,
        expires_at=_iso(g.expires_at),
        **extra,
    )


def _audit_granted(
    pool: Pool,
    g: StoredGrant,
    *,
    uid: int,
    vouched_by: str | None,
    renewed: bool | None = None,
    **extra: object,
) -> None:
    """The audit line and the log line of a credential granted (or renewed): never its
    password or verifier."""
    _audit(
        pool,
        "access.grant",
        uid=uid,
        vouched_by=vouched_by,
        login=g.login,
        role=g.role,
        branch=g.branch,
        read_only=g.read_only,
        app=g.app,
        **extra,
        expires_at=_iso(g.expires_at),
        **({} if renewed is None else {"renewed": renewed}),
    )
    log.info(
        "%s %s in branch %s until %s",
        "renewed" if renewed else "granted",
        g.role,
        g.branch,
        _iso(g.expires_at),
    )


def _audit(pool: Pool, event: str, **fields: object) -> None:
    """One line of the engine's audit log (root's, mode 0600, in ``<home>/audit``)."""
    from pgoverlay.runner import audit

    audit.engine_line(pool.home, event, **fields)
