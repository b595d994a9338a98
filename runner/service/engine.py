"""What a workflow may ask of the engine, and the engine's own answer to it.

``Engine`` is the whole surface: the engine service serves a ``LocalEngine`` on its socket, and
a caller that is not root reaches it through ``client.RemoteEngine``, so the Action, the
webhook listener and an admin's CLI all see the same operations with the same errors.

A ``LocalEngine`` acts for one caller (a uid). Every caller may list and look; only the uid
that created a branch (or root) may reset it, destroy it, read its password, save its record
(JSON the owner keeps with the branch; the engine never reads it), or grant, list and revoke
credentials in it. The front door's own identity (the uid of ``door_user``, as the socket's peer
credentials say) may only look, and grant or list a credential for a person it vouches for
(``vouched_by``), a person whose GitHub token it forwards and GitHub, asked here, says is theirs
and gives them access to the branch's repository (``witness.Reader``): everything else is
refused it, whatever it asks. A create names the
repository and pull request it is for (a caller other than root must name the repository): a
branch of one repository is never reset, destroyed or re-recorded for another. A caller other
than root is held to the pool's limits, in total, per repository and per uid (``branch.quota``).

With the pool's policy (``policy``: ``api_policy_file``, see ``admission``), a create by a
caller other than root is also held to what the policy says of the repository it names: its
owner and the repository must be admitted by name, and the policy's limits hold where lower
than the pool's. Root is the admin and is held to neither; the front door's vouched requests
were admitted by the policy's network rules, asked by the service of the credential it verified
(``witness``), and are not held to the socket's rules too.

The front door also acts for a repository it vouches for (``vouched``: the network API, for a
GitHub Actions job whose OIDC token, or a listener whose API token, it forwards, and the
service verified itself and its policy admitted, ``witness``): then it may
create a branch, and reset, destroy, get a job's credential in (``connection``), record on and
trace the branches created that way for the same repository id, nothing else. Such a branch is
owned by that id (``owner_repository_id``): another repository, or a re-created one of the
same name, is refused it, and the ``repository`` a request names is ignored. Only the door's
uid may vouch.
"""

from __future__ import annotations

import logging
import pwd
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pgoverlay.errors import (
    BaseMissingError,
    BranchMissingError,
    BranchOwnedError,
    ConfigError,
    DoorForbiddenError,
    NotOwnerError,
    PolicyError,
    RequestError,
    ServiceError,
)
from pgoverlay.runner import branch as branches
from pgoverlay.runner.branch import dirs, idle, lookup
from pgoverlay.runner.branch.quota import Quota
from pgoverlay.runner.pool import Pool, registry
from pgoverlay.runner.pool.registry import WAKEABLE, Branch
from pgoverlay.runner.runtime import Layout
from pgoverlay.runner.service.views import (
    BaseDetail,
    BaseView,
    BaseWorkload,
    BranchView,
    Connection,
    Credential,
    Destroyed,
    GcReport,
    GrantView,
    Layer,
    Login,
    Record,
    Revoked,
    TraceMark,
    WarmView,
)
from pgoverlay.runner.service.vouch import Vouched, for_pull_request

if TYPE_CHECKING:  # requests (Shapes, read by the app through pydantic), made by whoever calls
    from pgoverlay.runner.callers.policy import Policy
    from pgoverlay.runner.pool.registry import StoredGrant
    from pgoverlay.runner.service.models import (
        CreateRequest,
        CredentialCheck,
        GrantRequest,
        RecordRequest,
        TraceRequest,
    )
    from pgoverlay.runner.service.witness import Reader

log = logging.getLogger(__name__)


