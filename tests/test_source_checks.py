"""Seed-time checks, warnings and configuration confinement, without a server."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgoverlay.errors import SeedError, SettingError
from pgoverlay.runner.seed import baseconf, checks, tablespaces
from pgoverlay.runner.seed.source import SET, SourceInfo, Tablespace
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.units import memory_bytes


def test_each_overridden_setting_gets_one_line_saying_what_branches_run_with() -> None:
    info = SourceInfo(
        major=15,
        settings={
            "archive_mode": "on",
            "archive_command": SET,
            "restore_command": SET,
            "primary_conninfo": SET,
            "ssl": "on",
            "shared_buffers": "64GB",
            "work_mem": "1024",  # kB, as a bare number in a file
            "max_connections": "500",
            "huge_pages": "on",
            "synchronous_standby_names": "ANY 1 (a, b)",
            "config_file": "/etc/postgresql/15/main/postgresql.conf",
            "data_directory": "/var/lib/postgresql/15/main",
        },
    )
    lines = checks.override_warnings(info, Settings())
    joined = "\n".join(lines)
    assert len(lines) == 10, joined
    assert "shared_buffers is 64GB in the source: branches run with 32MB" in joined
    assert "max_connections is 500 in the source: branches run with 63" in joined
    assert "ssl=off" in joined
    assert "work_mem" not in joined, "1 MB is below the pool's 4MB: nothing overridden"
    assert "outside its data directory" in joined


def test_small_settings_and_an_in_data_directory_config_give_no_warning() -> None:
    info = SourceInfo(
        major=15,
        settings={
            "shared_buffers": "16MB",
            "max_connections": "20",
            "archive_mode": "off",
            "ssl": "off",
            "config_file": "/srv/pg/data/postgresql.conf",
            "data_directory": "/srv/pg/data",
        },
    )
    assert checks.override_warnings(info, Settings()) == []


def test_ssl_warning_names_the_pools_certificate_when_one_is_configured(tmp_path: Path) -> None:
    s = Settings(ssl_cert_file=tmp_path / "c.pem", ssl_key_file=tmp_path / "k.pem")
    (line,) = checks.override_warnings(SourceInfo(major=15, settings={"ssl": "on"}), s)
    assert f"ssl=on with the pool's certificate {tmp_path / 'c.pem'}" in line


def test_ssl_settings_need_both_certificate_and_key(tmp_path: Path) -> None:
    with pytest.raises(SettingError, match="PGOVERLAY_SSL_KEY_FILE"):
        Settings(ssl_cert_file=tmp_path / "c.pem")


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("shared_buffers", "1TB", 1024**4),
        ("shared_buffers", "16384", 16384 * 8192),
        ("work_mem", "4MB", 4 * 1024**2),
        ("work_mem", "64", 64 * 1024),
        ("max_wal_size", "2GB", 2 * 1024**3),
        ("shared_buffers", "lots", None),
    ],
)
def test_memory_settings_read_with_postgres_units(
    name: str, value: str, expected: int | None
) -> None:
    assert memory_bytes(name, value) == expected


def test_a_missing_extension_is_refused_with_its_name_and_a_package() -> None:
    with pytest.raises(SeedError) as caught:
        checks.check_extensions(
            ["plpgsql", "postgis", "vector"],
            {"plpgsql", "vector"},
            major=15,
            database="app",
            where="image pgoverlay/postgres:15",
        )
    message = str(caught.value)
    assert "uses extension 'postgis'" in message
    assert "image pgoverlay/postgres:15 has no postgis.control" in message
    assert "postgresql-15-postgis-3" in message


def test_extensions_all_available_pass() -> None:
    checks.check_extensions(["plpgsql"], {"plpgsql"}, major=15, database="app", where="here")


def test_a_missing_preloaded_library_is_refused_by_name() -> None:
    with pytest.raises(SeedError, match="preloads library 'timescaledb'.*timescaledb-2-postgresql"):
        checks.check_libraries(
            ["$libdir/timescaledb"], {"auto_explain.so"}, major=15, where="this runner"
        )
    checks.check_libraries(["auto_explain"], {"auto_explain.so"}, major=15, where="this runner")


def test_includes_outside_the_data_directory_or_missing_are_commented_out(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "conf.d").mkdir(parents=True)
    (data / "conf.d" / "10-ok.conf").write_text("include_if_exists '/etc/prod/secret.conf'\n")
    (data / "local.conf").write_text("work_mem = '8MB'\n")
    (data / "postgresql.conf").write_text(
        "shared_buffers = 128MB\n"
        "include 'local.conf'\n"
        "INCLUDE = '/etc/postgresql/15/main/extra.conf'  # production only\n"
        "include_dir 'conf.d'\n"
        "include_dir '../outside'\n"
        "# include 'already/commented.conf'\n"
    )
    warnings = baseconf.confine_includes(data)
    text = (data / "postgresql.conf").read_text()
    assert "\ninclude 'local.conf'\n" in text
    assert "\ninclude_dir 'conf.d'\n" in text
    assert f"{baseconf.MARK}INCLUDE = '/etc/postgresql/15/main/extra.conf'" in text
    assert f"{baseconf.MARK}include_dir '../outside'" in text
    assert "\n# include 'already/commented.conf'\n" in text
    nested = (data / "conf.d" / "10-ok.conf").read_text()
    assert nested.startswith(baseconf.MARK)
    assert len(warnings) == 3, warnings
    assert baseconf.confine_includes(data) == [], "a second pass finds nothing left to do"


def test_settings_that_may_hold_credentials_are_removed_from_the_base_values_and_all(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    (data / "conf.d").mkdir(parents=True)
    (data / "postgresql.auto.conf").write_text(
        "primary_conninfo = 'host=prod user=repl password=hunter2'\n"
        "shared_buffers = '1GB'\n"
        "  Restore_Command='curl -H token:abc123 %f'\n"
    )
    (data / "postgresql.conf").write_text("include_dir 'conf.d'\nwork_mem = 8MB\n")
    (data / "conf.d" / "archive.conf").write_text("archive_command = 's3 put --key=k3y %p'\n")
    notes = baseconf.remove_secret_settings(data)
    texts = "".join(p.read_text() for p in sorted(data.rglob("*.conf")))
    for secret in ("hunter2", "abc123", "k3y"):
        assert secret not in texts and secret not in "\n".join(notes)
    assert "shared_buffers = '1GB'" in texts and "work_mem = 8MB" in texts
    assert f"{baseconf.REMOVED_MARK}Restore_Command\n" in texts
    assert len(notes) == 3, notes
    assert baseconf.remove_secret_settings(data) == [], "a second pass finds nothing left to do"


def test_tablespace_mappings_cover_outside_tablespaces_only_and_escape_equals() -> None:
    spaces = [
        Tablespace(oid=16384, name="far", location="/srv/a=b"),
        Tablespace(oid=16385, name="inplace", location="pg_tblspc/16385"),
    ]
    assert tablespaces.mapping_args(spaces, Path("/pool/staging/x-1.tblspc")) == [
        "--tablespace-mapping=/srv/a\\=b=/pool/staging/x-1.tblspc/16384"
    ]


def test_make_in_place_replaces_links_by_their_directories(tmp_path: Path) -> None:
    data, root = tmp_path / "x-1", tmp_path / "x-1.tblspc"
    (data / "pg_tblspc").mkdir(parents=True)
    (root / "16384" / "PG_15_1").mkdir(parents=True)
    (root / "16384" / "PG_15_1" / "file").write_text("rows")
    (data / "pg_tblspc" / "16384").symlink_to(root / "16384")
    assert tablespaces.make_in_place(data, root) == ["16384"]
    moved = data / "pg_tblspc" / "16384"
    assert moved.is_dir() and not moved.is_symlink()
    assert (moved / "PG_15_1" / "file").read_text() == "rows"
    assert not root.exists()
    assert tablespaces.has_in_place(data)


def test_make_in_place_refuses_a_link_outside_the_staging_area(tmp_path: Path) -> None:
    data, root, elsewhere = tmp_path / "x-1", tmp_path / "x-1.tblspc", tmp_path / "elsewhere"
    (data / "pg_tblspc").mkdir(parents=True)
    elsewhere.mkdir()
    (data / "pg_tblspc" / "16390").symlink_to(elsewhere)
    with pytest.raises(SeedError, match="outside the seed's staging area"):
        tablespaces.make_in_place(data, root)


def test_settings_the_role_cannot_read_are_one_warning_naming_the_grant() -> None:
    info = SourceInfo(
        major=15, unreadable=["config_file", "shared_preload_libraries"], user="replicator"
    )
    (line,) = checks.unread_warnings(info)
    assert line.startswith("replicator cannot read these settings of the source: config_file, ")
    assert "the libraries the source preloads are checked in the copy's files" in line
    assert "no warning says whether branches run without config_file" in line
    assert "GRANT pg_read_all_settings TO replicator" in line
    assert checks.unread_warnings(SourceInfo(major=15, user="postgres")) == []
