"""Shared test helpers: privilege checks and leak checks."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgoverlay.errors import PgoverlayError
from pgoverlay.runner import branch, seed
from pgoverlay.runner.branch import lifecycle
from pgoverlay.runner.pool import Pool, gc, mounts
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.runtime import table
from pgoverlay.runner.runtime.choose import runtime_for
from pgoverlay.runner.seed import bases
from pgoverlay.runner.settings import Settings

# Ports handed to the test pools' branches. Two test runs on one machine (two checkouts) pick
# disjoint ranges: PGOVERLAY_TEST_PORTS=58000-58199. The main pool takes them from the bottom;
# small pools of single tests and extra servers take theirs from the top.
_low, _, _high = os.environ.get("PGOVERLAY_TEST_PORTS", "57000-57199").partition("-")
TEST_PORTS = (int(_low), int(_high))


# The session pool's base (conftest's `base`). Every test that creates a branch in that pool names
# it: a test must not depend on the pool holding that base alone.
SESSION_BASE = "app"
DECOY_BASE = "decoy"  # the second base PGOVERLAY_TEST_DECOY_BASE=1 adds to it


def top_ports(offset: int, count: int) -> tuple[int, int]:
    """``count`` ports ending ``offset`` below the top of the test range, for a small pool."""
    high = TEST_PORTS[1] - offset
    return high - count + 1, high


def source_dsn(srv: cluster.Running, *, user: str = "postgres", dbname: str = "app") -> str:
    return psycopg.conninfo.make_conninfo(
        host=os.fspath(srv.socket_dir), port=srv.port, user=user, dbname=dbname
    )


def require(condition: bool, reason: str) -> None:
    """Skip when a prerequisite is missing, but fail under CI=true: CI must run everything."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must be able to run this test: {reason}", pytrace=False)
    pytest.skip(reason)


def require_root() -> None:
    require(os.geteuid() == 0, "needs root (mounts and Postgres as another user)")


# Starts as root, imports everything the command needs (this interpreter may live where another
# user cannot read), then becomes the user and runs the command in the same process. The CLI
# imports a command's modules when it runs, so they are named here, and its consoles made.
_AS_USER = """
import grp, os, pwd, sys
import docker, docker.errors, psycopg, pgoverlay.cli, pgoverlay.runner.pool.gc
import pgoverlay.runner.runtime.docker, pgoverlay.action.main
import dotenv, github, requests, sqlparse, rich.markup, rich.progress, rich.table
import pgoverlay.runner.service.client, pgoverlay.runner.service.engine, pgoverlay.runner.seed
import pgoverlay.runner.postgres.sqlerror, pgoverlay.runner.runtime.choose
import pgoverlay.action.migrations, pgoverlay.action.workflow, pgoverlay.runner.pool.maintenance
import pgoverlay.action.insight.observe, pgoverlay.action.insight.jsonreport
import importlib.metadata  # pydantic's plugin loader (the listener's settings)
from pgoverlay.cli import common
common.out.console, common.err.console
user = pwd.getpwnam(sys.argv[1])
os.setgroups([grp.getgrnam(g).gr_gid for g in sys.argv[2].split(",") if g])
os.setgid(user.pw_gid)
os.setuid(user.pw_uid)
os.environ.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
raise SystemExit(pgoverlay.cli.main(sys.argv[3:]))
"""


