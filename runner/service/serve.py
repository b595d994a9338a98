"""Run the engine service: a root process answering on a Unix socket that only root and the
service's group may open (root:pgoverlay, 0660), and start it where systemd does not.

Who is calling, and what one caller may hold of it, is the protocol's (``protocol``); what one
request may carry is ``limits``'. The pool's policy for the socket's callers (``admission``) is
read before the socket is made, so a policy with a problem stops the service at its start, and
again on SIGHUP.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import uvicorn

from pgoverlay.errors import (
    CommandError,
    ConfigError,
    ServiceError,
    TimeoutExpiredError,
    UnsafePathError,
)
from pgoverlay.runner import polling, proc, safefs
from pgoverlay.runner.branch import expiry, idle, warm
from pgoverlay.runner.pool import Pool, gc, require_root
from pgoverlay.runner.service.admission import SocketPolicy
from pgoverlay.runner.service.app import create_app
from pgoverlay.runner.service.client import client, socket_path
from pgoverlay.runner.service.limits import MAX_HEAD_BYTES
from pgoverlay.runner.service.protocol import Caps, PeerCredProtocol, peer_of
from pgoverlay.runner.settings import Settings

log = logging.getLogger("pgoverlay.service")

UNIT = "pgoverlay.service"
SOCKET_MODE = 0o660
# An idle connection between two requests is closed after this (uvicorn's own default).
KEEP_ALIVE_SECONDS = 5
MAX_DESCRIPTORS = 65536
# Seconds between two top-ups of the warm branches (a claimed one is replaced within that).
WARM_INTERVAL = 2.0


def answering(settings: Settings) -> bool:
    try:
        client(settings).health()
    except ServiceError:
        return False
    return True


def group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(
            f"the service's group {name!r} does not exist: `pgoverlay pool init` makes it "
            f"(or `groupadd --system {name}`), or set PGOVERLAY_SERVICE_GROUP"
        ) from None


GROUPADD_TIMEOUT = 30.0  # seconds groupadd may take (it waits on /etc/group's lock)


def ensure_group(name: str) -> int:
    with contextlib.suppress(ConfigError):
        return group_id(name)
    try:
        proc.run(["groupadd", "--system", name], timeout=GROUPADD_TIMEOUT)
    except (CommandError, TimeoutExpiredError) as err:
        raise ConfigError(
            f"the service's group {name!r} does not exist and could not be made ({err}): make "
            f"it as root (`groupadd --system {name}`), or set PGOVERLAY_SERVICE_GROUP"
        ) from None
    return group_id(name)


def bind(path: Path, *, gid: int) -> socket.socket:
    """A listening socket at ``path``, root's and group ``gid``'s, mode 0660 from the moment
    its name appears (bound under a temporary name, then renamed over)."""
    parent = path.parent
    safefs.make_dir(parent, uid=0, gid=0, mode=0o755, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != 0:
            raise UnsafePathError(
                f"{path} exists and is not the service's socket: remove it, then start again"
            )
    temporary = parent / f".{path.name}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(os.fspath(temporary))
    finally:
        os.umask(old)
    os.chown(temporary, 0, gid, follow_symlinks=False)
    os.chmod(temporary, SOCKET_MODE)
    os.rename(temporary, path)
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def serve(settings: Settings) -> None:
    """Serve until SIGTERM/SIGINT, or until the pool or the socket is removed."""
    require_root()
    path = socket_path(settings)
    policy = SocketPolicy(settings.api.policy_file)  # as root: the admin's file may be root's
    with contextlib.closing(Pool.open(settings)) as pool:
        report = gc.collect(pool)  # a previous run may have been killed mid-operation
        log.info("start-up repair: %s", "; ".join(report.lines()))
    sock = bind(path, gid=ensure_group(settings.service_group))
    inode = os.stat(path).st_ino
    _more_descriptors()
    caps = Caps(
        connections_per_user=settings.service_connections_per_user,
        request_timeout=settings.service_request_timeout,
    )
    config = uvicorn.Config(
        create_app(settings, policy=policy),
        http=PeerCredProtocol.for_caps(caps),
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=int(settings.stop_timeout),
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )
    server = uvicorn.Server(config)
    stop = threading.Event()

    watcher = idle.Watcher()

    def housekeeping() -> None:
        """Warm branches topped up every 2 s (a claim is replaced within that); gc (TTLs,
        crashed servers) every ``service_gc_interval`` s; idle branches suspended, looked for
        every ``service_idle_interval`` s; stop when the pool or the socket is gone."""
        gc_interval = settings.service_gc_interval
        idle_interval = settings.service_idle_interval
        tick = min(WARM_INTERVAL, idle_interval) if idle_interval else WARM_INTERVAL
        waited = {"warm": 0.0, "gc": 0.0, "idle": 0.0}
        while not stop.wait(tick):
            for job in waited:
                waited[job] += tick
            try:
                still_ours = os.stat(path).st_ino == inode
            except FileNotFoundError:
                still_ours = False
            if not still_ours or not (settings.home / "pool.json").exists():
                log.info("the pool or the service's socket is gone: stopping")
                server.should_exit = True
                return
            if waited["warm"] >= WARM_INTERVAL:
                waited["warm"] = 0.0
                try:
                    with contextlib.closing(Pool.open(settings)) as pool:
                        done = warm.replenish(pool)
                    for made in done.started:
                        log.info("started warm branch %s", made)
                    for gone in done.retired:
                        log.info("retired warm branch %s", gone)
                except Exception:  # the edge of a loop: log, try again next time
                    log.exception("starting warm branches failed")
            if idle_interval and waited["idle"] >= idle_interval:
                waited["idle"] = 0.0
                try:
                    with contextlib.closing(Pool.open(settings)) as pool:
                        lines = watcher.round(pool).lines()
                    if lines:
                        log.info("idle branches: %s", "; ".join(lines))
                except Exception:  # the edge of a loop: log, try again next round
                    log.exception("looking for idle branches failed")
            if gc_interval and waited["gc"] >= gc_interval:
                waited["gc"] = 0.0
                try:
                    with contextlib.closing(Pool.open(settings)) as pool:
                        lines = gc.collect(pool).lines()
                    if lines != ["nothing to do"]:
                        log.info("gc: %s", "; ".join(lines))
                except Exception:  # the edge of a loop: log, try again next interval
                    log.exception("gc failed")

    keeper = threading.Thread(target=housekeeping, name="pgoverlay-housekeeping", daemon=True)
    keeper.start()
    expiry_timer(settings, stop)
    # `systemctl reload pgoverlay` (or `kill -HUP`): the policy file read again; uvicorn
    # handles SIGINT and SIGTERM only, and SIGHUP's default would end the service.
    signal.signal(signal.SIGHUP, lambda *_: policy.reload())
    if policy.current is not None:
        log.info("the socket's callers are held to the policy in %s", policy.path)
    log.info("engine service for %s listening on %s", settings.home, path)
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == inode:
                os.unlink(path)


def expiry_timer(settings: Settings, stop: threading.Event) -> threading.Thread | None:
    """The service's expiry timer (``branch.expiry``), started until ``stop`` is set; None when
    ``service_expiry_timer`` is off (gc revokes expired credentials then). Its own thread: a gc
    or a warm branch's start in the housekeeping thread takes seconds, and an expired
    credential's sessions end within ``expiry.BOUND`` s."""
    if not settings.service_expiry_timer:
        return None
    timer = threading.Thread(
        target=expiry.run,
        args=(lambda: Pool.open(settings), stop),
        name="pgoverlay-expiry",
        daemon=True,
    )
    timer.start()
    return timer


