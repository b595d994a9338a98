"""The front door gives up root before it reads a byte from the network.

It starts as root (systemd's unit, or `pool init`'s child) only to do what needs root: make its
account, bind its ports (443 and other low ones included), read the TLS key (root's, 0600) into
memory and open its audit file. Then, before any connection is accepted, it becomes the door's
own account (``Settings.door.user``, a system user with no shell and no home) with one
supplementary group, the engine service's, so that the only thing it can reach as more than
an anonymous process is the engine's socket, where the engine knows it by its uid and lets it
look and grant, nothing else (``service.engine``). ``no_new_privs`` then keeps it from ever
gaining privileges again (a setuid program it might be tricked into starting runs without
them), and it is not dumpable, so no other process of its uid may trace it.

A bug in TLS, HTTP or the Postgres startup parser is then a bug in an unprivileged process
that holds no password, no token but the page's OAuth client secret, and no file of the pool.
"""

from __future__ import annotations

import grp
import os
import pwd
import subprocess

from pgoverlay.errors import SettingError

_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38


def account(name: str) -> tuple[int, int]:
    """The door's uid and primary gid, making the system account when it is missing."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        made = subprocess.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                "--comment",
                "pgoverlay front door",
                name,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if made.returncode != 0:
            raise SettingError(
                "door_user",
                f"the account {name} does not exist and could not be made "
                f"({made.stderr.strip() or made.returncode}): make it as root "
                f"(`useradd --system --user-group --shell /usr/sbin/nologin {name}`)",
            ) from None
        entry = pwd.getpwnam(name)
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise SettingError(
            "door_user", f"{name} is root or in root's group: name an account of its own"
        )
    return entry.pw_uid, entry.pw_gid


def group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise SettingError(
            "service_group",
            f"the engine service's group {name} does not exist: run `pgoverlay pool init`",
        ) from None


def _prctl(option: int, value: int) -> None:
    import ctypes  # only the door's own process needs it, once

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


def drop(uid: int, gid: int, *, groups: list[int]) -> None:
    """Become ``uid``:``gid`` with exactly ``groups`` besides, for good: real, effective and
    saved ids all change, so nothing can switch back; then no new privileges, not dumpable.
    Checked: a process that could still become root stops here rather than serve."""
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _prctl(_PR_SET_DUMPABLE, 0)
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:  # pragma: no cover - the kernel would have to ignore setresuid
        raise RuntimeError("the front door could become root again after dropping it")
    if os.getuid() != uid or os.geteuid() != uid or os.getegid() != gid:
        raise RuntimeError("the front door's ids did not change")  # pragma: no cover
