"""Settings come from the environment over the admin's file, for every user."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_bad_settings_are_refused_with_the_variable_named() -> None:
    with pytest.raises(
        ValueError, match="PGOVERLAY_PORT_MIN=7000 is above PGOVERLAY_PORT_MAX=6000"
    ):
        Settings(port_min=7000, port_max=6000)
    with pytest.raises(ValueError, match="power of two"):
        Settings(wal_segsize_mb=3)


def test_the_webhooks_example_configuration_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    from pgoverlay.webhook.settings import WebhookSettings

    example = Path(__file__).resolve().parents[1] / "webhook" / "config.example.yml"
    monkeypatch.setenv("PGOVERLAY_WEBHOOK_CONFIG", str(example))
    monkeypatch.setenv("PGOVERLAY_WEBHOOK_SECRET", "s3cret-for-the-test")
    monkeypatch.setenv("PGOVERLAY_WEBHOOK_TOKEN", "ghp_test")
    settings = WebhookSettings()
    assert settings.repositories, "the example configures at least one repository"
    assert {r.runtime for r in settings.repositories.values()} <= {"auto", "local", "docker"}
