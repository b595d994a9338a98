"""Settings come from the environment over the admin's file, for every user."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import require_root
from pgoverlay.errors import ConfigError, SettingError
from pgoverlay.runner import settings as settings_module
from pgoverlay.runner.settings import Settings, load


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGOVERLAY_HOME", "/srv/pool")
    monkeypatch.setenv("PGOVERLAY_PORT_MIN", "6000")
    loaded = load()
    assert (loaded.home, loaded.port_min) == (Path("/srv/pool"), 6000)


def test_the_admins_file_is_read_by_every_user_who_can_and_the_environment_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Root without sudo (a boot unit, the service) reads /etc/pgoverlay/pgoverlay.env as a
    workflow's user does; a PGOVERLAY_* variable of the caller's own overrides it."""
    admin = tmp_path / "pgoverlay.env"
    admin.write_text("PGOVERLAY_HOME=/srv/admin-pool\nPGOVERLAY_PORT_MIN=6000\n")
    monkeypatch.setattr(settings_module, "ADMIN_ENV_FILE", admin)
    monkeypatch.delenv("PGOVERLAY_HOME", raising=False)
    monkeypatch.delenv("PGOVERLAY_PORT_MIN", raising=False)
    assert (load().home, load().port_min) == (Path("/srv/admin-pool"), 6000)
    monkeypatch.setenv("PGOVERLAY_PORT_MIN", "7000")
    assert (load().home, load().port_min) == (Path("/srv/admin-pool"), 7000)


def test_an_admin_file_this_user_cannot_read_is_skipped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    require_root()
    import pwd

    admin = tmp_path / "pgoverlay.env"
    admin.write_text("PGOVERLAY_HOME=/srv/admin-pool\n")
    admin.chmod(0o600)
    tmp_path.chmod(0o755)
    monkeypatch.setattr(settings_module, "ADMIN_ENV_FILE", admin)
    monkeypatch.delenv("PGOVERLAY_HOME", raising=False)
    assert load().home == Path("/srv/admin-pool")  # root reads it, with or without sudo
    nobody = pwd.getpwnam("nobody")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: as nobody, the file cannot be read
        os.close(read_end)
        os.setgroups([])
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)
        os.write(write_end, os.fspath(load().home).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as stream:
        seen = stream.read()
    os.waitpid(pid, 0)
    assert seen == "/var/lib/pgoverlay"


def test_bad_settings_are_refused_with_the_variable_named() -> None:
    with pytest.raises(
        SettingError, match="PGOVERLAY_PORT_MIN=7000 is above PGOVERLAY_PORT_MAX=6000"
    ):
        Settings(port_min=7000, port_max=6000)
    with pytest.raises(SettingError, match="PGOVERLAY_WAL_SEGSIZE_MB: must be a power of two"):
        Settings(wal_segsize_mb=3)


def test_load_names_a_bad_variable_in_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(settings_module, "ADMIN_ENV_FILE", tmp_path / "absent.env")
    monkeypatch.setenv("PGOVERLAY_PORT_MIN", "many")
    with pytest.raises(ConfigError) as caught:
        load()
    assert str(caught.value) == ("bad setting PGOVERLAY_PORT_MIN: should be a whole number")
    monkeypatch.setenv("PGOVERLAY_PORT_MIN", "7000")
    monkeypatch.setenv("PGOVERLAY_PORT_MAX", "6000")
    with pytest.raises(ConfigError) as caught:
        load()
    assert str(caught.value) == (
        "bad setting: port range is empty: PGOVERLAY_PORT_MIN=7000 is above PGOVERLAY_PORT_MAX=6000"
    )


def test_the_webhooks_settings_name_a_bad_one_in_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pgoverlay.webhook.settings import load as load_webhook

    example = Path(__file__).resolve().parents[1] / "webhook" / "config.example.yml"
    monkeypatch.setenv("PGOVERLAY_WEBHOOK_CONFIG", str(example))
    monkeypatch.setenv("PGOVERLAY_WEBHOOK_SECRET", "s3cret-for-the-test")
    monkeypatch.setenv("PGOVERLAY_WEBHOOK_TOKEN", "ghp_test")
    assert load_webhook().repositories
    monkeypatch.setenv("PGOVERLAY_WEBHOOK_LEASE_SECONDS", "soon")
    with pytest.raises(ConfigError) as caught:
        load_webhook()
    message = str(caught.value)
    assert message.startswith("webhook setting lease_seconds: Input should be a valid number")
    assert message.endswith(
        "; set it in PGOVERLAY_WEBHOOK_* or in the file named by PGOVERLAY_WEBHOOK_CONFIG"
    )
    assert "s3cret-for-the-test" not in message and "ghp_test" not in message


def test_the_webhooks_example_configuration_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    from pgoverlay.webhook.settings import WebhookSettings

    example = Path(__file__).resolve().parents[1] / "webhook" / "config.example.yml"
    monkeypatch.setenv("PGOVERLAY_WEBHOOK_CONFIG", str(example))
    monkeypatch.setenv("PGOVERLAY_WEBHOOK_SECRET", "s3cret-for-the-test")
    monkeypatch.setenv("PGOVERLAY_WEBHOOK_TOKEN", "ghp_test")
    settings = WebhookSettings()
    assert settings.repositories, "the example configures at least one repository"
    runtimes = {r.request().runtime for r in settings.repositories.values()}
    assert runtimes <= {"auto", "local", "docker"}


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("PGOVERLAY_PORT_MAX", "70000", "should be at most 65535"),
        ("PGOVERLAY_START_TIMEOUT", "0", "should be more than 0"),
        ("PGOVERLAY_START_TIMEOUT", "soon", "should be a number"),
        ("PGOVERLAY_BRANCH_SUPERUSER", "maybe", "should be true or false"),
        ("PGOVERLAY_RUNTIME", "kubernetes", "should be one of auto, local, docker"),
        ("PGOVERLAY_BRANCH_USER", "1st", "must be letters, digits and underscores"),
        ("PGOVERLAY_WAL_SEGSIZE_MB", "3", "must be a power of two"),
    ],
)
def test_each_kind_of_bad_value_names_its_variable_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variable: str, value: str, problem: str
) -> None:
    monkeypatch.setattr(settings_module, "ADMIN_ENV_FILE", tmp_path / "absent.env")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load()
    assert str(caught.value).startswith(f"bad setting {variable}: {problem}")


