"""Which runtime runs a branch, and the runtime object for it."""

from __future__ import annotations

import logging

from pgoverlay.errors import ConfigError, PgoverlayError, VersionMismatchError
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.runtime import Runtime
from pgoverlay.runner.runtime import docker as docker_runtime
from pgoverlay.runner.runtime.docker import DockerRuntime, Publish
from pgoverlay.runner.runtime.local import LocalRuntime

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "local", "docker")


def choose_runtime(pool: Pool, requested: str | None = None, *, major: int | None = None) -> str:
    """``local`` or ``docker``: what was asked for, else the pool's setting. ``auto`` means
    Docker when its daemon answers and (given the base's ``major``) its image is usable, else
    local; when neither has that major, Docker, so the error names the image."""
    wanted = requested or pool.settings.runtime
    if wanted not in RUNTIMES:
        raise ConfigError(f"unknown runtime {wanted!r}: use one of {', '.join(RUNTIMES)}")
    if wanted != "auto":
        return wanted
    if not docker_runtime.available():
        return "local"
    if major is None:
        return "docker"
    image = pool.settings.image_for(major)
    try:
        docker_runtime.image_major(
            docker_runtime.shared(), image, timeout=pool.settings.command_timeout
        )
    except PgoverlayError as err:
        if major in pgbin.installs(pool.settings.pg_bindir):
            log.warning("runtime auto: %s; using the local runtime", err)
            return "local"
    return "docker"


def runtime_for(
    pool: Pool, base: BaseVersion, name: str = "local", *, check: bool = False
) -> Runtime:
    """The runtime ``name`` for branches of ``base``. With ``check``, refuse (before anything
    starts) binaries or an image whose Postgres major version is not the base's."""
    s = pool.settings
    major = base.pg_major or 0
    if name == "docker":
        client = docker_runtime.shared()
        image = s.image_for(major)
        if check:
            found = docker_runtime.image_major(client, image, timeout=s.command_timeout)
            if found != major:
                raise VersionMismatchError(
                    f"image {image} runs Postgres {found}, but base {base.name} is Postgres "
                    f"{major}: set PGOVERLAY_DOCKER_IMAGE to an image of Postgres {major} "
                    "({major} in it stands for the base's major version)"
                )
        return DockerRuntime(
            client,
            image=image,
            pool_id=pool.id,
            owner=pool.owner,
            publish=Publish.parse(s.listen_address),
            shm_size=s.docker_shm_size,
            start_timeout=s.start_timeout,
            stop_timeout=s.stop_timeout,
        )
    install = pgbin.for_major(major, s.pg_bindir)
    return LocalRuntime(
        install, owner=pool.owner, start_timeout=s.start_timeout, stop_timeout=s.stop_timeout
    )
