"""Output is wrapped for a terminal only: piped into a file or a CI log, a long path or message
stays on one line (rich and argparse would otherwise break it at 80 columns)."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios

from helpers import require_root

# A pool folder no terminal is wide enough for (it does not exist: `doctor` says so).
LONG_HOME = "/var/tmp/" + "a-pool-folder-with-a-long-name-" * 5 + "/pool"
RUNTIME_HELP = (
    "where pg_basebackup and the prepare step run: `docker` runs them in a container of "
    "PGOVERLAY_DOCKER_IMAGE (no Postgres needed on the host); `auto` (the default) uses this "
    "host's binaries of the source's version when it has them"
)


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return {**env, **extra}


def _piped(args: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgoverlay", *args],
        env=_environment(**extra),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",
    )


def _on_a_terminal(args: list[str], *, columns: int, **extra: str) -> str:
    """What `pgoverlay ARGS` writes on a terminal ``columns`` wide (a real pseudo-terminal)."""
    main, sub = os.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    child = subprocess.Popen(
        [sys.executable, "-m", "pgoverlay", *args],
        env=_environment(**extra),
        stdin=sub,
        stdout=sub,
        stderr=sub,
        cwd="/",
    )
    os.close(sub)
    chunks = []
    try:
        while chunk := os.read(main, 65536):
            chunks.append(chunk)
    except OSError:  # EIO: the child closed its end of the terminal
        pass
    finally:
        os.close(main)
        child.wait(timeout=120)
    shown = b"".join(chunks).decode().replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;]*m", "", shown)  # colours take no room


def test_help_piped_into_a_file_keeps_each_usage_and_option_on_one_line() -> None:
    done = _piped(["base", "seed", "--help"])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    (usage,) = [line for line in lines if line.startswith("usage:")]
    # the whole usage on its one line: its first option through its last and the positional
    assert "[-h] [--from DSN]" in usage and usage.endswith("[--workload-top N] name"), usage
    assert any(line.strip() == RUNTIME_HELP for line in lines), done.stdout


def test_a_long_path_in_a_message_is_not_broken_off_a_terminal() -> None:
    require_root()  # `doctor` checks what root can do
    done = _piped(["doctor"], PGOVERLAY_HOME=LONG_HOME)
    assert f"FAIL pool: no pool at {LONG_HOME}: run `pgoverlay pool init`" in done.stdout.split(
        "\n"
    ), done.stdout
    for line in done.stdout.splitlines():  # one check a line, none continued on the next
        assert line.split()[0] in ("OK", "WARN", "FAIL"), done.stdout


def test_on_a_terminal_help_and_messages_still_wrap_at_its_width() -> None:
    require_root()
    shown = _on_a_terminal(["base", "seed", "--help"], columns=60)
    assert RUNTIME_HELP not in shown
    assert max(len(line) for line in shown.splitlines()) <= 60, shown
    doctor = _on_a_terminal(["doctor"], columns=60, PGOVERLAY_HOME=LONG_HOME)
    assert "no pool at" in doctor and LONG_HOME not in doctor
    assert max(len(line) for line in doctor.splitlines()) <= 60, doctor


def test_a_fingerprint_is_printed_as_it_is_not_as_emoji() -> None:
    """A certificate's SHA-256 fingerprint (`doctor`, the demo) holds pairs like ":AB:", which
    rich would turn into an emoji code (🆎): the CLI's console prints text as it is."""
    shown = subprocess.run(
        [sys.executable, "-c", "from pgoverlay.cli.common import out; "
         "out.print('SHA-256 03:6A:50:AB:F1:34 :ok: :smile:')"],
        capture_output=True, text=True, timeout=60, check=True, cwd="/",
    )  # fmt: skip
    assert shown.stdout == "SHA-256 03:6A:50:AB:F1:34 :ok: :smile:\n"
