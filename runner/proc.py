"""Every external program is started from here: argument lists, a timeout, our own errors.

Secrets reach a child only through ``env`` (or a file), never through argv, and ``env`` is never
logged.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pwd
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pgoverlay.errors import (
    CommandError,
    NotRootError,
    PostgresBinariesError,
    TimeoutExpiredError,
)
from pgoverlay.runner import safefs

log = logging.getLogger(__name__)

# Variables a child may inherit from our environment; everything else is dropped so that a
# token in the caller's environment does not leak into Postgres or its tools.
_INHERITED = ("PATH", "LANG", "LC_ALL", "TZ", "HOME")


@dataclass(frozen=True)
class OsUser:
    name: str
    uid: int
    gid: int
    home: str

    @classmethod
    def lookup(cls, name: str) -> OsUser:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise PostgresBinariesError(
                f"OS user {name!r} does not exist: install the Postgres server package "
                "(apt-get install postgresql) or set PGOVERLAY_OS_USER to the user that runs "
                "Postgres"
            ) from None
        return cls(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)

    @classmethod
    def owner_of(cls, path: Path) -> OsUser:
        """The user owning ``path`` (e.g. the runner user owning a job's checkout)."""
        st = path.stat()
        try:
            entry = pwd.getpwuid(st.st_uid)
        except KeyError:
            return cls(name=str(st.st_uid), uid=st.st_uid, gid=st.st_gid, home="/")
        return cls(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)


def child_env(
    extra: Mapping[str, str] | None = None, *, user: OsUser | None = None
) -> dict[str, str]:
    env = {k: os.environ[k] for k in _INHERITED if k in os.environ}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    if user is not None:
        env["HOME"] = user.home
        env["USER"] = user.name
        env["LOGNAME"] = user.name
    if extra:
        env.update(extra)
    return env


def _identity(user: OsUser | None) -> tuple[int | None, int | None, list[int] | None]:
    """uid, gid and supplementary groups for the child; Nones to stay who we are."""
    if user is None or os.geteuid() == user.uid:
        return None, None, None
    return user.uid, user.gid, []


_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: be killed when the process that started us dies, so a killed
    ``pgoverlay`` leaves no ``pg_basebackup`` writing into a directory ``gc`` is removing."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    user: OsUser | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input_text: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a program to completion; raise CommandError with its stderr if it fails."""
    args = [os.fspath(a) for a in argv]
    log.debug("run %s", args)
    uid, gid, groups = _identity(user)
    try:
        done = subprocess.run(
            args,
            env=child_env(env, user=user),
            cwd=cwd
            if cwd is not None
            else (user.home if user and Path(user.home).is_dir() else "/"),
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            user=uid,
            group=gid,
            extra_groups=groups,
            preexec_fn=_die_with_parent,
        )
    except FileNotFoundError:
        raise CommandError(f"{args[0]} not found: install it or put it on PATH") from None
    except subprocess.TimeoutExpired:
        raise TimeoutExpiredError(
            f"{Path(args[0]).name} did not finish within {timeout:.0f} s"
        ) from None
    if check and done.returncode != 0:
        raise CommandError(
            f"{Path(args[0]).name} failed (exit {done.returncode}): {last_lines(done.stderr)}",
            stderr=done.stderr,
            returncode=done.returncode,
        )
    return done


def spawn(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str] | None = None,
    user: OsUser | None = None,
    log_path: Path,
    cwd: str | os.PathLike[str] = "/",
) -> subprocess.Popen[bytes]:
    """Start a long-lived process that outlives us: its own session, output to ``log_path``.

    The GitHub runner kills every process carrying its job's ``RUNNER_TRACKING_ID`` when a job
    ends; ``child_env`` does not pass it on.
    """
    args = [os.fspath(a) for a in argv]
    log.debug("spawn %s", args)
    uid, gid, groups = _identity(user)
    # The log's directory is the server user's: open no link, and append only to that
    # user's own regular file.
    fd = safefs.open_log(
        log_path,
        uid=user.uid if user is not None else os.geteuid(),
        gid=user.gid if user is not None else os.getegid(),
    )
    try:
        return subprocess.Popen(
            args,
            env=child_env(env, user=user),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,
            close_fds=True,
            user=uid,
            group=gid,
            extra_groups=groups,
        )
    finally:
        os.close(fd)


def companion(
    argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str], nice: int = 0
) -> subprocess.Popen[bytes]:
    """Start a process of our own program that works beside us: it shares our output, runs
    ``nice`` steps below our CPU priority from its first instruction, and gets SIGTERM when we
    die, so it can stop cleanly. ``env`` is passed whole (the companion reads the same settings
    as we did). The kernel sends that SIGTERM when the *thread* that started the companion
    ends: start it from the main thread."""
    args = [os.fspath(a) for a in argv]
    log.debug("companion %s", args)

    def before_exec() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if nice:
            os.nice(nice)

    return subprocess.Popen(
        args,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        close_fds=True,
        preexec_fn=before_exec,
    )


def last_lines(text: str, count: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-count:]) if lines else "(no output)"


def run_streaming(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float,
    on_line: Callable[[str], None],
    env: Mapping[str, str] | None = None,
    user: OsUser | None = None,
) -> str:
    """Run a program, calling ``on_line`` for each line (``\\r`` or ``\\n``) of its stderr.

    Returns the collected stderr; raises CommandError if it fails.
    """
    args = [os.fspath(a) for a in argv]
    log.debug("run %s", args)
    uid, gid, groups = _identity(user)
    try:
        child = subprocess.Popen(
            args,
            env=child_env(env, user=user),
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            user=uid,
            group=gid,
            extra_groups=groups,
            preexec_fn=_die_with_parent,
        )
    except FileNotFoundError:
        raise CommandError(f"{args[0]} not found: install it or put it on PATH") from None
    assert child.stderr is not None
    deadline = time.monotonic() + timeout
    collected: list[str] = []
    pending = b""
    with selectors.DefaultSelector() as sel:
        sel.register(child.stderr, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                child.kill()
                child.wait()
                raise TimeoutExpiredError(
                    f"{Path(args[0]).name} did not finish within {timeout:.0f} s"
                )
            if not sel.select(timeout=min(remaining, 1.0)):
                continue
            chunk = os.read(child.stderr.fileno(), 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.replace(b"\r", b"\n").split(b"\n")
            for raw in lines:
                text = raw.decode(errors="replace")
                if text.strip():
                    collected.append(text)
                    on_line(text)
    child.stderr.close()
    returncode = child.wait(timeout=max(deadline - time.monotonic(), 1.0))
    stderr = "\n".join(collected + ([pending.decode(errors="replace")] if pending else []))
    if returncode != 0:
        raise CommandError(
            f"{Path(args[0]).name} failed (exit {returncode}): {last_lines(stderr)}",
            stderr=stderr,
            returncode=returncode,
        )
    return stderr


def _boot_time() -> float:
    for row in Path("/proc/stat").read_text().splitlines():
        if row.startswith("btime "):
            return float(row.split()[1])
    return 0.0


def process_start_epoch(pid: int) -> float | None:
    """When ``pid`` started (epoch seconds), or None if it does not exist or is a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        with contextlib.suppress(ChildProcessError):  # our own child: reap it
            os.waitpid(pid, os.WNOHANG)
        return None
    ticks = int(fields[19])
    return _boot_time() + ticks / os.sysconf("SC_CLK_TCK")


def require_root() -> None:
    if os.geteuid() != 0:
        raise NotRootError(
            "pgoverlay needs root (it mounts branches and keeps the pool's registry root-only): "
            "run it with sudo, or as root on the runner"
        )
