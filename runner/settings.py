"""The one settings object, loaded at the edge (CLI, Action, webhook) and passed in.

``Settings`` reads ``PGOVERLAY_*`` itself, as pydantic-settings' ``BaseSettings`` would: a
keyword given wins over the environment, which wins over the admin's file, which wins over the
default. It is a plain class that checks its own fields, each value read by the one reader of
typed values (``runner/values.py``), because every command builds one: importing pydantic and
building a model of these fields cost each command more than the rest of its start-up, and a
dataclass (``dataclasses`` imports ``inspect``) still about 20 ms (see docs/benchmarks.md,
"process").

The fields are in sections: the engine's are the class's own, the front door's are ``door``
(:class:`Door`), the branch pages' and their sign-in's ``page`` (:class:`Page`), the network
API's ``api`` (:class:`Api`). Each field is given by its key, the flat name it had before the
sections (``door_port`` is ``settings.door.port``), so the admin's file and the variables read
as they always did.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast, get_type_hints

from pgoverlay.errors import ConfigError, SettingError
from pgoverlay.github.grammar import API_URL, WEB_URL, ReadPermission, WritePermission
from pgoverlay.runner import values
from pgoverlay.runner.runtime import table as runtimes

ENV_PREFIX = "PGOVERLAY_"
# Settings renamed, by their former names: the former variable is still read; the new one wins.
RENAMED = {"lock_timeout": "lock_wait"}
# A branch's connections kept for superusers (the engine's own): the rest is shared by the
# door's clients and the engine's and job's own connections (``Settings.door_branch_cap``).
SUPERUSER_RESERVED = 3


def from_environment(environ: Mapping[str, str | None], names: set[str]) -> dict[str, str]:
    """The settings ``environ`` sets: ``PGOVERLAY_<NAME>`` in any case, for each field name;
    a variable without a value (a bare name in an env file) sets nothing."""
    found = {}
    for key, value in environ.items():
        if value is None or not key.upper().startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        name = RENAMED.get(name, name)
        if name in names and (name not in found or key.upper() == variable(name)):
            found[name] = value
    return found


def variable(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


T = TypeVar("T")


class _Bounded:
    __slots__ = ("default", "bounds", "among", "convert")

    def __init__(
        self,
        default: object,
        bounds: dict[str, float | None],
        among: Callable[[], tuple[str, ...]] | None = None,
        convert: Callable[[object], Any] | None = None,
    ) -> None:
        self.default = default
        self.bounds = bounds
        self.among = among
        self.convert = convert


def bounded(
    default: T, *, ge: float | None = None, le: float | None = None, gt: float | None = None
) -> T:
    """A field's default, and the bounds a value given for it must keep."""
    return cast(T, _Bounded(default, {"ge": ge, "le": le, "gt": gt}))


def one_of(default: str, among: Callable[[], tuple[str, ...]]) -> str:
    """A text field's default, and where the values it may take are listed: read when a value
    is checked, so a name added to that list is accepted at once."""
    return cast(str, _Bounded(default, {}, among))


def idle_seconds(default: float) -> float:
    """A field of seconds that may also be written as a duration ("10m", "2h"; 0: never), as
    the Action's ``suspend-after`` input is."""
    return cast(float, _Bounded(default, {"ge": 0}, convert=_to_idle_seconds))


