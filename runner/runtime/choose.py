"""The one place that decides which runtime, and which programs, serve a purpose.

A purpose is a branch (where its server runs), a seed (where the programs that copy and prepare
a base run) or the Action's psql (migrations). ``choose`` answers with a ``Choice``: the
runtime's name and the sentence ``doctor`` prints. ``tools_for`` gives the programs of a
choice, ``runtime_for`` the runtime of a branch whose runtime is recorded, and ``verify`` checks
that a runtime can run a base's major version.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

from pgoverlay.errors import ConfigError, PgoverlayError, PostgresBinariesError
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres.binaries import PgInstall
from pgoverlay.runner.postgres.tools import Tools
from pgoverlay.runner.runtime import Runtime, table
from pgoverlay.runner.runtime import docker as docker_runtime
from pgoverlay.runner.settings import Settings

log = logging.getLogger(__name__)

Purpose = Literal["branch", "seed", "psql"]

# A job's migrations never get the Docker daemon, which is root on this host.
PSQL_REASON = (
    "migrations run with this host's psql, as the job's own user, whatever runs the branch: "
    "a job is never given the Docker daemon, which is root on this host"
)


@dataclass(frozen=True)
class Choice:
    """Which runtime (a name in ``table``) serves a purpose, and why, in the words ``doctor``
    prints. ``usable`` is False when the choice is the only one left but cannot work;
    ``reason`` then says the fix."""

    name: str
    reason: str
    usable: bool = True


def _docker_version(settings: Settings) -> str | None:
    """The daemon's version if it answers, else None."""
    if not docker_runtime.available(settings.docker_host):
        return None
    return docker_runtime.daemon_version(settings)


def choose(
    settings: Settings,
    purpose: Purpose = "branch",
    *,
    requested: str | None = None,
    major: int | None = None,
) -> Choice:
    """Which runtime serves ``purpose``: what was asked for, else ``PGOVERLAY_RUNTIME``.

    ``auto`` for a branch means Docker when its daemon answers and (given the base's ``major``)
    its image is usable, else local; when neither has that major, Docker, so the error names
    the image. An image that is not on this host is pulled only when this host has no
    binaries of ``major``: otherwise every command would try (and, offline, fail) to pull it.
    ``auto`` for a seed means this host's binaries of ``major`` when it has them,
    else Docker when its daemon answers. The Action's psql is always this host's.
    """
    if purpose == "psql":
        return Choice("local", PSQL_REASON)
    wanted = requested or settings.runtime
    unknown = table.problem(wanted, auto=True)
    if unknown:
        raise ConfigError(unknown)
    if wanted != table.AUTO:
        usable, detail = table.get(wanted).readiness(settings)
        source = f"{wanted} was asked for" if requested else f"PGOVERLAY_RUNTIME={wanted}"
        if not usable:
            return Choice(wanted, f"{source}, but {detail}", usable=False)
        return Choice(wanted, f"{source}; {detail}" if detail else source)
    local = major is not None and major in pgbin.installs(settings.pg_bindir)
    if purpose == "seed" and local:
        return Choice("local", f"auto: this host has Postgres {major} binaries")
    # auto: Docker when it can, else this host; a runtime of its own is only ever asked for.
    version = _docker_version(settings)
    if version is None:
        if purpose == "seed" and major is not None:
            return Choice(
                "local",
                f"auto: no Postgres {major} binaries on this host and the Docker daemon does not "
                f"answer: install postgresql-{major}, or start Docker",
                usable=False,
            )
        return Choice("local", "auto: the Docker daemon does not answer")
    if major is None:
        return Choice("docker", f"auto: Docker {version} answers")
    image = settings.image_for(major)
    if purpose == "seed":
        return Choice(
            "docker",
            f"auto: no Postgres {major} binaries on this host; Docker {version} answers, so the "
            f"programs run from image {image}",
        )
    client = docker_runtime.shared(settings.docker_host)
    if local and not docker_runtime.image_present(client, image):
        return Choice(
            "local",
            f"auto: Docker {version} answers but image {image} is not on this host (pull it "
            f"to run branches in Docker); this host has Postgres {major} binaries",
        )
    try:
        found = docker_runtime.image_major(client, image, timeout=settings.command_timeout)
    except PgoverlayError as err:
        if local:
            log.warning("runtime auto: %s; using the local runtime", err)
            return Choice("local", f"auto: {err}; this host has Postgres {major} binaries")
        return Choice(
            "docker", f"auto: {err}; this host has no Postgres {major} binaries", usable=False
        )
    return Choice("docker", f"auto: Docker {version} answers; image {image} runs Postgres {found}")


def verify(settings: Settings, name: str, major: int, *, what: str) -> str:
    """Check that runtime ``name`` can run Postgres ``major`` for ``what`` (``base app``),
    before anything starts; says with which binaries or image. Raises what to fix."""
    return table.get(name).verify(settings, major, what=what)


def runtime_for(pool: Pool, base: BaseVersion, name: str, *, check: bool = False) -> Runtime:
    """The runtime ``name`` for branches of ``base``. With ``check``, refuse (before anything
    starts) binaries or an image whose Postgres major version is not the base's."""
    kind = table.get(name)
    if check:
        kind.verify(pool.settings, base.pg_major or 0, what=f"base {base.name}")
    return kind.for_base(pool, base)


@overload
def tools_for(purpose: Literal["psql"], *, settings: Settings, major: int) -> PgInstall: ...


@overload
def tools_for(
    purpose: Literal["seed"],
    *,
    pool: Pool,
    major: int,
    requested: str | None = None,
    base_name: str,
    mounts: Sequence[Path] = (),
) -> Tools: ...


def tools_for(
    purpose: Literal["psql", "seed"],
    *,
    major: int,
    settings: Settings | None = None,
    pool: Pool | None = None,
    requested: str | None = None,
    base_name: str = "",
    mounts: Sequence[Path] = (),
) -> Tools:
    """The programs that serve ``purpose``, as ``choose`` decides.

    ``psql``: this host's psql of ``major``, or its newest (psql speaks to servers of other
    versions; only its backslash commands may lag behind a newer server).
    ``seed``: the programs that copy and prepare base ``base_name`` of Postgres ``major``,
    this host's or an image's; in a container they see the pool and ``mounts``.
    """
    if purpose == "psql":
        assert settings is not None
        return _host_psql(settings, major)
    assert pool is not None
    choice = choose(pool.settings, "seed", requested=requested, major=major)
    return table.get(choice.name).seed_tools(pool, major=major, base_name=base_name, mounts=mounts)


def _host_psql(settings: Settings, major: int) -> PgInstall:
    installs = pgbin.installs(settings.pg_bindir)
    if major in installs:
        return installs[major]
    try:
        return pgbin.newest(settings.pg_bindir)
    except PostgresBinariesError:
        wanted = f"postgresql-{major}" if major else "postgresql"
        raise PostgresBinariesError(
            "no psql for the migrations on this runner: they run with the host's psql, as the "
            f"job's own user (a Docker branch too); install {wanted} on the runner, or set "
            "PGOVERLAY_PG_BINDIR to the bin directory of a Postgres install"
        ) from None