def cli(
    args: list[str],
    *,
    env: Mapping[str, str],
    timeout: float = 300,
    user: str | None = None,
    groups: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Run the real `pgoverlay` command in a child process; with ``user``, as that user (with
    supplementary ``groups``), not as root."""
    argv = [sys.executable, "-m", "pgoverlay", *args]
    if user is not None:
        argv = [sys.executable, "-c", _AS_USER, user, ",".join(groups), *args]
    return subprocess.run(
        argv,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",
    )


# Prints, after the command, the modules it imported (on stderr, after its output).
_IMPORTS_PROBE = """
import json, sys
from pgoverlay.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
raise SystemExit(code)
"""


def loaded(args: list[str], env: Mapping[str, str] | None = None) -> set[str]:
    """The modules a `pgoverlay` command had imported when it finished (it must succeed)."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS_PROBE, *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stderr.rsplit("MODULES ", 1)[1]
    return set(json.loads(line))


def postgres_processes_for(path: Path) -> list[int]:
    """PIDs of processes whose command line mentions ``path``."""
    needle = os.fspath(path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


DOCKER_IMAGE = "pgoverlay-local/postgres:{major}"  # what scripts/docker.sh builds


# Every runtime of the table: a test that holds for each runtime runs once per name.
RUNTIMES = list(table.names())


def require_runtime(name: str, major: int) -> None:
    """A branch of Postgres ``major`` on runtime ``name`` needs what that runtime runs with
    (Docker: the daemon and the image scripts/docker.sh builds)."""
    if name == "docker":
        require_docker_image(major)


def require_docker_image(major: int) -> None:
    """The Docker runtime's tests need the daemon and the image scripts/docker.sh builds."""
    from pgoverlay.errors import DockerError
    from pgoverlay.runner.runtime import docker as docker_runtime

    image = DOCKER_IMAGE.replace("{major}", str(major))
    try:
        client = docker_runtime.connect(None, timeout=5)
    except DockerError as err:
        require(False, f"needs a Docker daemon (scripts/docker.sh starts one): {err}")
        return
    try:
        present = bool(client.images.list(name=image))
    finally:
        client.close()
    require(present, f"needs the image {image}: run scripts/docker.sh")


def docker_objects_for(pool: Pool, name: str) -> list[str]:
    """This pool's Docker containers and volumes labelled with branch ``name``."""
    from pgoverlay.errors import DockerError
    from pgoverlay.runner.runtime import docker as docker_runtime

    try:
        client = docker_runtime.connect(None, timeout=5)
    except DockerError:
        return []
    try:
        containers, volumes = docker_runtime.labelled(client, pool.id)
    finally:
        client.close()
    label = docker_runtime.LABEL_BRANCH
    return [f"container {c.name}" for c in containers if c.labels.get(label) == name] + [
        f"volume {v.name}" for v in volumes if (v.attrs.get("Labels") or {}).get(label) == name
    ]


def server_pid(pool: Pool, name: str) -> int:
    """The host PID of branch ``name``'s postmaster, whatever its runtime."""
    b = branch.get(pool, name)
    if b.runtime == "docker":
        from pgoverlay.runner.runtime import docker as docker_runtime

        client = docker_runtime.connect(None, timeout=5)
        try:
            container = client.containers.get(f"pgoverlay-{pool.id}-{name}")
            return int(container.attrs["State"]["Pid"])
        finally:
            client.close()
    from pgoverlay.runner.postgres import postmaster

    info = postmaster.read_pidfile(branch.layout(pool, name).upper / "postmaster.pid")
    assert info is not None, "no postmaster.pid"
    return info.pid


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def assert_no_leaks(pool: Pool, name: str, *, port: int | None = None) -> None:
    lay = branch.layout(pool, name)
    assert pool.registry.branch(name) is None, "registry row left behind"
    left = [f"{p} ({p.stat().st_uid}, {oct(p.stat().st_mode)})" for p in lay.root.rglob("*")]
    assert not lay.root.exists(), f"branch directory left behind: {lay.root}: {left}"
    assert not lay.socket_dir.exists(), "socket directory left behind"
    assert not [m for m in mounts.mounted() if m.startswith(os.fspath(lay.root))], "mount leaked"
    assert postgres_processes_for(lay.root) == [], "Postgres process leaked"
    assert docker_objects_for(pool, name) == [], "Docker container or volume leaked"
    # The port is free, unless a branch registered since holds it (the test run's engine
    # service tops warm targets up, and a new warm branch takes the lowest free port).
    if port is not None and port not in {b.port for b in pool.registry.branches(warm=True)}:
        assert port_free(port), f"port {port} still bound"


def dismantle(pool: Pool) -> None:
    """Remove a test pool completely: branches, bases, sockets, mounts, files."""
    from pgoverlay.runner import seed

    for b in pool.registry.branches(warm=True):
        lifecycle.teardown(pool, b)
    for base in pool.registry.bases():
        seed.remove_version(pool, base.name, base.version)
    pool.close()
    shutil.rmtree(pool.socket_root, ignore_errors=True)
    for target in mounts.mounts_under(pool.home):
        mounts.unmount(Path(target))
    mounts.unmount(pool.home / "pool")
    shutil.rmtree(pool.home, ignore_errors=True)


@contextmanager
def extra_server(
    pool: Pool,
    name: str,
    *,
    options: Mapping[str, str] | None = None,
    hba: str | None = None,
    superuser: str = "postgres",
) -> Iterator[cluster.Running]:
    """Another real Postgres server for a test (a source, a publisher, a foreign server), with
    its own socket; ``hba`` replaces its pg_hba.conf (for password logins over TCP). Its log is
    ``socket_dir / "postgres.log"``."""
    from pgoverlay.runner.postgres import binaries as pgbin

    install = pgbin.newest()
    work = pool.home / name
    work.mkdir(mode=0o700)
    os.chown(work, pool.owner.uid, pool.owner.gid)
    settings = {"fsync": "off", **(options or {})}
    if hba is not None:
        hba_file = work / "pg_hba.conf"
        hba_file.write_text(hba)
        os.chown(hba_file, pool.owner.uid, pool.owner.gid)
        settings["hba_file"] = os.fspath(hba_file)
    try:
        cluster.initdb(install, work / "data", owner=pool.owner, superuser=superuser)
        with cluster.running(
            install, work / "data", owner=pool.owner, scratch=pool.tmp, options=settings
        ) as srv:
            yield dataclasses.replace(srv, port=int(settings.get("port", srv.port)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def free_tcp_port() -> int:
    """A TCP port nobody listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_branch_role(pool: Pool, b: Branch) -> psycopg.Connection[Any]:
    """The branch's login role over TCP with its password: what a pull request's SQL runs as."""
    return psycopg.connect(
        **branch.connection(pool, b).connect_kwargs(), autocommit=True, connect_timeout=10
    )


def as_engine(pool: Pool, b: Branch, base: BaseVersion) -> psycopg.Connection[Any]:
    """The base's bootstrap superuser through the branch's private socket (the engine's way)."""
    return psycopg.connect(
        host=os.fspath(branch.layout(pool, b.name).socket_dir),
        port=b.port,
        user=base.superuser,
        dbname=base.database,
        autocommit=True,
        connect_timeout=10,
    )


def service_settings(pool: Pool) -> Settings:
    """The settings the test run's engine service runs with (the ``service`` fixture). No
    periodic gc: tests leave half-made branches on purpose and call gc themselves; and no
    branch suspended for being idle unless it was created to be (tests/test_idle.py): a
    module's branch may sit unused longer than the pool's default while its tests run. No
    expiry timer either: tests expire credentials themselves (tests/test_attack_revoke.py runs
    the timer's own loop)."""
    return pool.settings.replace(service_gc_interval=0, suspend_after=0, service_expiry_timer=False)


# The settings the session's engine service was started with (the ``service`` fixture): what a
# test that restarts the service restores, whatever the test changed in ``pool.settings``
# meanwhile (a monkeypatched setting must not outlive its test in the running service).
SESSION_SERVICE: list[Settings] = []


def session_service_settings(pool: Pool) -> Settings:
    """The settings to give the test run's engine service back when a test is done with it."""
    return SESSION_SERVICE[0] if SESSION_SERVICE else service_settings(pool)


@contextmanager
def without_the_service(pool: Pool) -> Iterator[None]:
    """The test run's engine service stopped meanwhile, when it runs, then started again: it
    tops warm targets up every 2 s, and a test that crashes a command while it starts a warm
    branch needs that command, not the service, to be the one starting it."""
    from pgoverlay.runner.service import serve

    settings = service_settings(pool)
    was_running = serve.stop(settings, wait=settings.stop_timeout)
    try:
        yield
    finally:
        if was_running:
            start_service(session_service_settings(pool))


@contextmanager
def service_with(pool: Pool, **changes: Any) -> Iterator[Settings]:
    """The test run's engine service restarted with ``changes`` to its settings, then as it
    was: a front door's network API and GitHub settings, which the engine needs as the door
    does, since it verifies the credentials the door forwards itself (as both read one
    settings file on a real host)."""
    from pgoverlay.runner.service import serve

    plain = service_settings(pool)
    changed = plain.replace(**changes)
    serve.stop(plain, wait=plain.stop_timeout)
    start_service(changed)
    try:
        yield changed
    finally:
        serve.stop(changed, wait=changed.stop_timeout)
        start_service(session_service_settings(pool))


def start_service(settings: Settings) -> None:
    """Start the engine service with ``settings`` and nothing else: the PGOVERLAY_* a test sets
    for itself (``PGOVERLAY_SERVICE_AUTOSTART=false``, conftest) are not the session's
    service's, and would leave a service whose settings root's CLI does not share (its
    requests then answered 409 ``settings_differ``)."""
    from pgoverlay.runner.service import serve

    own = {key: value for key, value in os.environ.items() if key.startswith("PGOVERLAY_")}
    for key in own:
        del os.environ[key]
    try:
        serve.start(settings)
    finally:
        os.environ.update(own)


@contextmanager
def branch_of(pool: Pool, base: BaseVersion, *, name: str, runtime: str) -> Iterator[Branch]:
    """A branch of ``base`` on ``runtime``, destroyed afterwards (Docker: needs the image)."""
    require_runtime(runtime, base.pg_major or 0)
    made = branch.create(pool, name, base_name=base.name, runtime=runtime)
    try:
        yield made
    finally:
        branch.destroy(pool, name)


def remove_base(pool: Pool, base: BaseVersion) -> None:
    """Destroy every branch of ``base``'s name, then remove the version."""
    for b in pool.registry.branches():
        if b.base_name == base.name:
            branch.destroy(pool, b.name)
    seed.remove_version(pool, base.name, base.version)


def os_user(name: str, *, groups: Sequence[str] = ()) -> pwd.struct_passwd:
    """An unprivileged system user for tests (made once), in ``groups`` as well as its own."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--create-home", "--shell", "/bin/sh", name],
            check=True,
            capture_output=True,
        )
    for group in groups:
        subprocess.run(["usermod", "-aG", group, name], check=True, capture_output=True)
    return pwd.getpwnam(name)


def write_row(pool: Pool, b: Branch, value: int) -> None:
    """Add ``value`` to the table ``kept`` of branch ``b`` (made if missing), as its role."""
    with psycopg.connect(**branch.connection(pool, b).connect_kwargs(), autocommit=True) as db:
        db.execute("CREATE TABLE IF NOT EXISTS kept (x int)")
        db.execute("INSERT INTO kept VALUES (%s)", (value,))


def read_rows(pool: Pool, b: Branch) -> list[int]:
    """What ``write_row`` put in branch ``b``, in order."""
    with psycopg.connect(**branch.connection(pool, b).connect_kwargs(), autocommit=True) as db:
        return [row[0] for row in db.execute("SELECT x FROM kept ORDER BY x").fetchall()]


def is_down(pool: Pool, b: Branch) -> bool:
    """No server of ``b`` runs, and (the local runtime) its data is not mounted."""
    base = pool.registry.base(b.base_name, b.base_version)
    assert base is not None
    lay = branch.layout(pool, b.key)
    stopped = runtime_for(pool, base, b.runtime).liveness(lay).state == "stopped"
    return stopped and (b.runtime != "local" or not mounts.is_mounted(lay.data))


def read_outputs(path: Path) -> dict[str, str]:
    """A step's outputs as the Action writes them to GITHUB_OUTPUT (``key<<DELIMITER``
    blocks), by name."""
    values: dict[str, str] = {}
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        key, _, delimiter = lines[i].partition("<<")
        end = lines.index(delimiter, i + 1)
        values[key] = "\n".join(lines[i + 1 : end])
        i = end + 1
    return values


def as_user_call(
    user: str, groups: Sequence[str], code: str, *, preload: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` as ``user`` with supplementary ``groups`` (a real child process).
    The interpreter's own files may be root's alone: the modules ``code`` imports are imported
    before the switch (the service's client, and ``preload``)."""
    prelude = (
        "import grp, os, pwd, sys\n"
        f"import {', '.join(['pgoverlay.runner.service.client', *preload])}\n"
        f"u = pwd.getpwnam({user!r})\n"
        f"os.setgroups([grp.getgrnam(g).gr_gid for g in {list(groups)!r}])\n"
        "os.setgid(u.pw_gid); os.setuid(u.pw_uid)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd="/",
    )


SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def path_without(program: str, *, scratch: Path, path: str = SYSTEM_PATH) -> str:
    """``path`` with ``program`` nowhere on it: a directory that holds it is replaced by one
    (under ``scratch``) of links to everything else it holds."""
    parts = []
    for i, entry in enumerate(path.split(os.pathsep)):
        folder = Path(entry)
        if not entry or not folder.is_dir():
            continue
        if not (folder / program).exists():
            parts.append(entry)
            continue
        shadow = scratch / f"path-{i}"
        shadow.mkdir(parents=True, exist_ok=True)
        for item in folder.iterdir():
            if item.name != program:
                (shadow / item.name).symlink_to(item)
        parts.append(os.fspath(shadow))
    return os.pathsep.join(parts)


class Undo:
    """What a test makes in the session pool, named as it goes (``undo.branch(NAME)``,
    ``undo.base(NAME)``) and destroyed or removed when the test ends, passed or failed: a
    finaliser, not a line after the assertions. Naming what a test goes on to remove itself
    is harmless: destroying and removing are idempotent."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._branches: list[str] = []
        self._bases: list[str] = []

    def branch(self, *names: str) -> None:
        self._branches.extend(names)

    def base(self, *names: str) -> None:
        self._bases.extend(names)

    def run(self) -> None:
        for name in reversed(self._branches):
            branch.destroy(self.pool, name)
        for name in reversed(self._bases):
            if not self.pool.registry.bases(name):
                continue
            try:
                bases.remove(self.pool, name, destroy_branches=True)
            except PgoverlayError:  # e.g. a removal a test killed: gc finishes it
                gc.collect(self.pool)
                if self.pool.registry.bases(name):
                    bases.remove(self.pool, name, destroy_branches=True)


PEOPLE_RULES = "tables:\n  people:\n    email: {fake: email}\n"


@contextmanager
def masked_base(
    pool: Pool, source: cluster.Running, *, name: str, database: str, rows: int, folder: Path
) -> Iterator[BaseVersion]:
    """A base ``name`` seeded from a new ``database`` of the source holding ``people`` (``rows``
    rows, each with a real-looking email), its emails faked by the masking rules; its
    branches and versions removed afterwards."""
    with psycopg.connect(**source.conninfo(user="postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(database)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER app_owner").format(sql.Identifier(database)))
    with psycopg.connect(**source.conninfo(user="postgres", dbname=database)) as conn:
        conn.execute("SET ROLE app_owner")
        conn.execute("CREATE TABLE people (id int PRIMARY KEY, email text NOT NULL)")
        conn.execute(
            "INSERT INTO people SELECT g, 'person' || g || '@example.org' "
            "FROM generate_series(1, %s) g",
            (rows,),
        )
        conn.commit()
    rules = folder / "rules.yml"
    rules.write_text(PEOPLE_RULES)
    made = seed.seed(pool, name, source_dsn=source_dsn(source, dbname=database), mask=rules)
    assert made.masked
    try:
        yield made
    finally:
        for b in pool.registry.branches():
            if b.base_name == name:
                branch.destroy(pool, b.name)
        for version in pool.registry.bases(name):
            seed.remove_version(pool, version.name, version.version)