class Engine(Protocol):
    def bases(self) -> list[BaseView]: ...
    def base_workload(self, name: str) -> BaseWorkload: ...
    def branches(self, *, layer: bool = False) -> list[BranchView]: ...
    def branch(self, name: str, *, layer: bool = False) -> BranchView | None: ...
    def create(self, request: CreateRequest) -> BranchView: ...
    def reset(self, name: str, *, repository: str | None = None) -> BranchView: ...
    def destroy(self, name: str, *, repository: str | None = None) -> Destroyed: ...
    def suspend(self, name: str, *, repository: str | None = None) -> BranchView: ...
    def wake(self, name: str, *, repository: str | None = None) -> BranchView: ...
    def connection(self, name: str) -> Connection: ...
    def size(self, name: str) -> Layer: ...
    def save_record(self, name: str, request: RecordRequest) -> None: ...
    def gc(self) -> GcReport: ...
    def grant(self, name: str, request: GrantRequest) -> GrantView: ...
    def grants(self, name: str) -> list[GrantView]: ...
    def revoke(self, name: str, login: str, *, repository: str | None = None) -> Revoked: ...
    def end_job(self, name: str) -> Revoked: ...
    def check_credential(self, request: CredentialCheck) -> Credential: ...
    def trace_begin(self, name: str, request: TraceRequest) -> TraceMark: ...
    def trace_mark(self, name: str, *, repository: str | None = None) -> TraceMark: ...
    def trace_end(self, name: str, *, repository: str | None = None) -> TraceMark: ...
    def close(self) -> None: ...


def _discard_trace(pool: Pool, name: str) -> None:
    """Forget a branch's trace before it is reset or destroyed. A trace lives in the process
    that began it: one that never imported the trace module (and with it psycopg) has none,
    so a destroy from the CLI does not import them for nothing."""
    trace = sys.modules.get("pgoverlay.runner.trace")
    if trace is not None:
        trace.discard(pool, name)


def _detail(b: registry.BaseVersion) -> BaseDetail:
    return BaseDetail(
        source=b.source,
        source_role=b.source_role,
        via=b.via,
        start_lsn=b.start_lsn,
        superuser=b.superuser,
        owner_uid=b.owner_uid,
        source_settings=b.source_settings,
        tablespaces=b.tablespaces,
        neutralised=b.neutralised_notes if b.locked_down else None,
    )


@dataclass(frozen=True)
class _Known:
    """What a view of every branch reads once: the base versions and the records."""

    bases: dict[tuple[str, int], registry.BaseVersion]
    records: dict[str, registry.StoredRecord]
    layouts: dict[str, Layout]


def _record(pool: Pool, name: str) -> Record | None:
    found = pool.registry.record(name)
    if found is None:
        return None
    return Record(data=found.data, updated_at=found.updated_at)


def door_uid(user: str) -> int | None:
    """The uid of the front door's user ``user``; None when there is no such user (root's is
    never the door's: root may do anything)."""
    try:
        found = pwd.getpwnam(user).pw_uid
    except KeyError:
        return None
    return found or None


