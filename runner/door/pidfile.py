"""The front door's folder under the pool's home (its self-signed certificate and key) and
root's record of the running door, its pid file: written by the door's process while root
prepares it (``serve.prepare``), read by the commands that start, stop and check it
(``control``, ``doctor``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pgoverlay.runner import safefs
from pgoverlay.runner.proc import process_start_epoch

if TYPE_CHECKING:
    from pgoverlay.runner.settings import Settings


def door_dir(settings: Settings) -> Path:
    return settings.home / "door"


def pid_file(settings: Settings) -> Path:
    """Root's record of the running door: its pid, when it started (so a reused pid is never
    signalled) and its settings' fingerprint (so a start with other settings replaces it),
    written once its ports are bound."""
    return door_dir(settings) / "door.pid"


@dataclass(frozen=True)
class Running:
    """The door this pool started, as its pid file says, checked to be that process still."""

    pid: int
    started: float
    fingerprint: str  # Settings.fingerprint() of the settings it runs with ("": not said)


def running(settings: Settings) -> Running | None:
    """The door this pool's pid file names, if that very process still runs."""
    text = safefs.read_small(pid_file(settings))
    fields = (text or "").split()
    try:
        pid, started = int(fields[0]), float(fields[1])
    except (IndexError, ValueError):
        return None
    if process_start_epoch(pid) != started:
        return None  # gone, or the pid is another process's now
    return Running(pid, started, fields[2] if len(fields) > 2 else "")
