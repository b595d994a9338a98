"""A repository the front door vouches for: what it sends the engine with a request it makes for
a GitHub Actions job whose OIDC token it verified and whose policy admitted it.

The door sends these as headers on its socket requests (``headers``); the engine service reads
them back (``parse``) and hands them to the ``LocalEngine`` of the caller, which honours them
only when that caller is the door's uid (the socket's peer credentials say so, not the
request). The branch a vouched request creates is owned by the repository's id, which GitHub
keeps through a rename and never gives a re-created repository of the same name; the
repository's name in a request's body is then ignored.

The policy's limits travel with it: ``branch_limit`` (branches of this repository) and
``total_limit`` (branches of the network's callers in all); None where the policy sets none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pgoverlay.errors import RequestError
from pgoverlay.runner.names import REPOSITORY_RE

REPOSITORY_HEADER = "x-pgoverlay-vouched-repository"
REPOSITORY_ID_HEADER = "x-pgoverlay-vouched-repository-id"
BRANCH_LIMIT_HEADER = "x-pgoverlay-vouched-branch-limit"
TOTAL_LIMIT_HEADER = "x-pgoverlay-vouched-total-limit"
HEADERS = (REPOSITORY_HEADER, REPOSITORY_ID_HEADER, BRANCH_LIMIT_HEADER, TOTAL_LIMIT_HEADER)
_MAX_ID = 2**63 - 1  # SQLite's INTEGER


@dataclass(frozen=True, kw_only=True)
class Vouched:
    """The repository ``repository`` (owner/name) of id ``repository_id``, as the token said."""

    repository: str
    repository_id: int
    branch_limit: int | None = None
    total_limit: int | None = None


def headers(vouched: Vouched) -> dict[str, str]:
    """The headers that carry ``vouched`` on a request to the engine service."""
    sent = {
        REPOSITORY_HEADER: vouched.repository,
        REPOSITORY_ID_HEADER: str(vouched.repository_id),
    }
    if vouched.branch_limit is not None:
        sent[BRANCH_LIMIT_HEADER] = str(vouched.branch_limit)
    if vouched.total_limit is not None:
        sent[TOTAL_LIMIT_HEADER] = str(vouched.total_limit)
    return sent


def _number(given: Mapping[str, str], name: str) -> int | None:
    raw = given.get(name)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and 0 < len(raw) <= 19) or not 0 < int(raw) <= _MAX_ID:
        raise RequestError(f"{name}: not a positive integer")
    return int(raw)


def parse(given: Mapping[str, str]) -> Vouched | None:
    """The repository a request's headers vouch for; None when they name none. RequestError
    when they are not what ``headers`` writes (a repository without its id, or the reverse)."""
    if not any(name in given for name in HEADERS):
        return None
    repository = given.get(REPOSITORY_HEADER)
    repository_id = _number(given, REPOSITORY_ID_HEADER)
    if repository is None or repository_id is None:
        raise RequestError(
            f"{REPOSITORY_HEADER} and {REPOSITORY_ID_HEADER} go together: a vouched request "
            "names the repository and its id"
        )
    if not REPOSITORY_RE.match(repository) or len(repository) > 201:
        raise RequestError(f"{REPOSITORY_HEADER}: not OWNER/NAME")
    return Vouched(
        repository=repository,
        repository_id=repository_id,
        branch_limit=_number(given, BRANCH_LIMIT_HEADER),
        total_limit=_number(given, TOTAL_LIMIT_HEADER),
    )
