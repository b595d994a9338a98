"""The repository a caller with an API token acts for, named in each of its requests to the
network API: the webhook listener writes these headers (``headers``) from the signed delivery
of the job's pull request, and the front door reads them back (``parse``) once the engine has
said the token's scope holds the repository.

A GitHub Actions job needs none: its OIDC token names its repository, signed by GitHub. A
listener acts for many repositories, so its token (issued by the pool's admin) names a scope,
and each request names one repository in it, with its id and its owner's id (GitHub keeps
them through a rename, and a re-created repository of the same name gets new ones: a branch
is owned by the id, and the policy may pin either), and on a create whether the pull request
comes from a fork (the policy's ``forks`` rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pgoverlay.errors import RequestError
from pgoverlay.github.grammar import REPOSITORY_RE

REPOSITORY_HEADER = "x-pgoverlay-repository"
REPOSITORY_ID_HEADER = "x-pgoverlay-repository-id"
OWNER_ID_HEADER = "x-pgoverlay-owner-id"
FORK_HEADER = "x-pgoverlay-fork"
_FORK_VALUES = {"true": True, "false": False}
_MAX_ID = 2**63 - 1  # SQLite's INTEGER


@dataclass(frozen=True, kw_only=True)
class Acting:
    """The repository ``repository`` (owner/name) of id ``repository_id``, whose owner's id is
    ``owner_id``; ``from_fork``: whether the pull request comes from a fork (None: not said,
    which only a create needs)."""

    repository: str
    repository_id: int
    owner_id: int
    from_fork: bool | None = None

    @property
    def owner(self) -> str:
        return self.repository.partition("/")[0]


def headers(acting: Acting) -> dict[str, str]:
    """The headers that name ``acting`` on a request to the network API."""
    sent = {
        REPOSITORY_HEADER: acting.repository,
        REPOSITORY_ID_HEADER: str(acting.repository_id),
        OWNER_ID_HEADER: str(acting.owner_id),
    }
    if acting.from_fork is not None:
        sent[FORK_HEADER] = "true" if acting.from_fork else "false"
    return sent


def _github_id(given: Mapping[str, str], name: str) -> int:
    raw = given.get(name)
    if raw is None:
        raise RequestError(
            f"{name} is missing: a request with an API token names the repository it acts for "
            f"({REPOSITORY_HEADER}, {REPOSITORY_ID_HEADER}, {OWNER_ID_HEADER}), as the webhook "
            "delivery has them"
        )
    if not (raw.isascii() and raw.isdigit() and 0 < len(raw) <= 19) or not 0 < int(raw) <= _MAX_ID:
        raise RequestError(f"{name}: not a GitHub id (a positive integer)")
    return int(raw)


def parse(given: Mapping[str, str], *, create: bool) -> Acting:
    """The repository a request's headers name; RequestError saying which header is missing or
    wrong. ``create``: the request makes a branch, and must say whether its pull request comes
    from a fork."""
    repository = given.get(REPOSITORY_HEADER)
    if repository is None or not REPOSITORY_RE.match(repository):
        raise RequestError(
            f"{REPOSITORY_HEADER} is {'missing' if repository is None else 'not OWNER/NAME'}: "
            "a request with an API token names the repository it acts for"
        )
    from_fork = None
    if create:
        raw = given.get(FORK_HEADER)
        if raw not in _FORK_VALUES:
            raise RequestError(
                f"{FORK_HEADER} must be true or false on a create with an API token: whether "
                "the pull request comes from a fork, as the delivery says"
            )
        from_fork = _FORK_VALUES[raw]
    return Acting(
        repository=repository,
        repository_id=_github_id(given, REPOSITORY_ID_HEADER),
        owner_id=_github_id(given, OWNER_ID_HEADER),
        from_fork=from_fork,
    )
