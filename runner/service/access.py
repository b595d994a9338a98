"""May this process use an engine service's socket? If not, what is wrong and how to fix it.

Nothing but the standard library, and no import of pgoverlay: the Action's ``setup.sh`` runs
this file with the host's ``python3`` (``python3 -I access.py``) before it builds its virtual
environment, so that a runner's user outside the service's group, or a host with no service
running, fails in a second rather than after the build. The client asks the same functions
when a request cannot reach the socket, so both say the same thing.

The socket is ``root:<group>``, mode 0660: a process may connect when it holds the group. A
process keeps the groups it started with, so a runner started before its user was added to
the group does not have it yet, although ``/etc/group`` lists the user: the message tells
the two apart.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import sys
from pathlib import Path

SOCKET_ROOT = Path("/run/pgoverlay")  # every pool's service socket is <pool id>.sock here
CONNECT_SECONDS = 5.0
RESTART_RUNNER = (
    "restart the runner (`sudo systemctl restart 'actions.runner.*'`; a runner started by "
    "hand: stop its `./run.sh` and start it again, from a new login)"
)


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _group_of(path: Path) -> tuple[str, int | None]:
    """The socket's group, by name and id (the default name when the socket cannot be read)."""
    try:
        gid = os.stat(path).st_gid
    except OSError:
        return "pgoverlay", None
    try:
        return grp.getgrgid(gid).gr_name, gid
    except KeyError:
        return str(gid), gid


def _listed_in(user: str, group: str, gid: int | None) -> bool:
    """Whether the account database puts ``user`` in ``group`` (as a member, or as its primary
    group)."""
    try:
        entry = grp.getgrnam(group)
    except KeyError:
        return False
    try:
        primary = pwd.getpwnam(user).pw_gid
    except KeyError:
        primary = None
    return user in entry.gr_mem or primary in (entry.gr_gid, gid)


def not_a_member(path: Path) -> str:
    """Why this process may not open the socket at ``path``, naming its user and the
    socket's group, and the fix."""
    user = _user()
    group, gid = _group_of(path)
    if _listed_in(user, group, gid):
        return (
            f"this user ({user}) may not use the engine service's socket {path} yet: {user} is "
            f"in the group {group}, but this process started before it was added, and a "
            f"process keeps the groups it started with: {RESTART_RUNNER}"
        )
    return (
        f"this user ({user}) may not use the engine service's socket {path}: add it to the "
        f"service's group {group}, as root: `usermod -aG {group} {user}`, then "
        f"{RESTART_RUNNER}"
    )


def not_running(path: Path) -> str:
    return (
        f"the engine service is not running (no answer on {path}): start it with "
        "`systemctl start pgoverlay` or `pgoverlay pool init` (as root)"
    )


def explain(path: Path, err: OSError) -> str:
    """What a failed connection to the socket at ``path`` means, and the fix."""
    if err.errno in (errno.EACCES, errno.EPERM):
        return not_a_member(path)
    if err.errno in (errno.ENOENT, errno.ECONNREFUSED):
        return not_running(path)
    return f"the engine service at {path} did not answer: {err}"


def problem(path: Path) -> str | None:
    """None when this process can connect to the socket at ``path``; else what is wrong."""
    import socket  # here: the client imports this module, and `socket` costs it ~7 ms

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(CONNECT_SECONDS)
        try:
            sock.connect(os.fspath(path))
        except OSError as err:
            return explain(path, err)
    return None


DEFAULT_HOME = Path("/var/lib/pgoverlay")
ADMIN_ENV_FILE = Path("/etc/pgoverlay/pgoverlay.env")  # settings.ADMIN_ENV_FILE


def configured_home(environ: dict[str, str] | None = None) -> Path:
    """The pool this process's commands use: PGOVERLAY_HOME from the environment, else from
    the admin's /etc/pgoverlay/pgoverlay.env, else the default (as ``settings.load`` finds
    it, read here with the standard library alone)."""
    env = os.environ if environ is None else environ
    if env.get("PGOVERLAY_HOME"):
        return Path(env["PGOVERLAY_HOME"])
    try:
        lines = ADMIN_ENV_FILE.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    for line in lines:
        key, _, value = line.strip().removeprefix("export ").partition("=")
        if key.strip() == "PGOVERLAY_HOME" and value.strip():
            return Path(value.strip().strip("'\""))
    return DEFAULT_HOME


def socket_of(home: Path, root: Path = SOCKET_ROOT) -> Path:
    """The engine service's socket of the pool at ``home`` (``address.socket_path``: the
    first 8 hex digits of the SHA-256 of its resolved path)."""
    import hashlib

    return root / f"{hashlib.sha256(os.fspath(home.resolve()).encode()).hexdigest()[:8]}.sock"


def any_service_problem(root: Path = SOCKET_ROOT, *, home: Path | None = None) -> str | None:
    """None when this process can connect to the engine service of the pool at ``home`` (the
    settings' pool), or, when that pool has no socket here, to any on this host; else why not,
    naming that pool's socket when it has one, never another pool's."""
    try:
        sockets = sorted(root.glob("*.sock"))
    except OSError:
        sockets = []
    own = socket_of(home, root) if home is not None else None
    if own is not None and own in sockets:
        return problem(own)
    if not sockets:
        return (
            f"no engine service is running on this host (no socket in {root}): start it with "
            "`systemctl start pgoverlay` or `pgoverlay pool init` (as root)"
        )
    problems = [problem(path) for path in sockets]
    if any(found is None for found in problems):
        return None
    refused = [p for p, path in zip(problems, sockets, strict=True) if _denied(path)]
    return (refused or problems)[0]


def _denied(path: Path) -> bool:
    return not os.access(path, os.R_OK | os.W_OK)


def main() -> int:
    """`python3 access.py`: exit 0 when an engine service answers this user; else print why,
    as a GitHub Actions error annotation, and exit 30 (the client's exit code for it)."""
    found = any_service_problem(home=configured_home())
    if found is None:
        return 0
    text = found.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    print(f"::error title=pgoverlay::{text}", flush=True)
    return 30


if __name__ == "__main__":
    sys.exit(main())
