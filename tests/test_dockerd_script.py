"""scripts/dockerd.sh: the Docker daemon the tests start where there is no systemd is stopped
when they end (scripts/test.sh's trap), so running the tests does not leave `runtime: auto`
picking Docker for the machine's new branches; a daemon that answered already is left alone.

Each case runs the real script and the real dockerd in a mount and network namespace of its
own (fresh /run, /var/lib/docker and /var/log, its own loopback and processes), so the
machine's own daemon, if any, is neither seen nor touched, and nothing outlives the case.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers import require_root

ROOT = Path(__file__).resolve().parents[1]
APART = """
set -eu
mount -t tmpfs none /run
mount -t tmpfs none /var/lib/docker
mount -t tmpfs none /var/log
ip link set lo up
cd "$CHECKOUT"
answers() { if docker info >/dev/null 2>&1; then echo "$1: answers"; else echo "$1: silent"; fi; }
"""


def apart(script: str) -> str:
    """``script`` run as root in a namespace of its own; its output."""
    require_root()
    assert Path("/usr/sbin/dockerd").exists(), "scripts/docker.sh installs docker.io"
    done = subprocess.run(
        ["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc"]
        + ["--propagation", "private", "bash", "-c", APART + script],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CHECKOUT": os.fspath(ROOT)},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_the_tests_stop_the_dockerd_they_started_and_only_it() -> None:
    said = apart(
        """
        (  # scripts/test.sh's start and end
            trap 'scripts/dockerd.sh stop' EXIT
            scripts/dockerd.sh start
            answers during
        )
        answers after
        pgrep -a -x dockerd || echo "no dockerd runs"
        """
    )
    assert "during: answers" in said and "after: silent" in said, said
    assert "no dockerd runs" in said and "stopped the dockerd the tests started" in said


def test_a_dockerd_that_answered_before_the_tests_is_left_running() -> None:
    said = apart(
        """
        setsid /usr/sbin/dockerd >/var/log/admins-dockerd.log 2>&1 </dev/null &
        admins=$!
        for _ in $(seq 1 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
        scripts/dockerd.sh start
        scripts/dockerd.sh stop
        answers after
        kill -TERM "$admins"
        while [ -e "/proc/$admins" ]; do sleep 0.2; done
        """
    )
    assert "after: answers" in said and "stopped" not in said, said
