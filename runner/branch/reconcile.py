"""A branch's login roles made what the registry says, whatever happened in the branch meanwhile.

The registry is the truth about who may log in to a branch: its ``grants`` rows, and the
branch's own password (``Branch.password``). The branch's data says what Postgres will let in,
and it can fall behind or be changed: a credential revoked or expired while the branch was
suspended (its data was not running, so its role stayed), a revoke killed between its steps,
or SQL run in the branch (PR code, or a read-write reviewer who ``SET ROLE``s to the branch
role) that changed a role's password with ``ALTER ROLE ... PASSWORD``. ``reconcile`` puts the
data back in line with the registry, on the engine's own connection (the base's superuser on
the private socket, which needs no password: nothing PR SQL does to a role's password stops
the engine).

Invariants, once ``reconcile`` has run on a branch:

- every member of ``ACCESS_ROLE`` has an unexpired grant row: any other is dropped (its
  sessions ended first, as a revoke does), and an expired row is forgotten with it, audited
  as ``access.expire``;
- every unexpired row's role exists with the row's verifier and ``VALID UNTIL``: a password
  someone changed in SQL is set back, a role a killed grant never made is made;
- the branch's login role has the branch's own password (one that was changed in SQL is set
  back), unless the branch has none yet (a warm branch before its claim).

When it runs: at every start of a branch's server before any client may log in (``restart``:
a wake, gc's restart of a crashed server; the server starts admitting only the engine, see
``conf.hba``), when a job asks for the branch's password (``LocalEngine.connection``), and at
every gc for each running branch (``sweep``). Always under the branch's lock, so it never races
a grant, a revoke, a reset or a destroy of the same branch.
"""

from __future__ import annotations

import base64
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pgoverlay.errors import BranchError, LockBusyError, PgoverlayError
from pgoverlay.runner import branch as branches
from pgoverlay.runner.branch import access, lookup
from pgoverlay.runner.names import ACCESS_ROLE
from pgoverlay.runner.pool import Pool, flocks

if TYPE_CHECKING:
    import psycopg

    from pgoverlay.runner.pool.registry import BaseVersion, Branch

log = logging.getLogger(__name__)


@dataclass
class Reconciled:
    """What one reconcile changed in a branch."""

    dropped: list[str] = field(default_factory=list)  # roles with no unexpired grant
    restored: list[str] = field(default_factory=list)  # roles set back to their grant
    branch_password: bool = False  # the branch role's password was set back

    def __bool__(self) -> bool:
        return bool(self.dropped or self.restored or self.branch_password)

    def lines(self) -> list[str]:
        found = []
        if self.dropped:
            found.append("dropped " + ", ".join(self.dropped))
        if self.restored:
            found.append("set back " + ", ".join(self.restored))
        if self.branch_password:
            found.append("set the branch role's password back")
        return found


def verifies(stored: str | None, password: str) -> bool:
    """Whether the SCRAM verifier ``stored`` (a ``pg_authid.rolpassword``) is ``password``'s:
    the verifier computed again with its own salt and iterations is the same."""
    from pgoverlay.runner.postgres import roles

    if not stored or not stored.startswith("SCRAM-SHA-256$"):
        return False
    try:
        head, _keys = stored[len("SCRAM-SHA-256$") :].split("$", 1)
        iterations, salt = head.split(":", 1)
        again = roles.scram_verifier(
            password, salt=base64.b64decode(salt, validate=True), iterations=int(iterations)
        )
    except ValueError:
        return False
    return again == stored


def _marker_is_ours(conn: psycopg.Connection[Any]) -> bool:
    """Whether the branch has the engine's marker role (see ``grants._marker``)."""
    from pgoverlay.runner.branch import grants

    row = conn.execute(
        "SELECT shobj_description(g.oid, 'pg_authid') = %s AND NOT EXISTS (SELECT 1 "
        "FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member WHERE m.roleid = g.oid "
        "AND m.admin_option AND NOT r.rolsuper) FROM pg_roles g WHERE g.rolname = %s",
        (grants.MARKER_COMMENT, ACCESS_ROLE),
    ).fetchone()
    return bool(row and row[0])


