"""Warm branches: claimed by `branch create` in one registry step, reachable by nobody before,
mended by gc after a crash at any claim step, retired when their base is refreshed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from helpers import assert_no_leaks, cli, server_pid, source_dsn, without_the_service
from pgoverlay.runner import branch, seed
from pgoverlay.runner.branch import access, creation, lookup, primed, warm
from pgoverlay.runner.branch.conf import server_options
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool, flocks, gc
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.runtime.choose import runtime_for
from pgoverlay.runner.seed import bases
from pgoverlay.runner.service.engine import LocalEngine

KILLED = -signal.SIGKILL


@pytest.fixture
def keep_warm(pool: Pool, base: BaseVersion) -> Iterator[None]:
    """Whatever a test keeps warm is retired when it ends, so other tests create cold. The
    test run's engine service may be topping a target up meanwhile: setting the count to 0
    waits for that top-up and retires what it started (``warm.set_target``); a target the test
    lowered itself is waited for the same way."""
    yield
    for target in pool.registry.warm_targets():
        assert not warm.set_target(pool, target.base_name, target.runtime, 0).busy
    assert not warm.replenish(pool, start=False, wait=120).busy
    left = warm.warm_branches(pool)
    assert left == [], f"warm branches left: {left}"


def _warm_up(pool: Pool, base: BaseVersion, runtime: str, count: int) -> list[Branch]:
    pool.registry.set_warm_target(base.name, runtime, count)
    done = warm.replenish(pool)
    assert done.problems == []
    found = wait_for(
        lambda: ready if len(ready := _ready(pool, base, runtime)) >= count else None,
        timeout=120,
        what=f"{count} warm branches",
    )
    return found


def _ready(pool: Pool, base: BaseVersion, runtime: str) -> list[Branch]:
    return [
        b
        for b in warm.warm_branches(pool)
        if (b.base_name, b.base_version, b.runtime) == (base.name, base.version, runtime)
    ]


def _login(pool: Pool, b: Branch, password: str) -> bool:
    """Whether a real client logs in to ``b`` over TCP with ``password``."""
    kwargs = branch.connection(pool, b).connect_kwargs()
    try:
        with psycopg.connect(**{**kwargs, "password": password}, connect_timeout=10) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as err:
        assert "password authentication failed" in str(err), err
        return False
    return True


def _rolpassword(pool: Pool, b: Branch, base: BaseVersion) -> str | None:
    with access.engine_connection(pool, b, base) as conn:
        row = conn.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = %s", (b.user,)
        ).fetchone()
    assert row is not None
    return None if row[0] is None else str(row[0])


def _comparable(pool: Pool, name: str) -> dict[str, str]:
    """A branch's imposed settings, less those that are its own by nature (port, paths)."""
    own = {"port", "cluster_name", "data_directory", "config_file", "hba_file", "ident_file"}
    own |= {"unix_socket_directories", "log_directory"}
    return {o.name: o.branch_value for o in lookup.overrides(pool, name) if o.name not in own}


