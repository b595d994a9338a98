"""Attacks on the Action by the job that runs it: a workflow (or a pull request's code in it)
sets the variables GitHub Actions names files and folders with, or asks for what is not its.

Each attack runs the real `pgoverlay action run` as the runner's user (in the `pgoverlay`
group, not root), must fail with a clear message, must change no root-owned file, and must run
nothing as root: the migrate command writes `id -u` where the test reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import checkout
import pytest

from helpers import SESSION_BASE, cli, os_user
from pgoverlay.runner import branch
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion

RUNNER = "pgo-runner"  # the runner's user: in the service's group
OUTSIDER = "pgo-outsider"  # a user outside it
BRANCH = "shop-pr-9"
SECRET = "root-only-secret-5d1c"


@dataclass(frozen=True)
class Job:
    """One job's files and folders, the runner's, under a scratch folder; and root's files the
    attacks aim at."""

    root: Path  # scratch, root's (0755)
    workspace: Path  # the runner's checkout
    output: Path
    summary: Path
    event: Path
    who: Path  # where the migrate command writes `id -u`
    root_file: Path  # root:root 0644 in /etc
    root_only: Path  # root:root 0600 in /etc, holding SECRET
    uid: int


def _event(path: Path) -> None:
    pull = {
        "number": 9,
        "draft": False,
        "merged": False,
        "head": {"sha": "a" * 40, "ref": "feature", "repo": {"full_name": "acme/shop"}},
        "base": {"sha": "b" * 40, "ref": "main", "repo": {"full_name": "acme/shop"}},
    }
    data = {"action": "opened", "number": 9, "pull_request": pull}
    path.write_text(json.dumps({**data, "repository": {"full_name": "acme/shop"}}))


@pytest.fixture
def job(service: Path, base: BaseVersion, pool: Pool) -> Iterator[Job]:
    runner = os_user(RUNNER, groups=["pgoverlay"])
    os_user(OUTSIDER)
    root = Path(tempfile.mkdtemp(prefix="pgoverlay-attack-", dir="/var/tmp"))
    root.chmod(0o755)
    workspace = root / "workspace"
    workspace.mkdir()
    files = {name: root / name for name in ("output", "summary", "event.json", "who")}
    for path in files.values():
        path.touch()
    _event(files["event.json"])
    for path in (workspace, *files.values()):
        os.chown(path, runner.pw_uid, runner.pw_gid)
    fd, root_file = tempfile.mkstemp(prefix="pgoverlay-attack-", dir="/etc")
    os.write(fd, b"root's own file\n")
    os.close(fd)
    os.chmod(root_file, 0o644)
    fd, root_only = tempfile.mkstemp(prefix="pgoverlay-attack-", dir="/etc")
    os.write(fd, json.dumps({"action": "opened", "secret": SECRET}).encode())
    os.close(fd)
    try:
        yield Job(
            root=root,
            workspace=workspace,
            output=files["output"],
            summary=files["summary"],
            event=files["event.json"],
            who=files["who"],
            root_file=Path(root_file),
            root_only=Path(root_only),
            uid=runner.pw_uid,
        )
    finally:
        for b in pool.registry.branches():
            branch.destroy(pool, b.name)
        os.unlink(root_file)
        os.unlink(root_only)
        shutil.rmtree(root, ignore_errors=True)


def snapshot(paths: list[Path]) -> dict[str, tuple[object, ...]]:
    """Owner, mode, size, mtime and content hash of each file; a folder's entry names."""
    found: dict[str, tuple[object, ...]] = {}
    for path in paths:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            found[os.fspath(path)] = (st.st_uid, st.st_mode, tuple(sorted(os.listdir(path))))
        else:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[os.fspath(path)] = (st.st_uid, st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return found


def run_action(
    job: Job,
    env: dict[str, str],
    *,
    user: str = RUNNER,
    groups: tuple[str, ...] = ("pgoverlay",),
    **overrides: str,
) -> subprocess.CompletedProcess[str]:
    """`pgoverlay action run` as ``user``, in a job whose variables ``overrides`` changes."""
    variables = {
        **env,
        "GITHUB_EVENT_PATH": os.fspath(job.event),
        "GITHUB_EVENT_NAME": "pull_request",
        "GITHUB_REPOSITORY": "acme/shop",
        "GITHUB_WORKSPACE": os.fspath(job.workspace),
        "GITHUB_OUTPUT": os.fspath(job.output),
        "GITHUB_STEP_SUMMARY": os.fspath(job.summary),
        "INPUT_BASE": SESSION_BASE,
        "INPUT_COMMENT": "false",
        "INPUT_MIGRATE_COMMAND": f"id -u > {job.who}",
        **overrides,
    }
    return cli(["action", "run"], env=variables, user=user, groups=groups)


def assert_nothing_ran_as_root(job: Job) -> None:
    written = job.who.read_text().split()
    assert written in ([], [str(job.uid)]), f"the migrate command ran as uid {written}"


def test_the_action_runs_the_migrate_command_as_the_runner(
    job: Job, pool: Pool, env: dict[str, str]
) -> None:
    """The baseline the attacks are measured against: a job as GitHub sets it up works."""
    done = run_action(job, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert job.who.read_text().split() == [str(job.uid)]
    assert "status<<" in job.output.read_text()
    assert branch.get(pool, BRANCH).owner_uid == job.uid


def test_workspace_slash_runs_the_migrate_command_as_the_runner_not_root(
    job: Job, env: dict[str, str]
) -> None:
    targets = [Path("/"), job.root_file]
    before = snapshot(targets)
    command = f"id -u > {job.who}; echo pwned >> {job.root_file.relative_to('/')}; touch pwned"
    done = run_action(job, env, GITHUB_WORKSPACE="/", INPUT_MIGRATE_COMMAND=command)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Migration" in done.stdout and "failed" in done.stdout
    assert "Permission denied" in done.stdout, "the command's own error is shown"
    assert job.who.read_text().split() == [str(job.uid)]
    assert snapshot(targets) == before


def test_an_output_file_in_etc_is_refused_before_any_work(
    job: Job, pool: Pool, env: dict[str, str]
) -> None:
    before = snapshot([job.root_file])
    done = run_action(job, env, GITHUB_OUTPUT=os.fspath(job.root_file))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"cannot write GITHUB_OUTPUT={job.root_file}: this user may not write it" in done.stdout
    assert "do not change it in the workflow" in done.stdout
    assert snapshot([job.root_file]) == before
    assert pool.registry.branches() == [], "a step that cannot report made a branch"
    assert_nothing_ran_as_root(job)


def test_a_summary_symlinked_to_a_root_file_is_not_followed(
    job: Job, pool: Pool, env: dict[str, str]
) -> None:
    link = job.root / "summary-link"
    link.symlink_to(job.root_file)
    before = snapshot([job.root_file])
    done = run_action(job, env, GITHUB_STEP_SUMMARY=os.fspath(link))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"cannot write GITHUB_STEP_SUMMARY={link}: it is a symbolic link" in done.stdout
    assert snapshot([job.root_file]) == before
    assert pool.registry.branches() == []
    assert_nothing_ran_as_root(job)


def test_an_event_file_only_root_may_read_is_not_read(
    job: Job, pool: Pool, env: dict[str, str]
) -> None:
    before = snapshot([job.root_only])
    done = run_action(job, env, GITHUB_EVENT_PATH=os.fspath(job.root_only))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"cannot open GITHUB_EVENT_PATH={job.root_only}: Permission denied" in done.stdout
    assert SECRET not in done.stdout + done.stderr + job.output.read_text()
    assert SECRET not in job.summary.read_text()
    assert snapshot([job.root_only]) == before
    assert pool.registry.branches() == []
    assert_nothing_ran_as_root(job)


def test_a_base_named_by_a_path_is_refused_before_asking_the_service(
    job: Job, pool: Pool, env: dict[str, str]
) -> None:
    other = Path(tempfile.mkdtemp(prefix="pgoverlay-other-pool-", dir="/var/tmp"))
    try:
        before = snapshot([other, pool.home])
        done = run_action(job, env, INPUT_BASE=os.fspath(other))
        assert done.returncode == 2, done.stdout + done.stderr
        assert "input `base`" in done.stdout and "not a base name" in done.stdout
        assert "pgoverlay base list" in done.stdout
        assert snapshot([other, pool.home]) == before
    finally:
        shutil.rmtree(other)
    assert pool.registry.branches() == []
    assert_nothing_ran_as_root(job)


def test_a_base_this_pool_does_not_have_is_refused_by_the_service(
    job: Job, pool: Pool, env: dict[str, str]
) -> None:
    """Another pool's base is not this service's to hand out: it answers that no such base is
    seeded here, and makes nothing."""
    done = run_action(job, env, INPUT_BASE="other-pools-base")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "::error title=Branch not ready::no base named 'other-pools-base'" in done.stdout
    assert pool.registry.branches() == []
    assert_nothing_ran_as_root(job)


def test_a_pool_home_without_a_service_is_refused_with_how_to_start_it(
    job: Job, pool: Pool, env: dict[str, str]
) -> None:
    other = Path(tempfile.mkdtemp(prefix="pgoverlay-other-pool-", dir="/var/tmp"))
    try:
        done = run_action(job, env, PGOVERLAY_HOME=os.fspath(other))
        assert done.returncode == 30, done.stdout + done.stderr
        assert "the engine service is not running" in done.stdout
        assert os.listdir(other) == [], "nothing was made in the other folder"
    finally:
        shutil.rmtree(other)
    assert pool.registry.branches() == []
    assert_nothing_ran_as_root(job)


def test_a_caller_outside_the_group_is_told_how_to_join_it(
    job: Job, pool: Pool, env: dict[str, str]
) -> None:
    outsider = pwd.getpwnam(OUTSIDER)
    for path in (job.workspace, job.output, job.summary, job.event, job.who):
        os.chown(path, outsider.pw_uid, outsider.pw_gid)
    done = run_action(job, env, user=OUTSIDER, groups=())
    assert done.returncode == 30, done.stdout + done.stderr
    assert "may not use the engine service's socket" in done.stdout
    # the actual user and group, a command to paste as it is
    assert f"`usermod -aG pgoverlay {OUTSIDER}`" in done.stdout
    assert "restart the runner" in done.stdout
    assert output_values(job)["status"] == "failed", "status is set on every failure"
    assert pool.registry.branches() == []
    written = job.who.read_text().split()
    assert written in ([], [str(outsider.pw_uid)])


def output_values(job: Job) -> dict[str, str]:
    """The step's outputs as GitHub Actions reads GITHUB_OUTPUT: `name=value` lines and
    `name<<DELIMITER` blocks; a later value wins."""
    values: dict[str, str] = {}
    lines = job.output.read_text().splitlines()
    i = 0
    while i < len(lines):
        key, block, delimiter = lines[i].partition("<<")
        if block:
            end = lines.index(delimiter, i + 1)
            values[key] = "\n".join(lines[i + 1 : end])
            i = end + 1
        else:
            key, _, value = lines[i].partition("=")
            values[key] = value
            i += 1
    return values


def test_a_runner_started_before_its_user_joined_the_group_is_told_to_restart(
    job: Job, pool: Pool, env: dict[str, str]
) -> None:
    """/etc/group lists the runner's user, but its process started without the group: adding
    the user again would change nothing, restarting the runner does."""
    done = run_action(job, env, groups=())
    assert done.returncode == 30, done.stdout + done.stderr
    assert f"{RUNNER} is in the group pgoverlay, but this process started before" in done.stdout
    assert "restart the runner" in done.stdout and "usermod" not in done.stdout
    assert output_values(job)["status"] == "failed"
    assert pool.registry.branches() == []


def test_a_step_that_cannot_start_sets_status_failed(
    job: Job, pool: Pool, env: dict[str, str]
) -> None:
    done = run_action(job, env, INPUT_MIGRATIONS_SELECT="some")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "input `migrations-select`" in done.stdout
    assert output_values(job)["status"] == "failed"
    assert pool.registry.branches() == []


def setup_as(user: str, job: Job, cache: Path) -> subprocess.CompletedProcess[str]:
    """The Action's setup.sh (its first step), as ``user``, with an empty tool cache: the
    installed copy's, which ``user`` may read wherever the checkout is."""
    script = checkout.readable() / "action" / "setup.sh"
    return subprocess.run(
        [os.fspath(script)],
        env={
            "PATH": os.environ["PATH"],
            "HOME": os.fspath(cache),
            "ACTION_PATH": os.fspath(script.parents[1]),
            "RUNNER_TOOL_CACHE": os.fspath(cache),
            "GITHUB_OUTPUT": os.fspath(job.output),
        },
        user=user,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",
    )


def test_setup_refuses_a_user_outside_the_group_before_building_anything(
    job: Job, pool: Pool, service: Path
) -> None:
    """The first job of an Action version builds a virtual environment (tens of seconds);
    a user who cannot use the service is told so first, and nothing is built."""
    outsider = pwd.getpwnam(OUTSIDER)
    cache = job.root / "tool-cache"
    cache.mkdir()
    for path in (cache, job.output):
        os.chown(path, outsider.pw_uid, outsider.pw_gid)
    done = setup_as(OUTSIDER, job, cache)
    assert done.returncode == 30, done.stdout + done.stderr
    assert "::error title=pgoverlay::" in done.stdout
    assert f"`usermod -aG pgoverlay {OUTSIDER}`" in done.stdout
    assert "installing pgoverlay" not in done.stdout
    assert os.listdir(cache) == [], "a virtual environment was started"
    assert output_values(job)["status"] == "failed"


def test_run_sh_sets_status_failed_when_the_action_dies_before_it_could(tmp_path: Path) -> None:
    """pgoverlay-action sets `status` on every failure it can catch; one that dies on start-up
    (a broken install) leaves it to run.sh."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    crash = bin_dir / "pgoverlay-action"
    crash.write_text("#!/bin/sh\necho 'Traceback: ImportError' >&2\nexit 1\n")
    crash.chmod(0o755)
    output = tmp_path / "output"
    output.touch()
    script = Path(__file__).resolve().parents[1] / "action" / "run.sh"
    env = {"PATH": os.environ["PATH"], "PGOVERLAY_BIN": os.fspath(bin_dir / "pgoverlay")}
    done = subprocess.run(
        [os.fspath(script), "run"],
        env={**env, "GITHUB_OUTPUT": os.fspath(output)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert output.read_text() == "status=failed\n"
    # one that set it keeps its own value
    crash.write_text('#!/bin/sh\necho "status=ready" >> "$GITHUB_OUTPUT"\nexit 1\n')
    output.write_text("")
    subprocess.run(
        [os.fspath(script), "run"],
        env={**env, "GITHUB_OUTPUT": os.fspath(output)},
        check=False,
        timeout=60,
    )
    assert output.read_text() == "status=ready\n"


def test_the_setup_check_names_its_own_pools_socket_not_another_pools(tmp_path: Path) -> None:
    """Two pools on one host: the check speaks of the socket of the pool the job's settings
    name (PGOVERLAY_HOME, else the admin's pgoverlay.env), not of the first socket listed."""
    from pgoverlay.runner.service import access, address

    home = tmp_path / "pool-b"
    home.mkdir()
    assert access.socket_of(home) == address.socket_path(home)
    mine = access.socket_of(home, tmp_path)
    other = tmp_path / "00000000.sock"  # another pool's, listed first
    assert sorted([other, mine])[0] == other
    for stale in (other, mine):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(os.fspath(stale))  # bound, never listening: a service that is gone
    found = access.any_service_problem(tmp_path, home=home)
    assert found is not None and os.fspath(mine) in found and os.fspath(other) not in found
    assert access.configured_home({"PGOVERLAY_HOME": os.fspath(home)}) == home


def test_the_setup_check_says_when_no_engine_service_runs(tmp_path: Path) -> None:
    """No socket, or a socket left by a service that is gone: the first step says to start
    the service, before any build."""
    from pgoverlay.runner.service import access

    found = access.any_service_problem(tmp_path)
    assert found is not None and "no engine service is running on this host" in found
    assert "`systemctl start pgoverlay` or `pgoverlay pool init`" in found
    stale = tmp_path / "0123abcd.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(os.fspath(stale))  # bound, never listening: what a killed service leaves
    found = access.any_service_problem(tmp_path)
    assert (
        found is not None and f"the engine service is not running (no answer on {stale})" in found
    )
