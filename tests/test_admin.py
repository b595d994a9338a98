"""The lifecycle an admin expects: remove a base, take the pool down and bring it back, remove
the pool. Real pools, real branches (local and Docker), real mounts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from helpers import (
    Undo,
    assert_no_leaks,
    cli,
    dismantle,
    docker_objects_for,
    free_tcp_port,
    os_user,
    port_free,
    postgres_processes_for,
    require_docker_image,
    require_root,
    source_dsn,
    top_ports,
)
from pgoverlay.errors import (
    BaseInUseError,
    BaseMissingError,
    ConfigError,
    LockBusyError,
    PoolError,
    SeedBusyError,
    TokenError,
)
from pgoverlay.runner import branch, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool, flocks, gc, mounts
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.service import client, serve, tokens
from pgoverlay.runner.service.address import SOCKET_ROOT
from pgoverlay.runner.settings import Settings

KILLED = -signal.SIGKILL
SMALL_PORTS = top_ports(60, 10)  # the own pools of the tests below


def assert_base_gone(pool: Pool, name: str, version: int) -> None:
    assert pool.registry.base(name, version) is None, "registry row left behind"
    assert not pool.store_dir(name, version).exists(), "store copy left behind"
    assert not pool.base_dir(name, version).exists(), "bases/ mount point left behind"
    assert not mounts.is_mounted(pool.base_dir(name, version)), "bind mount left behind"


def seeded(pool: Pool, source: cluster.Running, name: str, *, refresh: bool = False) -> BaseVersion:
    return seed.seed(pool, name, source_dsn=source_dsn(source), refresh=refresh)


# -- seed rm ----------------------------------------------------------------------------------


def test_seed_rm_is_refused_while_branches_use_the_base_and_names_them(
    pool: Pool, source: cluster.Running, env: dict[str, str], undo: Undo
) -> None:
    undo.base("in-use")
    base = seeded(pool, source, "in-use")
    made = branch.create(pool, "uses-in-use", base_name="in-use")
    try:
        done = cli(["base", "rm", "in-use"], env=env)
        assert done.returncode == BaseInUseError.exit_code, done.stderr
        assert "uses-in-use" in done.stderr and "--destroy-branches" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert pool.registry.base("in-use", base.version).state == "ready"  # type: ignore[union-attr]
        with psycopg.connect(**branch.connection(pool, made).connect_kwargs()) as conn:
            assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (200000,)
    finally:
        branch.destroy(pool, "uses-in-use")
    done = cli(["base", "rm", "in-use"], env=env)  # no branch left: removed
    assert done.returncode == 0, done.stderr
    assert f"base in-use removed (v{base.version})" in done.stdout
    assert_base_gone(pool, "in-use", base.version)
    assert not (pool.root / "store" / "in-use").exists()


def test_seed_rm_destroy_branches_destroys_them_then_every_version(
    pool: Pool, source: cluster.Running, env: dict[str, str], undo: Undo
) -> None:
    require_docker_image(15)
    undo.base("wrongly-seeded")
    first = seeded(pool, source, "wrongly-seeded")
    local = branch.create(pool, "on-first", base_name="wrongly-seeded", runtime="local")
    second = seeded(pool, source, "wrongly-seeded", refresh=True)
    docker = branch.create(pool, "on-second", base_name="wrongly-seeded", runtime="docker")
    done = cli(["base", "rm", "wrongly-seeded", "--destroy-branches"], env=env)
    assert done.returncode == 0, done.stderr
    assert "destroyed branches: on-first, on-second" in done.stdout
    assert_no_leaks(pool, "on-first", port=local.port)
    assert_no_leaks(pool, "on-second", port=docker.port)
    for version in (first.version, second.version):
        assert_base_gone(pool, "wrongly-seeded", version)
    assert pool.registry.bases("wrongly-seeded") == []


def test_seed_rm_version_removes_only_that_version(
    pool: Pool, source: cluster.Running, env: dict[str, str], undo: Undo
) -> None:
    undo.base("two-versions")
    first = seeded(pool, source, "two-versions")
    second = seeded(pool, source, "two-versions", refresh=True)
    try:
        done = cli(["base", "rm", "two-versions", "--version", str(first.version)], env=env)
        assert done.returncode == 0, done.stderr
        assert_base_gone(pool, "two-versions", first.version)
        kept = pool.registry.latest_base("two-versions")
        assert kept is not None and kept.version == second.version
        assert mounts.is_mounted(pool.base_dir("two-versions", second.version))
        missing = cli(["base", "rm", "two-versions", "--version", "9"], env=env)
        assert missing.returncode == BaseMissingError.exit_code
        assert f"has no version 9 (it has: {second.version})" in missing.stderr
    finally:
        seed.remove_version(pool, "two-versions", second.version)


def test_seed_rm_of_a_base_being_seeded_is_refused(
    pool: Pool, source: cluster.Running, env: dict[str, str], undo: Undo
) -> None:
    undo.base("being-seeded")
    base = seeded(pool, source, "being-seeded")
    try:
        with flocks.locked(pool.lock_path("seed", "being-seeded"), timeout=0, what="a seed"):
            done = cli(["base", "rm", "being-seeded"], env=env)
        assert done.returncode == SeedBusyError.exit_code, done.stderr
        assert "base being-seeded is busy" in done.stderr
        assert pool.registry.base("being-seeded", base.version).state == "ready"  # type: ignore[union-attr]
    finally:
        seed.remove_version(pool, "being-seeded", base.version)


@pytest.mark.parametrize("step", ["marked", "branches", "unmounted"])
def test_kill_during_seed_rm_then_gc_finishes_the_removal(
    pool: Pool, source: cluster.Running, env: dict[str, str], step: str, undo: Undo
) -> None:
    name = f"crash-rm-{step}"
    undo.base(name)
    base = seeded(pool, source, name)
    made = branch.create(pool, f"{name}-branch", base_name=name)
    done = cli(
        ["base", "rm", name, "--destroy-branches"],
        env={**env, "PGOVERLAY_FAULT_POINT": f"seed-rm:{step}"},
    )
    assert done.returncode == KILLED, done.stderr
    row = pool.registry.base(name, base.version)
    assert row is not None and row.state == "removing"
    with pytest.raises(BaseMissingError):  # no new branch of a base being removed
        branch.create(pool, f"{name}-late", base_name=name)
    report = gc.collect(pool)
    assert report.bases_removed == [f"{name} v{base.version} (interrupted removal)"], report
    assert report.problems == []
    assert_no_leaks(pool, f"{name}-branch", port=made.port)
    assert_base_gone(pool, name, base.version)


# -- pool down, pool init, pool rm ----------------------------------------------------------


@pytest.fixture
def own_pool(source: cluster.Running) -> Iterator[tuple[Settings, dict[str, str]]]:
    """A small pool of its own (an XFS image) with base `app`, and the env that names it. Its
    home's parent does not exist yet: `pool init` makes it."""
    require_root()
    top = Path(tempfile.mkdtemp(prefix="pgoverlay-admin-", dir="/var/tmp"))
    top.chmod(0o755)  # Postgres's user passes through it
    home = top / "not-yet" / "pool"
    settings = Settings(
        home=home, port_min=SMALL_PORTS[0], port_max=SMALL_PORTS[1], runtime="local"
    )
    try:
        made = poolmod.init(settings, size="1G")
    except BaseException:
        shutil.rmtree(top)
        raise
    env = {
        "PGOVERLAY_HOME": os.fspath(home),
        "PGOVERLAY_PORT_MIN": str(SMALL_PORTS[0]),
        "PGOVERLAY_PORT_MAX": str(SMALL_PORTS[1]),
    }
    try:
        seed.seed(made, "app", source_dsn=source_dsn(source))
        made.close()
        yield settings, env
    finally:
        if poolmod.read_info(home) is not None:
            if poolmod.read_info(home).down or not mounts.is_mounted(home / "pool"):  # type: ignore[union-attr]
                poolmod.init(settings).close()  # up again, so it can be taken apart
            dismantle(Pool.open(settings))
        else:
            assert not home.exists() or list(home.iterdir()) == []
        shutil.rmtree(top)


