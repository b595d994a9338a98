"""`pgoverlay door --start`, `--restart` and `--stop` without systemd: the door this pool
started is the one its pid file names (checked against the process's start time), with the
fingerprint of the settings it runs with, so a start with other settings replaces it rather
than saying "answering" and keeping the old ones."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from helpers import cli, free_tcp_port
from pgoverlay.runner.door import control, pidfile
from pgoverlay.runner.pool import Pool


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def door_env(pool: Pool, env: dict[str, str]) -> Iterator[dict[str, str]]:
    ports = {"PGOVERLAY_DOOR_PORT": free_tcp_port(), "PGOVERLAY_DOOR_HTTPS_PORT": free_tcp_port()}
    yield {**env, "PGOVERLAY_DOOR_ADDRESS": "127.0.0.1"} | {k: str(v) for k, v in ports.items()}
    control.stop(pool.settings, wait=30)


def test_a_start_with_other_settings_replaces_the_running_door_and_says_so(
    pool: Pool, door_env: dict[str, str]
) -> None:
    first = cli(["door", "--start"], env=door_env, timeout=120)
    assert first.returncode == 0, first.stderr
    running = pidfile.running(pool.settings)
    assert running is not None
    old_https = int(door_env["PGOVERLAY_DOOR_HTTPS_PORT"])
    assert answers(old_https)

    same = cli(["door", "--start"], env=door_env, timeout=120)
    assert same.returncode == 0, same.stderr
    assert "answering on port" in same.stdout
    assert pidfile.running(pool.settings) == running  # the same process, left alone

    changed = {**door_env, "PGOVERLAY_DOOR_HTTPS_PORT": str(free_tcp_port())}
    moved = cli(["door", "--start"], env=changed, timeout=120)
    assert moved.returncode == 0, moved.stderr
    assert "ran with other settings than these" in moved.stdout, moved.stdout
    now = pidfile.running(pool.settings)
    assert now is not None and now.pid != running.pid
    assert answers(int(changed["PGOVERLAY_DOOR_HTTPS_PORT"]))
    assert not answers(old_https)  # the old door is gone, not left beside the new one


def test_restart_and_stop_without_systemd(pool: Pool, door_env: dict[str, str]) -> None:
    postgres_port = int(door_env["PGOVERLAY_DOOR_PORT"])
    started = cli(["door", "--restart"], env=door_env, timeout=120)
    assert started.returncode == 0, started.stderr
    first = pidfile.running(pool.settings)
    assert first is not None and answers(postgres_port)

    again = cli(["door", "--restart"], env=door_env, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("stopped the front door; "), again.stdout
    second = pidfile.running(pool.settings)
    assert second is not None and second.pid != first.pid and answers(postgres_port)

    stopped = cli(["door", "--stop"], env=door_env, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == "stopped the front door"
    assert pidfile.running(pool.settings) is None and not answers(postgres_port)
    none = cli(["door", "--stop"], env=door_env, timeout=120)
    assert none.returncode == 0 and none.stdout.strip() == "no front door of this pool was running"


def test_a_start_refuses_a_port_another_program_answers_on(
    pool: Pool, door_env: dict[str, str]
) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = {**door_env, "PGOVERLAY_DOOR_PORT": str(other.getsockname()[1])}
        refused = cli(["door", "--start"], env=taken, timeout=120)
    assert refused.returncode != 0
    assert "is not this pool's front door" in refused.stderr
    assert "PGOVERLAY_DOOR_PORT" in refused.stderr
