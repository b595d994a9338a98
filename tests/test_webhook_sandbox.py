"""Each job's PR code in a sandbox of its own: run by the listener's real, unprivileged user
(made by `pgoverlay webhook setup`), with real namespaces, real subordinate uids and real
processes left behind on purpose."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import as_user_call, cli, os_user, require_root
from pgoverlay.runner import doctor
from pgoverlay.runner.listener import SUBUID, ranges
from pgoverlay.runner.settings import Settings

HOOK_USER = "pgoverlay-test-hook"


@pytest.fixture(scope="module")
def hook() -> Iterator[tuple[pwd.struct_passwd, Path]]:
    """The listener's user and its state folder, as `pgoverlay webhook setup` makes them."""
    require_root()
    top = Path(tempfile.mkdtemp(prefix="pgoverlay-hook-", dir="/var/tmp"))
    top.chmod(0o755)
    state = top / "state"
    try:
        done = cli(["webhook", "setup", "--user", HOOK_USER, "--state-dir", str(state)], env={})
        assert done.returncode == 0, done.stderr
        again = cli(["webhook", "setup", "--user", HOOK_USER, "--state-dir", str(state)], env={})
        assert again.returncode == 0 and "made" not in again.stdout, again.stdout
        yield pwd.getpwnam(HOOK_USER), state
    finally:
        shutil.rmtree(top, ignore_errors=True)


def as_listener(code: str, **values: Any) -> Any:
    """Run ``code`` as the listener's user; it prints one JSON value, returned here."""
    prelude = (
        "import json, os, sys, tempfile\n"
        "from pathlib import Path\n"
        "from pgoverlay.webhook.sandbox import JobSandbox\n"
        "from pgoverlay.runner.polling import wait_for\n"
        f"values = json.loads({json.dumps(json.dumps(values))})\n"
    )
    modules = ["json", "tempfile", "pgoverlay.webhook.sandbox", "pgoverlay.runner.polling"]
    done = as_user_call(HOOK_USER, ["pgoverlay"], prelude + code, preload=modules)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


FIND_LEFTOVERS = """
def leftovers(marker):
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker in open(f"/proc/{entry}/cmdline", "rb").read():
                found.append(int(entry))
        except OSError:
            pass
    return found
"""


def subordinate_uid(user: str, inner: int) -> int:
    """The host uid of ``inner`` in ``user``'s sandboxes (inner 0 is the user itself)."""
    [(_, first, _)] = [r for r in ranges(SUBUID.read_text()) if r[0] == user]
    return first + inner - 1


def test_setup_makes_a_user_in_the_service_group_with_a_private_state_folder_and_ids(
    hook: tuple[pwd.struct_passwd, Path],
) -> None:
    user, state = hook
    assert user.pw_uid != 0 and user.pw_shell.endswith("nologin")
    assert HOOK_USER in grp.getgrnam("pgoverlay").gr_mem
    st = state.lstat()
    assert (st.st_uid, st.st_mode & 0o777) == (user.pw_uid, 0o700)
    assert subordinate_uid(HOOK_USER, 1) > 65535