def nothing_runs_or_is_mounted(settings: Settings, ports: list[int]) -> None:
    home = settings.home
    assert mounts.mounts_under(home) == [], "a mount is left"
    assert not mounts.is_mounted(home / "pool"), "the pool image is still mounted"
    assert postgres_processes_for(home) == [], "a Postgres process is left"
    for port in ports:
        assert port_free(port), f"port {port} still bound"


def test_a_suspended_branch_stays_suspended_over_a_reboot_and_wakes_with_its_data(
    own_pool: tuple[Settings, dict[str, str]],
) -> None:
    """`pool down` then `pool init` (what a reboot asks of the admin): a suspended branch is
    not started by init, and wakes afterwards with its port, password and data."""
    settings, env = own_pool
    p = Pool.open(settings)
    made = branch.create(p, "asleep-over-maintenance")
    with psycopg.connect(**branch.connection(p, made).connect_kwargs(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    branch.suspend(p, made.name)
    p.close()
    done = cli(["pool", "down"], env=env)
    assert done.returncode == 0, done.stderr
    nothing_runs_or_is_mounted(settings, [made.port])
    done = cli(["pool", "init"], env=env)
    assert done.returncode == 0, done.stderr
    assert "asleep-over-maintenance" not in done.stdout
    p = Pool.open(settings)
    try:
        after = branch.get(p, made.name)
        assert (after.state, after.port, after.password) == ("suspended", made.port, made.password)
        woken = branch.wake(p, made.name)
        with psycopg.connect(**branch.connection(p, woken).connect_kwargs(), autocommit=True) as c:
            assert c.execute("SELECT x FROM kept").fetchone() == (42,)
        branch.destroy(p, made.name)
    finally:
        p.close()


@pytest.mark.parametrize("runtime", ["local", "docker"])
def test_pool_down_then_init_gives_back_working_branches_with_their_ports_and_passwords(
    own_pool: tuple[Settings, dict[str, str]], runtime: str
) -> None:
    settings, env = own_pool
    if runtime == "docker":
        require_docker_image(15)
    p = Pool.open(settings)
    made = branch.create(p, "kept-over-maintenance", runtime=runtime)
    with psycopg.connect(**branch.connection(p, made).connect_kwargs(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    p.close()

    done = cli(["pool", "down"], env=env)
    assert done.returncode == 0, done.stderr
    assert "stopped branches: kept-over-maintenance" in done.stdout
    nothing_runs_or_is_mounted(settings, [made.port])
    assert docker_objects_for(p, made.name) == []
    refused = cli(["branch", "list"], env=env)
    assert refused.returncode == PoolError.exit_code
    assert "down for maintenance" in refused.stderr and "pool init" in refused.stderr
    again = cli(["pool", "down"], env=env)
    assert again.returncode == 0, again.stderr

    done = cli(["pool", "init"], env=env)
    assert done.returncode == 0, done.stderr
    assert "restarted branches: kept-over-maintenance" in done.stdout
    p = Pool.open(settings)
    try:
        after = branch.get(p, made.name)
        assert (after.port, after.password, after.runtime) == (made.port, made.password, runtime)
        # A real login with the password the branch had before: the same data.
        with psycopg.connect(
            **branch.connection(p, made).connect_kwargs(), autocommit=True
        ) as conn:
            assert conn.execute("SELECT x FROM kept").fetchone() == (42,)
        assert mounts.is_mounted(p.base_dir("app", 1))
        branch.destroy(p, made.name)
    finally:
        p.close()


def test_pool_down_and_rm_stop_an_engine_service_that_serves_and_keeps_warm_branches_first(
    own_pool: tuple[Settings, dict[str, str]],
) -> None:
    """The service holds the registry open (one connection per thread that answered) and keeps
    warm branches started: taking the pool down stops it first, or the image stays busy."""
    settings, env = own_pool
    env = {**env, "PGOVERLAY_RUNTIME": "local"}  # the service's settings: it acts for root
    serve.start(settings)
    try:
        warmed = cli(["base", "warm", "app", "--count", "1"], env=env)
        assert warmed.returncode == 0, warmed.stderr

        def warm_ready() -> bool:
            listed = cli(["base", "list", "--json"], env=env)  # asks the service, as root
            return any(w["ready"] for w in json.loads(listed.stdout)[0]["warm"])

        wait_for(warm_ready, timeout=120, what="the service's warm branch")
        down = cli(["pool", "down"], env=env)
        assert down.returncode == 0, down.stderr
        assert not serve.answering(settings)
        nothing_runs_or_is_mounted(settings, [])
        assert cli(["pool", "init"], env=env).returncode == 0
        serve.start(settings)  # what init does where the service may start itself
        log = settings.home / "service.log"
        start = len(log.read_text())
        assert cli(["branch", "list"], env=env).returncode == 0
        assert "GET /v1/branches -> 200" in log.read_text()[start:]  # the registry is open
        gone = cli(["pool", "rm", "--yes"], env=env)
        assert gone.returncode == 0, gone.stderr
        assert "stopped the engine service" in gone.stdout
        assert not settings.home.exists()
    finally:
        serve.stop(settings, wait=30)


def test_pool_down_waits_for_a_held_lock_then_refuses_and_leaves_the_pool_up(
    own_pool: tuple[Settings, dict[str, str]],
) -> None:
    settings, env = own_pool
    p = Pool.open(settings)
    made = branch.create(p, "busy-during-down")
    try:
        with flocks.locked(p.lock_path("branch", made.name), timeout=0, what="a reset"):
            done = cli(["pool", "down"], env={**env, "PGOVERLAY_LOCK_WAIT": "1"})
        assert done.returncode == LockBusyError.exit_code, done.stderr
        assert "branch busy-during-down stayed busy" in done.stderr
        assert poolmod.read_info(settings.home).down is False  # type: ignore[union-attr]
        assert branch.status(p, made.name).running
        listed = cli(["branch", "list", "--json"], env=env)
        assert listed.returncode == 0, listed.stderr
    finally:
        branch.destroy(p, made.name)
        p.close()


def test_pool_rm_leaves_no_mounts_files_containers_and_follows_no_link(
    own_pool: tuple[Settings, dict[str, str]],
) -> None:
    settings, env = own_pool
    require_docker_image(15)
    home = settings.home
    p = Pool.open(settings)
    local = branch.create(p, "rm-local", runtime="local")
    docker = branch.create(p, "rm-docker", runtime="docker")
    # What the pool's user (or a PR's SQL reaching the OS) may plant: links out of the pool.
    outside = Path(tempfile.mkdtemp(prefix="pgoverlay-outside-", dir="/var/tmp"))
    (outside / "precious").write_text("keep me")
    upper = branch.layout(p, local.name).upper
    os.symlink(outside, upper / "link-to-outside")
    os.symlink(outside / "precious", upper / "link-to-file")
    pool_hash = p.id
    p.close()
    serve.start(settings)  # as `pool init` starts it where there is no systemd
    try:
        unconfirmed = cli(["pool", "rm"], env=env)
        assert unconfirmed.returncode == ConfigError.exit_code
        assert "--yes" in unconfirmed.stderr
        assert mounts.is_mounted(home / "pool")  # nothing was touched

        done = cli(["pool", "rm", "--yes"], env=env)
        assert done.returncode == 0, done.stderr
        assert f"pool at {home} removed" in done.stdout
        nothing_runs_or_is_mounted(settings, [local.port, docker.port])
        assert not home.exists(), list(home.rglob("*"))
        assert not (SOCKET_ROOT / pool_hash).exists()
        assert "stopped the engine service" in done.stdout
        assert not client.socket_path(settings).exists() and not serve.answering(settings)
        assert docker_objects_for(p, "rm-docker") == []
        assert (outside / "precious").read_text() == "keep me"

        again = cli(["pool", "rm", "--yes"], env=env)
        assert again.returncode == PoolError.exit_code
        assert "no pool at" in again.stderr
    finally:
        serve.stop(settings)
        (outside / "precious").unlink()
        outside.rmdir()


def test_pool_rm_removes_the_doors_key_and_the_api_tokens_keeps_the_audit_log_and_says_so(
    own_pool: tuple[Settings, dict[str, str]],
) -> None:
    """`pool rm` leaves no secret of the pool: the front door's private key, its pid file and
    log, the API token store go; the audit log stays, and the output says why. A pool made
    again at that home accepts no token of the old one, even from a store an earlier
    release's `pool rm` left behind."""
    settings, env = own_pool
    home = settings.home
    os_user("pgoverlay-door", groups=["pgoverlay"])
    env = {
        **env,
        "PGOVERLAY_DOOR_PORT": str(free_tcp_port()),
        "PGOVERLAY_DOOR_HTTPS_PORT": str(free_tcp_port()),
    }
    serve.start(settings)
    try:
        started = cli(["door", "--start"], env=env)
        assert started.returncode == 0, started.stderr
        issued = cli(["api", "token", "issue", "old-listener", "--owner", "acme"], env=env)
        assert issued.returncode == 0, issued.stderr
        token = issued.stdout.strip().splitlines()[-1]
        assert tokens.check(home, token, repository="acme/shop").name == "old-listener"
        left = {p.relative_to(home).as_posix() for p in home.rglob("*") if p.is_file()}
        assert {"door/door.key", "door/door.pid", "door.log", "api/tokens.json"} <= left, left
        stale = (home / "api" / "tokens.json").read_bytes()  # as an earlier release left it

        done = cli(["pool", "rm", "--yes"], env=env)
        assert done.returncode == 0, done.stderr
        assert "stopped the front door" in done.stdout
        kept = sorted(p.relative_to(home).as_posix() for p in home.rglob("*"))
        assert kept[0] == "audit" and all(k.startswith("audit/") for k in kept[1:]), kept
        assert f"kept {home / 'audit'}: the audit log" in done.stdout
        for gone in ("door", "door.log", "api"):
            assert f"removed {home / gone}" in done.stdout

        # a new pool at the same home: the old token is good for nothing, even from a store
        # left behind
        (home / "api").mkdir(mode=0o700)
        (home / "api" / "tokens.json").write_bytes(stale)
        (home / "api" / "tokens.json").chmod(0o600)
        poolmod.init(settings, size="1G").close()
        with pytest.raises(TokenError):
            tokens.check(home, token, repository="acme/shop")
        assert not (home / "api").exists()
    finally:
        serve.stop(settings)


def test_pool_down_is_recorded_shown_by_doctor_and_cleared_by_init(
    own_pool: tuple[Settings, dict[str, str]],
) -> None:
    settings, env = own_pool
    assert json.loads((settings.home / "pool.json").read_text()).get("down") is None
    assert cli(["pool", "down"], env=env).returncode == 0
    assert json.loads((settings.home / "pool.json").read_text())["down"] is True
    doctor = {c["name"]: c for c in json.loads(cli(["doctor", "--json"], env=env).stdout)}
    assert doctor["pool"]["verdict"] == "fail" and "pool init" in doctor["pool"]["detail"]
    assert cli(["pool", "init"], env=env).returncode == 0
    assert json.loads((settings.home / "pool.json").read_text()).get("down") is None