def _members(conn: psycopg.Connection[Any]) -> dict[str, tuple[str | None, float | None]]:
    """Each member of ``ACCESS_ROLE``: its verifier and its VALID UNTIL (None: none, or it
    cannot log in: not as a grant made it either way)."""
    rows = conn.execute(
        "SELECT a.rolname, a.rolpassword, a.rolcanlogin, "
        "extract(epoch FROM a.rolvaliduntil)::float8 FROM pg_authid a "
        "JOIN pg_auth_members m ON m.member = a.oid JOIN pg_roles g ON g.oid = m.roleid "
        "WHERE g.rolname = %s",
        (ACCESS_ROLE,),
    ).fetchall()
    return {
        str(name): (None if pw is None else str(pw), float(until) if login and until else None)
        for name, pw, login, until in rows
    }


def reconcile(
    pool: Pool,
    b: Branch,
    base: BaseVersion,
    conn: psycopg.Connection[Any],
    *,
    now: float | None = None,
    branch_password: bool = True,
) -> Reconciled:
    """Make branch ``b``'s roles what the registry says (see the module's invariants), through
    the engine's connection ``conn``. The caller holds the branch's lock. ``branch_password``:
    False when the caller has just set the branch role's password itself."""
    from pgoverlay.runner.branch import grants
    from pgoverlay.runner.postgres import roles

    now = time.time() if now is None else now
    done = Reconciled()
    rows = {g.role: g for g in pool.registry.grants(b.name)}
    live = {role: g for role, g in rows.items() if g.expires_at > now}
    members = _members(conn) if _marker_is_ours(conn) else {}
    for role in sorted(set(members) - set(live)):
        grants._drop(conn, role, branch_user=b.user)
        done.dropped.append(role)
    for role in sorted(set(rows) - set(live)):
        pool.registry.delete_grant(b.name, role)
        grants._audit_gone(pool, "access.expire", rows[role], branch=b.name)
    for role, g in sorted(live.items()):
        if members.get(role) == (g.verifier, g.expires_at):
            continue
        grants._apply(conn, g, branch_user=b.user)
        done.restored.append(role)
    if b.password and branch_password:
        row = conn.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = %s", (b.user,)
        ).fetchone()
        if row is not None and not verifies(None if row[0] is None else str(row[0]), b.password):
            try:
                secret = roles.scram_verifier(b.password)
            except ValueError:  # an older release's password form: the server hashes it
                secret = roles.verifier(conn, user=b.user, password=b.password)
            access.alter_role(pool, conn, user=b.user, secret=secret)
            done.branch_password = True
    if done:
        log.warning(
            "branch %s: its roles made what the registry says: %s", b.name, "; ".join(done.lines())
        )
    return done


def settle(pool: Pool, name: str, *, lock_wait: float | None = None) -> Reconciled | None:
    """``reconcile`` running branch ``name`` under its lock; None when it is not running
    (its next start reconciles it)."""
    wait = pool.settings.lock_wait if lock_wait is None else lock_wait
    with flocks.locked(pool.lock_path("branch", name), timeout=wait, what=f"branch {name}"):
        b = branches.get(pool, name)
        base = pool.registry.base(b.base_name, b.base_version)
        if b.state != "ready" or base is None or not lookup.is_running(pool, b):
            return None
        from pgoverlay.runner.postgres import sqlerror

        with (
            sqlerror.wrapped(
                BranchError,
                what=f"branch {name}: its roles could not be checked against the registry",
                fix=f"check that it runs (`pgoverlay branch status {name}`), then ask again",
            ),
            access.engine_connection(pool, b, base) as conn,
        ):
            done = reconcile(pool, b, base, conn)
            # A restart killed before it admitted the clients again left the engine's alone.
            from pgoverlay.runner.branch import grants

            grants._admit_members(pool, b, base, conn)
            return done


def sweep(pool: Pool) -> tuple[list[str], list[str]]:
    """``settle`` every ready branch whose lock is free (gc): ``(changed, problems)``."""
    changed: list[str] = []
    problems: list[str] = []
    for b in pool.registry.branches():
        if b.state != "ready":
            continue
        try:
            done = settle(pool, b.name, lock_wait=0)
        except LockBusyError:
            continue
        except PgoverlayError as err:
            problems.append(f"roles of {b.name}: {err}")
            continue
        if done:
            changed.append(f"{b.name} ({'; '.join(done.lines())})")
    return changed, problems