def test_values_from_text_become_their_types(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGOVERLAY_BRANCH_SUPERUSER", "Yes")
    monkeypatch.setenv("PGOVERLAY_PG_BINDIR", "")
    monkeypatch.setenv("PGOVERLAY_STOP_TIMEOUT", "2.5")
    monkeypatch.setenv("PGOVERLAY_RUNTIME", "Local")
    s = Settings(port_min="6000", port_max=6100)
    assert (s.branch_superuser, s.pg_bindir, s.stop_timeout, s.runtime) == (
        True,
        None,
        2.5,
        "local",
    )
    assert (s.port_min, s.port_max) == (6000, 6100)
    assert Settings(branch_superuser=False).branch_superuser is False  # a keyword wins
    copy = s.replace(port_max=6200)
    assert (copy.port_max, copy.branch_superuser, s.port_max) == (6200, True, 6100)
    assert copy.changed()["port_max"] == 6200 and "home" not in copy.changed()
    with pytest.raises(TypeError, match="no field colour"):
        Settings(colour="blue")


def test_a_fingerprint_changes_with_any_setting_and_only_then() -> None:
    one = Settings(home=Path("/srv/pool"))
    assert one.fingerprint() == Settings(home=Path("/srv/pool")).fingerprint()
    assert one.fingerprint() != one.replace(fault_point="x").fingerprint()
    assert one.fingerprint() != one.replace(port_max=60000).fingerprint()


def test_a_renamed_setting_is_still_read_by_its_former_variable_and_the_new_one_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`lock_wait` (a file lock's wait) was `lock_timeout`, a name Postgres uses for another
    thing: PGOVERLAY_LOCK_TIMEOUT is still read, and PGOVERLAY_LOCK_WAIT wins over it."""
    monkeypatch.setenv("PGOVERLAY_LOCK_TIMEOUT", "7")
    assert Settings().lock_wait == 7.0
    monkeypatch.setenv("PGOVERLAY_LOCK_WAIT", "9")
    assert Settings().lock_wait == 9.0
    monkeypatch.delenv("PGOVERLAY_LOCK_TIMEOUT")
    assert Settings().lock_wait == 9.0


def test_the_doors_cap_per_branch_fits_in_what_a_branchs_connections_leave_it() -> None:
    """A branch's max_connections is shared knowingly: the engine's superuser's reserved slots,
    the engine's and the job's own, and the rest for the front door; a cap the branch itself
    could not honour is refused at load, saying what to raise."""
    assert Settings().door_branch_cap == 50  # 63 - 3 - 10
    assert Settings(max_connections=30).door_branch_cap == 17
    assert Settings(max_connections=100, door_max_per_branch=40).door_branch_cap == 40
    with pytest.raises(SettingError, match="raise PGOVERLAY_MAX_CONNECTIONS to 63"):
        Settings(max_connections=30, door_max_per_branch=50)
    with pytest.raises(SettingError, match="leaves 0 connections for the front door"):
        Settings(max_connections=10, branch_engine_connections=7)