def test_a_jobs_detached_leftover_dies_with_the_job_and_the_next_job_sees_nothing_of_it(
    hook: tuple[pwd.struct_passwd, Path],
) -> None:
    user, state = hook
    first = as_listener(
        FIND_LEFTOVERS
        + """
job = JobSandbox(Path(tempfile.mkdtemp(prefix="pgoverlay-pr-", dir=values["state"])), 1001)
(job.scratch / "head").mkdir()
(job.scratch / "head" / "001.sql").write_text("SELECT 1;\\n")
done = job.run(
    ["/bin/sh", "-c", values["script"]],
    timeout=60,
    env={"JOB_SECRET": "first-job-secret"},
    cwd=job.scratch / "head",
)
print(json.dumps({"scratch": str(job.scratch), "out": done.stdout,
                  "left": leftovers(b"sleep\\x001001")}))
""",
        state=str(state),
        script=(
            "id -u > whoami.txt; echo mine > /tmp/first-was-here; "
            "echo mine > /var/tmp/first-was-here; echo mine > /dev/shm/first-was-here; "
            "setsid sleep 1001 </dev/null >/dev/null 2>&1 & echo started"
        ),
    )
    assert first["out"].strip() == "started"
    assert first["left"] == [], "the detached process outlived its job"
    scratch = Path(first["scratch"])
    owner = (scratch / "head" / "whoami.txt").stat().st_uid
    assert (scratch / "head" / "whoami.txt").read_text().strip() == "1001"
    assert owner == subordinate_uid(HOOK_USER, 1001)
    assert owner not in (0, user.pw_uid)

    second = as_listener(
        """
job = JobSandbox(Path(tempfile.mkdtemp(prefix="pgoverlay-pr-", dir=values["state"])), 1002)
(job.scratch / "head").mkdir()
done = job.run(["/bin/sh", "-c", values["script"]], timeout=60, env={}, cwd=job.scratch / "head",
               check=False)
first = JobSandbox(Path(values["first"]), 1001)
first.remove()
job.remove()
print(json.dumps({"out": done.stdout, "err": done.stderr,
                  "left": [p for p in (first.scratch, job.scratch) if p.exists()]}))
""",
        state=str(state),
        first=first["scratch"],
        script=(
            'echo "uid $(id -u) groups $(id -G)"; '
            "ls -A /tmp /var/tmp /dev/shm; "
            "for p in /proc/[0-9]*; do echo \"proc $(stat -c %u $p) $(tr '\\0' ' ' <$p/cmdline)\"; "
            "done; "
            'echo "secret ${JOB_SECRET:-none}"; '
            f"cat {first['scratch']}/head/001.sql || echo 'first tree unreadable'"
        ),
    )
    out = second["out"]
    assert "uid 1002 groups 1002\n" in out, out
    assert "first-was-here" not in out and "whoami" not in out
    # Only its own processes, and the namespace's root shell that waits for them.
    seen = [line.split(" ", 2)[1:] for line in out.splitlines() if line.startswith("proc ")]
    assert seen and {uid for uid, _ in seen} == {"0", "1002"}, out
    assert not [cmd for _, cmd in seen if "sleep" in cmd], out
    assert "secret none" in out and "first tree unreadable" in out
    assert second["left"] == [], "a scratch folder was left behind"


def test_a_job_killed_at_its_timeout_takes_its_detached_processes_along(
    hook: tuple[pwd.struct_passwd, Path],
) -> None:
    _, state = hook
    result = as_listener(
        FIND_LEFTOVERS
        + """
from pgoverlay.errors import TimeoutExpiredError
job = JobSandbox(Path(tempfile.mkdtemp(prefix="pgoverlay-pr-", dir=values["state"])), 1003)
try:
    job.run(["/bin/sh", "-c", "setsid sleep 1003 </dev/null >/dev/null 2>&1 & sleep 600"],
            timeout=3, env={}, cwd=job.scratch)
    outcome = "finished"
except TimeoutExpiredError:
    outcome = "timed out"
wait_for(lambda: leftovers(b"sleep\\x001003") == [], timeout=30, what="the job's processes")
job.remove()
print(json.dumps({"outcome": outcome, "scratch": job.scratch.exists()}))
""",
        state=str(state),
    )
    assert result == {"outcome": "timed out", "scratch": False}


def test_the_listener_refuses_to_run_as_root() -> None:
    require_root()
    done = cli(["webhook", "serve"], env={"PGOVERLAY_WEBHOOK_SECRET": "x"})
    assert done.returncode == 2
    assert "does not run as root" in done.stderr and "webhook setup" in done.stderr


