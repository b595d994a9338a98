"""What the seed learns about a source before copying it: version, role (primary or standby),
preloaded libraries, extensions, tablespaces and the settings a branch cares about."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgoverlay.runner.names import SOURCE_MARK

# Settings a branch overrides, or that decide whether a branch starts on a small runner.
RELEVANT = (
    "archive_command",
    "archive_library",
    "archive_mode",
    "config_file",
    "data_directory",
    "huge_pages",
    "maintenance_work_mem",
    "max_connections",
    "max_wal_size",
    "primary_conninfo",
    "primary_slot_name",
    "restore_command",
    "shared_buffers",
    "shared_preload_libraries",
    "ssl",
    "ssl_cert_file",
    "ssl_key_file",
    "superuser_reserved_connections",
    "synchronous_standby_names",
    "unix_socket_group",
    "work_mem",
)
# Settings of RELEVANT that older majors lack: their absence is not for want of a right.
_SINCE = {"archive_library": 15}
# Their values can carry credentials (a conninfo's password, keys in an archive command): only
# whether they are set is recorded, never the value.
SECRET = frozenset({"archive_command", "archive_library", "primary_conninfo", "restore_command"})
SET = "(set)"
# What pg_settings reports as "where the value came from" that is not the server's own files.
_NOT_FROM_FILES = ("default", "override", "client", "session", "command line", "environment")


@dataclass(frozen=True)
class Tablespace:
    oid: int
    name: str
    location: str  # absolute path on the source host; "" or relative for an in-place one

    @property
    def outside(self) -> bool:
        return self.location.startswith("/")


@dataclass(frozen=True)
class SourceInfo:
    major: int
    standby: bool = False
    libraries: list[str] = field(default_factory=list)
    extensions: dict[str, str] = field(default_factory=dict)  # name -> version, DSN's database
    tablespaces: list[Tablespace] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)
    # RELEVANT settings the DSN's role may not read (they need pg_read_all_settings): the
    # checks that use them are not made before the copy.
    unreadable: list[str] = field(default_factory=list)
    user: str = ""  # the role the source was inspected as


def libraries(values: list[str]) -> list[str]:
    """The library names of ``shared_preload_libraries`` values, sorted, unquoted."""
    names = {lib.strip().strip('"') for v in values for lib in v.split(",")}
    return sorted(lib for lib in names if lib)


def _settings(conn: psycopg.Connection[Any]) -> tuple[dict[str, str], list[str]]:
    """The relevant settings the source's own files give, applied or waiting for a restart
    (the last file entry wins, as in Postgres), and the relevant ones the role may not see:
    pg_settings leaves out, for a role without pg_read_all_settings, those only a superuser
    may read (``shared_preload_libraries``, ``config_file`` ...)."""
    found: dict[str, str] = {}
    rows = conn.execute(
        SOURCE_MARK
        + "SELECT name, current_setting(name), source FROM pg_settings WHERE name = ANY(%s)",
        (list(RELEVANT),),
    ).fetchall()
    for name, value, source in rows:
        if str(source) not in _NOT_FROM_FILES or name in ("config_file", "data_directory"):
            found[str(name)] = str(value)
    unreadable = []
    if conn.execute(
        SOURCE_MARK + "SELECT pg_has_role('pg_read_all_settings', 'USAGE')"
    ).fetchone() != (True,):
        major = conn.info.server_version // 10000
        seen = {str(r[0]) for r in rows}
        unreadable = [n for n in RELEVANT if n not in seen and major >= _SINCE.get(n, 0)]
    # Needs pg_read_all_settings; without it, the applied values above are what we know.
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        for name, value in conn.execute(
            SOURCE_MARK + "SELECT name, setting FROM pg_file_settings "
            "WHERE name = ANY(%s) AND setting IS NOT NULL ORDER BY seqno",
            (list(RELEVANT),),
        ):
            found[str(name)] = str(value)
    for name in [n for n in unreadable if n in found]:  # read from the files after all
        unreadable.remove(name)
    settings = {k: (SET if k in SECRET and v else v) for k, v in sorted(found.items())}
    return settings, unreadable


def inspect(conn: psycopg.Connection[Any]) -> SourceInfo:
    """Everything the seed checks, from one autocommit connection to the DSN's database."""
    major = int(conn.info.server_version) // 10000
    standby = conn.execute(SOURCE_MARK + "SELECT pg_is_in_recovery()").fetchone() == (True,)
    settings, unreadable = _settings(conn)
    preload = [settings.get("shared_preload_libraries", "")]
    # SHOW needs pg_read_all_settings for this one; the file's value came through _settings.
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        preload += [str(r[0]) for r in conn.execute(SOURCE_MARK + "SHOW shared_preload_libraries")]
        if "shared_preload_libraries" in unreadable:
            unreadable.remove("shared_preload_libraries")
    extensions = {
        str(name): str(version)
        for name, version in conn.execute(
            SOURCE_MARK + "SELECT extname, extversion FROM pg_extension"
        )
    }
    tablespaces = [
        Tablespace(oid=int(oid), name=str(name), location=str(location or ""))
        for oid, name, location in conn.execute(
            SOURCE_MARK + "SELECT oid, spcname, pg_tablespace_location(oid) FROM pg_tablespace "
            "WHERE spcname NOT IN ('pg_default', 'pg_global') ORDER BY oid"
        )
    ]
    return SourceInfo(
        major=major,
        standby=standby,
        libraries=libraries(preload),
        extensions=extensions,
        tablespaces=tablespaces,
        settings=settings,
        unreadable=unreadable,
        user=str(conn.info.user),
    )
