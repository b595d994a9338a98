"""Settings come from the environment, except through sudo, where the caller cannot set them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import require_root
from pgoverlay.runner import settings as settings_module
from pgoverlay.runner.settings import Settings, load


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUDO_UID", raising=False)
    monkeypatch.setenv("PGOVERLAY_HOME", "/srv/pool")
    monkeypatch.setenv("PGOVERLAY_PORT_MIN", "6000")
    loaded = load()
    assert (loaded.home, loaded.port_min) == (Path("/srv/pool"), 6000)


def test_through_sudo_the_callers_settings_are_ignored_for_the_admins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    require_root()
    admin = tmp_path / "pgoverlay.env"
    admin.write_text("PGOVERLAY_HOME=/srv/admin-pool\n")
    monkeypatch.setattr(settings_module, "ADMIN_ENV_FILE", admin)
    monkeypatch.setenv("SUDO_UID", "1000")
    monkeypatch.setenv("PGOVERLAY_HOME", "/tmp/attacker-pool")
    monkeypatch.setenv("PGOVERLAY_PG_BINDIR", "/tmp/attacker-bin")
    loaded = load()
    assert loaded.home == Path("/srv/admin-pool")
    assert loaded.pg_bindir is None
    assert "PGOVERLAY_PG_BINDIR" not in os.environ


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
