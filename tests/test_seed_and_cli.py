"""Seeding and the command line: real sources, and every user error with its own exit code."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import sys
from pathlib import Path
from typing import Literal

import psycopg
import pytest

from helpers import Undo, cli, free_tcp_port, postgres_processes_for, source_dsn
from pgoverlay.errors import (
    ConfigError,
    NotRootError,
    PortsExhaustedError,
    SeedBusyError,
    SeedError,
    ServiceError,
    SourceUnreachableError,
    VersionMismatchError,
)
from pgoverlay.runner import branch, proc, seed
from pgoverlay.runner.pool import Pool, flocks, gc, mounts
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.seed import prepare

MiB = 1024 * 1024


def test_seeded_base_is_prepared_with_the_pools_wal_segment_size_and_metadata(
    pool: Pool, base: BaseVersion
) -> None:
    store = pool.base_dir(base.name, base.version)
    install = pgbin.for_major(15)
    assert prepare.cluster_state(install, store, owner=pool.owner) == "shut down"
    segments = [p for p in (store / "pg_wal").iterdir() if p.is_file() and len(p.name) == 24]
    assert segments and all(
        p.stat().st_size == pool.settings.wal_segsize_mb * MiB for p in segments
    )
    assert not (store / "backup_label").exists()
    assert (base.pg_major, base.database, base.superuser) == (15, "app", "postgres")
    assert base.start_lsn and "/" in base.start_lsn
    assert base.size_bytes > 10 * 1024 * 1024
    assert stat.S_IMODE((pool.root / "store").stat().st_mode) == 0o700


def test_seed_list_shows_versions_and_branch_counts(
    pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    done = cli(["base", "list", "--json"], env=env)
    assert done.returncode == 0, done.stderr
    listed = {(b["name"], b["version"]): b for b in json.loads(done.stdout)}
    assert listed[("app", base.version)]["state"] == "ready"
    assert listed[("app", base.version)]["source"].endswith(":5432")


def test_refresh_makes_a_new_version_and_gc_removes_the_unreferenced_old_one(
    pool: Pool, source: cluster.Running, undo: Undo
) -> None:
    undo.branch("on-old-version")
    undo.base("refreshing")
    first = seed.seed(pool, "refreshing", source_dsn=source_dsn(source))
    with pytest.raises(SeedError, match="--refresh"):
        seed.seed(pool, "refreshing", source_dsn=source_dsn(source))
    kept = branch.create(pool, "on-old-version", base_name="refreshing")
    second = seed.seed(pool, "refreshing", source_dsn=source_dsn(source), refresh=True)
    assert second.version == first.version + 1
    assert gc.collect(pool).bases_removed == []  # still referenced by a branch
    assert branch.status(pool, "on-old-version").branch.base_version == first.version
    with psycopg.connect(**branch.connection(pool, kept).connect_kwargs()) as conn:
        assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (200000,)
    branch.destroy(pool, "on-old-version")
    assert gc.collect(pool).bases_removed == [f"refreshing v{first.version} (superseded)"]
    assert not pool.store_dir("refreshing", first.version).exists()
    assert not pool.base_dir("refreshing", first.version).exists()
    seed.remove_version(pool, "refreshing", second.version)


def test_seed_via_dump_gives_the_same_data(pool: Pool, source: cluster.Running, undo: Undo) -> None:
    undo.branch("from-dump")
    dumped = seed.seed(pool, "dumped", source_dsn=source_dsn(source), via="dump")
    try:
        assert dumped.via == "dump"
        b = branch.create(pool, "from-dump", base_name="dumped")
        with psycopg.connect(**branch.connection(pool, b).connect_kwargs()) as conn:
            assert conn.execute("SELECT count(*), sum(balance) FROM accounts").fetchone() == (
                200000,
                200000 * 200001 // 2 * 10,
            )
        branch.destroy(pool, "from-dump")
    finally:
        seed.remove_version(pool, "dumped", dumped.version)


def test_source_refusing_replication_says_to_use_dump(pool: Pool, source: cluster.Running) -> None:
    with pytest.raises(SourceUnreachableError, match="--via dump"):
        seed.seed(pool, "norepl", source_dsn=source_dsn(source, user="norepl"))
    assert pool.registry.bases("norepl") == []
    assert list((pool.root / "staging").iterdir()) == []


def test_unreachable_source_is_a_clear_error(pool: Pool, env: dict[str, str]) -> None:
    done = cli(
        ["base", "seed", "nowhere", "--from", "host=127.0.0.1 port=1 user=x"],
        env={**env, "PGPASSWORD": "hunter2secret"},
    )
    assert done.returncode == SourceUnreachableError.exit_code
    assert "cannot reach the source 127.0.0.1:1" in done.stderr
    assert "hunter2secret" not in done.stderr + done.stdout


def test_a_second_seed_of_the_same_name_is_refused_while_one_runs(
    pool: Pool, source: cluster.Running
) -> None:
    with (
        flocks.locked(pool.lock_path("seed", "busy"), timeout=0, what="test"),
        pytest.raises(SeedBusyError, match="busy"),
    ):
        seed.seed(pool, "busy", source_dsn=source_dsn(source))


# Each step of the seed saga (runner/seed/__init__.py), what the killed seed leaves there.
SEED_STEPS = {
    "registered": "row",  # the `seeding` row only
    "restored": "staging+server",  # a restored dump in staging/, its server's scratch directory
    "copied": "staging",  # a base backup in staging/ (backup_label still in it)
    "prepared": "staging",  # prepared (no backup_label), still in staging/
    "stored": "store",  # moved into store/, not yet mounted
    "mounted": "store+mount",  # store/ bound read-only at bases/NAME/1, row not yet ready
}


@pytest.mark.parametrize("step", list(SEED_STEPS))
def test_kill_at_each_seed_step_then_gc_removes_the_version_and_a_reseed_works(
    pool: Pool, source: cluster.Running, env: dict[str, str], step: str
) -> None:
    name = f"killed-{step}"
    via: Literal["dump", "basebackup"] = "dump" if step == "restored" else "basebackup"
    dsn = source_dsn(source)
    gc.collect(pool)  # what other tests left, so the report below is this seed's alone
    before = set(pool.tmp.glob("pgo-*-*"))
    done = cli(
        ["base", "seed", name, "--from", dsn, "--via", via],
        env={**env, "PGOVERLAY_FAULT_POINT": f"seed:{step}"},
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    [row] = pool.registry.bases(name)
    assert (row.version, row.state) == (1, "seeding")
    staging, store, target = (
        pool.staging_dir(name, 1),
        pool.store_dir(name, 1),
        pool.base_dir(name, 1),
    )
    left = SEED_STEPS[step]
    assert staging.is_dir() == left.startswith("staging")
    assert (staging / "backup_label").exists() == (step == "copied")
    assert store.is_dir() == left.startswith("store")
    assert mounts.is_mounted(target) == (left == "store+mount")
    scratch = sorted(set(pool.tmp.glob("pgo-*-*")) - before)  # the killed process's
    assert len(scratch) == (1 if left == "staging+server" else 0), scratch

    report = gc.collect(pool)
    assert report.bases_removed == [f"{name} v1 (interrupted seed)"], report
    assert report.problems == [], report
    assert report.orphans == [f"scratch {p.name}" for p in scratch], report
    assert pool.registry.bases(name) == []
    assert not staging.exists() and not store.exists() and not target.exists()
    assert not mounts.is_mounted(target)
    assert postgres_processes_for(staging) == [] and postgres_processes_for(store) == []
    assert not any(p.exists() for p in scratch)

    again = seed.seed(pool, name, source_dsn=dsn, via=via)
    try:
        assert (again.version, again.state) == (1, "ready")
        made = branch.create(pool, f"{name}-branch", base_name=name)
        try:
            with psycopg.connect(**branch.connection(pool, made).connect_kwargs()) as conn:
                assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (200000,)
        finally:
            branch.destroy(pool, made.name)
    finally:
        seed.remove_version(pool, name, again.version)


def test_create_with_binaries_of_another_major_is_refused(
    pool: Pool, base: BaseVersion, tmp_path: Path, env: dict[str, str]
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "postgres").write_text("#!/bin/sh\necho 'postgres (PostgreSQL) 16.4'\n")
    (fake / "postgres").chmod(0o755)
    done = cli(
        ["branch", "create", "mismatch", "--base", base.name],
        env={**env, "PGOVERLAY_PG_BINDIR": os.fspath(fake)},
    )
    assert done.returncode == VersionMismatchError.exit_code, done.stderr
    assert "needs Postgres 15" in done.stderr and "postgresql-15" in done.stderr
    assert pool.registry.branch("mismatch") is None


def test_user_errors_have_distinct_exit_codes_and_one_line(
    pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    cases = [
        (["branch", "create", "Bad_Name"], 15, "invalid branch name"),
        (["branch", "create", "x", "--base", "missing"], 13, "no base named 'missing'"),
        (
            ["branch", "create", "x", "--ttl", "forever"],
            ConfigError.exit_code,
            "cannot read duration",
        ),
        (["branch", "status", "nope"], 17, "no branch named nope"),
    ]
    for args, code, text in cases:
        done = cli(args, env=env)
        assert done.returncode == code, (args, done.stderr)
        assert text in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def _as_nobody(env: dict[str, str], argv: list[str]) -> tuple[int, str]:
    """Run the CLI in a forked child that dropped to `nobody` with everything already imported
    (the interpreter itself may live where `nobody` cannot read); its exit code and stderr."""
    import pwd

    from pgoverlay import cli as cli_module
    from pgoverlay.runner import branch as _branch  # noqa: F401  (imported before dropping root)
    from pgoverlay.runner import pool as _pool  # noqa: F401
    from pgoverlay.runner.service import client as _client  # noqa: F401

    cli_module.build_parser([])  # imports every command group's module (a command imports its own)
    nobody = pwd.getpwnam("nobody")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(read_end)
            os.dup2(write_end, 2)
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            os.environ.update(env)
            code = cli_module.main(argv)
            sys.stderr.flush()
        except BaseException:
            code = 99
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as stream:
        stderr = stream.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), stderr


def test_not_root_is_refused_with_how_to_fix(env: dict[str, str], service: Path) -> None:
    # An admin's command needs root ...
    code, stderr = _as_nobody(env, ["pool", "status"])
    assert code == NotRootError.exit_code, stderr
    assert "root" in stderr
    # ... and a workflow's command asks the engine service, which runs: `nobody` is not in its
    # group, and the message says how to add it.
    code, stderr = _as_nobody(env, ["branch", "list"])
    assert code == ServiceError.exit_code, stderr
    assert "usermod -aG pgoverlay" in stderr, stderr


def test_exhausted_port_range_is_a_clear_error(
    pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    first = branch.create(pool, "port-holder", base_name=base.name)
    try:
        narrow = {
            **env,
            "PGOVERLAY_PORT_MIN": str(first.port),
            "PGOVERLAY_PORT_MAX": str(first.port),
        }
        done = cli(["branch", "create", "no-port", "--base", base.name], env=narrow)
        assert done.returncode == PortsExhaustedError.exit_code, done.stderr
        assert "PGOVERLAY_PORT_MAX" in done.stderr
        assert pool.registry.branch("no-port") is None
    finally:
        branch.destroy(pool, "port-holder")


def test_connect_prints_a_working_dsn_and_status_never_shows_the_password(
    pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    b = branch.create(pool, "cli-view", base_name=base.name)
    try:
        dsn = cli(["branch", "connect", "cli-view"], env=env).stdout.strip()
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (b.user,)
        for args in (
            ["branch", "status", "cli-view", "--json"],
            ["branch", "list", "--json"],
            ["branch", "list"],
            ["branch", "size", "cli-view"],
        ):
            done = cli(args, env=env)
            assert done.returncode == 0, done.stderr
            assert b.password not in done.stdout + done.stderr
        status = json.loads(cli(["branch", "status", "cli-view", "--json"], env=env).stdout)
        assert status["running"] is True
        # A new branch owns only what its server wrote (pid file, control file, relation cache,
        # a WAL block): what it copied up from the base shares the base's blocks.
        block = os.statvfs(pool.root).f_bsize
        assert block <= status["layer_physical_bytes"] < MiB, status
        assert status["layer_physical_bytes"] < status["layer_logical_bytes"], status
    finally:
        branch.destroy(pool, "cli-view")


def test_doctor_passes_on_this_runner(pool: Pool, env: dict[str, str]) -> None:
    done = cli(["doctor", "--json"], env=env)
    found = {c["name"]: c for c in json.loads(done.stdout)}
    checks = {name: c["verdict"] for name, c in found.items()}
    assert checks["root"] == "ok" and checks["reflink"] == "ok" and checks["overlayfs"] == "ok"
    assert done.returncode == 0
    # One place chooses the runtime and the psql, and doctor prints its reasons.
    assert found["runtime"]["detail"] == "local (PGOVERLAY_RUNTIME=local)"
    assert checks["psql"] == "ok" and "this host's psql" in found["psql"]["detail"]


def test_pool_init_is_idempotent(pool: Pool, env: dict[str, str]) -> None:
    for _ in range(2):
        done = cli(["pool", "init"], env=env)
        assert done.returncode == 0, done.stderr
        assert "image mode on xfs" in done.stdout


def _readme_demo_output() -> str:
    """The README's example of the demo's output: the code block after its description."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    after = text[text.index("The demo prepares the pool") :]
    return after.split("```\n", 2)[1]


