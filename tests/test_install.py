"""pgoverlay installed where the service group's members can run it.

The runner's user, the webhook listener and the systemd units run `pgoverlay` as themselves. An
interpreter under a private folder (root's pyenv under /root, 0700), or a checkout there, must
not leave them with 'Permission denied': `scripts/install.sh` refuses such an interpreter and
installs outside the checkout, and `pgoverlay doctor` says which folder stops them. Each check
is compared with what the kernel does when a real member of the group runs the interpreter.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import checkout
import pytest

from helpers import SYSTEM_PATH, os_user, require_root
from pgoverlay.runner import interpreter

ROOT = Path(__file__).resolve().parent.parent
GROUP = "pgoverlay"
MEMBER = "pgo-runner"  # the runner's user of the other tests: in the group, nothing more


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A folder everyone may enter, holding ``private`` (root's, 0700) as /root is."""
    require_root()
    from pgoverlay.runner.service.serve import ensure_group

    ensure_group(GROUP)
    os_user(MEMBER, groups=[GROUP])
    top = Path(tempfile.mkdtemp(prefix="pgoverlay-install-", dir="/var/tmp"))
    top.chmod(0o755)
    (top / "private").mkdir(mode=0o700)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def as_member(argv: list[str], *, groups: tuple[str, ...] = (GROUP,)) -> str:
    """Run ``argv`` as the group's member, from /; its output, or how starting it failed."""
    user = pwd.getpwnam(MEMBER)
    try:
        done = subprocess.run(
            argv,
            user=user.pw_uid,
            group=user.pw_gid,
            extra_groups=[grp.getgrnam(g).gr_gid for g in groups],
            env={"PATH": SYSTEM_PATH, "HOME": user.pw_dir, "LANG": "C.UTF-8"},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except PermissionError as exc:
        return f"PermissionError: {exc}"
    return done.stdout + done.stderr


def environment(folder: Path, *, mode: int = 0o755, group: str | None = None) -> Path:
    """A real virtual environment of Debian's Python in ``folder``, which sees this test run's
    packages (pgoverlay and its dependencies) through a .pth file; its interpreter."""
    folder.mkdir(mode=mode)
    folder.chmod(mode)
    if group is not None:
        os.chown(folder, 0, grp.getgrnam(group).gr_gid)
    venv = folder / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", venv], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "here.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})\n"
    )
    return venv / "bin" / "python3"


def doctor_verdict(python: Path, tmp: Path) -> dict[str, str]:
    """The interpreter line of `pgoverlay doctor --json` run by root with ``python``."""
    done = subprocess.run(
        [python, "-m", "pgoverlay", "doctor", "--json"],
        env={"PATH": SYSTEM_PATH, "PGOVERLAY_HOME": os.fspath(tmp / "no-pool")},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    return dict(checks["interpreter"])


def test_an_interpreter_under_a_private_folder_fails_the_check_as_it_fails_a_member(
    scratch: Path,
) -> None:
    python = environment(scratch / "private" / "pyenv")
    gid = grp.getgrnam(GROUP).gr_gid
    found = interpreter.refusal([(python, os.X_OK)], gid=gid)
    assert found is not None
    assert (found.path, found.needs) == (scratch / "private", "enter")
    assert "drwx------ root:root" in str(found)
    assert "Permission denied" in as_member([os.fspath(python), "-c", "print('ran')"])

    verdict = doctor_verdict(python, scratch)
    assert verdict["verdict"] == "fail"
    assert f"{scratch / 'private'} (drwx------ root:root)" in verdict["detail"]
    assert "scripts/install.sh" in verdict["detail"]


def test_an_interpreter_the_members_can_reach_passes_the_check_and_runs_for_them(
    scratch: Path,
) -> None:
    python = environment(scratch / "public")
    assert interpreter.refusal([(python, os.X_OK)], gid=grp.getgrnam(GROUP).gr_gid) is None
    assert as_member([os.fspath(python), "-c", "print('ran')"]).strip() == "ran"
    verdict = doctor_verdict(python, scratch)
    assert verdict["verdict"] == "ok", verdict
    assert f"{python} (Python 3." in verdict["detail"]


def test_a_folder_only_the_group_may_enter_passes_for_members_and_fails_for_others(
    scratch: Path,
) -> None:
    python = environment(scratch / "group-only", mode=0o750, group=GROUP)
    gid = grp.getgrnam(GROUP).gr_gid
    assert interpreter.refusal([(python, os.X_OK)], gid=gid) is None
    assert as_member([os.fspath(python), "-c", "print('ran')"]).strip() == "ran"
    others = interpreter.refusal([(python, os.X_OK)], gid=None)
    assert others is not None and others.path == scratch / "group-only"
    assert "Permission denied" in as_member([os.fspath(python), "-c", "1"], groups=())


def test_an_unreadable_module_of_the_package_fails_the_check(scratch: Path) -> None:
    """A file installed under root's umask 077 (0600) cannot be imported by a member."""
    package = scratch / "package"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "module.py").write_text("")
    (package / "sub" / "module.py").chmod(0o600)
    found = interpreter.refusal(list(interpreter._tree(package)), gid=None)
    assert found is not None
    assert (found.path, found.needs) == (package / "sub" / "module.py", "read")


