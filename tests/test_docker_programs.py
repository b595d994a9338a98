"""Postgres programs from the image: seeding and migrations need no Postgres on the host."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import assert_no_leaks, require_docker_image, source_dsn
from pgoverlay.errors import VersionMismatchError
from pgoverlay.runner import branch, seed
from pgoverlay.runner.pool import Pool, flocks, gc
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.runtime import docker as docker_runtime


@pytest.fixture
def no_host_binaries(pool: Pool, base: BaseVersion, tmp_path: Path) -> Iterator[Path]:
    """Point pgoverlay at an empty bin directory: any use of the host's Postgres fails."""
    require_docker_image(base.pg_major or 0)
    empty = tmp_path / "no-postgres-here"
    empty.mkdir()
    previous = pool.settings.pg_bindir
    pool.settings.pg_bindir = empty
    try:
        yield empty
    finally:
        pool.settings.pg_bindir = previous


def program_containers(pool: Pool) -> list[Any]:
    client = docker_runtime.connect(None)
    try:
        containers, _ = docker_runtime.labelled(client, pool.id)
    finally:
        client.close()
    return [c for c in containers if c.labels.get(docker_runtime.LABEL_KIND) != "branch"]


@pytest.mark.parametrize("via", ["basebackup", "dump"])
def test_a_docker_seed_needs_no_postgres_on_the_host_and_branches_serve_it(
    pool: Pool, source: cluster.Running, no_host_binaries: Path, via: str
) -> None:
    name = f"dock-seed-{via}"
    with pytest.raises(VersionMismatchError):
        pgbin.for_major(15, no_host_binaries)  # the host's binaries are out of reach
    made = seed.seed(pool, name, source_dsn=source_dsn(source), runtime="docker", via=via)  # type: ignore[arg-type]
    try:
        assert made.state == "ready" and made.pg_major == 15
        assert program_containers(pool) == [], "a program's container was left behind"
        b = branch.create(pool, f"{name}-b", base_name=name, runtime="docker")
        with psycopg.connect(**branch.connection(pool, b).connect_kwargs()) as conn:
            assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (200000,)
        branch.destroy(pool, b.name)
        assert_no_leaks(pool, b.name, port=b.port)
    finally:
        for version in pool.registry.bases(name):
            seed.remove_version(pool, name, version.version)


def test_gc_removes_a_killed_seeds_containers_but_not_a_running_seeds(
    pool: Pool, base: BaseVersion
) -> None:
    require_docker_image(base.pg_major or 0)
    client = docker_runtime.connect(None)
    image = pool.settings.image_for(base.pg_major or 0)
    labels = {docker_runtime.LABEL_POOL: pool.id, docker_runtime.LABEL_KIND: "tool"}
    orphan = client.containers.run(
        image,
        entrypoint=["sleep", "300"],
        labels={**labels, docker_runtime.LABEL_BASE: "gone"},
        detach=True,
        network_mode="none",
    )
    live = client.containers.run(
        image,
        entrypoint=["sleep", "300"],
        labels={**labels, docker_runtime.LABEL_BASE: "busy"},
        detach=True,
        network_mode="none",
    )
    try:
        with flocks.locked(pool.lock_path("seed", "busy"), timeout=0, what="a seed"):
            report = gc.collect(pool)
        assert f"container {orphan.name}" in report.orphans
        assert f"container {live.name}" not in report.orphans
        live.reload()
        assert live.status == "running"
    finally:
        for c in (orphan, live):
            with contextlib.suppress(Exception):  # already gone
                c.remove(force=True)
        client.close()


def test_migrations_of_a_docker_branch_need_a_psql_on_the_host_and_say_so(
    pool: Pool, base: BaseVersion, no_host_binaries: Path, tmp_path: Path
) -> None:
    """The PR's SQL runs as the job's own user, who has no Docker: a Docker branch is made by
    the engine, but its migrations run the host's psql, and without one the report says what
    to install."""
    from pgoverlay.action import event
    from pgoverlay.action.request import Inputs
    from pgoverlay.action.workflow import handle
    from pgoverlay.runner.service.engine import LocalEngine

    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "001_widgets.sql").write_text("CREATE TABLE widgets (id int);\n")
    inputs = Inputs(
        base=base.name, migrations="db", migrations_select="all", comment=False, runtime="docker"
    )
    ev = event.Event(
        kind="open",
        repository="acme/shop",
        pr=41,
        head_sha="a" * 40,
        base_sha="b" * 40,
        merged=None,
        from_fork=False,
        draft=False,
        ref_name="feature",
        action="opened",
    )
    try:
        outcome = handle(
            LocalEngine(pool), ev, inputs, settings=pool.settings, repo_dir=tmp_path, github=None
        )
        assert outcome.report is not None and outcome.report.status == "failed", outcome.report
        assert "no psql for the migrations" in outcome.report.message
        assert "install postgresql-15" in outcome.report.message
        made = branch.get(pool, "shop-pr-41")
        assert made.runtime == "docker"
        assert program_containers(pool) == [], "no program container is started for psql"
    finally:
        branch.destroy(pool, "shop-pr-41")


def test_a_silent_program_past_its_deadline_is_killed_and_removed(
    pool: Pool, base: BaseVersion
) -> None:
    from pgoverlay.errors import TimeoutExpiredError
    from pgoverlay.runner.runtime.docker_tools import DockerTools

    require_docker_image(base.pg_major or 0)
    tools = DockerTools.for_image(
        docker_runtime.connect(None),
        pool.settings.image_for(base.pg_major or 0),
        owner=pool.owner,
        scratch=pool.tmp,
        mounts=[],
        timeout=60,
        labels={docker_runtime.LABEL_POOL: pool.id},
    )
    with pytest.raises(TimeoutExpiredError, match="sleep did not finish within 2 s"):
        tools.run_streaming("sleep", ["300"], timeout=2, on_line=lambda _line: None)
    assert program_containers(pool) == []
