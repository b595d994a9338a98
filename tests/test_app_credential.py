"""The preview app's credential (the Action's `database-url`): one password for the branch's
life, renewed by each job of the pull request and by an admin's `--app`, replaced only when
asked to rotate; logged in over TCP as the deployed preview would."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from helpers import Undo, cli
from pgoverlay.errors import RequestError
from pgoverlay.runner import branch
from pgoverlay.runner.branch import grants
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import GrantRequest

DAY = 24 * 3600


def login(b: Branch, role: str, password: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host="127.0.0.1",
        port=b.port,
        dbname=b.database,
        user=role,
        password=password,
        connect_timeout=10,
        autocommit=True,
    )


def test_each_job_gets_the_deployed_app_password_back_with_its_expiry_renewed(
    pool: Pool, base: BaseVersion, undo: Undo
) -> None:
    """A second job of the pull request (the Action's database_url asks the engine for the app
    credential) does not break the first job's deployment: same password, later expiry."""
    undo.branch("app-renew")
    b = branch.create(pool, "app-renew", base_name=base.name, pr=7)
    engine = LocalEngine(pool)
    first = engine.grant(b.name, GrantRequest(app=True, ttl=3600))
    assert first.password and not first.renewed and first.role == "app_pr_7"
    deployed = login(b, first.role, first.password)
    try:
        second = engine.grant(b.name, GrantRequest(app=True))
        assert second.renewed and second.password == first.password
        assert second.expires_at > first.expires_at
        assert deployed.execute("SELECT current_user").fetchone() == ("app_pr_7",)
    finally:
        deployed.close()
    with login(b, first.role, first.password):
        pass
    (row,) = pool.registry.grants(b.name)
    assert row.expires_at == second.expires_at


def test_the_app_credential_lasts_as_long_as_the_branch(
    pool: Pool, base: BaseVersion, undo: Undo
) -> None:
    """Not the 8 hours of a person's: the branch's own expiry, and with none, the longest a
    credential may last (each job renews it)."""
    undo.branch("app-life")
    undo.branch("app-forever")
    dated = branch.create(pool, "app-life", base_name=base.name, ttl_seconds=2 * DAY)
    made = grants.grant(pool, dated.name, login=None, app=True)
    assert dated.expires_at is not None
    assert made.grant.expires_at == float(int(dated.expires_at))
    undated = branch.create(pool, "app-forever", base_name=base.name)
    before = time.time()
    made = grants.grant(pool, undated.name, login=None, app=True)
    assert made.grant.expires_at >= int(before + pool.settings.access_max_ttl)
    asked = grants.grant(pool, undated.name, login=None, app=True, ttl=3600)
    assert asked.grant.expires_at <= time.time() + 3600  # a ttl asks for less


def test_only_rotate_gives_the_app_a_new_password(
    pool: Pool, base: BaseVersion, undo: Undo, env: dict[str, str]
) -> None:
    """An admin's `access grant --app` renews the deployed credential and says so; `--rotate`
    replaces it, and the old password stops working."""
    undo.branch("app-rotate")
    b = branch.create(pool, "app-rotate", base_name=base.name)
    first = grants.grant(pool, b.name, login=None, app=True)
    again = cli(["access", "grant", b.name, "--app"], env=env)
    assert again.returncode == 0, again.stderr
    assert "renewed until" in again.stdout and first.password in again.stdout
    rotated = cli(["access", "grant", b.name, "--app", "--rotate"], env=env)
    assert rotated.returncode == 0, rotated.stderr
    assert "shown once" in rotated.stdout and first.password not in rotated.stdout
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        login(b, first.grant.role, first.password).close()
    (row,) = pool.registry.grants(b.name)
    assert row.password and row.password in rotated.stdout
    with login(b, row.role, row.password):
        pass


def test_rotate_is_for_the_app_alone() -> None:
    with pytest.raises(RequestError, match="rotate: only the app's credential"):
        GrantRequest(login="octo-cat", rotate=True)
