"""The listener's own system user, made once by root (`pgoverlay webhook setup`).

The listener never runs as root. Its user is in the engine service's group (so it may ask the
service for branches), owns the listener's state folder (0700: the queue and the jobs' scratch
folders), and has a range of subordinate uids and gids (/etc/subuid, /etc/subgid) from which
each job's code gets a uid of its own (``pgoverlay.webhook.sandbox``). Idempotent: a second run
changes nothing that is already right.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from pgoverlay.errors import ConfigError, SandboxError
from pgoverlay.runner import proc
from pgoverlay.runner.pool import require_root
from pgoverlay.runner.service.serve import ensure_group

USER = "pgoverlay-webhook"
SUBID_COUNT = 65536  # what `unshare --map-users=auto` maps
SUBID_FLOOR = 100000  # where Debian's useradd starts handing out ranges
SUBUID, SUBGID = Path("/etc/subuid"), Path("/etc/subgid")

Say = Callable[[str], None]


def setup(*, user: str, state_dir: Path, group: str, say: Say) -> None:
    """Make ``user`` (a system user without a login shell), put it in ``group``, give it
    ``state_dir`` and a subordinate id range."""
    require_root()
    for tool in ("newuidmap", "newgidmap", "unshare", "setpriv"):
        if shutil.which(tool, path=proc.child_env()["PATH"]) is None:
            raise SandboxError(
                f"{tool} is missing: install the `uidmap` (newuidmap, newgidmap) and "
                "`util-linux` packages, then run `pgoverlay webhook setup` again"
            )
    gid = ensure_group(group)
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        proc.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--home-dir",
                state_dir,
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                user,
            ],
            timeout=60,
        )
        entry = pwd.getpwnam(user)
        say(f"made system user {user}")
    if gid not in os.getgrouplist(user, entry.pw_gid):
        proc.run(["usermod", "--append", "--groups", group, user], timeout=60)
        say(f"added {user} to group {group} (the engine service's socket)")
    _state_dir(state_dir, uid=entry.pw_uid, gid=entry.pw_gid, say=say)
    _subordinate_ids(user, say=say)


def _state_dir(path: Path, *, uid: int, gid: int, say: Say) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
        st = path.lstat()
        say(f"made {path}")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(
            f"{path} is not a directory (a link or a file): remove it, or choose another state "
            "folder with --state-dir, then run `pgoverlay webhook setup` again"
        )
    if (st.st_uid, st.st_gid) != (uid, gid) or stat.S_IMODE(st.st_mode) != 0o700:
        os.lchown(path, uid, gid)
        os.chmod(path, 0o700, follow_symlinks=False)
        say(f"{path} is the listener's alone (0700)")


def ranges(text: str) -> list[tuple[str, int, int]]:
    """The (owner, first id, count) lines of an /etc/subuid or /etc/subgid file."""
    found = []
    for line in text.splitlines():
        owner, _, rest = line.strip().partition(":")
        first, _, count = rest.partition(":")
        if owner and first.isdigit() and count.isdigit():
            found.append((owner, int(first), int(count)))
    return found


def next_free(taken: list[tuple[str, int, int]]) -> int:
    """The first id above every range ``taken`` (and not below the floor where subordinate
    ranges start)."""
    return max([SUBID_FLOOR, *(first + size for _, first, size in taken)])


def _subordinate_ids(user: str, *, say: Say) -> None:
    uid = pwd.getpwnam(user).pw_uid
    subuid, subgid = (ranges(f.read_text()) if f.exists() else [] for f in (SUBUID, SUBGID))
    mine = {user, str(uid)}
    have_uids = any(o in mine and n >= SUBID_COUNT for o, _, n in subuid)
    have_gids = any(o in mine and n >= SUBID_COUNT for o, _, n in subgid)
    if have_uids and have_gids:
        return
    first = next_free(subuid + subgid)
    span = f"{first}-{first + SUBID_COUNT - 1}"
    argv = ["usermod"]
    if not have_uids:
        argv += ["--add-subuids", span]
    if not have_gids:
        argv += ["--add-subgids", span]
    proc.run([*argv, user], timeout=60)
    say(f"gave {user} subordinate ids {span} (one uid of them per job)")


def state_problem(path: Path, *, uid: int) -> str | None:
    """What is wrong with the listener's state folder (``None``: a folder, the listener's
    alone, 0700)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return f"{path} does not exist"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder (a link or a file)"
    if st.st_uid != uid or stat.S_IMODE(st.st_mode) != 0o700:
        return (
            f"{path} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}, not "
            f"the listener's alone (0700)"
        )
    return None


def subordinate_ranges(user: str) -> dict[str, int]:
    """How many subordinate uids and gids /etc/subuid and /etc/subgid give ``user`` (by name or
    uid), each file by its name: what ``unshare --map-users=auto`` needs SUBID_COUNT of."""
    try:
        mine = {user, str(pwd.getpwnam(user).pw_uid)}
    except KeyError:
        mine = {user}
    found = {}
    for path in (SUBUID, SUBGID):
        taken = ranges(path.read_text()) if path.exists() else []
        found[path.name] = max([0, *(n for owner, _, n in taken if owner in mine)])
    return found
