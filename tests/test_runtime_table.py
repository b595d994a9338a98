"""The runtimes are one table (runner/runtime/table.py): every list of runtimes is read from it,
so a runtime added there is accepted everywhere, and a name it does not have is refused
everywhere, naming the ones it has."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import cast

import pytest
from pydantic import ValidationError

from pgoverlay.action.request import PrRequest
from pgoverlay.errors import ConfigError, DockerError, RegistryRowError, RequestError, SettingError
from pgoverlay.runner import branch as branches
from pgoverlay.runner.pool import Pool, gc
from pgoverlay.runner.pool.registry import BaseVersion, Branch, branch_from_row
from pgoverlay.runner.postgres.binaries import PgInstall
from pgoverlay.runner.runtime import MayRemove, table
from pgoverlay.runner.runtime.choose import choose, runtime_for, tools_for, verify
from pgoverlay.runner.runtime.local import LocalRuntime
from pgoverlay.runner.service.models import CreateRequest
from pgoverlay.runner.settings import Settings
from pgoverlay.webhook.settings import RepoSettings

KNOWN = "local, docker"


class Nspawn(LocalRuntime):
    """A third runtime, as a test registers one: it runs branches as the local runtime does,
    and records what the pool asked of it."""

    name = "nspawn"
    asked: list[str] = []

    @classmethod
    def readiness(cls, settings: Settings) -> tuple[bool, str]:
        return True, "machinectl answers"

    @classmethod
    def verify(cls, settings: Settings, major: int, *, what: str) -> str:
        cls.asked.append(f"verify {major} for {what}")
        return super().verify(settings, major, what=what)

    @classmethod
    def seed_tools(
        cls, pool: Pool, *, major: int, base_name: str, mounts: Sequence[Path]
    ) -> PgInstall:
        cls.asked.append(f"seed tools for {base_name}")
        return super().seed_tools(pool, major=major, base_name=base_name, mounts=mounts)

    @classmethod
    def leftovers(
        cls, pool: Pool, *, known: Iterable[str], may_remove: MayRemove, in_use: bool
    ) -> list[str]:
        cls.asked.append(f"leftovers, in use: {in_use}")
        return ["machine pgoverlay-nspawn-gone"]

    @classmethod
    def remove_all(cls, settings: Settings, pool_id: str) -> list[str]:
        cls.asked.append(f"remove all of {pool_id}")
        return []


@pytest.fixture
def nspawn(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Nspawn]]:
    monkeypatch.setitem(table.RUNTIMES, "nspawn", lambda: Nspawn)
    monkeypatch.setattr(Nspawn, "asked", [])
    yield Nspawn


def _row(runtime: str) -> tuple[object, ...]:
    made = Branch(
        name="pr-1",
        base_name="app",
        base_version=1,
        state="ready",
        step="",
        port=55432,
        runtime=runtime,
        user="pgoverlay",
        password="",
        database="app",
        created_at=0.0,
        ready_at=0.0,
        expires_at=None,
    )
    return dataclasses.astuple(made)


# -- an unknown name -------------------------------------------------------------------------


def test_an_unknown_runtime_setting_is_refused_naming_the_known_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(SettingError, match="PGOVERLAY_RUNTIME.*one of auto, local, docker"):
        Settings(runtime="podman")
    monkeypatch.setenv("PGOVERLAY_RUNTIME", "podman")
    with pytest.raises(SettingError, match="one of auto, local, docker"):
        Settings()
    monkeypatch.setenv("PGOVERLAY_RUNTIME", " Docker ")
    assert Settings().runtime == "docker"  # as the setting was always read


def test_an_unknown_runtime_in_a_request_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(RequestError, match=f"^runtime: 'podman' is not one of {KNOWN}$"):
        CreateRequest(name="pr-1", runtime="podman")
    with pytest.raises(RequestError, match="runtime: should be one of auto, local, docker"):
        PrRequest(runtime="podman")
    with pytest.raises(ValidationError, match="should be one of auto, local, docker"):
        RepoSettings.model_validate({"runtime": "podman"})


def test_a_registry_row_of_an_unknown_runtime_is_refused_naming_the_known_ones() -> None:
    assert branch_from_row(_row("docker"), ports=None).runtime == "docker"
    with pytest.raises(RegistryRowError, match=f"unknown runtime 'podman': use one of {KNOWN}"):
        branch_from_row(_row("podman"), ports=None)


def test_an_unknown_runtime_never_falls_back_to_another() -> None:
    """choose, verify and the runtime of a branch refuse; none runs it as a local process
    or seeds it with Docker's programs."""
    settings = Settings(runtime="local")
    with pytest.raises(
        ConfigError, match="unknown runtime 'podman': use one of auto, local, docker"
    ):
        choose(settings, "branch", requested="podman", major=16)
    with pytest.raises(ConfigError, match=f"unknown runtime 'podman': use one of {KNOWN}"):
        verify(settings, "podman", 16, what="base app")
    with pytest.raises(ConfigError, match=f"use one of {KNOWN}"):
        table.get("podman")


# -- a third runtime -------------------------------------------------------------------------