def install(checkout: Path, scratch: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``checkout``'s scripts/install.sh into a prefix and a bin folder of ``scratch``."""
    (scratch / "bin").mkdir(exist_ok=True)
    return subprocess.run(
        [checkout / "scripts" / "install.sh"],
        env={
            "PATH": SYSTEM_PATH,
            "HOME": "/root",
            **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
            "PGOVERLAY_PREFIX": os.fspath(scratch / "prefix"),
            "PGOVERLAY_BINDIR": os.fspath(scratch / "bin"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_install_refuses_an_interpreter_the_members_cannot_run_before_building(
    scratch: Path,
) -> None:
    python = environment(scratch / "private" / "pyenv")
    done = install(ROOT, scratch, PYTHON=os.fspath(python))
    assert done.returncode == 3
    assert f"error: {python} (Python 3." in done.stderr
    assert "cannot be run by the members of the pgoverlay group" in done.stderr
    assert "Permission denied" in done.stderr and "/usr/bin/python3" in done.stderr
    assert not (scratch / "prefix").exists()


def test_install_refuses_an_interpreter_older_than_3_11_naming_what_to_install(
    scratch: Path,
) -> None:
    old = scratch / "python3.9"
    old.write_text("#!/bin/sh\necho 3.9.2\nexit 1\n")
    old.chmod(0o755)
    done = install(ROOT, scratch, PYTHON=os.fspath(old))
    assert done.returncode == 3
    assert f"pgoverlay needs Python 3.11 or newer; {old} is 3.9.2" in done.stderr
    assert "apt-get install python3 python3-venv" in done.stderr


@pytest.mark.slow
def test_install_from_a_checkout_under_a_private_folder_gives_members_a_working_command(
    scratch: Path,
) -> None:
    """A clone under /root: what is installed, and the command on PATH, run for a member;
    nothing they run reads the checkout. A second run with a changed tree reinstalls it."""
    checkout = scratch / "private" / "checkout"
    shutil.copytree(
        ROOT,
        checkout,
        symlinks=True,
        ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__"),
    )
    done = install(checkout, scratch, PGOVERLAY_EXTRAS="")
    assert done.returncode == 0, done.stdout + done.stderr
    command = scratch / "bin" / "pgoverlay"
    assert as_member([os.fspath(command), "--version"]).strip() == "pgoverlay 0.1.0"
    assert (checkout / ".venv").resolve() == scratch / "prefix" / "venv"
    python = scratch / "prefix" / "venv" / "bin" / "python"
    assert Path(os.path.realpath(python)).is_relative_to("/usr/bin")  # Debian's, not PATH's
    assert doctor_verdict(python, scratch)["verdict"] == "ok"
    # root's service runs this code: nobody else may change any of it
    writable = [
        f"{path} ({oct(path.lstat().st_mode)}, uid {path.lstat().st_uid})"
        for path in [scratch / "prefix", *(scratch / "prefix").rglob("*")]
        if path.lstat().st_uid != 0 or (path.lstat().st_mode & 0o022 and not path.is_symlink())
    ]
    assert writable == []
    # what members import is the installed copy, not the checkout
    where = as_member([os.fspath(python), "-c", "import pgoverlay.runner as r; print(r.__file__)"])
    assert where.strip().startswith(os.fspath(scratch / "prefix" / "venv"))

    with (checkout / "runner" / "units.py").open("a") as changed:
        changed.write("CHANGED_BY_THE_TEST = 1\n")
    again = install(checkout, scratch, PGOVERLAY_EXTRAS="")
    assert again.returncode == 0, again.stderr
    assert "installing the changed pgoverlay package" in again.stdout
    code = "import pgoverlay.runner.units as u; print(u.CHANGED_BY_THE_TEST)"
    assert as_member([os.fspath(python), "-c", code]).strip() == "1"
    unchanged = install(checkout, scratch, PGOVERLAY_EXTRAS="")
    assert unchanged.returncode == 0 and "installing" not in unchanged.stdout


def test_the_tests_stop_at_once_when_the_users_they_start_could_not_run_the_code(
    scratch: Path,
) -> None:
    """The suite run by an interpreter under a private folder (root's pyenv) stops before its
    first test with one line saying why, instead of failing wherever a user is started."""
    python = environment(scratch / "private" / "pyenv")
    done = subprocess.run(
        [python, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_layout.py"],
        cwd=ROOT,
        env={"PATH": SYSTEM_PATH, "HOME": "/root"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 4, done.stdout + done.stderr
    assert " passed" not in done.stdout
    if checkout.installed_source() is None:  # this run's pgoverlay is the checkout's
        line = (
            f"error: the users the tests start cannot run this pgoverlay: {scratch}/private "
            "(drwx------ root:root): they cannot enter it: run the tests with scripts/test.sh"
        )
    else:  # an installed copy: the private interpreter has none beside it
        line = "error: the installed pgoverlay"
    assert line in done.stdout + done.stderr
