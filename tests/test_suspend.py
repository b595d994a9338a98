"""Idle branches suspend (their server stopped cleanly, their data unmounted, their writable
layer kept) and wake, on each runtime: kill -9 at each step of either leaves what gc finishes;
the TTL and destroy work on a suspended branch. What does not depend on the runtime is in
tests/test_wake.py: this module's tests run with the runtime fixture set for the module, and a
test without it placed among them would run on whichever runtime is set at the time."""

from __future__ import annotations

import signal
import time

import pytest

from helpers import Undo, assert_no_leaks, cli, is_down, read_rows, write_row
from pgoverlay.runner import branch
from pgoverlay.runner.pool import Pool, gc
from pgoverlay.runner.pool.registry import BaseVersion

KILLED = -signal.SIGKILL


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