class LocalEngine:
    """The engine itself, acting for the caller ``uid`` (0: root, who may do anything), under
    the pool's ``policy`` when it has one (the service's, for the callers on its socket)."""

    def __init__(
        self,
        pool: Pool | Callable[[], Pool],
        *,
        uid: int = 0,
        vouched: Vouched | None = None,
        reader: Reader | None = None,
        policy: Policy | None = None,
    ) -> None:
        self._pool = pool
        self.uid = uid
        self._door: bool | None = None
        self._vouched = vouched
        self._reader = reader
        self._policy = policy

    @property
    def door(self) -> bool:
        """Whether the caller is the front door's identity (its uid is ``door_user``'s)."""
        if self._door is None:
            self._door = self.uid != 0 and self.uid == door_uid(self.pool.settings.door.user)
        return self._door

    @property
    def vouched(self) -> Vouched | None:
        """The repository the front door vouches for in this request; NotOwnerError when a
        caller other than the door says it vouches for one."""
        if self._vouched is not None and not self.door:
            raise NotOwnerError(
                "only the front door's identity may vouch for a repository (the "
                "x-pgoverlay-vouched-* headers): ask without them, and name the repository in "
                "the request"
            )
        return self._vouched

    def _not_door(self, what: str, *, vouchable: bool = False) -> None:
        """Refuse the front door's identity an operation that is not looking or granting, or
        (``vouchable``) one it asks for a repository it vouches for."""
        if self.vouched is not None and vouchable:
            return
        if self.door:
            user = self.pool.settings.door.user
            raise DoorForbiddenError(
                f"the front door's identity ({user}, uid {self.uid}) may not {what}: it may only "
                "look at bases and branches, and grant or list a credential for a person it "
                "vouches for (vouched_by); its own process must not need more"
            )

    @property
    def pool(self) -> Pool:
        """The pool; given as a function, asked for at each use (the service keeps one per
        thread, and a request's dependency and its route may run in different threads)."""
        return self._pool if isinstance(self._pool, Pool) else self._pool()

    def close(self) -> None:
        self.pool.close()

    # -- API tokens -----------------------------------------------------------------------

    def check_credential(self, request: CredentialCheck) -> Credential:
        """Whether an API token the front door was sent is good for acting for the repository
        the request names (``tokens.check``): for the door's identity (or root) alone, as the
        door may not read the store. TokenError, and an audit line, when it is not."""
        from pgoverlay.runner.service import tokens

        if not (self.uid == 0 or (self.door and self._vouched is None)):
            raise NotOwnerError(
                "only the front door's identity asks whether an API token is good: the network "
                "API does, for each request that sends one"
            )
        try:
            found = tokens.check(self.pool.home, request.secret, repository=request.repository)
        except ConfigError as err:  # the store itself: the admin's to mend, not the caller's
            log.error("API tokens cannot be checked: %s", err)
            raise ServiceError(
                "the pool cannot check API tokens now (its token store cannot be read): its "
                "admin must mend it; the engine service's log says why"
            ) from None
        return Credential(
            name=found.name,
            owners=list(found.owners),
            repositories=list(found.repositories),
            expires_at=found.expires_at,
        )

    # -- looking --------------------------------------------------------------------------

    def bases(self) -> list[BaseView]:
        from pgoverlay.runner.branch import warm

        used: dict[tuple[str, int], int] = {}
        for b in self.pool.registry.branches():
            key = (b.base_name, b.base_version)
            used[key] = used.get(key, 0) + 1
        warmth: dict[str, list[WarmView]] = {}
        for s in warm.states(self.pool):
            view = WarmView(
                runtime=s.runtime, target=s.target, ready=s.ready, memory_bytes_each=s.memory_each
            )
            warmth.setdefault(s.base_name, []).append(view)
        latest = {b.name: b.version for b in self.pool.registry.bases()}
        return [
            BaseView(
                name=b.name,
                version=b.version,
                state=b.state,
                pg_major=b.pg_major,
                size_bytes=b.size_bytes,
                database=b.database,
                created_at=b.created_at,
                prepared_at=b.prepared_at,
                masked=b.masked,
                mask_rules=b.mask_rules,
                mask_sha256=b.mask_sha256,
                locked_down=b.locked_down,
                branches=used.get((b.name, b.version), 0),
                warm=warmth.get(b.name, []) if latest[b.name] == b.version else [],
                detail=_detail(b) if self.uid == 0 else None,
            )
            for b in self.pool.registry.bases()
        ]

    def base_workload(self, name: str) -> BaseWorkload:
        """Production's statements kept with base ``name``'s newest ready version (normalized
        texts: no value of the source's data); an empty list and a note when none is kept."""
        from pgoverlay.runner.seed import workload

        self._not_door("read a base's workload")
        ready = [b for b in self.pool.registry.bases(name) if b.state == "ready"]
        if not ready:
            raise BaseMissingError(f"no ready base named {name!r}: see `pgoverlay base list`")
        version = ready[-1].version
        kept = workload.load(self.pool.workload_file(name, version))
        if kept is None:
            return BaseWorkload(
                name=name,
                version=version,
                note=f"no workload is kept with base {name} v{version}: give one with "
                f"`pgoverlay base workload {name} --from DSN` or `--file PATH` (as root)",
            )
        return kept

    def _view(
        self,
        b: Branch,
        *,
        layer: bool,
        seconds: float | None = None,
        known: _Known | None = None,
    ) -> BranchView:
        lay = known.layouts[b.key] if known else branches.layout(self.pool, b.key)
        size = branches.layer_size(self.pool, b, lay=lay) if layer else None
        if known is None:
            alive = lookup.liveness(self.pool, b)
            record = _record(self.pool, b.name)
        else:
            base = known.bases.get((b.base_name, b.base_version))
            alive = lookup.liveness_on(self.pool, b, base, lay=lay)
            stored = known.records.get(b.name)
            record = Record(data=stored.data, updated_at=stored.updated_at) if stored else None
        return BranchView(
            name=b.name,
            state=b.state,
            running=alive.running,
            liveness=alive.state,
            liveness_reason=alive.reason,
            base=b.base_name,
            base_version=b.base_version,
            runtime=b.runtime,
            host=self.pool.settings.public_host,
            port=b.port,
            database=b.database,
            user=b.user,
            created_at=b.created_at,
            ready_at=b.ready_at,
            expires_at=b.expires_at,
            suspended_at=b.suspended_at,
            suspend_after=idle.suspend_after(self.pool.settings, b),
            repository=b.repository,
            pr=b.pr,
            owner_uid=b.owner_uid,
            layer=Layer(logical_bytes=size.logical_bytes, physical_bytes=size.physical_bytes)
            if size
            else None,
            record=record,
            seconds=round(seconds, 3) if seconds is not None else None,
        )

    def branches(self, *, layer: bool = False) -> list[BranchView]:
        """Every branch: the bases, the records and the pool's folders read once for all of
        them, not once per branch (a pool may hold a thousand)."""
        kept = self.pool.registry
        rows = kept.branches()
        known = _Known(
            bases={(v.name, v.version): v for v in kept.bases()},
            records=kept.records(),
            layouts=dirs.layouts(self.pool, [b.key for b in rows]),
        )
        return [self._view(b, layer=layer, known=known) for b in rows]

    def branch(self, name: str, *, layer: bool = False) -> BranchView | None:
        found = self.pool.registry.branch(name)
        if found is not None and self.vouched is not None:
            self._vouched_owner(found, self.vouched)
        view = self._view(found, layer=layer) if found else None
        if view is not None and self.door and self.vouched is None:  # its router's one lookup
            granted = self.pool.registry.grants(name)
            view = view.replace(
                logins=[Login(role=g.role, expires_at=g.expires_at) for g in granted]
            )
        return view

    def size(self, name: str) -> Layer:
        b = branches.get(self.pool, name)
        if self.vouched is not None:  # measuring walks the layer as root: its owner's only
            self._vouched_owner(b, self.vouched)
        size = branches.layer_size(self.pool, b)
        return Layer(logical_bytes=size.logical_bytes, physical_bytes=size.physical_bytes)

    # -- acting ---------------------------------------------------------------------------

    def _mine(self, name: str, *, repository: str | None = None) -> Branch:
        """Branch ``name`` if this caller may act on it (for ``repository``, when given)."""
        b = branches.get(self.pool, name)
        vouched = self.vouched
        if vouched is not None:
            self._vouched_owner(b, vouched)
            return b
        if self.uid != 0 and b.owner_uid != self.uid:
            raise NotOwnerError(
                f"branch {name} was created by another user (uid {b.owner_uid}): only that user "
                "or root may change it or read its password; pick another branch name"
            )
        if repository and b.repository and b.repository.lower() != repository.lower():
            where = f"{b.repository}#{b.pr}" if b.pr else b.repository
            raise BranchOwnedError(
                f"branch {name} on this runner belongs to {where}: name branches after their "
                "repository (the default, `{repo}-pr-{number}`), or pick another name"
            )
        return b

    def _vouched_owner(self, b: Branch, vouched: Vouched) -> None:
        """NotOwnerError unless branch ``b`` was created for the repository the front door
        vouches for, by its id (not its name: a re-created repository gets another id)."""
        if b.owner_repository_id == vouched.repository_id:
            return
        mine = f"{vouched.repository} (id {vouched.repository_id})"
        if b.owner_repository_id is None:
            whose = "was created on this runner, not through the network API"
        elif b.repository.lower() == vouched.repository.lower():
            whose = (
                f"belongs to another repository of that name (id {b.owner_repository_id}): "
                f"{vouched.repository} was deleted and re-created, or renamed"
            )
        else:
            whose = f"belongs to {b.repository}"
        raise NotOwnerError(
            f"branch {b.name} {whose}; a job's token acts for its own repository, {mine}, "
            "only: name branches after their repository (the default, `{repo}-pr-{number}`)"
        )

    def create(self, request: CreateRequest) -> BranchView:
        """Create a branch for this caller. A caller other than root must say which repository
        it is for, and is held to the pool's limits (``branch.quota``), checked in the registry
        transaction that registers the branch."""
        self._not_door("create a branch", vouchable=True)
        vouched = self.vouched
        if vouched is not None:
            if vouched.listener and vouched.from_fork is None:
                raise RequestError(
                    "a create with an API token says whether its pull request comes from a fork "
                    "(x-pgoverlay-fork: true or false), as the delivery has it"
                )
            return self._create(
                request.replace(pr=for_pull_request(request.pr, vouched)),
                repository=vouched.repository,  # the token's; the request's is ignored
                owner_repository_id=vouched.repository_id,
                quota=Quota.of_network(
                    self.pool.settings,
                    door_uid=self.uid,
                    repository=vouched.repository,
                    branch_limit=vouched.branch_limit,
                    total_limit=vouched.total_limit,
                    repository_id=vouched.repository_id,
                ),
            )
        quota = None
        if self.uid != 0:
            if not request.repository:
                raise RequestError(
                    "repository: a create by a user other than root must name the repository "
                    'the branch is for, as OWNER/NAME ("repository": "acme/shop" in the '
                    "request; `pgoverlay branch create NAME --repository OWNER/NAME`)"
                    + (
                        "; the pool's policy admits branches by their repository's owner and name"
                        if self._policy is not None
                        else ""
                    )
                )
            quota = self._member_quota(request.repository)
        return self._create(request, repository=request.repository or "", quota=quota)

    def _member_quota(self, repository: str) -> Quota:
        """The limits of a create by this member (not root) for ``repository``: the pool's,
        and the policy's where it has one; PolicyError when the policy refuses the repository."""
        settings = self.pool.settings
        if self._policy is None:
            return Quota.of(settings, owner_uid=self.uid, repository=repository)
        decision = self._policy.admit_repository(repository)
        if not decision.allowed:
            raise PolicyError(
                f"the pool's policy does not admit a branch for {repository} on the engine's "
                f"socket ({decision.rule}): {decision.reason}"
            )
        return Quota.of(
            settings,
            owner_uid=self.uid,
            repository=repository,
            branch_limit=decision.branch_limit,
            total_limit=decision.total_limit,
        )

    def _create(
        self,
        request: CreateRequest,
        *,
        repository: str,
        quota: Quota | None,
        owner_repository_id: int | None = None,
    ) -> BranchView:
        started = time.monotonic()
        created = branches.create(
            self.pool,
            request.name,
            base_name=request.base,
            ttl_seconds=request.ttl_seconds,
            runtime=request.runtime,
            repository=repository,
            pr=request.pr,
            owner_uid=self.uid,
            owner_repository_id=owner_repository_id,
            quota=quota,
            suspend_after=request.suspend_after_seconds,
        )
        return self._view(created, layer=False, seconds=time.monotonic() - started)

    def reset(self, name: str, *, repository: str | None = None) -> BranchView:
        self._not_door("reset a branch", vouchable=True)
        self._mine(name, repository=repository)
        _discard_trace(self.pool, name)
        started = time.monotonic()
        done = branches.reset(self.pool, name)
        return self._view(done, layer=False, seconds=time.monotonic() - started)

    def suspend(self, name: str, *, repository: str | None = None) -> BranchView:
        """Stop an idle branch, keeping its layer (``branch.suspend``)."""
        self._not_door("suspend a branch", vouchable=True)
        self._mine(name, repository=repository)
        _discard_trace(self.pool, name)
        started = time.monotonic()
        done = branches.suspend(self.pool, name)
        return self._view(done, layer=False, seconds=time.monotonic() - started)

    def wake(self, name: str, *, repository: str | None = None) -> BranchView:
        """Start a suspended branch again (``branch.wake``); one that is up is answered as it
        is. The front door wakes any branch a client connects to, before a password is asked:
        its limits per source bound how often (docs/security.md)."""
        if not self.door or self.vouched is not None:
            self._mine(name, repository=repository)
        started = time.monotonic()
        done = branches.wake(self.pool, name)
        return self._view(done, layer=False, seconds=time.monotonic() - started)

    def _awake(self, b: Branch) -> Branch:
        """``b``, woken first when it is suspended: what needs its server (a login, a grant, a
        trace) wakes it."""
        if b.state in WAKEABLE:
            return branches.wake(self.pool, b.name)
        return b

    def destroy(self, name: str, *, repository: str | None = None) -> Destroyed:
        self._not_door("destroy a branch", vouchable=True)
        if self.pool.registry.branch(name) is None:
            return Destroyed(destroyed=False)
        self._mine(name, repository=repository)
        last = _record(self.pool, name)
        _discard_trace(self.pool, name)
        return Destroyed(destroyed=branches.destroy(self.pool, name), record=last)

    def connection(self, name: str) -> Connection:
        """The branch's connection details with a password: a job's way in. Its roles are
        made what the registry says first (``reconcile``), so a password PR SQL or a
        reviewer changed in the branch is set back and the one given here works.

        On the socket, the branch role's own (the caller's process is on the pool's host).
        For a caller the front door vouches for (a job or listener on another runner, which
        reaches the branch through the door), a credential minted for the job instead
        (``grants.grant_job``): the door admits no role the engine did not mint, and the
        branch role's password is PR SQL's to change."""
        self._not_door("read a branch's password", vouchable=True)
        b = self._awake(self._mine(name))
        from pgoverlay.runner.branch import grants, reconcile

        reconcile.settle(self.pool, name)
        own = branches.connection(self.pool, b)
        vouched = self.vouched
        if vouched is None:
            return own
        who = "listener" if vouched.listener else "job"
        made = grants.grant_job(
            self.pool, name, granted_by=f"{who}:{vouched.repository}", uid=self.uid
        )
        return own.replace(user=made.grant.role, password=made.password)

    def save_record(self, name: str, request: RecordRequest) -> None:
        self._not_door("write a branch's record", vouchable=True)
        self._mine(name, repository=request.repository)
        saved = self.pool.registry.save_record(
            registry.StoredRecord(branch=name, data=request.data, updated_at=time.time())
        )
        if not saved:
            raise BranchMissingError(f"branch {name} was destroyed while its report was saved")

    # -- tracing --------------------------------------------------------------------------

    def trace_begin(self, name: str, request: TraceRequest) -> TraceMark:
        """Open a trace of the branch (ending one left open); its first mark."""
        self._not_door("trace a branch", vouchable=True)
        b = self._awake(self._mine(name, repository=request.repository))
        from pgoverlay.runner import trace

        return trace.begin(
            self.pool,
            b,
            interval=request.interval,
            max_seconds=request.max_seconds,
            user=self._job_role(b),
        )

    def _job_role(self, b: Branch) -> str | None:
        """The role the job this caller acts for logs in to ``b`` with, when it is one on
        another runner holding its credential (``connection``); None: the branch role."""
        if self.vouched is None:
            return None
        from pgoverlay.runner.branch import grants

        found = self.pool.registry.grant(b.name, grants.job_role(b))
        return found.role if found is not None and found.job else None

    def trace_mark(self, name: str, *, repository: str | None = None) -> TraceMark:
        self._not_door("trace a branch", vouchable=True)
        self._mine(name, repository=repository)
        from pgoverlay.runner import trace

        return trace.mark(self.pool, name)

    def trace_end(self, name: str, *, repository: str | None = None) -> TraceMark:
        self._not_door("trace a branch", vouchable=True)
        self._mine(name, repository=repository)
        from pgoverlay.runner import trace

        return trace.end(self.pool, name)

    def gc(self) -> GcReport:
        self._not_door("run gc")
        from pgoverlay.runner.pool import gc

        report = gc.collect(self.pool)
        return GcReport(lines=report.lines(), problems=len(report.problems))

    # -- credentials ----------------------------------------------------------------------

    def _may_grant(
        self,
        name: str,
        *,
        repository: str | None,
        vouched_by: str | None,
        app: bool = False,
        read_only: bool = False,
    ) -> None:
        """Root and the branch's owner grant; the front door grants only for a person it
        vouches for, and only it may vouch. For a repository it vouches for (a workflow on the
        network API), the door may grant the pull request's app credential (the `database-url`
        output) in that repository's own branch, and nothing else."""
        if self.vouched is not None:
            if not app or vouched_by is not None:
                self._not_door("grant a person's credential for a repository it vouches for")
            self._mine(name)
            return
        if not self.door:
            if vouched_by is not None:
                raise NotOwnerError(
                    "vouched_by: only the front door's identity may vouch for a person; ask "
                    "without it (the grant is then recorded as this user's)"
                )
            self._mine(name, repository=repository)
            return
        if vouched_by is None:
            self._not_door("grant a credential for nobody it vouches for (set vouched_by)")
        b = branches.get(self.pool, name)
        if repository and b.repository and b.repository.lower() != repository.lower():
            raise BranchOwnedError(
                f"branch {name} belongs to {b.repository}, not {repository}: the front door "
                "grants in a branch for its own pull request's readers only"
            )
        self._signed_in(b, vouched_by=vouched_by or "", read_only=read_only)

    def _signed_in(self, b: Branch, *, vouched_by: str, read_only: bool) -> None:
        """The front door grants to a person only with the GitHub token of their sign-in,
        forwarded: GitHub, asked here, must say the token is ``vouched_by``'s and gives them
        access to the branch's repository, read-write for a read-write credential."""
        if self._reader is None:
            self._not_door(
                "grant a person's credential without their sign-in (forward the reader's "
                "GitHub token)"
            )
            return
        if not b.repository:
            self._not_door("grant a person's credential in a branch of no repository")
        login, access = self._reader.check(b.repository)
        wanted = vouched_by.removeprefix("github:").lower()
        if login.lower() != wanted:
            self._not_door(f"grant {wanted}'s credential with the sign-in of another person")
        if access is None or (access == "read-only" and not read_only):
            self._not_door(
                f"grant {wanted} a {'read-only' if read_only else 'read-write'} credential in "
                f"{b.name}: GitHub gives them {access or 'no'} access to {b.repository}"
            )

    def grant(self, name: str, request: GrantRequest) -> GrantView:
        """A credential in branch ``name`` (see ``branch.grants.grant``); its password is in
        this answer only."""
        self._may_grant(
            name,
            repository=request.repository,
            vouched_by=request.vouched_by,
            app=request.app,
            read_only=request.read_only,
        )
        if self.door and request.app and self.vouched is None:
            self._not_door("grant an app's credential")
        self._awake(branches.get(self.pool, name))
        from pgoverlay.runner.branch import grants

        made = grants.grant(
            self.pool,
            name,
            login=request.login,
            read_only=request.read_only,
            ttl=request.ttl,
            app=request.app,
            rotate=request.rotate,
            uid=self.uid,
            vouched_by=request.vouched_by,
        )
        return self._grant_view(made.grant, password=made.password, renewed=made.renewed)

    def grants(self, name: str) -> list[GrantView]:
        """The credentials granted in branch ``name``, without passwords."""
        if self.vouched is not None:
            self._not_door("list a branch's credentials for a repository it vouches for")
        if not self.door:
            self._mine(name)
        from pgoverlay.runner.branch import grants

        return [self._grant_view(g) for g in grants.listed(self.pool, name)]

    def revoke(self, name: str, login: str, *, repository: str | None = None) -> Revoked:
        self._not_door("revoke a credential")
        self._mine(name, repository=repository)
        from pgoverlay.runner.branch import grants

        done = grants.revoke(self.pool, name, login, uid=self.uid)
        return Revoked(branch=name, login=login.lower(), revoked=done)

    def end_job(self, name: str) -> Revoked:
        """The job on another runner that held branch ``name`` ended (the front door's hold
        was given back): its credential (``connection``) goes, its sessions ended. For a
        caller the door vouches for, on its own repository's branch; root's too."""
        if self.vouched is None and self.uid != 0:
            self._not_door("end a job's credential for a repository it does not vouch for")
        from pgoverlay.runner.branch import grants

        if self.pool.registry.branch(name) is None:  # a hold on a branch never made, or gone
            return Revoked(branch=name, login="", revoked=False)
        b = self._mine(name)
        role = grants.job_role(b)
        found = self.pool.registry.grant(name, role)
        done = found is not None and found.job
        if done:
            done = grants.revoke(self.pool, name, role, uid=self.uid, event="access.job_end")
        return Revoked(branch=name, login=role, revoked=done)

    def _grant_view(
        self, g: StoredGrant, *, password: str | None = None, renewed: bool = False
    ) -> GrantView:
        s = self.pool.settings
        return GrantView(
            branch=g.branch,
            login=g.login,
            role=g.role,
            read_only=g.read_only,
            app=g.app,
            expires_at=g.expires_at,
            granted_by=g.granted_by,
            password=password,
            renewed=renewed,
            dsn_host=s.door_name,  # the one answer to "which name reaches the door"
            dsn_port=s.door.port,
            database=g.branch,
        )
