"""Seed-time checks: refuse a source whose branches could not run on this runner, and say, one
line per setting, what a branch will run with instead of the source's own settings.

The refusals take the set of what the runtime provides (library files, extension control files),
so a container runtime can pass its image's sets instead of this host's.
"""

from __future__ import annotations

from collections.abc import Iterable

from pgoverlay.errors import SeedError
from pgoverlay.runner.postgres.tools import Tools
from pgoverlay.runner.seed.source import SET, SourceInfo
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.units import memory_bytes
from pgoverlay.runner.values import flag

# Debian/Ubuntu (PGDG) packages for extensions whose package name is not simply
# postgresql-MAJOR-NAME; {major} is the Postgres major version.
_PACKAGES = {
    "postgis": "postgresql-{major}-postgis-3",
    "postgis_raster": "postgresql-{major}-postgis-3",
    "postgis_topology": "postgresql-{major}-postgis-3",
    "postgis_tiger_geocoder": "postgresql-{major}-postgis-3",
    "vector": "postgresql-{major}-pgvector",
    "timescaledb": "timescaledb-2-postgresql-{major}",
    "pg_partman": "postgresql-{major}-partman",
    "pg_cron": "postgresql-{major}-cron",
    "pg_repack": "postgresql-{major}-repack",
    "pgaudit": "postgresql-{major}-pgaudit",
    "hypopg": "postgresql-{major}-hypopg",
    "orafce": "postgresql-{major}-orafce",
    "pg_hint_plan": "postgresql-{major}-pg-hint-plan",
}


def package_for(name: str, major: int) -> str:
    template = _PACKAGES.get(name, "postgresql-{major}-" + name.replace("_", "-"))
    return template.format(major=major)


def available_libraries(install: Tools) -> set[str]:
    """File names in the library directory of this runner's (or image's) Postgres."""
    return install.libraries()


def available_extensions(install: Tools) -> set[str]:
    """Extensions this runner's (or image's) Postgres can load."""
    return install.extensions()


def check_libraries(
    libraries: Iterable[str], available: set[str], *, major: int, where: str
) -> None:
    """Refuse, before copying anything, a base whose preloaded libraries this runner lacks."""
    for library in libraries:
        name = library.removeprefix("$libdir/").rsplit("/", 1)[-1]
        if not {name, f"{name}.so"} & available:
            raise SeedError(
                f"the source preloads library {name!r} (shared_preload_libraries) but "
                f"{where} has no {name}.so: install the package that provides it (e.g. "
                f"{package_for(name, major)}) or remove it from the source's "
                "shared_preload_libraries"
            )


def check_extensions(
    extensions: Iterable[str], available: set[str], *, major: int, database: str, where: str
) -> None:
    """Refuse a source whose database uses an extension this runner's Postgres does not have."""
    missing = sorted(set(extensions) - available)
    if missing:
        name = missing[0]
        others = f" (also missing: {', '.join(missing[1:])})" if missing[1:] else ""
        raise SeedError(
            f"database {database!r} of the source uses extension {name!r} but {where} has no "
            f"{name}.control{others}: install the package that provides it (e.g. "
            f"{package_for(name, major)}), or drop the extension in the source"
        )


def _is_on(value: str | None) -> bool:
    return flag(value or "") is True or (value or "").strip().lower() == "always"


def unread_warnings(info: SourceInfo) -> list[str]:
    """One line when the DSN's role could not read settings the checks need: the seed goes
    on (a replication role with no other right is enough to seed), and says what it did
    instead of checking them."""
    if not info.unreadable:
        return []
    role = info.user or "the DSN's role"
    instead = []
    if "shared_preload_libraries" in info.unreadable:
        instead.append("the libraries the source preloads are checked in the copy's files")
    others = [n for n in info.unreadable if n != "shared_preload_libraries"]
    if others:
        instead.append(f"no warning says whether branches run without {', '.join(others)}")
    return [
        f"{role} cannot read these settings of the source: {', '.join(info.unreadable)} "
        f"(reading them needs pg_read_all_settings), so {'; '.join(instead)}. To have them "
        f"checked before the copy, run `GRANT pg_read_all_settings TO {role}` in the source"
    ]


def override_warnings(info: SourceInfo, settings: Settings) -> list[str]:
    """One line per source setting a branch will not run with, saying what it runs with."""
    given = info.settings
    lines: list[str] = []
    if _is_on(given.get("archive_mode")):
        lines.append(
            f"archive_mode is {given['archive_mode']} in the source: branches run with "
            "archive_mode=off and never archive WAL"
        )
    for name, what in (
        ("archive_command", "never run it"),
        ("archive_library", "never load it (archiving is off)"),
        ("restore_command", "never fetch WAL from the source's archive"),
        ("primary_conninfo", "never connect to a primary"),
    ):
        if given.get(name) == SET:
            lines.append(f"{name} is set in the source: branches run without it and {what}")
    if given.get("primary_slot_name"):
        lines.append(
            "primary_slot_name is set in the source: branches run without it and use no "
            "replication slot"
        )
    if given.get("synchronous_standby_names"):
        lines.append(
            "synchronous_standby_names is set in the source: branches run without it, so their "
            "commits never wait for a standby"
        )
    if _is_on(given.get("ssl")):
        runs = (
            f"ssl=on with the pool's certificate {settings.ssl_cert_file}"
            if settings.ssl_cert_file
            else "ssl=off (set PGOVERLAY_SSL_CERT_FILE and PGOVERLAY_SSL_KEY_FILE for SSL)"
        )
        lines.append(
            f"ssl is on in the source, whose certificate files are not part of the base: "
            f"branches run with {runs}"
        )
    for name, ours in (
        ("shared_buffers", settings.shared_buffers),
        ("work_mem", settings.work_mem),
        ("maintenance_work_mem", settings.maintenance_work_mem),
        ("max_wal_size", settings.max_wal_size),
    ):
        theirs = given.get(name)
        if theirs is None:
            continue
        a, b = memory_bytes(name, theirs), memory_bytes(name, ours)
        if a is not None and b is not None and a > b:
            lines.append(
                f"{name} is {theirs} in the source: branches run with {ours} "
                f"(PGOVERLAY_{name.upper()})"
            )
    connections = given.get("max_connections", "")
    if connections.isdigit() and int(connections) > settings.max_connections:
        lines.append(
            f"max_connections is {connections} in the source: branches run with "
            f"{settings.max_connections} (PGOVERLAY_MAX_CONNECTIONS)"
        )
    if (given.get("huge_pages") or "").lower() == "on":
        lines.append("huge_pages is on in the source: branches run with huge_pages=try")
    if given.get("unix_socket_group"):
        lines.append(
            "unix_socket_group is set in the source: branches run without it, with their own "
            "socket directory"
        )
    config, data = given.get("config_file", ""), given.get("data_directory", "")
    if config and data and not config.startswith(data.rstrip("/") + "/"):
        lines.append(
            f"the source reads its configuration from {config}, outside its data directory: "
            "that file is not part of the base, so branches use the base's "
            "postgresql.auto.conf and Postgres's defaults for whatever it sets"
        )
    return lines
