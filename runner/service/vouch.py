"""What the front door sends the engine for a caller of the network API, and what the engine
makes of it: the caller's own credential, never the door's word.

The door forwards, on its socket requests, the credential its caller sent (``TOKEN_HEADER``: a
GitHub Actions job's OIDC token, or the API token the pool's admin issued to a listener, with
the repository that listener names in ``acting``'s headers), and for a grant to a person, the
token GitHub gave that reader when they signed in (``READER_HEADER``). The engine service reads
them back (``parse``) and verifies them itself (``service.witness``): a door that sends a
repository, a limit or a person without a credential that proves it gets nothing.

``Vouched`` is what the engine concluded: the repository (by its id, which GitHub keeps through
a rename and never gives a re-created repository of the same name), the policy's limits for it
(``branch_limit``: branches of this repository; ``total_limit``: branches of the network's
callers in all; None where the policy sets none), and what a create may be: a ``pull_request``
run's token names its pull request, and a listener's create says whether it is a fork's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pgoverlay.errors import NotOwnerError, PolicyError, RequestError
from pgoverlay.runner.service import acting
from pgoverlay.runner.service.acting import Acting

if TYPE_CHECKING:
    from pgoverlay.runner.callers.policy import Decision

PREFIX = "x-pgoverlay-vouched-"
TOKEN_HEADER = PREFIX + "token"
READER_HEADER = PREFIX + "reader-token"
_MAX_TOKEN = 16 * 1024  # an OIDC token is about 1 KiB (oidc.MAX_TOKEN_BYTES)


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """What the door forwarded: ``token``, the network API caller's credential, with the
    repository a listener names (``named``; None for a job, whose token names it); ``reader``,
    the GitHub token of the person signed in on the branch page."""

    token: str | None = None
    named: Acting | None = None
    reader: str | None = None


@dataclass(frozen=True, kw_only=True)
class Vouched:
    """The repository ``repository`` (owner/name) of id ``repository_id``, as a credential the
    engine verified says, admitted by the pool's policy."""

    repository: str
    repository_id: int
    branch_limit: int | None = None
    total_limit: int | None = None
    pull_request: int | None = None  # a pull_request run's: its creates are for that one
    listener: bool = False  # an API token: the repository is the listener's word, in scope
    from_fork: bool | None = None  # a listener's create says; None: not said


def headers(
    *, token: str | None = None, named: Acting | None = None, reader: str | None = None
) -> dict[str, str]:
    """The headers that forward a caller's credential on a request to the engine service."""
    sent: dict[str, str] = {}
    if token is not None:
        sent[TOKEN_HEADER] = token
        if named is not None:
            sent.update(acting.headers(named))
    if reader is not None:
        sent[READER_HEADER] = reader
    return sent


def _token(given: Mapping[str, str], name: str) -> str | None:
    raw = given.get(name)
    if raw is None:
        return None
    if not raw or len(raw) > _MAX_TOKEN or not raw.isascii() or not raw.isprintable() or " " in raw:
        raise RequestError(f"{name}: not a token")
    return raw


def parse(given: Mapping[str, str]) -> Evidence | None:
    """The credentials a request's headers forward; None when they forward none. RequestError
    when a header says something the engine no longer takes on the door's word (a repository or
    a limit without a credential), or a listener's token comes without its repository."""
    stale = sorted(
        n for n in given if n.startswith(PREFIX) and n not in (TOKEN_HEADER, READER_HEADER)
    )
    if stale:
        raise NotOwnerError(
            f"{stale[0]}: the engine takes no repository, limit or person on the front door's "
            f"word: forward the caller's own credential ({TOKEN_HEADER}, {READER_HEADER})"
        )
    token, reader = _token(given, TOKEN_HEADER), _token(given, READER_HEADER)
    if token is None and reader is None:
        return None
    named = None
    if token is not None and acting.REPOSITORY_HEADER in given:
        named = acting.parse(given, create=acting.FORK_HEADER in given)
    return Evidence(token=token, named=named, reader=reader)


def for_pull_request(pr: int | None, vouched: Vouched) -> int | None:
    """The pull request a create for ``vouched`` is for: the token's, when it names one (a
    ``pull_request`` run's ref, ``refs/pull/N/merge``), and a create naming another is refused;
    a token that names none (``pull_request_target``, a push, a listener) leaves ``pr`` as
    asked."""
    number = vouched.pull_request
    if number is None:
        return pr
    if pr is not None and pr != number:
        raise NotOwnerError(
            f"pr: this job's token is of pull request #{number} of {vouched.repository}, not "
            f"#{pr}: a job makes the branch of its own pull request"
        )
    return number


def admitted(
    repository: str,
    repository_id: int,
    decision: Decision,
    *,
    who: str,
    pull_request: int | None = None,
    listener: bool = False,
    from_fork: bool | None = None,
) -> Vouched:
    """What a verified ``who`` of ``repository`` is vouched for if the policy's ``decision``
    admits it; PolicyError naming the rule and the fix otherwise. The door and the engine both
    ask it, of the same policy file."""
    if not decision.allowed:
        raise PolicyError(
            f"the pool's policy does not admit this {who} of {repository} "
            f"({decision.rule}): {decision.reason}"
        )
    return Vouched(
        repository=repository,
        repository_id=repository_id,
        branch_limit=decision.branch_limit,
        total_limit=decision.total_limit,
        pull_request=pull_request,
        listener=listener,
        from_fork=from_fork,
    )
