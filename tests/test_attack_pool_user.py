"""The pool's OS user (the one Postgres runs as) attacks root: none of it may escalate.

Pull-request SQL that reaches the OS runs as that user. Each attack here is made by the real
user (a child process that dropped to it), then root does its usual work; a root-only victim
file outside the pool must keep its owner, mode and content, and nothing outside the pool may
be touched or quoted.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sqlite3
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import cli, dismantle, postgres_processes_for, require_root, server_pid, top_ports
from pgoverlay.errors import RegistryRowError, ServiceError, UnsafePathError
from pgoverlay.runner import branch, mask
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool, flocks, gc, mounts
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import postmaster
from pgoverlay.runner.seed import baseconf
from pgoverlay.runner.settings import Settings


@dataclass(frozen=True)
class Victim:
    """A root-only file outside the pool, and what it must stay."""

    path: Path
    content: bytes

    def assert_untouched(self) -> None:
        st = os.lstat(self.path)
        assert stat.S_ISREG(st.st_mode), f"{self.path} was replaced"
        assert (st.st_uid, st.st_gid) == (0, 0), f"{self.path} changed owner to {st.st_uid}"
        assert stat.S_IMODE(st.st_mode) == 0o600, f"{self.path} mode {st.st_mode:o}"
        assert self.path.read_bytes() == self.content, f"{self.path} was written"
        assert sorted(os.listdir(self.path.parent)) == [self.path.name], "victim dir changed"


@pytest.fixture()
def victim() -> Iterator[Victim]:
    require_root()
    directory = Path(tempfile.mkdtemp(prefix="pgoverlay-victim-", dir="/var/tmp"))
    os.chmod(directory, 0o755)  # reachable, so only root's own checks protect the file
    path = directory / "shadow"
    content = f"FATAL:  root-only secret {secrets.token_hex(8)}\n".encode()
    path.write_bytes(content)
    os.chmod(path, 0o600)
    try:
        yield Victim(path=path, content=content)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def as_pool_user(pool: Pool, code: str) -> str:
    """Run Python ``code`` as the pool's OS user; return what it printed."""
    done = subprocess.run(
        ["runuser", "-u", pool.owner.name, "--", "/usr/bin/python3", "-I", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def attempt(pool: Pool, statement: str) -> str:
    """As the pool's user, try one statement; ``ok`` or the name of the error it raised."""
    return as_pool_user(
        pool,
        "import os, pathlib\n"
        f"try:\n    {statement}\n    print('ok')\n"
        "except OSError as err:\n    print(type(err).__name__)",
    )


def stop_server(pool: Pool, name: str) -> None:
    lay = branch.layout(pool, name)
    os.kill(server_pid(pool, name), 9)
    for pid in postgres_processes_for(lay.root):
        with contextlib.suppress(ProcessLookupError):  # gone with its postmaster meanwhile
            os.kill(pid, 9)
    wait_for(lambda: not branch.status(pool, name).running, timeout=30, what="the server's death")


# -- the layout: what the pool's user can no longer reach --------------------------------


def test_the_pool_user_cannot_rename_or_replace_the_pools_directories(
    pool: Pool, base: BaseVersion
) -> None:
    root = pool.root
    for sub in ("store", "bases", "locks", "branches", "staging", "tmp", "registry.db"):
        assert attempt(pool, f"os.rename({str(root / sub)!r}, {str(root / 'moved')!r})") == (
            "PermissionError"
        ), f"the pool's user renamed {sub}"
    assert attempt(pool, f"os.symlink('/', {str(root / 'branches' / 'evil')!r})") == (
        "PermissionError"
    )
    assert not (root / "moved").exists()


def test_the_registry_and_locks_are_roots_alone(pool: Pool, base: BaseVersion) -> None:
    registry = pool.root / "registry.db"
    st = os.stat(registry)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
    assert attempt(pool, f"open({str(registry)!r}, 'rb')") == "PermissionError"
    assert attempt(pool, f"os.listdir({str(pool.root / 'locks')!r})") == "PermissionError"
    lock = pool.lock_path("branch", "planted")
    assert attempt(pool, f"os.symlink('/etc/shadow', {str(lock)!r})") == "PermissionError"
    assert not os.path.lexists(lock)


def test_a_symlinked_lock_file_is_refused_and_its_target_keeps_its_owner(
    pool: Pool, victim: Victim
) -> None:
    # Left by a pool of the old layout, where the pool's user owned locks/.
    lock = pool.lock_path("branch", "lock-attack")
    os.symlink(victim.path, lock)
    try:
        with (
            pytest.raises(UnsafePathError, match="symbolic link"),
            flocks.locked(lock, timeout=0, what="branch lock-attack"),
        ):
            pass
        with pytest.raises(UnsafePathError):
            flocks.is_free(lock)
    finally:
        os.unlink(lock)
    victim.assert_untouched()


def test_a_branchs_mount_target_cannot_be_swapped(
    pool: Pool, base: BaseVersion, victim: Victim
) -> None:
    branch.create(pool, "swap-target", runtime="local", base_name=base.name)
    try:
        lay = branch.layout(pool, "swap-target")
        for path in (lay.data, lay.conf, lay.root):
            moved = str(path) + ".moved"
            assert attempt(pool, f"os.rename({str(path)!r}, {moved!r})") == "PermissionError"
        assert attempt(pool, f"os.symlink('/', {str(lay.root / 'data2')!r})") == ("PermissionError")
        for sub in ("pg_hba.conf", "postgresql.conf"):
            st = os.lstat(lay.conf / sub)
            assert st.st_uid == 0 and stat.S_ISREG(st.st_mode)
        # Root itself refuses a link in a mount target's place (as an old layout allowed).
        link = lay.root / "link-target"
        os.symlink(victim.path.parent, link)
        with pytest.raises(UnsafePathError, match="not a directory"):
            mounts.mount_overlay(
                lower=pool.base_dir(base.name, base.version),
                upper=lay.upper,
                work=lay.work,
                target=link,
            )
        os.unlink(link)
        inside = os.fspath(pool.root) + "/"
        escaped = [
            p
            for p in mounts.mounts_under(pool.home)
            if p != os.fspath(pool.root) and not p.startswith(inside)
        ]
        assert escaped == [], "a mount escaped the pool"
        assert not mounts.is_mounted(victim.path.parent)
    finally:
        branch.destroy(pool, "swap-target")
    victim.assert_untouched()


# -- logs: root appends to and reads a directory the pool's user owns --------------------


def _plant_log_link(pool: Pool, name: str, victim: Victim) -> Path:
    log_file = branch.layout(pool, name).log_file
    as_pool_user(
        pool,
        f"import os\np = {str(log_file)!r}\n"
        "os.path.lexists(p) and os.unlink(p)\n"
        f"os.symlink({str(victim.path)!r}, p)",
    )
    assert os.path.islink(log_file)
    return log_file


def test_a_symlinked_log_is_not_followed_when_gc_restarts_a_crashed_branch(
    pool: Pool, base: BaseVersion, runtime: str, victim: Victim
) -> None:
    name = f"log-gc-{runtime}"
    branch.create(pool, name, base_name=base.name)
    try:
        stop_server(pool, name)
        log_file = _plant_log_link(pool, name, victim)
        report = gc.collect(pool)
        assert name in report.restarted, report.lines()
        assert branch.status(pool, name).running
        victim.assert_untouched()
        assert victim.content.decode().strip() not in " ".join(report.lines())
        if runtime == "local":  # root made the log afresh, for the pool's user
            st = os.lstat(log_file)
            assert stat.S_ISREG(st.st_mode) and st.st_uid == pool.owner.uid
    finally:
        branch.destroy(pool, name)
    victim.assert_untouched()


def test_a_symlinked_log_is_not_followed_on_reset(
    pool: Pool, base: BaseVersion, runtime: str, victim: Victim
) -> None:
    name = f"log-reset-{runtime}"
    branch.create(pool, name, base_name=base.name)
    try:
        _plant_log_link(pool, name, victim)
        branch.reset(pool, name)
        assert branch.status(pool, name).running
    finally:
        branch.destroy(pool, name)
    victim.assert_untouched()


def test_a_log_linked_to_a_root_file_is_never_quoted_into_an_error(
    pool: Pool, base: BaseVersion, victim: Victim
) -> None:
    branch.create(pool, "log-quote", runtime="local", base_name=base.name)
    try:
        log_file = _plant_log_link(pool, "log-quote", victim)
        tail = postmaster.log_tail(log_file)
        assert "secret" not in tail and "FATAL" not in tail, tail
        # A FIFO would block a reader forever: it is refused at once.
        as_pool_user(pool, f"import os\nos.unlink({str(log_file)!r})\nos.mkfifo({str(log_file)!r})")
        started = time.monotonic()
        assert postmaster.log_tail(log_file).startswith("(log not read")
        assert time.monotonic() - started < 5
    finally:
        branch.destroy(pool, "log-quote")
    victim.assert_untouched()


def test_a_start_failure_quotes_the_real_log_not_a_linked_root_file(
    pool: Pool, base: BaseVersion, victim: Victim
) -> None:
    """The error that reaches the PR comment: a branch that cannot start, with a linked log."""
    branch.create(pool, "log-fail", runtime="local", base_name=base.name)
    try:
        stop_server(pool, "log-fail")
        lay = branch.layout(pool, "log-fail")
        _plant_log_link(pool, "log-fail", victim)
        # The server now refuses to start (restarts write conf/ again, so break the data's own).
        broken = lay.data / "postgresql.auto.conf"  # through the overlay, still mounted
        broken.write_text("this is = not = a setting\n")
        os.chown(broken, pool.owner.uid, pool.owner.gid)
        report = gc.collect(pool)
        problem = " ".join(p for p in report.problems if "log-fail" in p)
        assert "postgresql.auto.conf" in problem, report.lines()
        assert "secret" not in problem
    finally:
        branch.destroy(pool, "log-fail")
    victim.assert_untouched()


# -- the registry: rows root builds paths from -------------------------------------------


def test_a_crafted_registry_row_is_refused_and_gc_deletes_nothing_outside_the_pool(
    pool: Pool, base: BaseVersion, victim: Victim
) -> None:
    # branches/../../../NAME is NAME next to the pool's home: the victim's directory.
    escape = "../../../" + victim.path.parent.name
    assert (pool.root / "branches" / escape).resolve() == victim.path.parent.resolve()
    db = sqlite3.connect(pool.root / "registry.db")
    rows = [
        (escape, "destroying", pool.settings.port_min + 150, "local"),
        ("evil-port", "destroying", 22, "local"),
        ("evil-runtime", "destroying", pool.settings.port_min + 151, "ssh"),
    ]
    try:
        with db:
            for name, state, port, runtime in rows:
                db.execute(
                    "INSERT INTO branches (name, base_name, base_version, state, port, runtime, "
                    "user, password, database, created_at) VALUES (?, ?, ?, ?, ?, ?, 'u', 'p', "
                    "'app', 0)",
                    (name, base.name, base.version, state, port, runtime),
                )
            db.execute(
                "INSERT INTO bases (name, version, state, created_at) "
                "VALUES ('../../../etc', 1, 'seeding', 0)"
            )
        names = {b.name for b in pool.registry.branches()}
        assert not names & {r[0] for r in rows}
        with pytest.raises(RegistryRowError):
            pool.registry.branch("evil-port")
        report = gc.collect(pool)
        assert len([p for p in report.problems if "not one pgoverlay wrote" in p]) == 4
        assert not report.finished and not report.bases_removed
        victim.assert_untouched()
    finally:
        with db:
            db.execute("DELETE FROM branches WHERE name IN (?, ?, ?)", [r[0] for r in rows])
            db.execute("DELETE FROM bases WHERE name = '../../../etc'")
        db.close()


def test_a_user_outside_the_service_group_gets_a_clear_error(
    pool: Pool, base: BaseVersion, env: dict[str, str], service: Path
) -> None:
    done = cli(
        ["branch", "create", "as-user", "--runtime", "docker", "--base", base.name],
        env={**env, "PGOVERLAY_RUNTIME": "docker"},
        user=pool.owner.name,
        groups=["docker"],
    )
    assert done.returncode == ServiceError.exit_code, done.stderr
    assert "usermod -aG pgoverlay" in done.stderr
    assert pool.registry.branch("as-user") is None


def test_the_engine_service_imports_nothing_from_the_directory_root_starts_it_in(
    tmp_path: Path,
) -> None:
    """Root may run `pgoverlay pool init` (which starts the service) anywhere, also in a
    directory another user can write: the service's Python must not import a `json.py` or a
    `pgoverlay` package planted there."""
    from pgoverlay.runner.service import serve

    planted = tmp_path / "writable-by-anyone"
    (planted / "pgoverlay").mkdir(parents=True)
    marker = tmp_path / "imported"
    payload = f"open({os.fspath(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for module in ("json.py", "argparse.py", "pgoverlay/__init__.py", "pgoverlay/__main__.py"):
        (planted / module).write_text(payload)
    done = subprocess.run(
        [*serve.SERVICE_COMMAND, "--help"],
        cwd=planted,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and "usage: pgoverlay service" in done.stdout, done.stderr
    assert not marker.exists(), marker.read_text()
    # The same command without -P (nor PYTHONSAFEPATH, which the tests set) would have
    # imported them: the test can fail.
    without = [arg for arg in serve.SERVICE_COMMAND if arg != "-P"]
    unsafe = {key: value for key, value in os.environ.items() if key != "PYTHONSAFEPATH"}
    subprocess.run(
        [*without, "--help"], cwd=planted, env=unsafe, capture_output=True, timeout=60, check=False
    )
    assert marker.exists()


# -- pool init: repairing an old layout, refusing links ----------------------------------


@pytest.fixture()
def spare_pool() -> Iterator[Pool]:
    require_root()
    home = Path(tempfile.mkdtemp(prefix="pgoverlay-spare-", dir="/var/tmp"))
    low, high = top_ports(50, 10)
    p = poolmod.init(Settings(home=home, port_min=low, port_max=high), size="400M")
    try:
        yield p
    finally:
        dismantle(p)


def test_pool_init_repairs_a_pool_of_the_old_layout(spare_pool: Pool) -> None:
    root, owner = spare_pool.root, spare_pool.owner
    lock = spare_pool.lock_path("branch", "old")
    lock.write_text("")
    # What earlier releases did: the pool's user owned these.
    for path in (root, root / "locks", root / "branches", root / "registry.db", lock):
        os.chown(path, owner.uid, owner.gid)
    os.chmod(root / "registry.db", 0o644)
    poolmod.init(spare_pool.settings).close()
    for path, mode in (
        (root, 0o711),
        (root / "locks", 0o700),
        (root / "branches", 0o711),
        (root / "registry.db", 0o600),
        (lock, 0o600),
    ):
        st = os.lstat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, mode), path


@pytest.mark.parametrize("sub", ["store", "bases", "locks"])
def test_pool_init_refuses_a_directory_replaced_by_a_symlink(
    spare_pool: Pool, victim: Victim, sub: str
) -> None:
    path = spare_pool.root / sub
    path.rename(spare_pool.root / f"{sub}.real")
    os.symlink(victim.path.parent, path)
    try:
        with pytest.raises(UnsafePathError, match="not a directory"):
            poolmod.init(spare_pool.settings)
        victim.assert_untouched()
        st = os.stat(victim.path.parent)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755), "followed the link"
    finally:
        os.unlink(path)
        (spare_pool.root / f"{sub}.real").rename(path)


# -- the staging copy: root edits a data directory the pool's user wrote ------------------


def test_base_configuration_edits_do_not_write_through_links(
    tmp_path: Path, victim: Victim
) -> None:
    datadir = tmp_path / "data"
    datadir.mkdir()
    victim_text = victim.content.decode()
    victim.path.write_text(victim_text + "primary_conninfo = 'host=prod'\n")
    victim = Victim(victim.path, victim.path.read_bytes())
    (datadir / "postgresql.auto.conf").symlink_to(victim.path)
    (datadir / "postgresql.conf").write_text("include 'conf.d/x.conf'\n")
    (datadir / "conf.d").symlink_to(victim.path.parent, target_is_directory=True)
    baseconf.remove_secret_settings(datadir)
    baseconf.confine_includes(datadir)
    victim.assert_untouched()


def test_emptying_a_copys_statistics_does_not_follow_a_link(tmp_path: Path, victim: Victim) -> None:
    datadir = tmp_path / "data"
    datadir.mkdir()
    (datadir / "pg_stat").symlink_to(victim.path.parent, target_is_directory=True)
    mask._empty(datadir, "pg_stat")
    victim.assert_untouched()
