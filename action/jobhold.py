"""A job's hold on its branch, kept after the Action's step for the rest of the job.

With `server:`, the Action holds its pull request's branch (``NetworkEngine.hold``) before it
looks at it. Its step ends, but the job goes on: later steps test the app against the branch
its ``dsn`` names. Another job of the same pull request (another runner, no ``concurrency:``)
must not reset or migrate that branch meanwhile. So when the step ends well, it hands the hold
to a keeper (``hand_over``): a small process in a session of its own that renews the hold while
the job runs and gives it back when the job ends; the other job waits for it. A later step of
the same job (the Action used twice) finds the hold's note in the job's RUNNER_TEMP
(``kept_by_this_job``) and works under it, rather than wait for its own job to end.

How the keeper knows the job ended: it watches the job's process (``job_process``: the step's
nearest ancestor that is not a shell, the runner's worker or act), checked by its start time so
that a reused pid is not taken for it, and gives the hold back within a second of its end. It
also carries the job's ``RUNNER_TRACKING_ID``, by which GitHub's runner ends a job's leftover
processes, and stops after ``MAX_SECONDS`` (GitHub's longest job) in any case. A keeper killed
before it gives the hold back leaves a hold that lapses within ``netclient.HOLD_SECONDS``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pgoverlay.action import outputs
from pgoverlay.errors import LockBusyError, PgoverlayError, TimeoutExpiredError
from pgoverlay.runner import polling, proc, safefs
from pgoverlay.runner.service.netclient import HOLD_SECONDS, NetworkEngine, OidcCredential

log = logging.getLogger(__name__)

MAX_SECONDS = 6 * 3600  # GitHub's longest job
RENEW_EVERY = HOLD_SECONDS / 3
WATCH_EVERY = 1.0  # seconds between looks at the job's process
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "busybox"})
# What the keeper needs of the step's environment: the job's OIDC token (asked again as it
# expires) and the runner's mark of the job's processes.
_PASSED = ("ACTIONS_ID_TOKEN_REQUEST_URL", "ACTIONS_ID_TOKEN_REQUEST_TOKEN", "RUNNER_TRACKING_ID")


@dataclass(frozen=True)
class Process:
    """A process, known by its pid and its start time (clock ticks since boot)."""

    pid: int
    started: int

    @classmethod
    def of(cls, pid: int) -> Process | None:
        found = _stat(pid)
        return cls(pid, found[1]) if found else None

    def alive(self) -> bool:
        found = _stat(self.pid)
        return found is not None and found[1] == self.started


def _stat(pid: int) -> tuple[int, int, str] | None:
    """The parent pid, start time and name of process ``pid`` (None: there is none)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2 :].split()
    return int(rest[1]), int(rest[19]), name


def job_process(start: int) -> Process | None:
    """The job's process: from ``start`` up, the first process that is not a shell (None: the
    chain ends first, as in a container whose processes are the job's alone)."""
    pid = start
    for _ in range(64):
        found = _stat(pid)
        if found is None or pid <= 1:
            return None
        parent, started, name = found
        if name not in SHELLS:
            return Process(pid, started)
        pid = parent
    return None


def _notes(temp: Path, name: str) -> list[Path]:
    """The notes this job left of its holds on branch ``name`` (a name has no dot)."""
    return sorted(temp.glob(f"pgoverlay-{name}.*.hold"))


def kept_by_this_job(engine: NetworkEngine, name: str, *, temp: Path | None) -> bool:
    """Whether an earlier step of this job keeps the hold on branch ``name`` (its note is in
    the job's RUNNER_TEMP, which the runner empties after each job): then this step works
    under it, renewed now, rather than wait for its own job to end."""
    if temp is None:
        return False
    for note in _notes(temp, name):
        try:
            hold_id = safefs.read_regular(note, limit=256, what=f"{note}").decode().strip()
            engine.renew_hold(name, hold_id)
        except (PgoverlayError, UnicodeDecodeError):  # lapsed, or not ours: forget it
            note.unlink(missing_ok=True)
            continue
        return True
    return False


def hand_over(engine: NetworkEngine, name: str, hold_id: str, *, temp: Path | None) -> bool:
    """Start a keeper of hold ``hold_id`` on branch ``name`` for the rest of the job, and note
    it for the job's later steps; False when there is no job process to watch, or no
    RUNNER_TEMP (the hold is then given back by the step)."""
    watched = job_process(os.getppid())
    if watched is None or temp is None:
        return False
    for old in _notes(temp, name):
        old.unlink(missing_ok=True)
    outputs.write_new(
        temp, hold_id, prefix=f"pgoverlay-{name}.", suffix=".hold", variable="RUNNER_TEMP"
    )
    argv = [sys.executable, "-P", "-m", "pgoverlay.action.jobhold", engine.server, name]
    argv += ["--watch", str(watched.pid), "--started", str(watched.started)]
    if engine.ca_file is not None:
        argv += ["--ca-file", os.fspath(engine.ca_file)]
    env = {key: os.environ[key] for key in _PASSED if key in os.environ}
    env["PGOVERLAY_HOLD_ID"] = hold_id  # not in argv: another user may read a process's argv
    proc.spawn(argv, env=env, log_path=temp / f"pgoverlay-{name}.{os.getpid()}.log")
    return True


def keep(engine: NetworkEngine, name: str, hold_id: str, watched: Process) -> None:
    """Renew the hold while ``watched`` runs (at most MAX_SECONDS), then give it back."""
    renewed = [0.0]

    def job_ended() -> bool:
        if not watched.alive():
            return True
        now = time.monotonic()
        if now - renewed[0] >= RENEW_EVERY:
            engine.renew_hold(name, hold_id)  # LockBusyError: it lapsed, nothing to keep
            renewed[0] = now
        return False

    renewed[0] = time.monotonic()
    try:
        polling.wait_for(
            job_ended,
            timeout=MAX_SECONDS,
            what="the job to end",
            first_interval=WATCH_EVERY,
            max_interval=WATCH_EVERY,
        )
    except LockBusyError as err:
        log.warning("the hold on branch %s lapsed: %s", name, err)
        return
    except TimeoutExpiredError:
        log.warning("the job held branch %s for %d s, the most: giving it back", name, MAX_SECONDS)
    engine.give_back(name, hold_id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pgoverlay.action.jobhold")
    parser.add_argument("server")
    parser.add_argument("name")
    parser.add_argument("--watch", type=int, required=True)
    parser.add_argument("--started", type=int, required=True)
    parser.add_argument("--ca-file", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    hold_id = os.environ.get("PGOVERLAY_HOLD_ID", "")
    engine = NetworkEngine(
        args.server,
        credential=OidcCredential(args.server, lazy=True),
        ca_file=args.ca_file,
        timeout=60.0,
    )
    try:
        keep(engine, args.name, hold_id, Process(args.watch, args.started))
    except PgoverlayError as err:
        log.error("the hold on branch %s: %s", args.name, err)
        return 1
    log.info("the job ended: the hold on branch %s is given back", args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
