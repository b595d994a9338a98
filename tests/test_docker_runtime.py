"""What only the Docker runtime has: containers, volumes, images and their labels."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from helpers import Undo, assert_no_leaks, cli, docker_objects_for, require_docker_image
from pgoverlay.errors import DockerError, VersionMismatchError
from pgoverlay.runner import branch, doctor
from pgoverlay.runner.pool import Pool, gc
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.runtime import docker as docker_runtime
from pgoverlay.runner.runtime.choose import choose


@pytest.fixture
def client(base: BaseVersion) -> Iterator[Any]:
    require_docker_image(base.pg_major or 0)
    c = docker_runtime.connect(None)
    yield c
    c.close()


def container_of(client: Any, pool: Pool, name: str) -> Any:
    return client.containers.get(f"pgoverlay-{pool.id}-{name}")


def test_auto_picks_docker_when_the_daemon_answers_and_records_it(
    pool: Pool, base: BaseVersion, client: Any
) -> None:
    previous = pool.settings.runtime
    pool.settings.runtime = "auto"
    try:
        b = branch.create(pool, "dock-auto", base_name=base.name)
    finally:
        pool.settings.runtime = previous
    try:
        assert b.runtime == "docker"
        shown = branch.status(pool, "dock-auto")
        assert (shown.branch.runtime, shown.running) == ("docker", True)
        container = container_of(client, pool, "dock-auto")
        labels = container.labels
        assert labels[docker_runtime.LABEL_POOL] == pool.id
        assert labels[docker_runtime.LABEL_BRANCH] == "dock-auto"
        host = container.attrs["HostConfig"]
        assert host["Privileged"] is False and not host["CapAdd"]
        assert container.attrs["Config"]["User"] == f"{pool.owner.uid}:{pool.owner.gid}"
        # The daemon mounted the overlay: no mount of ours on the host.
        assert not branch.layout(pool, "dock-auto").data.is_mount()
        assert b.password not in json.dumps(container.attrs)
        with psycopg.connect(**branch.connection(pool, b).connect_kwargs()) as conn:
            assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (200000,)
    finally:
        branch.destroy(pool, "dock-auto")
    assert_no_leaks(pool, "dock-auto", port=b.port)


def test_a_killed_container_is_seen_as_down_and_gc_restarts_it(
    pool: Pool, base: BaseVersion, client: Any
) -> None:
    b = branch.create(pool, "dock-dead", runtime="docker", base_name=base.name)
    try:
        with psycopg.connect(
            **branch.connection(pool, b).connect_kwargs(), autocommit=True
        ) as conn:
            conn.execute("CREATE TABLE survives (id int)")
            conn.execute("CHECKPOINT")
        container_of(client, pool, "dock-dead").kill()
        assert branch.status(pool, "dock-dead").running is False
        assert gc.collect(pool).restarted == ["dock-dead"]
        with psycopg.connect(**branch.connection(pool, b).connect_kwargs()) as conn:
            assert conn.execute("SELECT count(*) FROM survives").fetchone() == (0,)
    finally:
        branch.destroy(pool, "dock-dead")


def test_gc_removes_containers_and_volumes_that_no_branch_claims(
    pool: Pool, base: BaseVersion, client: Any, undo: Undo
) -> None:
    undo.branch("dock-orphan")
    b = branch.create(pool, "dock-orphan", runtime="docker", base_name=base.name)
    # As if the registry row had been lost: the container and volume now belong to nobody.
    pool.registry.delete_branch("dock-orphan")
    assert len(docker_objects_for(pool, "dock-orphan")) == 2
    report = gc.collect(pool)
    assert any("container" in item for item in report.orphans)
    assert any("volume" in item for item in report.orphans)
    assert_no_leaks(pool, "dock-orphan", port=b.port)


def test_an_image_of_another_major_is_refused_before_anything_starts(
    pool: Pool, base: BaseVersion, client: Any
) -> None:
    good = pool.settings.image_for(base.pg_major or 0)
    scratch = client.containers.create(good, entrypoint=["true"])
    wrong_major = (base.pg_major or 0) + 1
    tag = f"pgoverlay-local/postgres-mismatch:{wrong_major}"
    try:
        scratch.commit(
            repository=tag.split(":")[0],
            tag=str(wrong_major),
            changes=[f"ENV PG_MAJOR={wrong_major}"],
        )
    finally:
        scratch.remove(force=True)
    previous = pool.settings.docker_image
    pool.settings.docker_image = tag
    try:
        with pytest.raises(VersionMismatchError, match=f"runs Postgres {wrong_major}"):
            branch.create(pool, "dock-mismatch", runtime="docker", base_name=base.name)
        assert pool.registry.branch("dock-mismatch") is None
        assert docker_objects_for(pool, "dock-mismatch") == []
        pool.settings.runtime = "docker"
        try:
            checks = {c.name: c for c in doctor.run(pool.settings)}
        finally:
            pool.settings.runtime = "local"
        major_check = checks[f"postgres {base.pg_major}"]
        assert major_check.verdict == "fail" and tag in major_check.detail
    finally:
        pool.settings.docker_image = previous
        client.images.remove(tag, force=True)
    assert_no_leaks(pool, "dock-mismatch")


def test_auto_runs_locally_without_pulling_when_the_image_is_not_here(
    pool: Pool, base: BaseVersion, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """With the base's binaries on the host and no image, `auto` runs the branch locally and
    says why, without trying (and, offline, failing) to pull the image at every command."""
    previous = (pool.settings.runtime, pool.settings.docker_image)
    pool.settings.runtime = "auto"
    pool.settings.docker_image = "pgoverlay-local/no-such-image:{major}"
    try:
        choice = choose(pool.settings, "branch", major=base.pg_major or 0)
        b = branch.create(pool, "dock-fallback", base_name=base.name)
    finally:
        pool.settings.runtime, pool.settings.docker_image = previous
    try:
        assert b.runtime == "local" and choice.name == "local"
        assert "no-such-image" in choice.reason and "not on this host" in choice.reason
        assert "using the local runtime" not in caplog.text  # no pull was tried
    finally:
        branch.destroy(pool, "dock-fallback")


def test_an_image_without_pg_major_is_asked_and_a_non_postgres_image_refused(
    pool: Pool, base: BaseVersion, client: Any
) -> None:
    good = pool.settings.image_for(base.pg_major or 0)
    scratch = client.containers.create(good, entrypoint=["true"])
    try:
        scratch.commit(repository="pgoverlay-local/unlabelled", tag="1", changes=["ENV PG_MAJOR="])
        scratch.commit(
            repository="pgoverlay-local/not-postgres",
            tag="1",
            changes=["ENV PG_MAJOR=", "ENV PATH=/usr/bin:/bin"],
        )
    finally:
        scratch.remove(force=True)
    try:
        assert docker_runtime.image_major(client, "pgoverlay-local/unlabelled:1", timeout=60) == (
            base.pg_major
        )
        with pytest.raises(DockerError, match="does not look like a Postgres image"):
            docker_runtime.image_major(client, "pgoverlay-local/not-postgres:1", timeout=60)
        probes = client.containers.list(
            all=True, filters={"label": f"{docker_runtime.LABEL_KIND}=probe"}
        )
        assert probes == [], "a probe container was left behind"
    finally:
        for tag in ("pgoverlay-local/unlabelled:1", "pgoverlay-local/not-postgres:1"):
            client.images.remove(tag, force=True)


def test_docker_failing_to_run_an_image_says_dockers_error_not_that_it_is_no_postgres(
    pool: Pool, base: BaseVersion, client: Any
) -> None:
    """A Postgres image Docker cannot start (here: its USER is not in its passwd) is not called
    "not a Postgres image": the admin is told what Docker said, which is what to fix."""
    good = pool.settings.image_for(base.pg_major or 0)
    scratch = client.containers.create(good, entrypoint=["true"])
    try:
        scratch.commit(
            repository="pgoverlay-local/no-such-user",
            tag="1",
            changes=["ENV PG_MAJOR=", "USER no-such-user"],
        )
    finally:
        scratch.remove(force=True)
    try:
        with pytest.raises(DockerError) as refused:
            docker_runtime.image_major(client, "pgoverlay-local/no-such-user:1", timeout=60)
        said = str(refused.value)
        assert "does not look like a Postgres image" not in said
        assert "unable to find user no-such-user" in said, said
        assert "pgoverlay-local/no-such-user:1" in said and "http+docker" not in said, said
        probes = client.containers.list(
            all=True, filters={"label": f"{docker_runtime.LABEL_KIND}=probe"}
        )
        assert probes == [], "a probe container was left behind"
    finally:
        client.images.remove("pgoverlay-local/no-such-user:1", force=True)


def test_a_docker_outage_reads_as_unknown_and_gc_neither_restarts_nor_destroys(
    pool: Pool, base: BaseVersion, client: Any, env: dict[str, str]
) -> None:
    """A process that cannot reach the daemon cannot tell whether a Docker branch runs: it says
    so, and gc leaves the branch alone instead of restarting it."""
    b = branch.create(pool, "dock-blind", runtime="docker", base_name=base.name)
    try:
        before = container_of(client, pool, "dock-blind").id
        # The daemon is up for this test; for the commands below, no daemon answers.
        blind = {**env, "DOCKER_HOST": f"unix://{pool.home}/no-daemon-here.sock"}
        shown = cli(["branch", "status", "dock-blind", "--json"], env=blind)
        assert shown.returncode == 0, shown.stderr
        status = json.loads(shown.stdout)
        assert status["liveness"] == "unknown" and status["running"] is False
        assert "cannot reach the Docker daemon" in status["liveness_reason"]
        listed = json.loads(cli(["branch", "list", "--json"], env=blind).stdout)
        assert [(r["name"], r["liveness"]) for r in listed] == [("dock-blind", "unknown")]
        table = cli(["branch", "list"], env={**blind, "COLUMNS": "200"}).stdout
        assert "dock-blind: could not tell whether it runs: cannot reach the Docker" in table

        done = cli(["gc"], env=blind)
        assert "restarted branches" not in done.stdout
        left_alone = "skipped: dock-blind (could not tell whether it runs: cannot reach the Docker"
        assert left_alone in done.stdout, done.stdout
        # Without a daemon, the pool's containers cannot be reconciled: a problem, exit 1.
        assert done.returncode == 1 and "problems: cannot reach the Docker daemon" in done.stdout

        after = container_of(client, pool, "dock-blind")
        assert after.id == before and after.status == "running"
        row = pool.registry.branch("dock-blind")
        assert row is not None and row.state == "ready"
        assert branch.status(pool, "dock-blind").liveness.state == "running"
        with psycopg.connect(**branch.connection(pool, b).connect_kwargs()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        branch.destroy(pool, "dock-blind")
    assert_no_leaks(pool, "dock-blind", port=b.port)