def _to_idle_seconds(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    from pgoverlay.runner.names import parse_idle_seconds

    try:
        return parse_idle_seconds(str(value))
    except ConfigError:
        raise ValueError(
            "should be a number of seconds (0: never) or a duration (e.g. 10m, 2h)"
        ) from None


class Section:
    """A section of the settings: the fields one part of the product reads, an attribute of
    :class:`Settings` (``settings.door.port``). A field's key, the name it is given by in
    ``Settings(**given)``, the admin's file and the environment (``PGOVERLAY_<KEY>``), is the
    section's ``prefix`` and its name, unless ``keys`` names it otherwise: the keys are those
    of the flat settings that came before the sections, so every file and variable an admin
    wrote is read as it was."""

    prefix = ""
    keys: dict[str, str] = {}

    def __init__(self, **values: object) -> None:
        for name, value in values.items():
            setattr(self, name, value)

    @classmethod
    def key(cls, name: str) -> str:
        """The field's key: ``door.port`` is ``door_port`` (``PGOVERLAY_DOOR_PORT``)."""
        return cls.keys.get(name, cls.prefix + name)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, as Settings is

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class Door(Section):
    """The front door (`pgoverlay door`): one TCP port speaking the Postgres protocol for every
    branch, over TLS, and the branch pages over HTTPS. Started as root, it binds its ports and
    reads its key, then runs as ``user`` and reaches the engine only through its socket."""

    prefix = "door_"

    user: str = "pgoverlay-door"
    address: str = "0.0.0.0"
    port: int = bounded(6543, ge=1, le=65535)
    https_port: int = bounded(8443, ge=1, le=65535)
    # The name clients connect to (what the certificate names, for sslmode=verify-full);
    # unset: advertise_host, else this host's fully qualified name.
    host: str | None = None
    # The admin's certificate chain and key (PEM); without them a self-signed pair is made in
    # <home>/door/ and its SHA-256 fingerprint shown by the page and `doctor`.
    cert_file: Path | None = None
    key_file: Path | None = None
    # Whether clients verify the door against its own self-signed certificate (the file the
    # pages offer) rather than an authority they trust; unset: when cert_file is unset.
    # The Action sets it from the pool's answer when it reaches a pool over the network.
    self_signed: bool | None = None
    # A wildcard name (branches reached as BRANCH.<sni_suffix>, routed by TLS SNI).
    sni_suffix: str | None = None
    # Plaintext Postgres connections from loopback (never from elsewhere).
    plaintext_loopback: bool = False
    # Connections to one branch through the door; 0: all that a branch leaves the door
    # (Settings.door_branch_cap). More than that is refused at start: the branch itself would
    # refuse them.
    max_per_branch: int = bounded(0, ge=0)
    max_per_source: int = bounded(20, ge=1)
    # Seconds a client has from connecting to its first query (TLS, startup and login).
    handshake_timeout: float = bounded(10.0, gt=0)
    # Failed logins a source may make in failed_window seconds before it is refused.
    failed_logins: int = bounded(10, ge=1)
    failed_window: float = bounded(300.0, gt=0)
    # The door's limits count an IPv6 client by its prefix of this many bits (IPv4: per address).
    ipv6_prefix: int = bounded(64, ge=8, le=128)


class Page(Section):
    """The branch pages and their sign-in with GitHub (OAuth): the GitHub (or GitHub Enterprise)
    web and API addresses, the OAuth client of the admin's GitHub App or OAuth App and the file
    holding its secret, who gets which credential, and how long a page session lasts."""

    prefix = "page_"
    keys = {
        "github_web_url": "github_web_url",
        "github_api_url": "github_api_url",
        "oauth_client_id": "oauth_client_id",
        "oauth_client_secret_file": "oauth_client_secret_file",
        "write_permission": "access_write_permission",
        "read_permission": "access_read_permission",
    }

    github_web_url: str = WEB_URL
    github_api_url: str = API_URL
    oauth_client_id: str | None = None
    oauth_client_secret_file: Path | None = None
    # The least permission on the PR's repository that gets a read-write credential, and the
    # least that gets a read-only one (on a public or internal repository, where GitHub gives
    # every account read, never less than triage); and how long a page session lasts, in
    # seconds.
    write_permission: WritePermission = "write"
    read_permission: ReadPermission = "read"
    session_seconds: float = bounded(3600.0, gt=0)


class Api(Section):
    """The engine's API on the door's HTTPS port (/api/v1), for workflows on any runner: a
    GitHub Actions OIDC token of ``issuer`` for ``audience`` (the pool's URL; unset: the API
    is off), admitted by the policy in ``policy_file`` (required with an audience), its times
    checked with ``leeway`` seconds of clock skew either way. The engine service holds its
    socket's callers to that policy too, where a repository's name can be held to it."""

    prefix = "api_"

    issuer: str = "https://token.actions.githubusercontent.com"
    audience: str | None = None
    policy_file: Path | None = None
    leeway: float = bounded(60.0, ge=0, le=600)


class Settings:
    """Runner-side settings: the engine's fields, and the sections of the front door
    (``door``), the branch pages and their sign-in (``page``) and the network API (``api``).
    The listener's are its own (``webhook.settings``), in the listener's process alone.

    Every field has a key (an engine field's name; a section's field's ``Section.key``) and
    can be set as ``PGOVERLAY_<KEY>`` in the environment. ``Settings(**given)`` takes each
    field from ``given`` by its key, else from ``PGOVERLAY_*``, else its default, converts it to
    its type with the one reader of typed values (``runner/values.py``) and checks it
    (``SettingError`` names the variable); ``replace`` copies one with some fields changed."""

    home: Path = Path("/var/lib/pgoverlay")
    os_user: str = "postgres"
    pg_bindir: Path | None = None
    # Each branch's own port, on loopback by default (listen_address): reviewers and preview
    # apps reach every branch through the front door's one port, so these are private, and
    # the range is wide (10,000), below Linux's ephemeral ports (32768 and up), which
    # outgoing connections take their local ports from.
    port_min: int = bounded(20000, ge=1024, le=65535)
    port_max: int = bounded(29999, ge=1024, le=65535)
    listen_address: str = "127.0.0.1"
    advertise_host: str | None = None
    branch_user: str = "pgoverlay"
    branch_superuser: bool = False
    # Postgres 16+ only: the branch role gets CREATEROLE (which there administers only the roles
    # it creates). Never on 15 or older, where CREATEROLE may grant itself a shell.
    branch_createrole: bool = False
    shared_buffers: str = "32MB"
    # A branch's connections: superuser_reserved_connections (3) for the engine's superuser,
    # branch_engine_connections for the engine and the job's own (the migration, its probe),
    # the rest for the front door (door_max_per_branch). The defaults give the door 50.
    max_connections: int = bounded(63, ge=5)
    branch_engine_connections: int = bounded(10, ge=1)
    work_mem: str = "4MB"
    maintenance_work_mem: str = "64MB"
    # WAL kept for recycling after a checkpoint (with wal_recycle on); a branch gets at least
    # two segments of its base, the least Postgres accepts.
    min_wal_size: str = "16MB"
    # WAL segment size (MiB) a base is prepared with (existing bases keep theirs). On the
    # reflink pool a branch's first write copies the base's current segment up as a clone,
    # which costs no space whatever its size, and 16 writes faster than 1 (fewer segment
    # switches, each with its fsyncs; see docs/benchmarks.md, "wal").
    wal_segsize_mb: int = bounded(16, ge=1, le=1024)
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
    # daemon answers, otherwise local. The choice is recorded per branch. The runtimes are
    # the names in runtime/table.py.
    runtime: str = one_of("auto", runtimes.choices)
    # The Docker daemon's address (unix:///path or tcp://host:port); unset: DOCKER_HOST's,
    # else the local socket.
    docker_host: str | None = None
    # The image of a Docker branch; {major} is the base's Postgres major version. Any image
    # of that major with `postgres` on its PATH works (the official one, PostGIS, pgvector).
    docker_image: str = "postgres:{major}"
    docker_shm_size: str = "256m"
    start_timeout: float = bounded(60.0, gt=0)
    stop_timeout: float = bounded(30.0, gt=0)
    command_timeout: float = bounded(3600.0, gt=0)
    # Seconds a seed, create, reset or destroy waits for its base's or branch's file lock (not
    # Postgres's lock_timeout); PGOVERLAY_LOCK_TIMEOUT, its former name, is still read.
    lock_wait: float = bounded(120.0, gt=0)
    # The engine service (`pgoverlay service`): its socket is root's and this group's (0660);
    # members of the group (the runner's user, the webhook listener's user) may ask it for
    # branches. Its limits hold for every caller but root's own CLI.
    service_group: str = "pgoverlay"
    max_branches: int = bounded(50, ge=1)
    max_branches_per_repository: int = bounded(10, ge=1)
    # per caller's uid (the peer credentials the service records as a branch's owner): by
    # default half the pool, so neither the runner's user nor the listener's takes it all
    max_branches_per_user: int = bounded(25, ge=1)
    # connections one uid may have open on the service at once (root's are not counted), and
    # the seconds a caller has to send a whole request (its head and body)
    service_connections_per_user: int = bounded(32, ge=1)
    service_request_timeout: float = bounded(10.0, gt=0)
    # `pool init` starts the service when it is not answering and systemd does not run it
    service_autostart: bool = True
    # the service runs gc (expired TTLs, servers that died) this often, in seconds; 0: never
    service_gc_interval: float = bounded(300.0, ge=0)
    # the service revokes each credential at its expiry, so its open sessions end within 2 s of
    # it (runner/branch/expiry.py); off: at the next gc
    service_expiry_timer: bool = True
    # A ready branch with no connection for this long is suspended by the service (its server
    # stopped, its layer kept; the next connection through the front door wakes it): seconds,
    # or a duration (10m, 2h); 0: never. A branch created with its own (the Action's
    # `suspend-after`) keeps that. The service looks for idle branches every
    # service_idle_interval seconds (0: it never looks, and no branch is suspended on its own).
    suspend_after: float = idle_seconds(600.0)
    service_idle_interval: float = bounded(20.0, ge=0)
    # Personal credentials (`pgoverlay access`): their default and longest life in seconds, and
    # whether a branch of an unmasked base (production's personal data) may have them at all.
    access_ttl: float = bounded(8 * 3600.0, gt=0)
    access_max_ttl: float = bounded(7 * 24 * 3600.0, gt=0)
    access_unmasked: bool = False
    # Fault injection for crash tests: the saga kills its own process at this step.
    fault_point: str | None = None
    # The sections (each field's default is in its section's class).
    door: Door
    page: Page
    api: Api

    def __init__(self, **given: object) -> None:
        unknown = sorted(given.keys() - _FIELDS.keys())
        if unknown:
            raise TypeError(f"Settings has no field {', '.join(unknown)}")
        values = {**from_environment(os.environ, set(_FIELDS)), **given}
        if "docker_host" not in values:  # the variable every Docker client reads
            values["docker_host"] = os.environ.get("DOCKER_HOST")
        sections: dict[str, dict[str, object]] = {name: {} for name in _SECTIONS}
        for key, field in _FIELDS.items():
            value = _check(key, field, values[key]) if key in values else field.default
            if field.section:
                sections[field.section][field.name] = value
            else:
                setattr(self, field.name, value)
        for name, kind in _SECTIONS.items():
            setattr(self, name, kind(**sections[name]))
        self._whole()

    def get(self, key: str) -> object:
        """The value of the field whose key is ``key`` (``door_port``: ``self.door.port``)."""
        field = _FIELDS[key]
        return getattr(getattr(self, field.section) if field.section else self, field.name)

    def replace(self, **changes: object) -> Settings:
        """A copy with ``changes`` (by key), checked as a new one is (every field is given, so
        the environment plays no part)."""
        return Settings(**{**{key: self.get(key) for key in _FIELDS}, **changes})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Settings):
            return NotImplemented
        return all(self.get(key) == other.get(key) for key in _FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable, as a dataclass would be

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in self.changed().items())})"

    def _whole(self) -> None:
        """What no one field can check."""
        if self.wal_segsize_mb & (self.wal_segsize_mb - 1):
            raise SettingError("wal_segsize_mb", "must be a power of two between 1 and 1024 (MiB)")
        user = self.branch_user
        if not user or not user.replace("_", "").isalnum() or not user[0].isalpha():
            raise SettingError(
                "branch_user",
                "must be letters, digits and underscores, starting with a letter",
            )
        if self.port_min > self.port_max:
            raise SettingError(
                "",
                f"port range is empty: {variable('port_min')}={self.port_min} is above "
                f"{variable('port_max')}={self.port_max}",
            )
        if (self.ssl_cert_file is None) != (self.ssl_key_file is None):
            raise SettingError(
                "",
                f"set both {variable('ssl_cert_file')} and {variable('ssl_key_file')} for SSL, "
                "or neither",
            )
        left = self.max_connections - SUPERUSER_RESERVED - self.branch_engine_connections
        if left < 1 or self.door.max_per_branch > left:
            door = variable("door_max_per_branch")
            wanted = max(self.door.max_per_branch, 1) + SUPERUSER_RESERVED
            wanted += self.branch_engine_connections
            fewer = f", fewer than {door}={self.door.max_per_branch}" if left >= 1 else ""
            raise SettingError(
                "",
                f"a branch's {variable('max_connections')}={self.max_connections} leaves "
                f"{max(left, 0)} connections for the front door ({SUPERUSER_RESERVED} are the "
                f"engine's superuser's, {variable('branch_engine_connections')}="
                f"{self.branch_engine_connections} the engine's and the job's own){fewer}: "
                f"raise {variable('max_connections')} to {wanted}, or lower {door}",
            )
        if self.api.audience is not None and self.api.policy_file is None:
            raise SettingError(
                "api_policy_file",
                f"is required with {variable('api_audience')} (the network API is on): name "
                "the policy file of the owners and repositories that may use the pool "
                "(docs/policy.md), or unset the audience to turn the API off",
            )

    def changed(self) -> dict[str, object]:
        """The fields whose value is not their default, by key."""
        return {
            key: self.get(key) for key, field in _FIELDS.items() if self.get(key) != field.default
        }

    def fingerprint(self) -> str:
        """A digest of every field: two processes with the same one act alike on the pool (root's
        CLI has the engine service act for it only when both have the same)."""
        from pgoverlay.runner.digest import sha256_hex

        every = {key: str(self.get(key)) for key in _FIELDS}
        return sha256_hex(json.dumps(every, sort_keys=True).encode())[:32]

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

    @property
    def door_name(self) -> str:
        """The host name the front door and the branch pages are reached by (what their
        certificate names): door_host, else advertise_host, else this host's fully qualified
        name."""
        if self.door.host:
            return self.door.host
        if self.advertise_host:
            return self.advertise_host
        import socket

        return socket.getfqdn()

    @property
    def door_app_sslmode(self) -> str:
        """What the network API's ``/pool`` answers as ``app_sslmode`` (a field of its wire
        since before ``door.dsn``): ``verify-full`` with the admin's certificate, ``require``
        with the door's own. The Action reads it only to tell which (``door_self_signed``):
        every string it prints, ``database-url`` included, is ``verify-full`` either way."""
        return "verify-full" if self.door.cert_file is not None else "require"

    @property
    def door_branch_cap(self) -> int:
        """How many connections one branch takes through the front door: door_max_per_branch,
        else all a branch's max_connections leaves once the engine's superuser and
        branch_engine_connections have theirs (checked at load to be at least one)."""
        left = self.max_connections - SUPERUSER_RESERVED - self.branch_engine_connections
        return self.door.max_per_branch or left

    @property
    def door_rootcert(self) -> str:
        """What a person's connection strings through the door name as ``sslrootcert``
        (``door.dsn``): the door's own certificate's file name, or the system's store."""
        from pgoverlay.runner.door import dsn

        own = self.door.self_signed
        return dsn.rootcert(self_signed=self.door.cert_file is None if own is None else own)

    @property
    def page_origin(self) -> str:
        """``https://<door_name>[:port]``: where readers reach the branch pages (the port left
        out when it is HTTPS's own, 443; an IPv6 address in brackets)."""
        host = self.door_name
        host = f"[{host}]" if ":" in host else host
        port = "" if self.door.https_port == 443 else f":{self.door.https_port}"
        return f"https://{host}{port}"

    def page_url(self, branch: str) -> str:
        """The branch's page, behind GitHub sign-in: ``<page_origin>/b/<branch>``."""
        return f"{self.page_origin}/b/{branch}"


