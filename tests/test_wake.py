"""Suspended branches wake when something needs them: the engine's operations that need a
server, and the first connections through the front door (which share one wake, and which a
source banned for failed logins cannot make); gc leaves a suspended branch alone; a list shows
what status shows without walking a suspended layer again. On the session's runtime (see
tests/test_suspend.py for the tests run on each)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apikit import running_door

from helpers import Undo, write_row
from pgoverlay.errors import BranchStateError
from pgoverlay.runner import branch
from pgoverlay.runner.branch import grants, sizes
from pgoverlay.runner.pool import Pool, gc
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import RecordRequest


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
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool.settings, "access_unmasked", True)
    name = "susp-door"
    undo.branch(name)
    made = branch.create(pool, name, base_name=base.name)
    write_row(pool, made, 9)
    # through the door, a credential the engine minted (the branch's own role is refused)
    granted = grants.grant(pool, name, login="octo-cat", ttl=3600)
    folder = tmp_path_factory.mktemp("door-wake")
    with running_door(pool, base, folder, policy="owners: [acme]\n") as door:
        login: dict[str, Any] = {
            "host": "localhost",
            "port": door.door_port,
            "dbname": name,
            "user": granted.grant.role,
            "password": granted.password,
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


def test_doctor_warns_when_the_branches_ports_overlap_the_kernels_ephemeral_ones(
    tmp_path: Path,
) -> None:
    """A suspended branch listens on nothing: an outgoing connection may take its port from the
    kernel's ephemeral range, and it cannot wake. doctor says so, and what to choose."""
    from pgoverlay.runner import doctor
    from pgoverlay.runner.settings import Settings

    ephemeral = tmp_path / "ip_local_port_range"
    ephemeral.write_text("32768\t60999\n")
    inside = doctor._ports(Settings(port_min=50000, port_max=51199), ephemeral=ephemeral)
    assert inside.verdict == "warn" and "choose a range below 32768" in inside.detail
    below = doctor._ports(Settings(port_min=20000, port_max=29999), ephemeral=ephemeral)
    assert below.verdict == "ok" and "outside the kernel's ephemeral ports" in below.detail
    assert doctor._ports(Settings(), ephemeral=tmp_path / "absent").verdict == "ok"