@pytest.mark.usefixtures("keep_warm")
def test_a_claimed_warm_branch_is_a_branch_like_any_other_and_only_its_new_password_works(
    pool: Pool, base: BaseVersion, runtime: str
) -> None:
    (ready,) = _warm_up(pool, base, runtime, 1)
    assert ready.password == ""
    assert _rolpassword(pool, ready, base) is None  # no password: nobody can log in
    assert lookup.is_running(pool, ready)
    assert not _login(pool, ready, "x")
    assert not _login(pool, ready, "guess")
    assert "warm" not in {b.state for b in pool.registry.branches()}  # not listed as a branch

    claimed = branch.create(
        pool, "claimed", ttl_seconds=3600, repository="o/r", pr=7, base_name=base.name
    )
    cold = branch.create(pool, "cold-twin", base_name=base.name)  # the only warm one is taken
    try:
        assert claimed.slot == ready.name and claimed.port == ready.port
        assert cold.slot == "cold-twin"
        assert (claimed.state, claimed.base_version, claimed.runtime) == (
            "ready",
            base.version,
            runtime,
        )
        assert claimed.expires_at is not None and claimed.repository == "o/r" and claimed.pr == 7
        assert _login(pool, claimed, claimed.password)
        assert not _login(pool, claimed, cold.password)
        assert not _login(pool, claimed, "x")
        assert _comparable(pool, "claimed") == _comparable(pool, "cold-twin")
        with psycopg.connect(
            **branch.connection(pool, claimed).connect_kwargs(), autocommit=True
        ) as conn:
            conn.execute("CREATE TABLE claimed_only (id int)")
        assert branch.layer_size(pool, "claimed").physical_bytes > 0

        after = branch.reset(pool, "claimed")  # same port and password, the change gone
        assert after.slot == ready.name and after.password == claimed.password
        with psycopg.connect(**branch.connection(pool, after).connect_kwargs()) as conn:
            assert conn.execute("SELECT to_regclass('claimed_only')").fetchone() == (None,)
    finally:
        branch.destroy(pool, "claimed")
        branch.destroy(pool, "cold-twin")
    assert_no_leaks(pool, ready.name, port=ready.port)
    assert pool.registry.branch("claimed") is None


