"""Settings in sections (``settings.door``, ``settings.page``, ``settings.api``) read the keys
admins have always written: ``PGOVERLAY_DOOR_PORT`` is ``settings.door.port``, in the
environment, the admin's file and ``Settings(door_port=...)`` alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgoverlay.errors import SettingError
from pgoverlay.runner import settings as settings_module
from pgoverlay.runner.settings import Api, Door, Page, Section, Settings, load

# Every key of a section, as admins wrote it before the sections, and where it now is.
MOVED = {
    "door_user": "door.user",
    "door_address": "door.address",
    "door_port": "door.port",
    "door_https_port": "door.https_port",
    "door_host": "door.host",
    "door_cert_file": "door.cert_file",
    "door_key_file": "door.key_file",
    "door_self_signed": "door.self_signed",
    "door_sni_suffix": "door.sni_suffix",
    "door_plaintext_loopback": "door.plaintext_loopback",
    "door_max_per_branch": "door.max_per_branch",
    "door_max_per_source": "door.max_per_source",
    "door_handshake_timeout": "door.handshake_timeout",
    "door_failed_logins": "door.failed_logins",
    "door_failed_window": "door.failed_window",
    "door_ipv6_prefix": "door.ipv6_prefix",
    "github_web_url": "page.github_web_url",
    "github_api_url": "page.github_api_url",
    "oauth_client_id": "page.oauth_client_id",
    "oauth_client_secret_file": "page.oauth_client_secret_file",
    "access_write_permission": "page.write_permission",
    "access_read_permission": "page.read_permission",
    "page_session_seconds": "page.session_seconds",
    "api_issuer": "api.issuer",
    "api_audience": "api.audience",
    "api_policy_file": "api.policy_file",
    "api_leeway": "api.leeway",
}


def _at(settings: Settings, path: str) -> object:
    section, name = path.split(".")
    return getattr(getattr(settings, section), name)


def test_each_sections_key_is_the_flat_key_admins_wrote() -> None:
    keys = {
        kind.key(name): f"{attr}.{name}"
        for attr, kind in _sections().items()
        for name in kind.__annotations__
    }
    assert keys == MOVED


def _sections() -> dict[str, type[Section]]:
    return {"door": Door, "page": Page, "api": Api}


def test_the_admins_file_and_the_environment_set_a_sections_field_by_its_old_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    admin = tmp_path / "pgoverlay.env"
    admin.write_text(
        "PGOVERLAY_DOOR_PORT=7000\nPGOVERLAY_ACCESS_READ_PERMISSION=triage\n"
        "PGOVERLAY_PAGE_SESSION_SECONDS=60\nPGOVERLAY_OAUTH_CLIENT_ID=Iv1.abc\n"
    )
    monkeypatch.setattr(settings_module, "ADMIN_ENV_FILE", admin)
    monkeypatch.setenv("PGOVERLAY_API_LEEWAY", "30")
    monkeypatch.setenv("PGOVERLAY_PAGE_SESSION_SECONDS", "90")  # the environment wins
    loaded = load()
    assert (loaded.door.port, loaded.page.read_permission) == (7000, "triage")
    assert (loaded.page.session_seconds, loaded.page.oauth_client_id) == (90.0, "Iv1.abc")
    assert loaded.api.leeway == 30.0
    assert (
        loaded.changed().items()
        >= {
            "door_port": 7000,
            "access_read_permission": "triage",
            "page_session_seconds": 90.0,
            "oauth_client_id": "Iv1.abc",
            "api_leeway": 30.0,
        }.items()
    )


def test_a_keyword_and_a_copy_take_the_old_key_and_a_bad_value_names_its_variable() -> None:
    made = Settings(door_failed_logins=3, access_write_permission="never")
    assert (made.door.failed_logins, made.page.write_permission) == (3, "never")
    assert made.replace(door_failed_logins=4).door.failed_logins == 4
    assert made.replace(door_failed_logins=4).page.write_permission == "never"
    assert made.replace() == made and made.replace(api_leeway=1) != made
    assert made.get("door_failed_logins") == 3
    with pytest.raises(SettingError, match="^bad setting PGOVERLAY_DOOR_PORT: should be at most"):
        Settings(door_port=70000)
    with pytest.raises(TypeError, match="no field door_bogus"):
        Settings(door_bogus=1)


def test_every_key_is_read_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, path in MOVED.items():
        field = settings_module._FIELDS[key]
        assert f"{field.section}.{field.name}" == path
    monkeypatch.setenv("PGOVERLAY_DOOR_SNI_SUFFIX", "db.example.com")
    monkeypatch.setenv("PGOVERLAY_API_AUDIENCE", "https://pool.example.com")
    monkeypatch.setenv("PGOVERLAY_API_POLICY_FILE", "/etc/pgoverlay/policy.yml")
    made = Settings()
    assert _at(made, MOVED["door_sni_suffix"]) == "db.example.com"
    assert made.api.policy_file == Path("/etc/pgoverlay/policy.yml")


def test_no_engine_field_is_named_as_a_section_names_its_fields() -> None:
    """A new setting of the door, the pages or the API goes in its section: an engine field
    with a section's prefix (or one of its own keys) would be a flat one again."""
    prefixes = tuple(kind.prefix for kind in _sections().values())
    own = {key for kind in _sections().values() for key in kind.keys.values()}
    engine = [
        key
        for key, field in settings_module._FIELDS.items()
        if not field.section and (key.startswith(prefixes) or key in own)
    ]
    assert engine == []
