"""The one exception tree. Every error a user can cause says what is wrong and how to fix it.

Every class here derives from :class:`PgoverlayError`, and each carries a process exit code
(``exit_code``) so scripts can tell failures apart: a subclass without one of its own shares its
parent's. The codes are stable; docs/engine.md lists them. Library errors (``psycopg.Error``,
``sqlite3.Error``, PyGithub's and requests' exceptions, pydantic's ``ValidationError``) are
turned into one of these where they enter pgoverlay's own API, so an edge (a CLI command, the
Action, a listener's worker or request, the engine service) catches only ``PgoverlayError``.

An exception class anywhere else must be private control flow that never reaches a user, and say
so in its docstring (tests/test_errors.py checks both).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class PgoverlayError(Exception):
    """Root of every error pgoverlay raises on purpose. Raised as itself for a failure that
    fits no subsystem below (a branch an interrupted run left half-made, a listener that does
    not know a repository's GitHub App installation yet)."""

    exit_code = 1


class ConfigError(PgoverlayError):
    """A setting, an argument, an Action input or a file of settings is missing or not valid;
    the message names it and says what it must be."""

    exit_code = 2


class SettingError(ConfigError):
    """A runner setting (``PGOVERLAY_*``, the admin's file, or a keyword to ``Settings``) has a
    value of the wrong kind or out of range; the message names the variable and what it must
    be. ``name`` is the setting's field, empty for a problem of several (an empty port range)."""

    def __init__(self, name: str, problem: str) -> None:
        where = f" PGOVERLAY_{name.upper()}" if name else ""
        super().__init__(f"bad setting{where}: {problem}")
        self.name = name


class RequestError(ConfigError, ValueError):
    """A request to the engine (a create, a record, a trace) has a value out of its range or
    of the wrong form; the message names the field and what it must be. A ValueError too, so
    the service's request parsing reports it as the caller's mistake (422)."""


class UnsafeFileError(ConfigError):
    """A file read with privileges is not a regular file, is too big, or leads out of the
    folder it must stay in (a password file, a pull request's migration file)."""


class SandboxError(ConfigError):
    """The webhook listener cannot run a job's code in a sandbox of its own: it runs as root,
    or its user has no subordinate uid range, or unshare/newuidmap is missing."""


class JobFileError(ConfigError):
    """A file a GitHub Actions job names in its environment (GITHUB_EVENT_PATH, GITHUB_OUTPUT,
    GITHUB_STEP_SUMMARY) cannot be read or written as the job's user, or is not a regular
    file: the Action reads and writes them as that user, through no link."""


class NotRootError(PgoverlayError):
    """A command that changes the pool (mounts, seeds, starts servers) was run by a user other
    than root."""

    exit_code = 3


class OverlayUnsupportedError(PgoverlayError):
    """The kernel cannot mount OverlayFS (no module, or not allowed here, e.g. inside an
    unprivileged container)."""

    exit_code = 4


class PoolError(PgoverlayError):
    """The pool is not initialised, not mounted, or down for maintenance (``pool down``), or
    there is no pool to remove."""

    exit_code = 5


class PoolFullError(PoolError):
    """The pool's file system has no room for what was asked (a new branch, a seed)."""

    exit_code = 6


class CommandError(PgoverlayError):
    """An external program (``pg_ctl``, ``pg_basebackup``, ``mount``, ...) failed or could not
    be started; carries its (already secret-free) stderr and return code."""

    exit_code = 7

    def __init__(self, message: str, *, stderr: str = "", returncode: int | None = None) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.returncode = returncode


class PostgresBinariesError(PgoverlayError):
    """The Postgres programs a step needs (``postgres``, ``pg_ctl``, ``initdb``, ...) are not
    installed where the settings say, or not for the major version the base needs."""

    exit_code = 8


class VersionMismatchError(PgoverlayError):
    """A base and the Postgres binaries (or Docker image) that would run it are of different
    major versions."""

    exit_code = 9


class SeedError(PgoverlayError):
    """Seeding a base failed: the copy, the checks of the source, or preparing the copy
    (recovery, lockdown, the branch role); the half-made version is removed."""

    exit_code = 10


class SourceUnreachableError(SeedError):
    """The source server to seed from cannot be reached, refuses the login, or refuses
    replication connections."""

    exit_code = 11


class SeedBusyError(SeedError):
    """Another seed (or removal) of the same base holds its lock."""

    exit_code = 12


class SourcePasswordError(SourceUnreachableError):
    """The source asks for a password and none was given in a way that stays out of argv."""


class BaseMissingError(PgoverlayError):
    """The base a branch is asked of is not seeded (no ready version), or is being removed."""

    exit_code = 13


class BranchError(PgoverlayError):
    """A branch operation failed in a way none of its subclasses names (e.g. the settings of
    a branch that is not running were asked for)."""

    exit_code = 14


class InvalidNameError(BranchError):
    """A branch or base name is not a valid name (letters, digits, ``-`` and ``_``, within the
    length a Postgres identifier and a folder name allow)."""

    exit_code = 15


class BranchExistsError(BranchError):
    """A branch of that name exists already."""

    exit_code = 16


class BranchMissingError(BranchError):
    """No branch of that name exists."""

    exit_code = 17


class PortsExhaustedError(BranchError):
    """Every port of the pool's range (PGOVERLAY_PORT_MIN to PGOVERLAY_PORT_MAX) is taken."""

    exit_code = 18


class BranchStartError(BranchError):
    """A branch's server did not start, or started but the engine could not set its login
    role, or a client could not log in with the branch's password."""

    exit_code = 19


class TimeoutExpiredError(PgoverlayError):
    """A wait ran past its deadline (a server that does not come up, a command that does not
    finish, a migration past its time limit)."""

    exit_code = 20


class MigrationError(PgoverlayError):
    """A pull request's migrations could not be listed, run or recorded (a failing migration
    file or command, a migration ledger the branch cannot read or write)."""

    exit_code = 21


class LockBusyError(PgoverlayError):
    """Another process holds the lock of a branch, a base or the pool for longer than the
    wait allows."""

    exit_code = 22


class MaskError(SeedError):
    """Masking rules that cannot be read, do not fit the database, or fail to apply."""

    exit_code = 23


class DockerError(PgoverlayError):
    """The Docker daemon is unreachable, an image is missing, or a container misbehaved."""

    exit_code = 24


class UnsafePathError(PoolError):
    """A file or directory of the pool is not what pgoverlay made (a symbolic link, a FIFO, a
    file of another owner, a path leaving the pool): root refuses to follow or trust it."""

    exit_code = 25


class RegistryError(PoolError):
    """The pool's registry (its SQLite file) cannot be opened, read or written: it is not a
    database or is damaged, another process keeps it locked past the wait, or its disk is
    full or read-only."""

    exit_code = 34


class RegistryRowError(RegistryError):
    """A registry row fails validation (a name, port, runtime or path pgoverlay never writes):
    it is reported, never acted on."""

    exit_code = 26


class BranchOwnedError(BranchExistsError):
    """The branch belongs to another repository's pull request: a workflow may not reset,
    destroy or re-record it."""

    exit_code = 27


class NotOwnerError(BranchError):
    """The branch was created by another user of the engine service: only that user (or root)
    may reset it, destroy it, read its password or record its report."""

    exit_code = 28


class LimitReachedError(BranchError):
    """The pool's limit on branches (in total, per repository or per caller's uid) is
    reached."""

    exit_code = 29


class ServiceError(PgoverlayError):
    """The engine service cannot be reached (not running, or this user is not in its group),
    or it answered something that is not its protocol."""

    exit_code = 30


class SettingsDifferError(ServiceError):
    """Root asked the engine service to act with settings other than the service's own: root's
    CLI then works on the pool itself."""


class RequestTooLargeError(ServiceError):
    """A request to the engine service has a body over its route's cap: it is answered 413
    before the rest is read, and nothing is done."""


class ServiceBusyError(ServiceError):
    """The engine service refused a connection because its caller (a uid) already has as many
    open as ``PGOVERLAY_SERVICE_CONNECTIONS_PER_USER`` allows: nothing was done."""


class BaseInUseError(PgoverlayError):
    """A base (or one version of it) that branches still use was asked to be removed without
    destroying them."""

    exit_code = 31


class DeliveryError(PgoverlayError):
    """A signed webhook delivery the listener cannot act on: a header missing or outside what
    GitHub sends, a body that is not the JSON GitHub sends for its event. It is answered 400
    and recorded with this message, and nothing is queued."""

    exit_code = 32


class QueueError(PgoverlayError):
    """The webhook listener's job queue (its SQLite file) cannot be opened, read or written
    (another process keeps it locked, it is damaged, its file system has no WAL support), or a
    worker acts on a job it no longer holds (its lease ran out) or on a delivery that is not
    recorded."""

    exit_code = 33


class GitHubError(PgoverlayError):
    """A GitHub API call failed after its retries (a token without the permission, a missing
    repository or pull request, GitHub down or rate-limiting). The message says which call
    and GitHub's answer, never the token."""

    exit_code = 35


class TransientError(PgoverlayError):
    """A step of a webhook listener's job failed for a reason that may pass (GitHub answered
    an error or could not be reached while the job read the pull request, set its commit
    status or downloaded its sources). The worker puts the job back in its lane with a backoff
    (``retry_after`` and ``ratelimit_reset`` are GitHub's hints, when it gave them) instead of
    failing it; out of attempts, the message is the job's recorded result."""

    exit_code = 36

    def __init__(
        self, message: str, *, retry_after: str | None = None, ratelimit_reset: str | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.ratelimit_reset = ratelimit_reset


class TraceError(BranchError):
    """A branch's migration trace cannot be opened, marked or ended: the branch has no open
    trace, its server is not running, or the engine could not install or read what the trace
    watches with (event triggers, role settings, the server's log)."""

    exit_code = 37


class AccessError(BranchError):
    """A personal or application credential cannot be granted or revoked in a branch: a role
    of that name exists there and is not one pgoverlay made for access (a production role is
    never taken over), the base already has a ``pgoverlay_access`` role of its own, the branch
    is not running, or the login was never granted."""

    exit_code = 38


class UnmaskedAccessError(AccessError):
    """A personal credential was asked for a branch of an unmasked base (production's personal
    data) while the admin has not allowed it (``PGOVERLAY_ACCESS_UNMASKED``)."""


class DoorForbiddenError(NotOwnerError):
    """The front door's own identity (``PGOVERLAY_DOOR_USER``) asked the engine for something
    only a branch's owner or root may do: it may only look, and grant or list credentials for
    a person it vouches for."""


class TokenError(PgoverlayError):
    """A caller's GitHub Actions OIDC token is refused: too large, not a JWT, not signed with
    RS256, signed by a key its issuer does not publish, of another issuer or audience, expired,
    not yet valid, issued in the future, or missing a claim pgoverlay needs. The message says
    which, and never holds the token. The network API answers it 401: the caller must get a new
    token (or the admin fix the pool's issuer or audience), not retry this one."""

    exit_code = 39


class IssuerError(TokenError):
    """The OIDC issuer's discovery document or keys (its JWKS) cannot be fetched, or are not
    what OpenID Connect says they must be: the token could not be checked, good or not. A
    TokenError too (nothing is done for the caller), but one that may pass: the network API
    answers it 503, and the message names the issuer's address and what went wrong."""


class PolicyError(PgoverlayError):
    """A verified GitHub Actions job is not one the pool's policy admits (its owner, its
    repository, its workflow, or a fork's pull request): the message names the policy's rule
    and the fix. The network API answers it 403; nothing is done for the caller."""

    exit_code = 40


class BranchStateError(BranchError):
    """A branch is not in a state the operation works from (suspending a branch that is
    being reset, say): the message names its state and what to do."""

    exit_code = 41


# -- pydantic's ValidationError as one of ours ---------------------------------------------


Location = tuple[int | str, ...]


class _Invalid(Protocol):
    """What :func:`config_error` reads of pydantic's ``ValidationError`` (pydantic is not
    imported here: every command imports this module)."""

    def errors(self, *, include_url: bool = ..., include_input: bool = ...) -> Sequence[Any]: ...


class Problems:
    """Problems a module found in values it read without pydantic (the Action's inputs, its
    job's variables), in the form :func:`config_error` reads, so that they are worded as a
    pydantic model's would be: each a place (``()`` for the whole) and what is wrong there."""

    def __init__(self, found: Sequence[tuple[Location, str]]) -> None:
        self.found = list(found)

    def errors(self, *, include_url: bool = False, include_input: bool = False) -> list[Any]:
        return [{"loc": loc, "msg": message} for loc, message in self.found]


def dotted(loc: Location) -> str:
    """A field's place as ``outer.inner.0``."""
    return ".".join(str(part) for part in loc)


def config_error(
    exc: _Invalid,
    *,
    what: str,
    fix: str = "",
    where: Callable[[Location], str] = dotted,
    error: type[PgoverlayError] = ConfigError,
) -> PgoverlayError:
    """The first problem pydantic found, as ``{what} {where}: {problem}`` (``{what}: {problem}``
    for a problem of the whole, where ``where`` gives ""), plus how many more there are and
    ``; {fix}``, in an ``error`` (ConfigError unless given). A validator's own message comes
    without pydantic's "Value error, ". Raise it ``from None``: pydantic's own message shows the
    input, which may hold a secret."""
    problems = exc.errors(include_url=False, include_input=False)
    first = problems[0]
    place = where(tuple(first["loc"]))
    problem = str(first["msg"]).removeprefix("Value error, ")
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    message = (
        f"{what} {place}: {problem}{more}" if place else f"{what.rstrip(':')}: {problem}{more}"
    )
    return error(f"{message}; {fix}" if fix else message)
