"""Start, check and stop one Postgres server process.

A PID is not trusted until checked: ``postmaster.pid`` names the process, and we compare the
process's start time and command before signalling it. A server is stopped by its process group
(it runs in its own session), and we wait until it is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pgoverlay.errors import BranchStartError, TimeoutExpiredError, UnsafePathError
from pgoverlay.runner import proc, safefs
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.proc import OsUser, process_start_epoch

if TYPE_CHECKING:  # binaries runs its server through this module
    from pgoverlay.runner.postgres.binaries import PgInstall


@dataclass(frozen=True)
class PidFile:
    pid: int
    datadir: str
    start_epoch: int
    port: int
    socket_dir: str
    status: str
    shm_id: int | None = None  # the System V shared memory segment the server made


READY_POLL = 0.01  # seconds between looks at a starting or stopping server


def read_pidfile(path: Path) -> PidFile | None:
    # In a directory the server's user owns: read no link, FIFO or hard link as root.
    text = safefs.read_small(path, limit=4096)
    if text is None:
        return None
    lines = text.splitlines()
    if len(lines) < 3 or not lines[0].strip().lstrip("-").isdigit():
        return None

    def line(i: int) -> str:
        return lines[i].strip() if len(lines) > i else ""

    try:
        return PidFile(
            pid=abs(int(line(0))),
            datadir=line(1),
            start_epoch=int(line(2) or 0),
            port=int(line(3) or 0) if line(3).isdigit() else 0,
            socket_dir=line(4),
            status=line(7),
            shm_id=int(line(6).split()[1]) if len(line(6).split()) == 2 else None,
        )
    except ValueError:
        return None  # not a file Postgres wrote


def shm_attached(shm_id: int) -> int:
    """How many processes are still attached to System V segment ``shm_id`` (0 if gone)."""
    try:
        rows = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    except OSError:
        return 0
    for row in rows:
        fields = row.split()
        if len(fields) > 6 and fields[1] == str(shm_id):
            return int(fields[6])
    return 0


def wait_detached(info: PidFile, *, timeout: float) -> None:
    """After a crash, the dead server's other processes may still hold its shared memory for a
    moment, and a new server refuses to start until they are gone: wait for them."""
    if info.shm_id is None or shm_attached(info.shm_id) == 0:
        return
    wait_for(
        lambda: shm_attached(info.shm_id or 0) == 0 or None,
        timeout=timeout,
        what="the crashed server's processes to exit",
    )


@dataclass(frozen=True)
class Usage:
    """What a server's processes cost: memory (proportional set size, so pages shared with
    other servers, like the binaries, count a fair share) and CPU time so far."""

    processes: int
    pss_bytes: int
    cpu_seconds: float


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc (a server's backends are its children)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        pending += parents.get(current, [])
    return found


def usage(pid: int) -> Usage | None:
    """Memory and CPU of the server whose postmaster is ``pid`` and of all its processes;
    None if it is gone."""
    pss, cpu, count = 0, 0.0, 0
    tick = os.sysconf("SC_CLK_TCK")
    for member in _tree(pid):
        try:
            rollup = Path(f"/proc/{member}/smaps_rollup").read_text()
            stat = Path(f"/proc/{member}/stat").read_text()
        except OSError:
            continue
        for row in rollup.splitlines():
            if row.startswith("Pss:"):
                pss += int(row.split()[1]) * 1024
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu += (int(fields[11]) + int(fields[12])) / tick
        count += 1
    return Usage(count, pss, cpu) if count else None


def is_running(info: PidFile) -> bool:
    """True only if ``info.pid`` is alive, is a postgres, and is the server the file names:
    it started when the file says, or (the wall clock having been stepped since, as on a
    virtual machine whose clock is corrected: the file holds the wall clock at its start, /proc
    the boot clock) it works in the file's data directory, where a postmaster changes to."""
    started = process_start_epoch(info.pid)
    if started is None:
        return False
    try:
        cmd = Path(f"/proc/{info.pid}/cmdline").read_bytes().split(b"\0")[0]
    except FileNotFoundError:
        return False
    if not cmd.endswith((b"postgres", b"postmaster")):
        return False
    if abs(started - info.start_epoch) <= 2:
        return True
    try:
        return bool(info.datadir) and os.readlink(f"/proc/{info.pid}/cwd") == info.datadir
    except OSError:
        return False


