"""The engine service suspends a ready branch that nobody has been connected to for its
``suspend_after`` seconds; an open connection (idle, or idle in a transaction) or an open trace
keeps it up, and 0 means never. The Action's ``suspend-after`` input reaches the registry.

These run against a real engine service, started for the module with a one-second round and a
pool default of two seconds; the session's service (which suspends nothing) is back afterwards.
Nothing is timed: a test waits, generously, for what must happen, and proves that something did
not happen by waiting for a later branch that was due after it to be suspended first."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_workflow import job_env, payload

from helpers import (
    Undo,
    cli,
    is_down,
    read_rows,
    service_settings,
    start_service,
    without_the_service,
    write_row,
)
from pgoverlay.action import main
from pgoverlay.action.request import PrRequest
from pgoverlay.errors import ConfigError, RequestError, SettingError
from pgoverlay.runner import branch
from pgoverlay.runner.branch import idle
from pgoverlay.runner.names import parse_idle_seconds
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool, flocks
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.service import serve
from pgoverlay.runner.service.client import RemoteEngine
from pgoverlay.runner.service.models import CreateRequest, TraceRequest
from pgoverlay.runner.service.views import BranchView
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.units import format_duration, idle_rule
from pgoverlay.runner.web import render

# -- what is read and said (pure) --------------------------------------------------------------


def test_an_idle_time_is_seconds_or_a_duration_and_0_is_never() -> None:
    assert [parse_idle_seconds(t) for t in ("0", "600", "10m", "2h", "1.5s")] == [
        0,
        600,
        600,
        7200,
        1.5,
    ]
    for wrong in ("soon", "-1", "0.5", "500ms", ""):
        with pytest.raises(ConfigError, match="cannot read idle time"):
            parse_idle_seconds(wrong)
    assert Settings(suspend_after="10m").suspend_after == 600
    assert Settings().suspend_after == 600  # the default
    with pytest.raises(SettingError, match="PGOVERLAY_SUSPEND_AFTER: should be a number"):
        Settings(suspend_after="soon")
    assert PrRequest(suspend_after="45m").suspend_after_seconds() == 2700
    assert PrRequest(suspend_after="0").suspend_after_seconds() == 0
    assert PrRequest().suspend_after_seconds() is None  # the runner's
    with pytest.raises(RequestError, match="^suspend_after: cannot read idle time 'soon'"):
        PrRequest(suspend_after="soon")
    with pytest.raises(RequestError, match="suspend_after_seconds: -1 is out of range"):
        CreateRequest(name="x", suspend_after_seconds=-1)


def test_the_page_and_the_comment_say_a_suspended_branch_wakes_on_the_next_connection() -> None:
    assert idle_rule(0) == "never suspended"
    assert idle_rule(600) == (
        "suspended after 10m with no connection: wakes on the next connection"
    )
    assert [format_duration(s) for s in (90, 7200, 86400, 1.5)] == ["90s", "2h", "1d", "1.5s"]
    view = BranchView(
        name="shop-pr-1",
        state="suspended",
        running=False,
        liveness="stopped",
        base="app",
        base_version=1,
        runtime="local",
        host="127.0.0.1",
        port=20001,
        database="app",
        user="pgoverlay",
        created_at=0.0,
        ready_at=0.0,
        expires_at=None,
        repository="acme/shop",
        pr=1,
        owner_uid=0,
        suspended_at=86400.0,
        suspend_after=600.0,
    )
    page = render.branch_page(
        view, None, masked=True, login="octocat", access="read-only", csrf="c", nonce="n"
    )
    assert "suspended since 1970-01-02 00:00:00 UTC: wakes on the next connection" in page
    assert "suspended after 10m with no connection" in page


ROUND = 1.0  # seconds between the module's service's looks
POOL_DEFAULT = 2.0  # its suspend_after, for a branch created without its own
WAIT = 90.0  # generous: a round, a clean shutdown and an unmount, on a busy machine


@pytest.fixture(scope="module")
def idle_service(pool: Pool, service: Path) -> Iterator[Path]:
    """The engine service with a one-second round and a two-second default, in place of the
    session's for this module."""
    session = service_settings(pool)
    serve.stop(session, wait=session.stop_timeout)
    watching = session.replace(suspend_after=POOL_DEFAULT, service_idle_interval=ROUND)
    start_service(watching)
    try:
        yield service
    finally:
        serve.stop(watching, wait=watching.stop_timeout)
        start_service(session)


def suspended(pool: Pool, name: str) -> Branch:
    return wait_for(
        lambda: found if (found := branch.get(pool, name)).state == "suspended" else None,
        timeout=WAIT,
        what=f"branch {name} to be suspended by the engine service",
        max_interval=0.5,
    )


def after_a_later_one_is_suspended(pool: Pool, base: BaseVersion, undo: Undo, name: str) -> None:
    """Return once a round of the watcher that began after every branch made so far was due has
    ended: branch ``name``, made now (so due after them), is suspended; then one more, made
    after that, is, so the round that suspended the first had ended."""
    for n in (name, f"{name}-2"):
        undo.branch(n)
        branch.create(pool, n, base_name=base.name, suspend_after=POOL_DEFAULT)
        suspended(pool, n)


