"""The one settings object, loaded at the edge (CLI, Action, webhook) and passed in.

``Settings`` reads ``PGOVERLAY_*`` itself (as pydantic-settings' ``BaseSettings`` would: a
keyword given wins over the environment, which wins over the admin's file, which wins over the
default): importing pydantic-settings costs every command more than the rest of its start-up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pgoverlay.errors import config_error, dotted

log = logging.getLogger(__name__)

ENV_PREFIX = "PGOVERLAY_"


def from_environment(environ: Mapping[str, str | None], names: set[str]) -> dict[str, str]:
    """The settings ``environ`` sets: ``PGOVERLAY_<NAME>`` in any case, for each field name;
    a variable without a value (a bare name in an env file) sets nothing."""
    found = {}
    for key, value in environ.items():
        if value is None or not key.upper().startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name in names:
            found[name] = value
    return found


class Settings(BaseModel):
    """Runner-side settings; every field can be set as ``PGOVERLAY_<NAME>`` in the environment."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _environment(cls, given: Any) -> Any:
        """Fields not given as keywords come from ``PGOVERLAY_*``."""
        if not isinstance(given, dict):
            return given
        return {**from_environment(os.environ, set(cls.model_fields)), **given}

    home: Path = Path("/var/lib/pgoverlay")
    os_user: str = "postgres"
    pg_bindir: Path | None = None
    port_min: int = Field(default=55432, ge=1024, le=65535)
    port_max: int = Field(default=55631, ge=1024, le=65535)
    listen_address: str = "127.0.0.1"
    advertise_host: str | None = None
    branch_user: str = "pgoverlay"
    branch_superuser: bool = False
    # Postgres 16+ only: the branch role gets CREATEROLE (which there administers only the roles
    # it creates). Never on 15 or older, where CREATEROLE may grant itself a shell.
    branch_createrole: bool = False
    shared_buffers: str = "32MB"
    max_connections: int = Field(default=30, ge=5)
    work_mem: str = "4MB"
    maintenance_work_mem: str = "64MB"
    # WAL kept for recycling after a checkpoint (with wal_recycle on); a branch gets at least
    # two segments of its base, the least Postgres accepts.
    min_wal_size: str = "16MB"
    # WAL segment size (MiB) a base is prepared with (existing bases keep theirs). On the
    # reflink pool a branch's first write copies the base's current segment up as a clone,
    # which costs no space whatever its size, and 16 writes faster than 1 (fewer segment
    # switches, each with its fsyncs; see docs/benchmarks.md, "wal").
    wal_segsize_mb: int = Field(default=16, ge=1, le=1024)
    # A new segment is a new file in the branch's layer, not a clone: filling it with zeros
    # first (Postgres's default) makes every commit's fdatasync an overwrite rather than an
    # allocation, about twice as fast on XFS. A finished segment is removed rather than
    # renamed for reuse, as a recycled segment would stay in the layer at full size.
    wal_init_zero: bool = True
    wal_recycle: bool = False
    max_wal_size: str = "512MB"
    checkpoint_timeout: str = "5min"
    # The pool's own certificate and key (PEM): branches then run with ssl=on. Without them,
    # ssl=off: a base's certificate paths are production's.
    ssl_cert_file: Path | None = None
    ssl_key_file: Path | None = None
    # Where branches run: "local" (a process of this host), "docker" (a container of
    # docker_image, its data a Docker volume the daemon mounts), or "auto": Docker when the
    # daemon answers, otherwise local. The choice is recorded per branch.
    runtime: Literal["auto", "local", "docker"] = "auto"
    # The image of a Docker branch; {major} is the base's Postgres major version. Any image
    # of that major with `postgres` on its PATH works (the official one, PostGIS, pgvector).
    docker_image: str = "postgres:{major}"
    docker_shm_size: str = "256m"
    start_timeout: float = Field(default=60.0, gt=0)
    stop_timeout: float = Field(default=30.0, gt=0)
    command_timeout: float = Field(default=3600.0, gt=0)
    lock_timeout: float = Field(default=120.0, gt=0)
    # The engine service (`pgoverlay service`): its socket is root's and this group's (0660);
    # members of the group (the runner's user, the webhook listener's user) may ask it for
    # branches. Its limits hold for every caller but root's own CLI.
    service_group: str = "pgoverlay"
    max_branches: int = Field(default=50, ge=1)
    max_branches_per_repository: int = Field(default=10, ge=1)
    # `pool init` starts the service when it is not answering and systemd does not run it
    service_autostart: bool = True
    # the service runs gc (expired TTLs, servers that died) this often, in seconds; 0: never
    service_gc_interval: float = Field(default=300.0, ge=0)
    # Fault injection for crash tests: the saga kills its own process at this step.
    fault_point: str | None = None

    @field_validator("wal_segsize_mb")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError("wal_segsize_mb must be a power of two between 1 and 1024")
        return value

    @field_validator("branch_user")
    @classmethod
    def _plain_role_name(cls, value: str) -> str:
        if not value.replace("_", "").isalnum() or not value[0].isalpha():
            raise ValueError(
                "branch_user must be letters, digits and underscores, starting with a letter"
            )
        return value

    @model_validator(mode="after")
    def _port_range(self) -> Settings:
        if self.port_min > self.port_max:
            raise ValueError(
                f"port range is empty: PGOVERLAY_PORT_MIN={self.port_min} is above "
                f"PGOVERLAY_PORT_MAX={self.port_max}"
            )
        return self

    @model_validator(mode="after")
    def _ssl_pair(self) -> Settings:
        if (self.ssl_cert_file is None) != (self.ssl_key_file is None):
            raise ValueError(
                "set both PGOVERLAY_SSL_CERT_FILE and PGOVERLAY_SSL_KEY_FILE for SSL, or neither"
            )
        return self

    def image_for(self, major: int) -> str:
        return self.docker_image.replace("{major}", str(major))

    @property
    def public_host(self) -> str:
        """The host name a client should use to reach a branch."""
        if self.advertise_host:
            return self.advertise_host
        if self.listen_address in ("0.0.0.0", "*", "::"):
            return "127.0.0.1"
        return self.listen_address.split(",")[0].strip()


ADMIN_ENV_FILE = Path("/etc/pgoverlay/pgoverlay.env")


def load() -> Settings:
    """The settings for this process: PGOVERLAY_* variables over the administrator's
    /etc/pgoverlay/pgoverlay.env (when this user may read it; it holds no secrets, and a
    workflow's user needs it to find the engine service). A ConfigError names a bad one."""
    env_file = None
    try:
        with open(ADMIN_ENV_FILE, "rb"):
            env_file = ADMIN_ENV_FILE
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        pass
    except PermissionError:
        log.warning(
            "cannot read %s as this user: its settings are not applied (make it and its "
            "folder readable, e.g. mode 0644: it holds no secrets)",
            ADMIN_ENV_FILE,
        )
    from_file: dict[str, str] = {}
    if env_file is not None:
        from dotenv import dotenv_values  # what pydantic-settings reads env files with

        from_file = from_environment(dotenv_values(env_file), set(Settings.model_fields))
    try:
        return Settings.model_validate(
            {**from_file, **from_environment(os.environ, set(Settings.model_fields))}
        )
    except ValidationError as exc:
        raise config_error(
            exc,
            what="bad setting",
            where=lambda loc: f"PGOVERLAY_{dotted(loc).upper()}" if loc else "",
        ) from None