def start(
    install: PgInstall,
    *,
    datadir: Path,
    options: Mapping[str, str],
    user: OsUser,
    log_path: Path,
) -> subprocess.Popen[bytes]:
    argv: list[str | os.PathLike[str]] = [install.tool("postgres"), "-D", datadir]
    for key, value in options.items():
        argv += ["-c", f"{key}={value}"]
    return proc.spawn(argv, user=user, log_path=log_path)


def wait_ready(
    datadir: Path, *, child: subprocess.Popen[bytes] | None, log_path: Path, timeout: float
) -> PidFile:
    """Wait until the server in ``datadir`` says it accepts connections."""

    def probe() -> PidFile | None:
        if child is not None and child.poll() is not None:
            raise BranchStartError(
                f"Postgres exited with code {child.returncode} while starting: "
                f"{log_tail(log_path)} (full log: {log_path})"
            )
        info = read_pidfile(datadir / "postmaster.pid")
        if info is None or info.status != "ready":
            return None
        # A stale file from a crashed server also says "ready": trust only our own child.
        ours = info.pid == child.pid if child is not None else is_running(info)
        return info if ours else None

    try:
        # A start takes a few hundred ms: poll the pid file often, as waiting is the cost.
        return wait_for(
            probe,
            timeout=timeout,
            what=f"Postgres in {datadir} to accept connections",
            max_interval=READY_POLL,
        )
    except TimeoutExpiredError as err:
        raise BranchStartError(f"{err}: {log_tail(log_path)} (full log: {log_path})") from None


def log_tail(log_path: Path, lines: int = 3) -> str:
    """The log's last lines, led by its first FATAL or PANIC line (the cause, usually).

    The log is in a directory the server's user owns: only its last 64 KiB are read, never
    through a link, and nothing but a regular file with one link is read at all."""
    try:
        text = safefs.read_tail(log_path)
    except (UnsafePathError, OSError) as err:
        return f"(log not read: {type(err).__name__})"
    if text is None:
        return "(no log)"
    tail = proc.last_lines(text, lines)
    cause = next((ln for ln in text.splitlines() if "FATAL:" in ln or "PANIC:" in ln), "")
    return f"{cause.strip()} | {tail}" if cause and cause.strip() not in tail else tail


def reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is a child of this process that has ended (a server
    this process started, killed since): until then it is a zombie, which a new server's
    socket lock file check takes for a live postmaster, and refuses to start."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop(pidfile: Path, *, timeout: float, discard: bool = False) -> bool:
    """Stop the server named by ``pidfile`` if it runs; True if one was stopped. A fast
    shutdown (a checkpoint, then exit), or with ``discard`` (its data is thrown away next) an
    immediate one: no checkpoint to write and flush for nothing."""
    info = read_pidfile(pidfile)
    if info is None or not is_running(info):
        return False
    gone = lambda: not is_running(info)  # noqa: E731
    signals = ((signal.SIGQUIT, 1.0),) if discard else ((signal.SIGINT, 0.8), (signal.SIGQUIT, 0.2))
    for sig, share in signals:
        try:
            os.kill(info.pid, sig)
        except ProcessLookupError:
            return True
        try:
            wait_for(
                gone,
                timeout=timeout * share,
                what=f"Postgres pid {info.pid} to stop",
                max_interval=READY_POLL,
            )
            _kill_group(info.pid)  # leftovers of a crashed server, if any
            return True
        except TimeoutExpiredError:
            continue
    _kill_group(info.pid, signal.SIGKILL)
    wait_for(gone, timeout=10, what=f"Postgres pid {info.pid} to die")
    return True


def _kill_group(pgid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