class _Field:
    """A field as ``Settings`` reads it: its section (empty for the engine's), its name there,
    its type, default and bounds, and how its value is read and checked."""

    __slots__ = ("section", "name", "kind", "default", "bounds", "among", "convert")

    def __init__(self, section: str, name: str, kind: Any, given: object) -> None:
        self.section, self.name, self.kind = section, name, kind
        self.default: object = given
        self.bounds: dict[str, float | None] = {}
        self.among: Callable[[], tuple[str, ...]] | None = None
        self.convert: Callable[[object], Any] | None = None
        if isinstance(given, _Bounded):
            self.default, self.bounds = given.default, given.bounds
            self.among, self.convert = given.among, given.convert


def _fields() -> tuple[dict[str, _Field], dict[str, type[Section]]]:
    """Each field by its key, and each section by its attribute; the classes keep the defaults
    alone."""
    found: dict[str, _Field] = {}
    sections: dict[str, type[Section]] = {}

    def add(owner: type, section: str, key_of: Callable[[str], str]) -> None:
        hints = get_type_hints(owner)
        for name in owner.__annotations__:
            kind = hints[name]
            if isinstance(kind, type) and issubclass(kind, Section):
                sections[name] = kind
                add(kind, name, kind.key)
                continue
            field = _Field(section, name, kind, owner.__dict__[name])
            setattr(owner, name, field.default)
            found[key_of(name)] = field

    add(Settings, "", lambda name: name)
    return found, sections


