"""How the source's password reaches a seed without ever being on a command line.

A password in ``--from`` would show in ``ps``, in ``/proc/PID/cmdline`` and in shell history,
so the DSN may not hold one. The ways that stay out of argv, in the order they are taken:
``--password-file PATH``, ``PGPASSWORD``, a libpq passfile (``PGPASSFILE``, else ``~/.pgpass``),
and at last, on a terminal, a prompt.

A passfile is never parsed here: its bytes are copied into a private file the seeding programs'
user can read (the admin's own may be readable by root only, and a Docker container sees only
the pool), and libpq, in this process and in every child, reads that copy.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pgoverlay.errors import ConfigError, UnsafeFileError
from pgoverlay.runner.proc import OsUser
from pgoverlay.runner.safefs import read_regular

WAYS = (
    "PGPASSWORD, a passfile (PGPASSFILE or ~/.pgpass), --password-file PATH, "
    "or the prompt when pgoverlay runs on a terminal"
)
MAX_FILE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Credentials:
    """A password, or the content of a libpq passfile; neither is ever shown in a repr."""

    password: str | None = field(default=None, repr=False)
    passfile: bytes | None = field(default=None, repr=False)
    origin: str = ""  # where it came from, for messages: never the secret itself

    @property
    def given(self) -> bool:
        return self.password is not None or self.passfile is not None


NONE = Credentials()


def from_password_file(path: Path) -> Credentials:
    """The password in ``path``: a regular file of at most 64 KiB; one trailing newline is not
    part of the password."""
    data = read_regular(path, limit=MAX_FILE_BYTES, what=f"the password file {path}")
    try:
        password = data.decode().removesuffix("\n")
    except UnicodeDecodeError:
        raise UnsafeFileError(f"the password file {path} is not UTF-8 text") from None
    if not password:
        raise ConfigError(f"the password file {path} is empty: write the password into it")
    if "\n" in password:
        raise ConfigError(
            f"the password file {path} holds more than one line: write only the password "
            "(for a passfile of host:port:db:user:password lines, set PGPASSFILE instead)"
        )
    return Credentials(password=password, origin="--password-file")


def from_passfile(path: Path) -> Credentials:
    """A libpq passfile, refused like libpq refuses one that others can read."""
    what = f"the passfile {path}"
    data = read_regular(path, limit=MAX_FILE_BYTES, what=what)
    if os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UnsafeFileError(
            f"{what} can be read by group or others, so libpq would ignore it: chmod 0600 {path}"
        )
    return Credentials(passfile=data, origin=f"passfile {path}")


def resolve(
    *, password_file: Path | None, environ: Mapping[str, str], home: Path | None
) -> Credentials:
    """The source's credentials from the seed's options and environment (see the module)."""
    if password_file is not None:
        return from_password_file(password_file)
    if environ.get("PGPASSWORD"):
        return Credentials(password=environ["PGPASSWORD"], origin="PGPASSWORD")
    if environ.get("PGPASSFILE"):
        return from_passfile(Path(environ["PGPASSFILE"]))
    default = home / ".pgpass" if home is not None else None
    if default is not None and default.is_file():
        return from_passfile(default)
    return NONE


@contextlib.contextmanager
def passfile_copy(creds: Credentials, *, scratch: Path, owner: OsUser) -> Iterator[str | None]:
    """The path of a private copy of ``creds``' passfile that ``owner`` reads (None without
    one), removed on exit. ``scratch`` must be reachable by the programs that read it."""
    if creds.passfile is None:
        yield None
        return
    fd, name = tempfile.mkstemp(prefix="pgpass-", dir=scratch)  # 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            if os.geteuid() == 0:
                os.fchown(handle.fileno(), owner.uid, owner.gid)
            handle.write(creds.passfile)
        yield name
    finally:
        Path(name).unlink(missing_ok=True)