def _more_descriptors() -> None:
    """Raise this process's soft limit on open files to its hard one (at most
    ``MAX_DESCRIPTORS``): the usual soft 1024 is below what a few members may hold open
    within their connection caps, with the pool's own files and locks besides."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, MAX_DESCRIPTORS)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


# The detached service's command line. -P (and the cwd /): nothing is imported from the
# directory root started it in, where another user may have put a `json.py`.
SERVICE_COMMAND = [sys.executable, "-P", "-m", "pgoverlay", "service"]


def systemd_runs(unit: str) -> bool:
    """Whether systemd runs here and knows ``unit`` (installed by the admin)."""
    if not Path("/run/systemd/system").is_dir() or shutil.which("systemctl") is None:
        return False
    found = subprocess.run(
        ["systemctl", "cat", unit], capture_output=True, text=True, check=False, timeout=30
    )
    return found.returncode == 0


def detach(command: list[str], settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    """``command`` as a root process of its own session (it outlives the caller), from ``/``,
    with ``settings`` in its environment and its output appended to ``log``."""
    log_fd = safefs.open_log(log, uid=0, gid=0)
    try:
        return subprocess.Popen(
            command,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            env={**os.environ, **settings_environ(settings)},
            close_fds=True,
        )
    finally:
        os.close(log_fd)


def start(settings: Settings) -> str:
    """Make sure the service answers; say how. Under systemd the unit is started; elsewhere
    (containers, CI, the demo) a detached `pgoverlay service` process, logging to the pool's
    service.log."""
    require_root()
    if answering(settings):
        return f"engine service answering on {socket_path(settings)}"
    # The service would stop at its start on a policy with a problem, said only in its log:
    # said here, to the admin who starts it.
    SocketPolicy(settings.api.policy_file)
    ensure_group(settings.service_group)
    if systemd_runs(UNIT):
        subprocess.run(["systemctl", "start", UNIT], check=True, capture_output=True, timeout=60)
        how = f"started {UNIT}"
    else:
        detach(SERVICE_COMMAND, settings, settings.home / "service.log")
        how = f"started the engine service (log: {settings.home / 'service.log'})"
    polling.wait_for(
        lambda: answering(settings),
        timeout=settings.start_timeout,
        what=f"the engine service to answer on {socket_path(settings)}",
    )
    return f"{how}; answering on {socket_path(settings)}"


def settings_environ(settings: Settings) -> dict[str, str]:
    """``settings`` as the PGOVERLAY_* variables that make them again in a child process."""
    found: dict[str, str] = {}
    for name, value in settings.changed().items():
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        found[f"PGOVERLAY_{name.upper()}"] = text
    return found


def stop(settings: Settings, *, wait: float | None = None) -> bool:
    """Ask a running service to stop (by removing its socket: it notices within seconds, ends
    its requests and exits). With ``wait``, return once its process is gone, and it no longer
    holds the pool's registry open: after ``wait`` seconds it gets SIGTERM, then SIGKILL.
    False when no service had a socket."""
    path = socket_path(settings)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not (stat.S_ISSOCK(st.st_mode) and st.st_uid == 0):
        return False
    pid = _listener(path)
    os.unlink(path)
    if pid is not None and wait is not None:
        for signal_number in (None, signal.SIGTERM, signal.SIGKILL):
            if signal_number is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal_number)
                log.warning(
                    "the engine service (pid %s) did not stop: sent %s",
                    pid,
                    signal.Signals(signal_number).name,
                )
            with contextlib.suppress(TimeoutExpiredError):
                polling.wait_for(
                    # gone, or a zombie (its files closed; reaped if this process's child)
                    lambda: proc.process_start_epoch(pid) is None,
                    timeout=wait,
                    what="the engine service to stop",
                    max_interval=0.1,
                )
                break
    return True


def _listener(path: Path) -> int | None:
    """The pid of the process that listens on ``path`` (its peer credentials), or None."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5.0)
        try:
            sock.connect(os.fspath(path))
        except OSError:
            return None
        return peer_of(sock).pid