def _top_lines(output: str) -> list[str]:
    """The first word of each line the demo prints at the left margin (base, branch, writable,
    connect, front, way, destroy): what a reader of the README expects, in order."""
    return [line.split()[0] for line in output.splitlines() if line[:1].strip()]


def test_demo_seeds_a_sample_base_branches_it_and_applies_the_examples(
    pool: Pool, env: dict[str, str], service: Path
) -> None:
    from pgoverlay.runner.door import control as door

    ports = {"PGOVERLAY_DOOR_PORT": free_tcp_port(), "PGOVERLAY_DOOR_HTTPS_PORT": free_tcp_port()}
    env = {**env, **{name: str(port) for name, port in ports.items()}}
    done = cli(["demo", "--scale", "1", "--branch", "demo-run"], env=env, timeout=600)
    try:
        assert done.returncode == 0, done.stderr
        assert "migration migrations/001_loyalty_points.sql: applied" in done.stdout
        assert "migration migrations/002_order_status_index.sql: applied" in done.stdout
        assert "pgoverlay branch destroy demo-run" in done.stdout
        # The way in: a preview app's credential through the front door, over verified TLS,
        # and a reviewer's: the base is masked by the demo's rules, so a person may have one.
        assert "over TLS (verify-full)" in done.stdout
        assert "masked by masking-rules.yml" in done.stdout
        customers = re.search(
            r"reviewer a read-only credential for GitHub user demo-reviewer connected the same "
            r"way and read ([\d,]+) customers, ([\d,]+) of their emails made up",
            done.stdout,
        )
        assert customers is not None, done.stdout
        assert customers[1] == customers[2] and customers[1] != "0"
        assert "access grant demo-run --github-login YOUR-LOGIN --read-only" in done.stdout
        assert "sudo" not in done.stdout and "PGOVERLAY_ACCESS_UNMASKED" not in done.stdout
        assert pool.registry.latest_base("demo").masked  # type: ignore[union-attr]
        # The README's example is a real run's: the same lines, in the same order.
        assert _top_lines(done.stdout) == _top_lines(_readme_demo_output())
        b = branch.get(pool, "demo-run")
        assert b.password not in done.stdout + done.stderr
        with psycopg.connect(**branch.connection(pool, b).connect_kwargs()) as conn:
            assert conn.execute("SELECT count(*) > 0 FROM open_orders").fetchone() == (True,)
            assert conn.execute("SELECT max(loyalty_points) > 0 FROM customers").fetchone() == (
                True,
            )
        again = cli(["demo", "--scale", "1", "--branch", "demo-run"], env=env, timeout=600)
        assert again.returncode == 0, again.stderr
        assert "seed demo base" not in again.stdout, "a second demo reuses the base"
    finally:
        assert door.stop(pool.settings, wait=30), "the demo left its front door running"
        branch.destroy(pool, "demo-run")
        for version in pool.registry.bases("demo"):
            seed.remove_version(pool, "demo", version.version)
    assert not list(pool.tmp.glob("demo-source-*"))