def test_a_runtime_added_to_the_table_is_accepted_by_every_list(nspawn: type[Nspawn]) -> None:
    from pgoverlay import cli
    from pgoverlay.runner.service.app import openapi_document

    assert Settings(runtime="nspawn").runtime == "nspawn"
    assert CreateRequest(name="pr-1", runtime="nspawn").runtime == "nspawn"
    assert PrRequest(runtime="nspawn").runtime == "nspawn"
    assert RepoSettings.model_validate({"runtime": "nspawn"}).request().runtime == "nspawn"
    assert branch_from_row(_row("nspawn"), ports=None).runtime == "nspawn"
    schema = json.loads(openapi_document())["components"]["schemas"]["CreateRequest"]
    assert schema["properties"]["runtime"]["anyOf"][0]["enum"] == ["local", "docker", "nspawn"]
    command = ["branch", "create", "pr-1", "--runtime"]
    assert cli.build_parser(command).parse_args([*command, "nspawn"]).runtime == "nspawn"

    picked = choose(Settings(runtime="nspawn"), "branch", major=16)
    assert (picked.name, picked.reason, picked.usable) == (
        "nspawn",
        "PGOVERLAY_RUNTIME=nspawn; machinectl answers",
        True,
    )


def test_a_runtime_added_to_the_table_runs_branches_seeds_and_is_swept(
    nspawn: type[Nspawn], pool: Pool, base: BaseVersion
) -> None:
    """Nothing outside the table names it, yet a branch runs on it (recorded, restarted by
    its runtime), a seed asks it for its programs, and gc asks it for its leftovers."""
    major = base.pg_major or 0
    made = branches.create(pool, "third-runtime", base_name=base.name, runtime="nspawn")
    try:
        assert made.runtime == "nspawn"
        assert getattr(pool.registry.branch("third-runtime"), "runtime", None) == "nspawn"
        assert f"verify {major} for base {base.name}" in nspawn.asked
        rt = runtime_for(pool, base, "nspawn")
        assert isinstance(rt, Nspawn)
        assert rt.liveness(branches.layout(pool, made.key)).running
        tools = tools_for("seed", pool=pool, major=major, requested="nspawn", base_name="next")
        assert tools.major == major and "seed tools for next" in nspawn.asked
        report = gc.collect(pool)
        assert "machine pgoverlay-nspawn-gone" in report.orphans
        assert "leftovers, in use: True" in nspawn.asked
        assert "third-runtime" not in report.restarted
    finally:
        branches.destroy(pool, "third-runtime")


def test_gc_reports_a_runtime_it_cannot_ask_only_when_a_branch_runs_on_it(
    monkeypatch: pytest.MonkeyPatch, pool: Pool, base: BaseVersion
) -> None:
    """gc tells each runtime whether a branch runs on it; one without its daemon has nothing
    of the pool when none does, and is a problem when one does."""

    class Unreachable(Nspawn):
        name = "unreachable"

        @classmethod
        def leftovers(
            cls, pool: Pool, *, known: Iterable[str], may_remove: MayRemove, in_use: bool
        ) -> list[str]:
            if in_use:
                raise DockerError("cannot reach the unreachable daemon: start it")
            return []

    monkeypatch.setitem(table.RUNTIMES, "unreachable", lambda: Unreachable)
    problem = "cannot reach the unreachable daemon: start it"
    assert problem not in gc.collect(pool).problems
    branches.create(pool, "on-unreachable", base_name=base.name, runtime="unreachable")
    try:
        assert problem in gc.collect(pool).problems
    finally:
        branches.destroy(pool, "on-unreachable")


# -- the Docker daemon's address ---------------------------------------------------------


def test_the_docker_daemons_address_is_a_setting_that_defaults_to_docker_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nowhere = f"unix://{tmp_path}/no-daemon-here.sock"
    monkeypatch.delenv("PGOVERLAY_DOCKER_HOST", raising=False)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert Settings().docker_host is None
    monkeypatch.setenv("DOCKER_HOST", "tcp://docker.example:2375")
    assert Settings().docker_host == "tcp://docker.example:2375"
    monkeypatch.setenv("PGOVERLAY_DOCKER_HOST", nowhere)
    assert Settings().docker_host == nowhere  # ours wins over the Docker client's variable

    asked = choose(Settings(runtime="docker"), "branch", major=16)
    assert (asked.name, asked.usable) == ("docker", False)
    assert "the Docker daemon does not answer" in asked.reason
    with pytest.raises(DockerError, match="cannot reach the Docker daemon"):
        table.get("docker").leftovers(
            cast(Pool, _FakePool(Settings())),
            known=(),
            may_remove=lambda kind, name: True,
            in_use=True,
        )
    unused = table.get("docker").leftovers(
        cast(Pool, _FakePool(Settings())),
        known=(),
        may_remove=lambda kind, name: True,
        in_use=False,
    )
    assert unused == []  # no daemon and no branch on it: nothing of this pool to remove
    assert table.get("docker").remove_all(Settings(), "p0") == []


class _FakePool:
    """What the Docker runtime's leftovers read of a pool: its settings and id."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.id = "p0"
