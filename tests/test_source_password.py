"""The source's password never rides on a command line, and every way of giving it works.

The source here asks the seeding role for a SCRAM password over TCP: without the password,
every seed below would fail.
"""

from __future__ import annotations

import contextlib
import os
import pty
import secrets
import select
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
import psycopg
import pytest
from conftest import PORTS

from helpers import port_free, require_docker_image
from pgoverlay.errors import ConfigError, SourcePasswordError, UnsafeFileError
from pgoverlay.runner import seed
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.runtime import docker as docker_runtime
from pgoverlay.runner.seed import credentials


@dataclass(frozen=True)
class Locked:
    """A source that lets ``user`` in over TCP with ``password`` only."""

    port: int
    user: str
    password: str

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname=app"


def _free_port() -> int:
    # From the top of this run's range: branches take ports from its bottom.
    return next(p for p in range(PORTS[1], PORTS[0], -1) if port_free(p))


@pytest.fixture(scope="module")
def locked(pool: Pool) -> Iterator[Locked]:
    install = pgbin.newest()
    work = pool.home / "locked-source"
    work.mkdir()
    os.chown(work, pool.owner.uid, pool.owner.gid)
    datadir = work / "data"
    cluster.initdb(install, datadir, owner=pool.owner)
    port = _free_port()
    # A colon and a backslash: a passfile must escape them, a careless one breaks.
    password = f"pw:{secrets.token_hex(8)}\\x"
    with cluster.running(
        install,
        datadir,
        owner=pool.owner,
        scratch=pool.tmp,
        options={
            "wal_level": "replica",
            "fsync": "off",
            "listen_addresses": "127.0.0.1",
            "port": str(port),
            "password_encryption": "scram-sha-256",
        },
    ) as srv:
        local: dict[str, Any] = {
            "host": os.fspath(srv.socket_dir),
            "port": port,
            "user": "postgres",
        }
        with psycopg.connect(**local, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL(
                    "CREATE ROLE seeder LOGIN SUPERUSER REPLICATION PASSWORD {}"
                ).format(psycopg.sql.Literal(password))
            )
            conn.execute("CREATE DATABASE app OWNER seeder")
        with psycopg.connect(**local, dbname="app", autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (id int PRIMARY KEY)")
            conn.execute("INSERT INTO kept SELECT generate_series(1, 1000)")
        hba = srv.socket_dir / "pg_hba.conf"
        hba.write_text(
            "local all postgres trust\n"
            "host all seeder 127.0.0.1/32 scram-sha-256\n"
            "host replication seeder 127.0.0.1/32 scram-sha-256\n"
        )
        with psycopg.connect(**local, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        yield Locked(port=port, user="seeder", password=password)
    shutil.rmtree(work, ignore_errors=True)


def test_the_locked_source_refuses_a_connection_without_its_password(locked: Locked) -> None:
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(locked.dsn, connect_timeout=5, passfile="/nonexistent").close()
    psycopg.connect(locked.dsn, password=locked.password, connect_timeout=5).close()


def _passfile_line(port: int, password: str) -> str:
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    return f"127.0.0.1:{port}:*:seeder:{escaped}\n"


def _seen(pool: Pool, needle: str, client: Any) -> list[str]:
    """Where ``needle`` shows right now: any process's command line, or the configuration of
    one of this pool's containers."""
    found = []
    raw = needle.encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if raw in (entry / "cmdline").read_bytes():
                    found.append(f"cmdline of pid {entry.name}")
            except OSError:
                continue
    if client is not None:
        label = f"{docker_runtime.LABEL_POOL}={pool.id}"
        # Listed sparse, then inspected one by one: a container of the seed may end between
        # the two (its inspection then answers 404), which is not a sighting.
        for listed in client.containers.list(filters={"label": label}, sparse=True):
            try:
                attrs = client.api.inspect_container(listed.id)
            except docker.errors.NotFound:
                continue
            config = attrs.get("Config") or {}
            shown = [*attrs.get("Args", []), *(config.get("Env") or [])]
            shown += config.get("Cmd") or []
            if any(needle in str(item) for item in shown):
                found.append(f"container {attrs.get('Name', listed.id)}")
    return found


def _watched_seed(
    pool: Pool, args: list[str], env: dict[str, str], *, secret: str, docker: bool
) -> tuple[subprocess.CompletedProcess[str], list[str], int]:
    """Run `pgoverlay` to the end while looking for ``secret`` in every process's command line
    (and Docker's view of the pool's containers); returns the result, the sightings and how
    many looks were taken."""
    client = docker_runtime.connect(None) if docker else None
    child = subprocess.Popen(
        [sys.executable, "-m", "pgoverlay", "-vv", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    sightings: list[str] = []
    looks = 0
    try:
        while child.poll() is None:
            sightings += _seen(pool, secret, client)
            looks += 1
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=0.05)  # pacing of the looks, not a timing assertion
        out, err = child.communicate(timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
        if client is not None:
            client.close()
    return subprocess.CompletedProcess(child.args, child.returncode, out, err), sightings, looks


def _base_env(env: dict[str, str], home: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return {**clean, **env, "HOME": os.fspath(home)}


WAYS = ["PGPASSWORD", "PGPASSFILE", "~/.pgpass", "--password-file"]


@pytest.mark.parametrize("via", ["basebackup", "dump"])
@pytest.mark.parametrize("where", ["local", "docker"])
@pytest.mark.parametrize("way", WAYS)
def test_a_password_given_outside_argv_seeds_and_never_shows_in_a_command_line(
    pool: Pool,
    locked: Locked,
    env: dict[str, str],
    tmp_path: Path,
    way: str,
    where: str,
    via: str,
) -> None:
    if where == "docker":
        require_docker_image(15)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    run_env = _base_env(env, home)
    name = f"pw-{WAYS.index(way)}-{where}-{via}"
    args = ["base", "seed", name, "--from", locked.dsn, "--via", via, "--runtime", where]
    if way == "PGPASSWORD":
        run_env["PGPASSWORD"] = locked.password
    elif way == "PGPASSFILE":
        passfile = tmp_path / "passfile"
        passfile.write_text(_passfile_line(locked.port, locked.password))
        passfile.chmod(0o600)
        run_env["PGPASSFILE"] = os.fspath(passfile)
    elif way == "~/.pgpass":
        (home / ".pgpass").write_text(_passfile_line(locked.port, locked.password))
        (home / ".pgpass").chmod(0o600)
    else:
        secret_file = tmp_path / "source-password"
        secret_file.write_text(locked.password + "\n")  # one trailing newline is not part of it
        secret_file.chmod(0o600)
        args += ["--password-file", os.fspath(secret_file)]
    try:
        done, sightings, looks = _watched_seed(
            pool, args, run_env, secret=locked.password, docker=where == "docker"
        )
        assert done.returncode == 0, done.stderr
        assert looks > 0
        assert sightings == [], sightings
        assert locked.password not in done.stdout + done.stderr
        made = pool.registry.latest_base(name)
        assert made is not None and made.state == "ready" and made.via == via
    finally:
        for version in pool.registry.bases(name):
            seed.remove_version(pool, name, version.version)
    assert list(pool.tmp.glob("pgpass-*")) == [], "a passfile copy was left behind"


def test_a_password_in_the_dsn_is_refused_without_echoing_it(
    pool: Pool, locked: Locked, env: dict[str, str], tmp_path: Path
) -> None:
    quoted = urllib.parse.quote(locked.password, safe="")
    for dsn in (
        f"{locked.dsn} password='{locked.password.replace(chr(92), chr(92) * 2)}'",
        f"postgresql://seeder:{quoted}@127.0.0.1:{locked.port}/app",
    ):
        done = subprocess.run(
            [sys.executable, "-m", "pgoverlay", "-vv", "base", "seed", "refused", "--from", dsn],
            env=_base_env(env, tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd="/",
        )
        assert done.returncode == ConfigError.exit_code, done.stderr
        message = done.stderr.strip()
        assert len(message.splitlines()) == 1, message
        for way in ("PGPASSWORD", "PGPASSFILE", "--password-file", "prompt"):
            assert way in message
        assert locked.password not in done.stdout + done.stderr
        assert quoted not in done.stdout + done.stderr
    assert pool.registry.bases("refused") == []


def test_no_password_off_a_terminal_says_how_to_give_one(
    pool: Pool, locked: Locked, env: dict[str, str], tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pgoverlay", "base", "seed", "no-password", "--from", locked.dsn],
        env=_base_env(env, tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",
    )
    assert done.returncode == SourcePasswordError.exit_code, done.stderr
    assert "asks for a password" in done.stderr and "--password-file" in done.stderr
    assert pool.registry.bases("no-password") == []


def _read_until(fd: int, needle: bytes, *, deadline: float) -> bytes:
    seen = b""
    while needle not in seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"never saw {needle!r}: {seen!r}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                chunk = b""
            assert chunk, f"the terminal closed before {needle!r}: {seen!r}"
            seen += chunk
    return seen


def test_on_a_terminal_a_missing_password_is_prompted_for(
    pool: Pool, locked: Locked, env: dict[str, str], tmp_path: Path
) -> None:
    run_env = _base_env(env, tmp_path)
    pid, fd = pty.fork()
    if pid == 0:  # the child: pgoverlay on a terminal
        os.execve(
            sys.executable,
            [sys.executable, "-m", "pgoverlay", "base", "seed", "prompted", "--from", locked.dsn],
            run_env,
        )
    try:
        _read_until(fd, b"password for the source 127.0.0.1", deadline=time.monotonic() + 60)
        os.write(fd, locked.password.encode() + b"\n")
        rest = b""
        while True:
            ready, _, _ = select.select([fd], [], [], 300)
            assert ready, "pgoverlay did not finish"
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            rest += chunk
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, rest.decode(errors="replace")
        assert locked.password.encode() not in rest, "the typed password was echoed"
        made = pool.registry.latest_base("prompted")
        assert made is not None and made.state == "ready"
    finally:
        os.close(fd)
        for version in pool.registry.bases("prompted"):
            seed.remove_version(pool, "prompted", version.version)


def test_a_password_file_must_be_a_small_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError, match="a FIFO"):
        credentials.from_password_file(fifo)  # returns at once: the open does not block
    with pytest.raises(UnsafeFileError, match="a device"):
        credentials.from_password_file(Path("/dev/zero"))
    big = tmp_path / "big"
    with big.open("wb") as handle:
        handle.truncate(credentials.MAX_FILE_BYTES + 1)
    with pytest.raises(UnsafeFileError, match="more than"):
        credentials.from_password_file(big)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        credentials.from_password_file(empty)
    good = tmp_path / "good"
    good.write_text("secret with spaces \n")
    assert credentials.from_password_file(good).password == "secret with spaces "
    shared = tmp_path / "shared-passfile"
    shared.write_text("*:*:*:*:x\n")
    shared.chmod(0o644)
    with pytest.raises(UnsafeFileError, match="chmod 0600"):
        credentials.from_passfile(shared)


def test_the_explicit_way_wins_and_nothing_given_is_nothing(tmp_path: Path) -> None:
    file = tmp_path / "pw"
    file.write_text("from-file")
    environ = {"PGPASSWORD": "from-env"}
    assert credentials.resolve(password_file=file, environ=environ, home=None).password == (
        "from-file"
    )
    assert credentials.resolve(password_file=None, environ=environ, home=None).password == (
        "from-env"
    )
    assert not credentials.resolve(password_file=None, environ={}, home=tmp_path).given
    given = credentials.resolve(password_file=None, environ=environ, home=None)
    assert "from-env" not in repr(given)