def test_a_source_preloading_a_library_this_runner_lacks_is_refused_before_copying(
    pool: Pool, source: cluster.Running
) -> None:
    with psycopg.connect(**source.conninfo(user="postgres"), autocommit=True) as conn:
        # Configured, not yet applied by a restart: still in the files a base would copy.
        conn.execute(
            "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements', 'no_such_lib'"
        )
        try:
            with pytest.raises(SeedError, match="preloads library 'no_such_lib'") as caught:
                seed.seed(pool, "preloads", source_dsn=source_dsn(source))
            assert "postgresql-15-no-such-lib" in str(caught.value)
        finally:
            conn.execute("ALTER SYSTEM RESET shared_preload_libraries")
    assert pool.registry.bases("preloads") == []
    assert list((pool.root / "staging").iterdir()) == []


def test_status_config_lists_what_pgoverlay_imposes_over_the_bases_settings(
    pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    branch.create(pool, "configured", base_name=base.name)
    try:
        done = cli(["branch", "status", "configured", "--config", "--json"], env=env)
        assert done.returncode == 0, done.stderr
        changed = {o["name"]: o for o in json.loads(done.stdout)}
        # initdb wrote these into the base's postgresql.conf; the branch runs smaller.
        assert changed["shared_buffers"]["branch_value"] == "32MB"
        assert changed["shared_buffers"]["base_value"] == "128MB"
        assert changed["max_connections"]["base_value"] == "100"
        assert changed["recovery_init_sync_method"]["branch_value"] == "syncfs"
        assert "archive_mode" not in changed, "off is the default: nothing to report"
    finally:
        branch.destroy(pool, "configured")


def test_a_source_using_an_extension_this_runner_lacks_is_refused_with_its_name(
    pool: Pool, source: cluster.Running
) -> None:
    install = pgbin.for_major(15)
    sharedir = Path(proc.run([install.tool("pg_config"), "--sharedir"], timeout=30).stdout.strip())
    control = sharedir / "extension" / "pgo_gone_probe.control"
    script = sharedir / "extension" / "pgo_gone_probe--1.0.sql"
    control.write_text("default_version = '1.0'\nrelocatable = true\n")
    script.write_text("CREATE FUNCTION pgo_gone_probe() RETURNS int LANGUAGE sql AS 'SELECT 1';\n")
    try:
        with psycopg.connect(
            **source.conninfo(user="postgres", dbname="app"), autocommit=True
        ) as c:
            c.execute("CREATE EXTENSION pgo_gone_probe")
        control.unlink()  # the source has it; this runner no longer does
        with pytest.raises(SeedError, match="uses extension 'pgo_gone_probe'") as caught:
            seed.seed(pool, "gone-ext", source_dsn=source_dsn(source))
        assert "postgresql-15-pgo-gone-probe" in str(caught.value)
        assert pool.registry.bases("gone-ext") == []
        assert list((pool.root / "staging").iterdir()) == []
    finally:
        control.write_text("default_version = '1.0'\nrelocatable = true\n")
        with psycopg.connect(
            **source.conninfo(user="postgres", dbname="app"), autocommit=True
        ) as c:
            c.execute("DROP EXTENSION IF EXISTS pgo_gone_probe")
        control.unlink(missing_ok=True)
        script.unlink(missing_ok=True)


def test_a_base_including_files_only_production_has_still_starts_branches(
    pool: Pool, source: cluster.Running
) -> None:
    conf = source.datadir / "postgresql.conf"
    original = conf.read_text()
    conf.write_text(
        original
        + "include '/nonexistent/pgoverlay-test/production.conf'\n"
        + "include_dir = 'conf.d.missing'  # relative: inside the data directory, but absent\n"
    )
    try:
        included = seed.seed(pool, "includes", source_dsn=source_dsn(source))
    finally:
        conf.write_text(original)
    try:
        text = (pool.store_dir("includes", included.version) / "postgresql.conf").read_text()
        assert "# pgoverlay: not part of the base: include '/nonexistent/" in text
        assert "# pgoverlay: not part of the base: include_dir = 'conf.d.missing'" in text
        b = branch.create(pool, "included", base_name="includes")
        with psycopg.connect(**branch.connection(pool, b).connect_kwargs()) as conn:
            assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (200000,)
        branch.destroy(pool, "included")
    finally:
        seed.remove_version(pool, "includes", included.version)
