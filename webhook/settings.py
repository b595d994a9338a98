"""The listener's settings: environment (PGOVERLAY_WEBHOOK_*) and an optional YAML file
(PGOVERLAY_WEBHOOK_CONFIG). Loaded once at start-up and passed in."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from pgoverlay.action.request import (
    PrRequest,
    description,
    field_problem,
    field_types,
    is_blank,
    whole_problem,
)
from pgoverlay.errors import ConfigError, config_error
from pgoverlay.github.grammar import API_URL, is_repository
from pgoverlay.runner.values import read as typed

MIB = 1024 * 1024


class _Request(BaseModel):
    """The fields of a request, read and checked as the request checks them: a value left empty
    means its default, as an Action input left empty does; each field's own check, then the
    whole's once its fields are right."""

    @model_validator(mode="before")
    @classmethod
    def _blank_is_unset(cls, data: object) -> object:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not is_blank(v)}
        return data

    @model_validator(mode="after")
    def _whole(self) -> _Request:
        problem = whole_problem(
            getattr(self, "migrations", None),
            getattr(self, "migrate_command", None),
            branch_when=getattr(self, "branch_when", None),
        )
        if problem:
            raise PydanticCustomError("invalid_request", "{message}", {"message": problem})
        return self


def _read(kind: Any, field: dataclasses.Field[Any], value: object) -> object:
    """``value`` read as the request reads it (``runner/values.py``, the one reader of typed
    values), then held to the field's own check."""
    try:
        value = typed(kind, value)
    except ValueError as wrong:
        raise PydanticCustomError("invalid_request", "{message}", {"message": str(wrong)}) from None
    problem = field_problem(field, value)
    if problem:
        raise PydanticCustomError("invalid_request", "{message}", {"message": problem})
    return value


class ListenerSettings(BaseModel):
    """What the listener alone decides for a repository: how it treats forks, drafts and a
    repository file."""

    model_config = ConfigDict(extra="forbid")
    request_type: ClassVar[type[PrRequest]] = PrRequest  # with_request() sets it

    forks: Literal["label", "deny"] = "label"  # label: a maintainer's label approves a fork PR
    fork_label: str = "pgoverlay:allow"
    drafts: bool = True
    # May a `.pgoverlay.yml` at the PR's head change these settings? (never for forks)
    honour_repo_file: bool = False

    def request(self) -> PrRequest:
        """What the PR workflow is asked for this repository."""
        made = self.request_type
        return made(**{f.name: getattr(self, f.name) for f in dataclasses.fields(made)})


Model = TypeVar("Model", bound=ListenerSettings)


def with_request(request: type[PrRequest]) -> Callable[[type[Model]], type[Model]]:
    """Make a settings model take a request too: the class it decorates, with ``request``'s
    fields before its own, each with the field's type, default and description, read as the
    request reads it and checked by the field's own check. Its ``request()`` is the
    ``request`` they make."""

    def decorate(cls: type[Model]) -> type[Model]:
        types = field_types(request)
        fields: dict[str, Any] = {
            f.name: (
                Annotated[
                    types[f.name], BeforeValidator(functools.partial(_read, types[f.name], f))
                ],
                Field(default=f.default, description=description(f)),
            )
            for f in dataclasses.fields(request)
        }
        # The request's fields come first (pydantic orders fields from the last base up).
        bases: tuple[type[BaseModel], ...] = (
            cls,
            create_model(f"{request.__name__}Fields", __base__=_Request, **fields),
        )
        made = cast(
            "type[Model]",
            create_model(
                cls.__name__, __base__=bases, __module__=cls.__module__, __doc__=cls.__doc__
            ),
        )
        made.request_type = request
        return made

    return decorate


@with_request(PrRequest)
class RepoSettings(ListenerSettings):
    """What to do for one allowed repository: the request the Action's inputs make too (the
    fields of ``PrRequest``, added by ``with_request``), and the listener's own settings.
    ``request()`` is the request the PR workflow is given."""


class WebhookSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PGOVERLAY_WEBHOOK_", extra="forbid")

    secret: SecretStr
    token: SecretStr | None = None  # a personal access token, or:
    app_id: int | None = None  # a GitHub App (app id + private key)
    private_key: SecretStr | None = None
    private_key_file: Path | None = None
    api_url: str = API_URL
    repositories: dict[str, RepoSettings] = Field(default_factory=dict)
    workers: int = Field(default=2, ge=1, le=32)
    max_body_bytes: int = Field(default=25 * MIB, ge=1024)
    # The listener's own directory (its user's, 0700): the queue and each job's scratch space.
    state_dir: Path = Path("/var/lib/pgoverlay-webhook")
    queue_path: Path | None = None  # default: queue.db in state_dir
    lease_seconds: float = Field(default=120.0, gt=1)
    max_attempts: int = Field(default=5, ge=1)
    reconcile_interval: float = Field(default=600.0, gt=0)
    shutdown_grace: float = Field(default=60.0, ge=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8088, ge=1, le=65535)
    # When set, /healthz and /metrics answer only `Authorization: Bearer <metrics_token>`.
    metrics_token: SecretStr | None = None
    # How much lower the worker process's CPU priority is than intake's (nice, 0-19).
    worker_nice: int = Field(default=10, ge=0, le=19)
    # The pool's network API (its front door's origin, https://HOST[:PORT]) when the pool is on
    # another host: the jobs ask it, with the API token the pool's admin issued (the one line
    # of server_token_file, read once, never logged), instead of the engine service's socket.
    server: str | None = None
    server_token_file: Path | None = None
    # The certificate (PEM) to trust for the API and the door's Postgres port; unset: the
    # system's trust store.
    server_ca: Path | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config = os.environ.get("PGOVERLAY_WEBHOOK_CONFIG")
        if config:
            if not Path(config).is_file():
                raise ConfigError(
                    f"PGOVERLAY_WEBHOOK_CONFIG names {config}, which is not a file: fix the path"
                )
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config))
        return tuple(sources)

    @model_validator(mode="after")
    def _auth(self) -> WebhookSettings:
        if not self.secret.get_secret_value():
            raise ValueError("the webhook secret is empty: set PGOVERLAY_WEBHOOK_SECRET")
        has_app = self.app_id is not None
        if has_app and not (self.private_key or self.private_key_file):
            raise ValueError("app_id needs private_key or private_key_file")
        if not has_app and self.token is None:
            raise ValueError("set token (a personal access token) or app_id and a private key")
        for name in self.repositories:
            if not is_repository(name):
                raise ValueError(f"repository {name!r} must be written owner/name")
        if self.server is not None and self.server_token_file is None:
            raise ValueError(
                "server needs server_token_file: a file holding the API token the pool's admin "
                "issued (`pgoverlay api token issue NAME --owner OWNER` on the pool)"
            )
        if self.server is None and (self.server_token_file or self.server_ca):
            raise ValueError(
                "server_token_file and server_ca are for a pool on another host: set server "
                "(its front door's https://HOST[:PORT]) too, or remove them"
            )
        if self.server_ca is not None:
            from pgoverlay.webhook.mounts import PRIVATE, SCRATCH_AT

            hidden = next(
                (p for p in (SCRATCH_AT, *PRIVATE) if self.server_ca.is_relative_to(p)), None
            )
            if hidden is not None or not self.server_ca.is_absolute():
                raise ValueError(
                    f"server_ca {self.server_ca}: the jobs' psql verifies the pool's door with "
                    "this file too, and a job sees "
                    + (f"its own {hidden}, not this one" if hidden else "no relative path")
                    + ": give an absolute path elsewhere (e.g. /etc/pgoverlay-webhook/ca.pem), "
                    "readable by all"
                )
        if self.metrics_token is not None and not self.metrics_token.get_secret_value():
            raise ValueError("metrics_token is empty: set a long random string, or leave it out")
        return self

    def queue_file(self) -> Path:
        """The job queue: ``queue_path``, else ``queue.db`` in ``state_dir``."""
        return self.queue_path or self.state_dir / "queue.db"

    def make_state_dir(self) -> None:
        """Make ``state_dir`` (the queue and each job's scratch space) its owner's alone."""
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o700)

    def repo(self, full_name: str) -> RepoSettings | None:
        """Settings for an allowed repository (names compare case-insensitively)."""
        for name, settings in self.repositories.items():
            if name.lower() == full_name.lower():
                return settings
        return None

    def app_key(self) -> str:
        if self.private_key is not None:
            return self.private_key.get_secret_value()
        assert self.private_key_file is not None
        return self.private_key_file.read_text()


def load() -> WebhookSettings:
    """The listener's settings, or a ConfigError naming the bad one."""
    try:
        return WebhookSettings()
    except ValidationError as exc:
        raise config_error(
            exc,
            what="webhook setting",
            fix="set it in PGOVERLAY_WEBHOOK_* or in the file named by PGOVERLAY_WEBHOOK_CONFIG",
        ) from None
