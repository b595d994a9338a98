"""How many branches a caller of the engine service may hold: the pool's limits, checked in the
registry transaction that registers (or claims) the caller's branch.

A check made before that transaction, then a create, lets simultaneous creates all pass it:
each counts the branches the others have not registered yet. Counted inside the create's own
``BEGIN IMMEDIATE``, every create sees the ones committed before it, and the one over a limit
is refused with nothing left behind. Root's own requests hold no quota.

The front door's requests for a repository it vouches for (the network API) are all its uid's:
for them the per-user limit is the policy's ``limits.total`` (branches of the network's callers
in all; the pool's total when the policy sets none), and a repository's limit the lower of the
pool's and the policy's.

A member's request on the socket, when the pool has a policy (``api_policy_file``), is held to
the lower of the pool's and the policy's limits: ``limits.total`` against every branch of the
pool, as ``PGOVERLAY_MAX_BRANCHES`` counts, and a repository's against that repository's
branches (the network's of the same name included). A refusal names the limit that held: the
policy's where it is the lower one, else the setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgoverlay.errors import LimitReachedError
from pgoverlay.runner.pool.registry import Usage
from pgoverlay.runner.settings import Settings


@dataclass(frozen=True, kw_only=True)
class Quota:
    """The limits one create is held to: for the caller ``owner_uid`` (its peer uid), asking
    for ``repository`` ('' for none)."""

    owner_uid: int
    repository: str
    max_branches: int
    max_per_repository: int
    max_per_user: int
    network: bool = False  # the front door's, for a repository it vouches for
    repository_id: int | None = None  # the network's: its branches are counted by this id
    # Whether the pool's policy set max_branches (max_per_repository): it was the lower.
    policy_total: bool = False
    policy_per_repository: bool = False

    @classmethod
    def of(
        cls,
        settings: Settings,
        *,
        owner_uid: int,
        repository: str,
        branch_limit: int | None = None,
        total_limit: int | None = None,
    ) -> Quota:
        """The limits of a member's create on the socket: the pool's settings, or the policy's
        limits for ``repository`` (``branch_limit``, ``total_limit``; None: none) where they
        are lower."""
        total, per_repository = settings.max_branches, settings.max_branches_per_repository
        if total_limit is not None:
            total = min(total, total_limit)
        if branch_limit is not None:
            per_repository = min(per_repository, branch_limit)
        return cls(
            owner_uid=owner_uid,
            repository=repository,
            max_branches=total,
            max_per_repository=per_repository,
            max_per_user=settings.max_branches_per_user,
            policy_total=total < settings.max_branches,
            policy_per_repository=per_repository < settings.max_branches_per_repository,
        )

    @classmethod
    def of_network(
        cls,
        settings: Settings,
        *,
        door_uid: int,
        repository: str,
        branch_limit: int | None,
        total_limit: int | None,
        repository_id: int | None = None,
    ) -> Quota:
        """The limits of a create the front door asks for a repository it vouches for, with
        the policy's limits for it (None: the pool's setting alone)."""
        per_repository = settings.max_branches_per_repository
        if branch_limit is not None:
            per_repository = min(per_repository, branch_limit)
        return cls(
            owner_uid=door_uid,
            repository=repository,
            max_branches=settings.max_branches,
            max_per_repository=per_repository,
            max_per_user=total_limit if total_limit is not None else settings.max_branches,
            network=True,
            repository_id=repository_id,
        )

    def check(self, usage: Usage) -> None:
        """LimitReachedError, saying which limit and how to raise it, if one more branch would
        go over one of them."""
        if usage.total >= self.max_branches:
            raise LimitReachedError(
                f"this pool already has {usage.total} branches, its limit: destroy branches "
                "that are no longer needed, or raise "
                + (
                    "limits.total in the pool's policy (it holds on the engine's socket "
                    "where it is lower than PGOVERLAY_MAX_BRANCHES)"
                    if self.policy_total
                    else "PGOVERLAY_MAX_BRANCHES"
                )
            )
        if self.repository and usage.of_repository >= self.max_per_repository:
            raise LimitReachedError(
                f"{self.repository} already has {usage.of_repository} branches on this runner, "
                "its limit: close pull requests or destroy their branches, or raise "
                + (
                    "its limit in the pool's policy (limits.per_repository, or the "
                    "repository's branches) and PGOVERLAY_MAX_BRANCHES_PER_REPOSITORY"
                    if self.network
                    else "its limit in the pool's policy (limits.per_repository, or the "
                    "repository's branches; PGOVERLAY_MAX_BRANCHES_PER_REPOSITORY is higher)"
                    if self.policy_per_repository
                    else "PGOVERLAY_MAX_BRANCHES_PER_REPOSITORY"
                )
            )
        if self.network and usage.of_owner >= self.max_per_user:
            raise LimitReachedError(
                f"the network API's callers already have {usage.of_owner} branches on this "
                "runner, the pool's policy's limit (limits.total): destroy branches that are "
                "no longer needed, or raise it"
            )
        if usage.of_owner >= self.max_per_user:
            raise LimitReachedError(
                f"this user (uid {self.owner_uid}) already has {usage.of_owner} branches on "
                "this runner, its limit: destroy the ones it no longer needs, or raise "
                "PGOVERLAY_MAX_BRANCHES_PER_USER"
            )
