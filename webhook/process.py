"""The worker process as the intake process sees it: started with intake, watched, stopped on
shutdown. If it dies, intake goes on acknowledging and queueing deliveries; /healthz and
/metrics say that no job runs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

from pgoverlay.runner import proc

log = logging.getLogger(__name__)

# `pgoverlay webhook work` on this interpreter, finding the modules where this process found
# them (its sys.path, .pth files included: a venv, an editable install, a folder it was given).
WORK = """import site, sys
for entry in sys.argv[1:]:
    site.addsitedir(entry)
from pgoverlay.cli import main
sys.exit(main(["webhook", "work"]))
"""
KILL_WAIT = 10.0  # seconds a SIGKILLed worker process gets to be reaped


class WorkerProcess:
    """``pgoverlay webhook work`` as a child of intake, ``nice`` steps below intake's CPU
    priority (the branch servers it starts inherit that). ``grace`` is how long it gets to stop
    after SIGTERM (its own shutdown grace, plus a margin) before it is killed."""

    def __init__(self, *, grace: float, nice: int, argv: list[str] | None = None) -> None:
        self.grace = grace
        self.nice = nice
        self.argv = argv or [sys.executable, "-P", "-c", WORK, *(p for p in sys.path if p)]
        self.child: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        """Call from the main thread (see :func:`proc.companion`)."""
        self.child = proc.companion(self.argv, env=os.environ, nice=self.nice)
        log.info("started the worker process %s", self.child.pid)
        threading.Thread(target=self._watch, name="pgoverlay-watch-workers", daemon=True).start()

    def _watch(self) -> None:
        assert self.child is not None
        code = self.child.wait()
        if not self._stopping.is_set():
            log.error("%s", self.problem() or f"the worker process exited with code {code}")

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child is not None else None

    def alive(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def problem(self) -> str | None:
        """None while it runs; else what is wrong and what to do."""
        if self.child is None:
            return "the worker process has not started"
        code = self.child.poll()
        if code is None:
            return None
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return (
            f"the worker process {how}: deliveries are still acknowledged and queued, but no"
            " job runs; read the log for why, then restart the listener"
            " (systemctl restart pgoverlay-webhook)"
        )

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it is not gone within ``grace`` seconds."""
        self._stopping.set()
        child = self.child
        if child is None or child.poll() is not None:
            return
        child.terminate()
        try:
            child.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            log.warning("the worker process did not stop within %.0f s: killing it", self.grace)
            child.kill()
            child.wait(timeout=KILL_WAIT)