@pytest.mark.usefixtures("keep_warm")
def test_concurrent_creates_never_claim_the_same_warm_branch(
    pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    warmed = {b.name for b in _warm_up(pool, base, "local", 2)}
    names = [f"race-{i}" for i in range(5)]
    with ThreadPoolExecutor(len(names)) as workers:
        done = list(
            workers.map(
                lambda n: cli(["branch", "create", n, "--json", "--base", base.name], env=env),
                names,
            )
        )
    try:
        assert [d.returncode for d in done] == [0] * len(names), [d.stderr for d in done]
        made = [pool.registry.branch(n) for n in names]
        assert all(b is not None and b.state == "ready" for b in made)
        slots = [b.slot for b in made if b is not None]
        assert len(set(slots)) == len(names)
        assert {s for s in slots if s in warmed} == warmed  # both claimed, each once
        assert len(set(b.port for b in made if b is not None)) == len(names)
        for b in made:
            assert b is not None
            assert _login(pool, b, b.password)
            others = {o.password for o in made if o is not None and o.name != b.name}
            assert not any(_login(pool, b, p) for p in others)
    finally:
        for n in names:
            branch.destroy(pool, n)


@pytest.mark.usefixtures("keep_warm")
@pytest.mark.parametrize("step", ["bound", "password"])
def test_a_crash_between_claim_steps_is_mended_by_gc(
    pool: Pool, base: BaseVersion, env: dict[str, str], step: str
) -> None:
    (ready,) = _warm_up(pool, base, "local", 1)
    name = f"crash-claim-{step}"
    done = cli(
        ["branch", "create", name, "--base", base.name],
        env={**env, "PGOVERLAY_FAULT_POINT": f"claim:{step}"},
    )
    assert done.returncode == KILLED, done.stderr
    row = pool.registry.branch(name)
    assert row is not None and row.state == "claiming" and row.slot == ready.name
    assert pool.registry.branch(ready.name) is None  # the warm row is the claimed one now
    if step == "password":  # its password was set, and it is never handed out
        assert _rolpassword(pool, row, base) is not None

    report = gc.collect(pool)
    assert name in report.undone
    assert_no_leaks(pool, name)
    assert_no_leaks(pool, ready.name)  # its port may be the new warm branch's
    # the target is met again (by gc, or by the engine service when a test started one)
    (refilled,) = _warm_up(pool, base, "local", 1)
    again = branch.create(pool, name, runtime="local", base_name=base.name)
    try:
        assert again.slot == refilled.name and _login(pool, again, again.password)
    finally:
        branch.destroy(pool, name)


@pytest.mark.usefixtures("keep_warm")
@pytest.mark.parametrize("step", ["registered", "dirs", "mounted", "started"])
def test_a_crash_while_starting_a_warm_branch_is_undone_by_gc(
    pool: Pool, base: BaseVersion, env: dict[str, str], step: str
) -> None:
    """At each step of the saga a cold create goes through too (creation.py's ``Start``)."""
    with without_the_service(pool):  # until gc has undone the half-started one
        done = cli(
            ["base", "warm", base.name, "--count", "1"],
            env={**env, "PGOVERLAY_FAULT_POINT": f"warm:{step}"},
        )
        assert done.returncode == KILLED, done.stderr
        (half,) = [b for b in pool.registry.branches(warm=True) if b.state == "creating"]
        assert half.name.startswith("warm-")
        report = gc.collect(pool)
        assert half.name in report.undone
        assert_no_leaks(pool, half.name)
    _warm_up(pool, base, "local", 1)  # started again, by gc or the engine service


@pytest.mark.usefixtures("keep_warm")
def test_a_refreshed_base_retires_the_old_versions_warm_branches(
    pool: Pool, source: cluster.Running
) -> None:
    first = seed.seed(pool, "warmed", source_dsn=source_dsn(source))
    (old,) = _warm_up(pool, first, "local", 1)
    second = seed.seed(pool, "warmed", source_dsn=source_dsn(source), refresh=True)
    try:
        # gc retires it (or the engine service does, when a test started one), then removes
        # the version nothing uses any more
        removed = gc.collect(pool).bases_removed
        wait_for(
            lambda: pool.registry.branch(old.name) is None or None,
            timeout=120,
            what="the old version's warm branch to be retired",
        )
        removed += gc.collect(pool).bases_removed
        assert "warmed v1 (superseded)" in removed
        assert_no_leaks(pool, old.name)
        (new,) = _warm_up(pool, second, "local", 1)
        claimed = branch.create(pool, "on-refreshed", base_name="warmed", runtime="local")
        assert claimed.slot == new.name and claimed.base_version == second.version
        branch.destroy(pool, "on-refreshed")
        _warm_up(pool, second, "local", 1)
    finally:
        gone = bases.remove(pool, "warmed")  # warm branches go with it, unlisted
    assert gone.branches == []
    assert warm.warm_branches(pool) == []
    assert [t for t in pool.registry.warm_targets() if t.base_name == "warmed"] == []


@pytest.mark.usefixtures("keep_warm")
def test_seed_list_and_doctor_show_each_warm_branchs_memory(
    pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    done = cli(["base", "warm", base.name, "--count", "2"], env=env)
    assert done.returncode == 0, done.stderr
    assert f"base {base.name} on local: 2/2 (" in done.stdout

    listed = cli(["base", "list", "--json"], env=env)
    assert listed.returncode == 0, listed.stderr
    (row,) = [b for b in json.loads(listed.stdout) if b["name"] == base.name]
    (state,) = row["warm"]
    assert (state["runtime"], state["target"], state["ready"]) == ("local", 2, 2)
    # an idle server: more than its binary's share, far less than its shared_buffers
    assert 1024**2 < state["memory_bytes_each"] < 128 * 1024**2
    assert row["branches"] == 0  # warm branches are nobody's yet
    # What the engine service answers a workflow's user (`base list` as anyone but root).
    views = LocalEngine(pool, uid=1000).bases()
    (view,) = [b for b in views if (b.name, b.version) == (base.name, base.version)]
    (served,) = view.warm
    assert (served.runtime, served.target, served.ready) == ("local", 2, 2)
    assert served.memory_bytes_each and 1024**2 < served.memory_bytes_each < 128 * 1024**2

    doctor = cli(["doctor"], env=env)
    assert "2 of 2 warm branches ready on local, " in doctor.stdout, doctor.stdout
    assert "MiB each" in doctor.stdout

    bad = cli(["base", "warm", base.name], env=env)
    assert bad.returncode != 0 and "--count N" in bad.stderr


@pytest.mark.usefixtures("keep_warm")
def test_the_engine_service_keeps_the_target_met(
    pool: Pool, base: BaseVersion, service: object
) -> None:
    pool.registry.set_warm_target(base.name, "local", 1)
    first = wait_for(
        lambda: ready[0] if (ready := _ready(pool, base, "local")) else None,
        timeout=120,
        what="the service to start a warm branch",
    )
    branch.create(pool, "served", runtime="local", base_name=base.name)
    try:
        second = wait_for(
            lambda: ready[0] if (ready := _ready(pool, base, "local")) else None,
            timeout=120,
            what="the service to replace the claimed warm branch",
        )
        assert second.name != first.name
    finally:
        branch.destroy(pool, "served")
        # Every warm branch, not only the ready ones: one the service was still starting when
        # the target fell to 0 is retired once it is up, before set_target returns.
        assert not warm.set_target(pool, base.name, "local", 0).busy
        assert warm.warm_branches(pool) == []


@pytest.mark.usefixtures("keep_warm")
def test_a_count_of_0_set_during_a_top_up_waits_for_it_and_leaves_no_warm_branch(
    pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    """A top-up in another thread stands for the engine service's: `base warm NAME --count 0`
    (a process) returns only when that top-up has ended, and nothing it started is left."""

    def top_up() -> warm.Replenished:
        with contextlib.closing(Pool.open(pool.settings)) as own:  # a registry per thread
            return warm.replenish(own, wait=120)

    pool.registry.set_warm_target(base.name, "local", 4)
    with ThreadPoolExecutor(1) as worker:
        topping = worker.submit(top_up)
        wait_for(
            lambda: warm.warm_branches(pool) or None,
            timeout=120,
            what="the top-up to start its first warm branch",
        )
        done = cli(["base", "warm", base.name, "--count", "0"], env=env)
        left = warm.warm_branches(pool)
        ended = topping.done()
        topping.result(timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"base {base.name} on local: no warm branches kept" in done.stdout, done.stdout
    assert ended and left == []


@pytest.mark.usefixtures("keep_warm")
def test_a_top_up_reads_the_count_again_before_each_branch_it_starts(
    pool: Pool, base: BaseVersion, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count is lowered to 0 right after the top-up's first start (as `base warm NAME
    --count 0` would meanwhile): it starts no second one."""
    started: list[str] = []
    start_warm = creation.start_warm

    def start_then_lower(p: Pool, b: BaseVersion, runtime: str) -> Branch:
        made = start_warm(p, b, runtime)
        started.append(made.name)
        pool.registry.set_warm_target(base.name, "local", 0)
        return made

    monkeypatch.setattr(creation, "start_warm", start_then_lower)
    with without_the_service(pool):  # this top-up, not the service's, is the one to watch
        pool.registry.set_warm_target(base.name, "local", 3)
        done = warm.replenish(pool, wait=120)
        assert len(started) == 1 and done.started == started
        assert warm.replenish(pool, start=False).retired == [
            f"{started[0]} (no warm branches of {base.name} are wanted on local)"
        ]


@contextmanager
def _warm_here(pool: Pool, base: BaseVersion) -> Iterator[Branch]:
    """One warm branch started by this process, with no engine service starting or retiring
    any meanwhile (it would find the warm branches' lock taken)."""
    with flocks.locked(pool.lock_path("warm", "replenish"), timeout=120, what="warm branches"):
        pool.registry.set_warm_target(base.name, "local", 1)
        assert warm.warm_branches(pool) == []
        yield creation.start_warm(pool, base, "local")


def _held_key(pool: Pool, b: Branch) -> str:
    return os.fspath(branch.layout(pool, b.key).socket_dir)


@pytest.mark.usefixtures("keep_warm")
def test_a_claim_sets_the_password_on_the_connection_held_since_the_branch_became_warm(
    pool: Pool, base: BaseVersion, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _warm_here(pool, base) as ready:
        assert _held_key(pool, ready) in primed._sessions

        def refuse(*args: object, **kwargs: object) -> None:
            raise AssertionError("the claim opened a connection of its own")

        monkeypatch.setattr(access, "engine_connection", refuse)
        claimed = branch.create(pool, "held-claim", runtime="local", base_name=base.name)
        monkeypatch.undo()
    try:
        assert claimed.slot == ready.name
        assert _login(pool, claimed, claimed.password)
        assert _held_key(pool, claimed) not in primed._sessions  # closed, not held for the user
    finally:
        branch.destroy(pool, "held-claim")


@pytest.mark.usefixtures("keep_warm")
def test_a_claim_whose_held_connection_was_ended_connects_again(
    pool: Pool, base: BaseVersion
) -> None:
    with _warm_here(pool, base) as ready:
        held_pids = _other_backends(pool, ready, base)
        assert len(held_pids) == 1  # the one held connection
        with access.engine_connection(pool, ready, base) as conn:
            assert conn.execute("SELECT pg_terminate_backend(%s)", held_pids).fetchone() == (True,)
        claimed = branch.create(pool, "reheld-claim", runtime="local", base_name=base.name)
    try:
        assert claimed.slot == ready.name  # claimed warm, not created cold after a failure
        assert _login(pool, claimed, claimed.password)
    finally:
        branch.destroy(pool, "reheld-claim")


@pytest.mark.usefixtures("keep_warm")
def test_retiring_a_warm_branch_closes_its_held_connection(pool: Pool, base: BaseVersion) -> None:
    with _warm_here(pool, base) as ready:
        kept = primed._sessions[_held_key(pool, ready)]
        assert warm.retire(pool, ready)
    assert kept.closed
    assert _held_key(pool, ready) not in primed._sessions


def _other_backends(pool: Pool, b: Branch, base: BaseVersion) -> list[int]:
    """The pids of branch ``b``'s client backends but the engine connection asking (so: the
    one a warm branch's starter holds, when it holds one)."""
    with access.engine_connection(pool, b, base) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchall()
    return [pid for (pid,) in rows]


def _server_processes(pool: Pool, b: Branch) -> tuple[int, list[int]]:
    """Branch ``b``'s postmaster and its children."""
    pm = server_pid(pool, b.name)
    children = Path(f"/proc/{pm}/task/{pm}/children").read_text().split()
    return pm, [int(pid) for pid in children]


@pytest.mark.usefixtures("keep_warm")
def test_a_claimed_branch_whose_server_died_before_the_wal_flush_comes_back_with_its_password(
    pool: Pool, base: BaseVersion
) -> None:
    with _warm_here(pool, base) as ready:
        (held_pid,) = _other_backends(pool, ready, base)
        pm, children = _server_processes(pool, ready)
        # Nothing but the held session runs: no WAL writer, checkpointer, background writer or
        # autovacuum flushes the WAL after the claim's commit, which stays in shared memory.
        frozen = [pm, *(pid for pid in children if pid != held_pid)]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            claimed = branch.create(pool, "unflushed", runtime="local", base_name=base.name)
        finally:
            for pid in [pm, *children]:
                os.kill(pid, signal.SIGKILL)
    try:
        assert claimed.slot == ready.name
        lay = branch.layout(pool, claimed.key)
        wait_for(lambda: not lookup.is_running(pool, claimed) or None, timeout=60, what="the kill")
        # Started as it is, the server comes back without the claim: nobody can log in.
        rt = runtime_for(pool, base, "local")
        rt.start(lay, options=server_options(pool, lay, claimed))
        assert _rolpassword(pool, claimed, base) is None
        assert not _login(pool, claimed, claimed.password)
        rt.stop(lay)
        # gc's restart, which brings back every ready branch, sets the password again.
        assert "unflushed" in gc.collect(pool).restarted
        assert _login(pool, claimed, claimed.password)
    finally:
        branch.destroy(pool, "unflushed")
