"""The one exception tree. Every error a user can cause says what is wrong and how to fix it.

Each class carries a distinct process exit code so scripts can tell failures apart.
"""

from __future__ import annotations


class PgoverlayError(Exception):
    """Root of every error pgoverlay raises on purpose."""

    exit_code = 1


class ConfigError(PgoverlayError):
    exit_code = 2


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
    exit_code = 3


class OverlayUnsupportedError(PgoverlayError):
    exit_code = 4


class PoolError(PgoverlayError):
    exit_code = 5


class PoolFullError(PoolError):
    exit_code = 6


class CommandError(PgoverlayError):
    """An external program failed; carries its (already secret-free) stderr."""

    exit_code = 7

    def __init__(self, message: str, *, stderr: str = "", returncode: int | None = None) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.returncode = returncode


class PostgresBinariesError(PgoverlayError):
    exit_code = 8


class VersionMismatchError(PgoverlayError):
    exit_code = 9


class SeedError(PgoverlayError):
    exit_code = 10


class SourceUnreachableError(SeedError):
    exit_code = 11


class SeedBusyError(SeedError):
    exit_code = 12


class SourcePasswordError(SourceUnreachableError):
    """The source asks for a password and none was given in a way that stays out of argv."""


class BaseMissingError(PgoverlayError):
    exit_code = 13


class BranchError(PgoverlayError):
    exit_code = 14


class InvalidNameError(BranchError):
    exit_code = 15


class BranchExistsError(BranchError):
    exit_code = 16


class BranchMissingError(BranchError):
    exit_code = 17


class PortsExhaustedError(BranchError):
    exit_code = 18


class BranchStartError(BranchError):
    exit_code = 19


class TimeoutExpiredError(PgoverlayError):
    exit_code = 20


class MigrationError(PgoverlayError):
    exit_code = 21


class LockBusyError(PgoverlayError):
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


class RegistryRowError(PoolError):
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
    """The pool's limit on branches (in total, or per repository) is reached."""

    exit_code = 29


class ServiceError(PgoverlayError):
    """The engine service cannot be reached (not running, or this user is not in its group),
    or it answered something that is not its protocol."""

    exit_code = 30


class BaseInUseError(PgoverlayError):
    """A base (or one version of it) that branches still use was asked to be removed without
    destroying them."""

    exit_code = 31


class DeliveryError(PgoverlayError):
    """A signed webhook delivery the listener cannot act on: a header missing or outside what
    GitHub sends, a body that is not the JSON GitHub sends for its event. It is answered 400
    and recorded with this message, and nothing is queued."""

    exit_code = 32