@pytest.mark.parametrize("filters", ["as this Python has them", "without extraction filters"])
def test_tarballs_extract_only_plain_files_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filters: str
) -> None:
    """Debian 12's Python 3.11.2 has no ``tarfile.data_filter`` (3.11.4+): a newer one is made
    to look like it, and the result must be the same."""
    import io
    import tarfile

    from pgoverlay.webhook.worker import _extract

    archive = tmp_path / "pr.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, kind in (
            ("top/db/001.sql", tarfile.REGTYPE),
            ("top/../escaped.sql", tarfile.REGTYPE),
            ("/tmp/absolute.sql", tarfile.REGTYPE),
            ("top/link.sql", tarfile.SYMTYPE),
            ("top/fifo", tarfile.FIFOTYPE),
        ):
            info = tarfile.TarInfo(name)
            info.type = kind
            data = b"SELECT 1;\n" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            info.linkname = "/etc/shadow" if kind == tarfile.SYMTYPE else ""
            info.mode = 0o4755
            tar.addfile(info, io.BytesIO(data))
    if filters == "without extraction filters":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    top = _extract(archive, tmp_path / "out")
    found = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert found == ["out", "out/top", "out/top/db", "out/top/db/001.sql", "pr.tar.gz"]
    assert top == tmp_path / "out" / "top"
    assert (top / "db" / "001.sql").stat().st_mode & 0o7000 == 0


def writable_folders(uid: int, gid: int) -> list[str]:
    """Every folder on this host that others may write in (sticky or not), or that host uid
    ``uid`` or gid ``gid`` may write in: the whole filesystem from /, except /proc and /sys."""
    found = []
    stack = ["/"]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:  # gone meanwhile (another test's mount), or not a folder to list
            continue
        for entry in entries:
            if entry.path in ("/proc", "/sys"):
                continue
            try:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            mode = st.st_mode
            if (
                mode & stat.S_IWOTH
                or (st.st_uid == uid and mode & stat.S_IWUSR)
                or (st.st_gid == gid and mode & stat.S_IWGRP)
            ):
                found.append(entry.path)
            stack.append(entry.path)
    return found


# Runs as the job: tries to write a file named MARK in each folder listed in /tmp/folders
# (NUL-separated), and prints the folders where it could.
WRITE_EVERYWHERE = """
import json, sys
written = []
for folder in open("/tmp/folders", "rb").read().decode("utf-8", "surrogateescape").split("\\0"):
    try:
        with open(f"{folder}/{sys.argv[1]}", "x") as f:
            f.write("left by the first job")
        written.append(folder)
    except OSError:
        pass
print(json.dumps(written))
"""

# Runs as the next job: prints the folders where it sees a file named MARK.
LOOK_EVERYWHERE = """
import json, os, sys
folders = open("/tmp/folders", "rb").read().decode("utf-8", "surrogateescape").split("\\0")
print(json.dumps([f for f in folders if os.path.lexists(f"{f}/{sys.argv[1]}")]))
"""


def test_a_job_writes_nowhere_the_next_job_or_the_host_sees(
    hook: tuple[pwd.struct_passwd, Path],
) -> None:
    """Every folder of this host that a job's uid could write in, found by walking the
    filesystem (not a list of the usual ones: /run/lock was one a list missed): what the job
    writes there is gone with it, for the next job and for the host."""
    _, state = hook
    job_uid = 1004
    host_id = subordinate_uid(HOOK_USER, job_uid)
    folders = writable_folders(host_id, host_id)
    assert {"/tmp", "/var/tmp", "/dev/shm", "/run/lock"} <= set(folders), folders[:20]
    mark = f"pgoverlay-leak-{os.getpid()}"
    run_job = """
job = JobSandbox(Path(tempfile.mkdtemp(prefix="pgoverlay-pr-", dir=values["state"])), values["uid"])
(job.scratch / "folders").write_bytes(values["folders"].encode("utf-8", "surrogateescape"))
(job.scratch / "probe.py").write_text(values["probe"])
done = job.run([sys.executable, "-I", "/tmp/probe.py", values["mark"]], timeout=300, env={},
               cwd=job.scratch)
job.remove()
print(json.dumps({"out": json.loads(done.stdout), "left": job.scratch.exists()}))
"""
    listed = "\0".join(folders)
    common = {"state": str(state), "folders": listed, "mark": mark}
    try:
        first = as_listener(run_job, uid=job_uid, probe=WRITE_EVERYWHERE, **common)
        # The job could write in its own places, and nowhere else.
        assert set(first["out"]) == {"/tmp", "/var/tmp", "/dev/shm", "/run/lock"}, first
        second = as_listener(run_job, uid=job_uid + 1, probe=LOOK_EVERYWHERE, **common)
        assert second["out"] == [], "the next job sees what the first one wrote"
        on_host = [f for f in folders if os.path.lexists(f"{f}/{mark}")]
        assert on_host == [], "what the job wrote stayed on the host"
        assert not first["left"] and not second["left"]
    finally:
        for folder in folders:
            with contextlib.suppress(OSError):
                os.unlink(f"{folder}/{mark}")


