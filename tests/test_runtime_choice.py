"""`auto` asks the Docker daemon for an image without pulling it when this host can run the
branch itself: a missing image is pulled only when Docker is the only way."""

from __future__ import annotations

from typing import Any

import docker.errors
import pytest

from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.runtime import choose
from pgoverlay.runner.runtime import docker as docker_runtime
from pgoverlay.runner.settings import Settings


class Images:
    """A daemon's images where ``image`` is missing and pulls fail (an offline host)."""

    def __init__(self) -> None:
        self.pulled: list[str] = []

    def get(self, image: str) -> Any:
        raise docker.errors.ImageNotFound(f"no such image: {image}")

    def pull(self, image: str) -> Any:
        self.pulled.append(image)
        raise docker.errors.APIError("offline")


class Daemon:
    def __init__(self) -> None:
        self.images = Images()

    def version(self) -> dict[str, str]:
        return {"Version": "27.0"}


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch) -> Daemon:
    fake = Daemon()
    monkeypatch.setattr(docker_runtime, "available", lambda host: True)
    monkeypatch.setattr(docker_runtime, "shared", lambda host: fake)
    return fake


def test_auto_runs_locally_without_pulling_when_this_host_has_the_binaries(
    daemon: Daemon,
) -> None:
    major = pgbin.newest().major
    settings = Settings(runtime="auto")
    picked = choose.choose(settings, "branch", major=major)
    assert picked.name == "local" and picked.usable
    assert f"image {settings.image_for(major)} is not on this host" in picked.reason
    assert daemon.images.pulled == []


def test_auto_pulls_when_docker_is_the_only_way(daemon: Daemon) -> None:
    missing = max(pgbin.installs(None)) + 40  # a major this host has no binaries of
    settings = Settings(runtime="auto")
    picked = choose.choose(settings, "branch", major=missing)
    assert daemon.images.pulled == [settings.image_for(missing)]
    assert picked.name == "docker" and not picked.usable
    assert "could not be pulled" in picked.reason