_FIELDS, _SECTIONS = _fields()


def _check(key: str, field: _Field, raw: object) -> object:
    """``raw`` as the field's type, within its bounds; a SettingError says why not."""
    try:
        value: Any = field.convert(raw) if field.convert else values.read(field.kind, raw)
    except ValueError as exc:
        raise SettingError(key, str(exc)) from None
    among = field.among
    if among is not None:
        value = value.strip().lower()
        if value not in among():
            raise SettingError(key, "should be one of " + ", ".join(among()))
    bounds = field.bounds
    if value is not None and bounds:
        if bounds.get("ge") is not None and value < bounds["ge"]:
            raise SettingError(key, f"should be at least {bounds['ge']}")
        if bounds.get("le") is not None and value > bounds["le"]:
            raise SettingError(key, f"should be at most {bounds['le']}")
        if bounds.get("gt") is not None and value <= bounds["gt"]:
            raise SettingError(key, f"should be more than {bounds['gt']}")
    return value


ADMIN_ENV_FILE = Path("/etc/pgoverlay/pgoverlay.env")


def load() -> Settings:
    """The settings for this process: PGOVERLAY_* variables over the administrator's
    /etc/pgoverlay/pgoverlay.env (when this user may read it; it holds no secrets, and a
    workflow's user needs it to find the engine service). A SettingError (a ConfigError) names a bad
    one."""
    env_file = None
    try:
        with open(ADMIN_ENV_FILE, "rb"):
            env_file = ADMIN_ENV_FILE
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        pass
    except PermissionError:
        import logging

        logging.getLogger(__name__).warning(
            "cannot read %s as this user: its settings are not applied (make it and its "
            "folder readable, e.g. mode 0644: it holds no secrets)",
            ADMIN_ENV_FILE,
        )
    from_file: dict[str, str] = {}
    if env_file is not None:
        from dotenv import dotenv_values  # what pydantic-settings reads env files with

        from_file = from_environment(dotenv_values(env_file), set(_FIELDS))
    return Settings(**{**from_file, **from_environment(os.environ, set(_FIELDS))})