def test_a_jobs_program_reads_the_input_it_is_given(
    hook: tuple[pwd.struct_passwd, Path],
) -> None:
    """psql reads a marked migration file from its standard input: it reaches the program
    inside the job's namespace whole, as the job's uid."""
    _, state = hook
    text = "UPDATE t SET a = 1\\; CALL x('n', 0);\n" * 2000 + "é\n"
    got = as_listener(
        """
job = JobSandbox(Path(tempfile.mkdtemp(prefix="pgoverlay-pr-", dir=values["state"])), 1005)
done = job.run(["/bin/sh", "-c", "cat; id -u"], timeout=120, env={}, cwd=job.scratch,
               input_text=values["text"])
job.remove()
print(json.dumps({"out": done.stdout, "code": done.returncode}))
""",
        state=str(state),
        text=text,
    )
    assert got["code"] == 0
    assert got["out"] == text + "1005\n"


def test_doctor_checks_the_listener_it_finds_set_up(
    hook: tuple[pwd.struct_passwd, Path], settings: Settings
) -> None:
    _, state = hook
    checks = doctor.listener(settings, user=HOOK_USER, state_dir=state)
    assert {c.name: c.verdict for c in checks} == {
        "listener user": "ok",
        "listener ids": "ok",
        "listener state": "ok",
        "listener newuidmap": "ok",
        "listener newgidmap": "ok",
    }, checks


def test_doctor_says_what_a_listener_lacks_and_how_to_fix_it(
    settings: Settings, tmp_path: Path
) -> None:
    """A listener's user made by hand: outside the service's group, no subordinate ids, a
    state folder others can read, and no newuidmap where doctor looks."""
    require_root()
    user = os_user("pgoverlay-test-bare-hook")
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chown(state, user.pw_uid, user.pw_gid)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    checks = {
        c.name: c
        for c in doctor.listener(
            settings, user=user.pw_name, state_dir=state, path=os.fspath(bin_dir)
        )
    }
    fix = f"run `pgoverlay webhook setup --state-dir {state}` as root"
    assert checks["listener user"].verdict == "fail"
    assert "is not in the group pgoverlay" in checks["listener user"].detail
    assert checks["listener ids"].verdict == "fail"
    assert "needs 65536 subordinate uids and gids" in checks["listener ids"].detail
    assert checks["listener state"].verdict == "fail"
    assert "mode 0755, not the listener's alone (0700)" in checks["listener state"].detail
    for name in ("listener user", "listener ids", "listener state"):
        assert fix in checks[name].detail
    assert checks["listener newuidmap"].verdict == "fail"
    assert "apt-get install uidmap" in checks["listener newuidmap"].detail
    assert doctor.blocking(list(checks.values()))


def test_doctor_checks_no_listener_where_none_is_set_up(settings: Settings) -> None:
    assert doctor.listener(settings, user="pgoverlay-test-no-listener") == []
