"""Starting and stopping the front door from root's commands (`pgoverlay door --start`,
`pool init`, `pool down`, the demo): its systemd unit when installed, else a detached
`pgoverlay door`, found again by its pid file (``pidfile``). Never imported by the door's own
process, which is ``serve``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from pgoverlay.errors import ConfigError, TimeoutExpiredError
from pgoverlay.runner import polling, safefs
from pgoverlay.runner.door import pidfile
from pgoverlay.runner.door.reach import answering
from pgoverlay.runner.proc import process_start_epoch, require_root
from pgoverlay.runner.settings import ADMIN_ENV_FILE, Settings

UNIT = "pgoverlay-door.service"
# The detached door's command line; -P and cwd / as for the engine service.
DOOR_COMMAND = [sys.executable, "-P", "-m", "pgoverlay", "door"]


def start(settings: Settings) -> str:
    """Make sure the front door answers with ``settings``; say how (its unit under systemd,
    else a detached `pgoverlay door`, logging to ``<home>/door.log``). A door of this pool
    that runs with other settings is stopped first, and the answer says so."""
    require_root()
    found = pidfile.running(settings)
    if found is not None and found.fingerprint == settings.fingerprint():
        return f"front door answering on port {settings.door.port}"
    replaced = ""
    if found is not None:
        stop_door(settings)
        replaced = "the front door ran with other settings than these: stopped it; "
    elif answering(settings):
        raise ConfigError(
            f"something that is not this pool's front door answers on port {settings.door.port} "
            f"(the pool's {pidfile.pid_file(settings)} names no running door): "
            "stop it, or set PGOVERLAY_DOOR_PORT to a free port"
        )
    how = _launch(settings)
    now = pidfile.running(settings)
    if now is not None and now.fingerprint != settings.fingerprint():
        return (
            f"{how}, but it runs with the settings its unit gives it, not these: put them in "
            f"its environment file ({ADMIN_ENV_FILE}) and run `pgoverlay door --restart`"
        )
    return (
        f"{replaced}{how}; Postgres on port {settings.door.port}, pages on "
        f"{settings.door.https_port}"
    )


def restart(settings: Settings) -> str:
    """Stop this pool's door if it runs, and start it with ``settings``."""
    require_root()
    stopped = stop_door(settings)
    return ("stopped the front door; " if stopped else "") + start(settings)


def stop_door(settings: Settings) -> bool:
    """Stop this pool's door, its unit's under systemd: False when none was running."""
    from pgoverlay.runner.service.serve import systemd_runs

    require_root()
    if systemd_runs(UNIT):
        was = pidfile.running(settings) is not None
        subprocess.run(["systemctl", "stop", UNIT], check=True, capture_output=True, timeout=120)
        return was
    return stop(settings, wait=settings.stop_timeout)


def _launch(settings: Settings) -> str:
    """Start the door (its unit, or a detached process) and wait until it answers."""
    from pgoverlay.runner.service.serve import detach, systemd_runs

    process = None
    if systemd_runs(UNIT):
        subprocess.run(["systemctl", "start", UNIT], check=True, capture_output=True, timeout=60)
        how = f"started {UNIT}"
    else:
        process = detach(DOOR_COMMAND, settings, settings.home / "door.log")
        how = f"started the front door (log: {settings.home / 'door.log'})"

    def up() -> bool:
        if process is not None and process.poll() is not None:
            tail = (safefs.read_tail(settings.home / "door.log") or "").strip().splitlines()
            raise ConfigError(
                f"the front door exited at start ({process.returncode}): "
                + (tail[-1] if tail else "see its log")
            )
        return answering(settings) and pidfile.running(settings) is not None

    polling.wait_for(
        up,
        timeout=settings.start_timeout,
        what=f"the front door to answer on port {settings.door.port}",
    )
    return how


def stop(settings: Settings, *, wait: float) -> bool:
    """Stop the door this pool started, if it runs: SIGTERM, then SIGKILL after ``wait``
    seconds. False when none was running."""
    found = pidfile.running(settings)
    if found is None:
        return False
    pid, started = found.pid, found.started
    for signal_number in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal_number)
        with contextlib.suppress(TimeoutExpiredError):
            polling.wait_for(
                lambda: process_start_epoch(pid) != started,
                timeout=wait,
                what="the front door to stop",
                max_interval=0.1,
            )
            break
    with contextlib.suppress(FileNotFoundError):
        pidfile.pid_file(settings).unlink()
    return True
