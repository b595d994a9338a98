"""kill -9 of the CLI at every saga step, then `gc`: nothing leaks, ready branches stay usable."""

from __future__ import annotations

import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from helpers import Undo, assert_no_leaks, cli
from pgoverlay.runner import branch
from pgoverlay.runner.pool import Pool, gc
from pgoverlay.runner.pool.registry import BaseVersion

KILLED = -signal.SIGKILL

pytestmark = pytest.mark.usefixtures("runtime")


@pytest.mark.parametrize("step", ["registered", "dirs", "mounted", "started"])
def test_kill_during_create_then_gc_leaves_no_leaks(
    pool: Pool, base: BaseVersion, runtime_env: dict[str, str], step: str
) -> None:
    name = f"crash-create-{step}"
    done = cli(
        ["branch", "create", name, "--base", base.name],
        env={**runtime_env, "PGOVERLAY_FAULT_POINT": f"create:{step}"},
    )
    assert done.returncode == KILLED, done.stderr
    row = pool.registry.branch(name)
    assert row is not None and row.state == "creating"
    report = gc.collect(pool)
    assert name in report.undone
    assert_no_leaks(pool, name, port=row.port)


@pytest.mark.parametrize("step", ["marked", "stopped"])
def test_kill_during_destroy_then_gc_finishes_it(
    pool: Pool, base: BaseVersion, runtime_env: dict[str, str], step: str, undo: Undo
) -> None:
    undo.branch(f"crash-destroy-{step}")
    name = f"crash-destroy-{step}"
    created = branch.create(pool, name, base_name=base.name)
    done = cli(
        ["branch", "destroy", name], env={**runtime_env, "PGOVERLAY_FAULT_POINT": f"destroy:{step}"}
    )
    assert done.returncode == KILLED, done.stderr
    assert name in gc.collect(pool).finished
    assert_no_leaks(pool, name, port=created.port)


@pytest.mark.parametrize("step", ["marked", "wiped", "mounted", "started"])
def test_kill_during_reset_then_gc_finishes_it_with_the_same_password(
    pool: Pool, base: BaseVersion, runtime_env: dict[str, str], step: str
) -> None:
    name = f"crash-reset-{step}"
    created = branch.create(pool, name, base_name=base.name)
    try:
        with psycopg.connect(
            **branch.connection(pool, created).connect_kwargs(), autocommit=True
        ) as conn:
            conn.execute("CREATE TABLE written_before_reset (x int)")
        done = cli(
            ["branch", "reset", name], env={**runtime_env, "PGOVERLAY_FAULT_POINT": f"reset:{step}"}
        )
        assert done.returncode == KILLED, done.stderr
        assert name in gc.collect(pool).finished
        after = branch.get(pool, name)
        assert (after.state, after.port, after.password) == (
            "ready",
            created.port,
            created.password,
        )
        with psycopg.connect(
            **branch.connection(pool, after).connect_kwargs(), autocommit=True
        ) as conn:
            assert conn.execute("SELECT to_regclass('written_before_reset')").fetchone() == (None,)
    finally:
        branch.destroy(pool, name)


def test_gc_leaves_ready_branches_and_running_sagas_alone(pool: Pool, base: BaseVersion) -> None:
    created = branch.create(pool, "bystander", base_name=base.name)
    try:
        report = gc.collect(pool)
        assert "bystander" not in report.undone + report.finished + report.restarted
        with psycopg.connect(
            **branch.connection(pool, created).connect_kwargs(), autocommit=True
        ) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        branch.destroy(pool, "bystander")


def test_concurrent_creates_of_different_branches_all_succeed(
    pool: Pool, base: BaseVersion, runtime_env: dict[str, str]
) -> None:
    names = [f"parallel-{i}" for i in range(4)]
    with ThreadPoolExecutor(len(names)) as workers:
        results = list(
            workers.map(
                lambda n: cli(["branch", "create", n, "--base", base.name], env=runtime_env), names
            )
        )
    try:
        assert [r.returncode for r in results] == [0] * len(names), [r.stderr for r in results]
        ports = {branch.get(pool, n).port for n in names}
        assert len(ports) == len(names)
        for name in names:
            with psycopg.connect(
                **branch.connection(pool, branch.get(pool, name)).connect_kwargs()
            ) as conn:
                assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (200000,)
    finally:
        for name in names:
            branch.destroy(pool, name)


def test_concurrent_creates_of_one_name_give_one_branch_and_one_clear_error(
    pool: Pool, base: BaseVersion, runtime_env: dict[str, str]
) -> None:
    with ThreadPoolExecutor(3) as workers:
        results: list[subprocess.CompletedProcess[str]] = list(
            workers.map(
                lambda _: cli(
                    ["branch", "create", "contested", "--base", base.name], env=runtime_env
                ),
                range(3),
            )
        )
    try:
        codes = sorted(r.returncode for r in results)
        assert codes == [0, 16, 16], [r.stderr for r in results]
        for r in results:
            if r.returncode == 16:
                assert "branch contested already exists" in r.stderr
                assert len(r.stderr.strip().splitlines()) == 1
        assert [b.name for b in pool.registry.branches()].count("contested") == 1
    finally:
        branch.destroy(pool, "contested")