def test_a_branch_whose_lock_is_taken_is_left_for_a_later_round(
    pool: Pool, base: BaseVersion, undo: Undo
) -> None:
    """A command working on the branch holds its lock: the watcher neither waits nor suspends.
    A watcher of this process, on a clock of the test's, with no service watching meanwhile
    (first in the module: the module's service starts after it)."""
    name = "idle-locked"
    undo.branch(name)
    with without_the_service(pool):
        made = branch.create(pool, name, base_name=base.name, suspend_after=1)
        clock = [made.ready_at or 0.0]
        watcher = idle.Watcher(clock=lambda: clock[0])
        assert watcher.round(pool).suspended == []  # not idle for a second yet
        clock[0] += 5
        with flocks.hold(pool.lock_path("branch", name), timeout=5, what="the test's hold"):
            done = watcher.round(pool)
        assert name in done.locked and branch.get(pool, name).state == "ready"
        # the round's connection backend may still be on its way out a moment after it closed
        wait_for(
            lambda: name in watcher.round(pool).suspended,
            timeout=WAIT,
            what=f"the watcher to suspend {name}",
            max_interval=0.5,
        )
        assert branch.get(pool, name).state == "suspended"


def test_a_branch_nobody_connects_to_is_suspended_within_a_few_rounds(
    pool: Pool, base: BaseVersion, idle_service: Path, undo: Undo, env: dict[str, str]
) -> None:
    """With its own time, and with none (the pool's); it keeps its data and wakes."""
    own, default = "idle-own", "idle-default"
    undo.branch(own)
    undo.branch(default)
    made = branch.create(pool, own, base_name=base.name, suspend_after=2)
    write_row(pool, made, 4)
    branch.create(pool, default, base_name=base.name)
    assert branch.get(pool, default).suspend_after is None
    for name in (own, default):
        after = suspended(pool, name)
        assert after.suspended_at is not None and is_down(pool, after)
    views = {v.name: v for v in RemoteEngine(idle_service).branches()}
    assert (views[own].state, views[own].suspend_after) == ("suspended", 2)
    assert views[default].suspend_after == POOL_DEFAULT
    status = cli(["branch", "status", own], env=env)
    assert status.returncode == 0, status.stderr
    assert "state: suspended since 20" in status.stdout
    assert ": wakes on the next connection" in status.stdout
    assert "suspend_after: suspended after 2s with no connection" in status.stdout
    listed = cli(["branch", "list"], env=env)
    assert listed.returncode == 0, listed.stderr
    assert any(own in line and "suspended since" in line for line in listed.stdout.splitlines())
    woken = branch.wake(pool, own)
    assert read_rows(pool, woken) == [4]
    assert (woken.port, woken.password) == (made.port, made.password)
    # woken, it is idle from its wake, and suspended again
    assert suspended(pool, own).suspended_at is not None


def test_an_open_connection_a_transaction_left_idle_or_a_trace_keeps_a_branch_up(
    pool: Pool, base: BaseVersion, idle_service: Path, undo: Undo
) -> None:
    """And a branch created with 0 is never suspended."""
    names = {"connected": "idle-conn", "in_transaction": "idle-xact", "traced": "idle-trace"}
    never = "idle-never"
    for name in (*names.values(), never):
        undo.branch(name)
    made = {
        key: branch.create(pool, name, base_name=base.name, suspend_after=2)
        for key, name in names.items()
    }
    branch.create(pool, never, base_name=base.name, suspend_after=0)
    login: dict[str, Any] = branch.connection(pool, made["connected"]).connect_kwargs()
    in_transaction = branch.connection(pool, made["in_transaction"]).connect_kwargs()
    engine = RemoteEngine(idle_service)  # root's: the trace is held by the service
    with (
        psycopg.connect(**login, autocommit=True) as connected,
        psycopg.connect(**in_transaction) as open_transaction,
    ):
        connected.execute("SELECT 1")
        open_transaction.execute("SELECT 1")  # BEGIN, then nothing: idle in transaction
        engine.trace_begin(names["traced"], TraceRequest(max_seconds=600))
        try:
            with psycopg.connect(**in_transaction, autocommit=True) as look:
                states = look.execute(
                    "SELECT state FROM pg_stat_activity WHERE usename = current_user "
                    "AND pid <> pg_backend_pid()"
                ).fetchall()
            assert states == [("idle in transaction",)]
            after_a_later_one_is_suspended(pool, base, undo, "idle-later")
            for name in (*names.values(), never):
                assert branch.get(pool, name).state == "ready", name
            assert connected.execute("SELECT 2").fetchone() == (2,)
            assert open_transaction.execute("SELECT 3").fetchone() == (3,)
        finally:
            engine.trace_end(names["traced"])
        open_transaction.rollback()
    # once closed, the connected branch is idle again, and suspended
    suspended(pool, names["connected"])
    assert branch.get(pool, never).state == "ready"


def test_the_actions_suspend_after_input_reaches_the_registry(
    pool: Pool,
    base: BaseVersion,
    idle_service: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = payload("opened")
    data["pull_request"]["number"] = 31
    name = "hello-world-pr-31"
    for key, value in job_env(tmp_path, pool, data, comment="false", suspend_after="45m").items():
        monkeypatch.setenv(key, value)
    try:
        assert main.run(out=io.StringIO()) == 0
        assert branch.get(pool, name).suspend_after == 45 * 60
        summary = (tmp_path / "summary").read_text()
        assert "suspended after 45m with no connection: wakes on the next connection" in summary
    finally:
        branch.destroy(pool, name)
