"""Idle branches suspend (their server stopped cleanly, their data unmounted, their writable
layer kept) and wake: by hand, by the engine's operations that need a server, and on the first
connection through the front door. kill -9 at each step of either leaves what gc finishes; the
TTL and destroy work on a suspended branch."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apikit import running_door

from helpers import Undo, assert_no_leaks, cli
from pgoverlay.errors import BranchStateError
from pgoverlay.runner import branch
from pgoverlay.runner.branch import sizes
from pgoverlay.runner.pool import Pool, gc, mounts
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.runtime.choose import runtime_for
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import RecordRequest

KILLED = -signal.SIGKILL


def write_row(pool: Pool, b: Branch, value: int) -> None:
    with psycopg.connect(**branch.connection(pool, b).connect_kwargs(), autocommit=True) as db:
        db.execute("CREATE TABLE IF NOT EXISTS kept (x int)")
        db.execute("INSERT INTO kept VALUES (%s)", (value,))


def read_rows(pool: Pool, b: Branch) -> list[int]:
    with psycopg.connect(**branch.connection(pool, b).connect_kwargs(), autocommit=True) as db:
        return [row[0] for row in db.execute("SELECT x FROM kept ORDER BY x").fetchall()]


def is_down(pool: Pool, b: Branch) -> bool:
    """No server of ``b`` runs, and (the local runtime) its data is not mounted."""
    base = pool.registry.base(b.base_name, b.base_version)
    assert base is not None
    lay = branch.layout(pool, b.key)
    stopped = runtime_for(pool, base, b.runtime).liveness(lay).state == "stopped"
    return stopped and (b.runtime != "local" or not mounts.is_mounted(lay.data))


@pytest.mark.usefixtures("runtime")
def test_a_suspended_branch_keeps_its_layer_port_and_password_and_wakes_with_its_data(
    pool: Pool, base: BaseVersion, undo: Undo
) -> None:
    name = "susp-keep"
    undo.branch(name)
    made = branch.create(pool, name, base_name=base.name)
    write_row(pool, made, 1)
    suspended = branch.suspend(pool, name)
    assert suspended.state == "suspended" and suspended.suspended_at is not None
    assert is_down(pool, suspended)
    assert branch.layer_size(pool, suspended).logical_bytes > 0  # the layer is kept
    assert branch.suspend(pool, name).state == "suspended"  # again: nothing to do
    started = time.monotonic()
    woken = branch.wake(pool, name)
    print(f"wake took {time.monotonic() - started:.3f} s")
    assert woken.state == "ready" and woken.suspended_at is None
    assert (woken.port, woken.password) == (made.port, made.password)
    assert read_rows(pool, woken) == [1]
    assert branch.wake(pool, name).state == "ready"  # a branch that is up is left as it is


def test_only_a_ready_branch_is_suspended(pool: Pool, base: BaseVersion, undo: Undo) -> None:
    name = "susp-state"
    undo.branch(name)
    branch.create(pool, name, base_name=base.name)
    pool.registry.update_branch(name, state="resetting")
    with pytest.raises(BranchStateError, match="is resetting, not ready"):
        branch.suspend(pool, name)
    gc.collect(pool)  # finishes the "reset"
    assert branch.get(pool, name).state == "ready"


def test_what_needs_a_server_wakes_a_suspended_branch(
    pool: Pool, base: BaseVersion, undo: Undo
) -> None:
    """Its password asked for (a workflow's migrations), a reset, and a trace wake it."""
    engine = LocalEngine(pool)
    name = "susp-engine"
    undo.branch(name)
    made = branch.create(pool, name, base_name=base.name)
    write_row(pool, made, 7)
    branch.suspend(pool, name)
    viewed = engine.branch(name)
    assert viewed is not None and viewed.state == "suspended" and not viewed.running
    c = engine.connection(name)
    assert branch.get(pool, name).state == "ready"
    with psycopg.connect(**c.connect_kwargs(), autocommit=True) as db:
        assert db.execute("SELECT x FROM kept").fetchone() == (7,)
    engine.suspend(name)
    done = engine.reset(name)
    assert done.state == "ready" and branch.get(pool, name).suspended_at is None
    with psycopg.connect(**engine.connection(name).connect_kwargs(), autocommit=True) as db:
        assert db.execute("SELECT to_regclass('kept')").fetchone() == (None,)


@pytest.mark.usefixtures("runtime")
@pytest.mark.parametrize("step", ["marked", "stopped"])
def test_kill_during_suspend_then_gc_finishes_it(
    pool: Pool, base: BaseVersion, runtime_env: dict[str, str], step: str, undo: Undo
) -> None:
    name = f"susp-crash-{step}"
    undo.branch(name)
    made = branch.create(pool, name, base_name=base.name)
    write_row(pool, made, 3)
    done = cli(
        ["branch", "suspend", name],
        env={**runtime_env, "PGOVERLAY_FAULT_POINT": f"suspend:{step}"},
    )
    assert done.returncode == KILLED, done.stderr
    assert branch.get(pool, name).state == "suspending"
    assert name in gc.collect(pool).finished
    after = branch.get(pool, name)
    assert after.state == "suspended" and is_down(pool, after)
    assert read_rows(pool, branch.wake(pool, name)) == [3]


@pytest.mark.usefixtures("runtime")
@pytest.mark.parametrize("step", ["marked", "started"])
def test_kill_during_wake_then_gc_or_the_next_wake_finishes_it(
    pool: Pool, base: BaseVersion, runtime_env: dict[str, str], step: str, undo: Undo
) -> None:
    name = f"wake-crash-{step}"
    undo.branch(name)
    made = branch.create(pool, name, base_name=base.name)
    write_row(pool, made, 5)
    for finish in ("gc", "wake"):
        branch.suspend(pool, name)
        done = cli(
            ["branch", "resume", name],
            env={**runtime_env, "PGOVERLAY_FAULT_POINT": f"wake:{step}"},
        )
        assert done.returncode == KILLED, done.stderr
        assert branch.get(pool, name).state == "waking"
        if finish == "gc":
            assert name in gc.collect(pool).finished
        else:
            branch.wake(pool, name)
        after = branch.get(pool, name)
        assert (after.state, after.port, after.password) == ("ready", made.port, made.password)
        assert read_rows(pool, after) == [5]


@pytest.mark.usefixtures("runtime")
def test_the_ttl_and_destroy_take_a_suspended_branch(pool: Pool, base: BaseVersion) -> None:
    expiring = branch.create(pool, "susp-ttl", base_name=base.name, ttl_seconds=60)
    branch.suspend(pool, expiring.name)
    assert "susp-ttl" in gc.collect(pool, now=time.time() + 120).expired
    assert_no_leaks(pool, "susp-ttl", port=expiring.port)
    gone = branch.create(pool, "susp-gone", base_name=base.name)
    branch.suspend(pool, gone.name)
    assert branch.destroy(pool, gone.name)
    assert_no_leaks(pool, "susp-gone", port=gone.port)


def test_gc_leaves_a_suspended_branch_suspended(pool: Pool, base: BaseVersion, undo: Undo) -> None:
    undo.branch("susp-gc")
    branch.create(pool, "susp-gc", base_name=base.name)
    branch.suspend(pool, "susp-gc")
    report = gc.collect(pool)
    assert "susp-gc" not in report.restarted
    assert branch.get(pool, "susp-gc").state == "suspended"


def test_a_suspended_layer_is_walked_once_per_suspension_and_a_list_shows_what_status_does(
    pool: Pool, base: BaseVersion, undo: Undo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list of a thousand branches cannot walk every layer: a suspended one, which nothing
    writes, is measured once until it wakes; a running one each time."""
    name = "susp-size"
    undo.branch(name)
    made = branch.create(pool, name, base_name=base.name)
    write_row(pool, made, 1)
    upper = branch.layout(pool, made.key).upper
    real = sizes.layer_size
    walks: list[object] = []

    def counted(root: Any) -> sizes.LayerSize:
        walks.append(root)
        return real(root)

    monkeypatch.setattr(sizes, "layer_size", counted)
    suspended = branch.suspend(pool, name)
    first = branch.layer_size(pool, suspended)
    assert first == real(upper) and first.logical_bytes > 0
    assert branch.layer_size(pool, name) == first and len(walks) == 1  # not walked again
    woken = branch.wake(pool, name)
    branch.layer_size(pool, woken)
    branch.layer_size(pool, woken)
    assert len(walks) == 3  # a running branch's layer changes: walked each time
    with psycopg.connect(**branch.connection(pool, woken).connect_kwargs(), autocommit=True) as db:
        db.execute("CREATE TABLE grown AS SELECT g AS x FROM generate_series(1, 50000) g")
    again = branch.suspend(pool, name)
    grown = branch.layer_size(pool, again)
    assert len(walks) == 4 and grown.logical_bytes > first.logical_bytes  # a new suspension

    engine = LocalEngine(pool)
    engine.save_record(name, RecordRequest(data='{"pr": 7}'))
    listed = [v for v in engine.branches(layer=True) if v.name == name]
    assert listed == [engine.branch(name, layer=True)]
    view = listed[0]
    assert view.state == "suspended" and view.liveness == "stopped" and not view.running
    assert view.layer is not None and view.layer.logical_bytes == grown.logical_bytes
    assert view.record is not None and view.record.data == '{"pr": 7}'


# -- waking through the front door -------------------------------------------------------------


def test_the_first_connections_through_the_front_door_wake_a_suspended_branch_once(
    pool: Pool,
    base: BaseVersion,
    service: Path,
    tmp_path_factory: pytest.TempPathFactory,
    undo: Undo,
) -> None:
    name = "susp-door"
    undo.branch(name)
    made = branch.create(pool, name, base_name=base.name)
    write_row(pool, made, 9)
    folder = tmp_path_factory.mktemp("door-wake")
    with running_door(pool, base, folder, policy="owners: [acme]\n") as door:
        login: dict[str, Any] = {
            "host": "localhost",
            "port": door.door_port,
            "dbname": name,
            "user": made.user,
            "password": made.password,
            "sslmode": "verify-full",
            "sslrootcert": str(door.certs.ca_file),
            "connect_timeout": 30,
        }

        def first_result() -> tuple[float, int]:
            started = time.monotonic()
            with psycopg.connect(**login) as db:
                row = db.execute("SELECT x FROM kept").fetchone()
            assert row is not None
            return time.monotonic() - started, row[0]

        branch.suspend(pool, name)
        with ThreadPoolExecutor(5) as workers:
            results = list(workers.map(lambda _: first_result(), range(5)))
        assert [value for _, value in results] == [9] * 5
        assert branch.get(pool, name).state == "ready"
        woke = [line for line in door.log.read_text().splitlines() if f"woke branch {name}" in line]
        assert len(woke) == 1, woke
        print("connect-to-first-result while waking:", sorted(round(s, 3) for s, _ in results))
        seconds, _ = first_result()  # and once up, as any running branch
        print(f"connect-to-first-result when up: {seconds:.3f} s")


def test_a_source_banned_for_failed_logins_wakes_no_branch(
    pool: Pool,
    base: BaseVersion,
    service: Path,
    tmp_path_factory: pytest.TempPathFactory,
    undo: Undo,
) -> None:
    """Naming a suspended branch wakes it before any password is checked: an anonymous client
    may do so only until its failed logins ban it, after which the branches it names stay
    suspended."""
    name = "susp-banned"
    undo.branch(name)
    made = branch.create(pool, name, base_name=base.name)
    branch.suspend(pool, name)
    folder = tmp_path_factory.mktemp("door-ban")
    env = {"PGOVERLAY_DOOR_FAILED_LOGINS": "2"}
    with running_door(pool, base, folder, policy="owners: [acme]\n", env=env) as door:

        def attempt(database: str, password: str) -> str:
            try:
                psycopg.connect(
                    host="localhost",
                    port=door.door_port,
                    dbname=database,
                    user=made.user,
                    password=password,
                    sslmode="verify-full",
                    sslrootcert=str(door.certs.ca_file),
                    connect_timeout=30,
                ).close()
            except psycopg.OperationalError as err:
                return str(err)
            return "connected"

        for guess in ("susp-nope-1", "susp-nope-2"):
            assert "password authentication failed" in attempt(guess, "wrong")
        refused = attempt(name, made.password)
        assert "too many failed logins" in refused
        assert branch.get(pool, name).state == "suspended"
        assert f"woke branch {name}" not in door.log.read_text()
