"""Credentials in a branch (`pgoverlay access`): a person's or a preview app's login role with a
fresh password until an expiry, tried as a reviewer would: over TCP with that password, on real
branches of a masked and an unmasked base, and through the engine service as the front door's
own identity."""

from __future__ import annotations

import json
import os
import re
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fakegithub import FakeGitHub
from helpers import as_engine, as_user_call, cli, masked_base, os_user, service_with
from pgoverlay.errors import AccessError, NotOwnerError, RequestError, UnmaskedAccessError
from pgoverlay.runner import audit, branch, polling
from pgoverlay.runner.branch import grants
from pgoverlay.runner.pool import Pool, gc
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import GrantRequest

MASKED = "grants-masked"
DOOR = "pgoverlay-door"  # Settings.door.user's default: the service's door identity
RUNNER = "pgo-runner"  # a workflow's user, in the service's group
OTHER = "pgo-other"


@pytest.fixture(scope="module")
def masked(
    pool: Pool, source: cluster.Running, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BaseVersion]:
    """A small base seeded with masking rules (its people's emails faked)."""
    folder = tmp_path_factory.mktemp("grant-rules")
    with masked_base(
        pool, source, name=MASKED, database="grantsdb", rows=50, folder=folder
    ) as made:
        yield made


@pytest.fixture
def made(pool: Pool, masked: BaseVersion) -> Iterator[list[str]]:
    """Names of branches a test creates, destroyed when it ends, passed or failed."""
    names: list[str] = []
    yield names
    for name in names:
        branch.destroy(pool, name)


def _create(pool: Pool, made: list[str], name: str, base: str = MASKED, **kw: Any) -> Branch:
    made.append(name)
    return branch.create(pool, name, base_name=base, **kw)


def login(b: Branch, role: str, password: str, **kw: Any) -> psycopg.Connection[Any]:
    """A reviewer's connection: over TCP to the branch's port, as the granted role."""
    return psycopg.connect(
        host="127.0.0.1",
        port=b.port,
        dbname=b.database,
        user=role,
        password=password,
        connect_timeout=10,
        autocommit=True,
        **kw,
    )


def refused(b: Branch, role: str, password: str) -> str:
    """The server's refusal of a login (the test fails if it lets the role in)."""
    try:
        with login(b, role, password):
            pass
    except psycopg.OperationalError as err:
        return str(err)
    raise AssertionError(f"{role} logged in to {b.name}")


def role_row(pool: Pool, b: Branch, role: str) -> tuple[Any, ...] | None:
    base = pool.registry.base(b.base_name, b.base_version)
    assert base is not None
    with as_engine(pool, b, base) as conn:
        return conn.execute(
            "SELECT rolcanlogin, rolpassword IS NOT NULL FROM pg_authid WHERE rolname = %s",
            (role,),
        ).fetchone()


def assert_never_written(pool: Pool, *secrets: str) -> None:
    """No password appears in the audit log, the service's log or any branch server's log."""
    files = [*(pool.home / "audit").glob("*"), pool.home / "service.log"]
    files += list((pool.root / "branches").glob("*/log/*"))
    for path in files:
        if path.is_file():
            text = path.read_bytes()
            for secret in secrets:
                assert secret.encode() not in text, f"a password is in {path}"


def audit_lines(pool: Pool) -> list[dict[str, object]]:
    return audit.read(pool.home / audit.ENGINE_LOG)


# -- read-write, read-only -------------------------------------------------------------------


def test_a_read_write_grant_logs_in_over_tcp_and_writes(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    b = _create(pool, made, "acc-rw")
    done = grants.grant(pool, "acc-rw", login="Octo-Cat", uid=0)
    assert done.grant.role == "octo-cat" and not done.grant.read_only
    with login(b, "octo-cat", done.password) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("octo-cat",)
        conn.execute("INSERT INTO people VALUES (1000, 'new@example.org')")
        conn.execute("CREATE TABLE notes (id int)")
        # The masked base's data, as a reviewer sees it.
        (email,) = conn.execute("SELECT email FROM people WHERE id = 1").fetchone() or ("",)
        assert email != "person1@example.org"
    (row,) = [g for g in pool.registry.grants("acc-rw")]
    assert (row.login, row.role, row.granted_by) == ("octo-cat", "octo-cat", "uid:0")
    assert abs(row.expires_at - (time.time() + pool.settings.access_ttl)) < 60
    lines = [x for x in audit_lines(pool) if x.get("branch") == "acc-rw"]
    assert [x["event"] for x in lines] == ["access.grant"]
    assert lines[0]["login"] == "octo-cat" and lines[0]["uid"] == 0
    assert lines[0]["read_only"] is False and "expires_at" in lines[0]
    assert_never_written(pool, done.password, row.verifier)


def test_a_read_only_grant_reads_but_cannot_insert_or_create(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    b = _create(pool, made, "acc-ro")
    done = grants.grant(pool, "acc-ro", login="reader", read_only=True)
    with login(b, "reader", done.password) as conn:
        assert conn.execute("SELECT count(*) FROM people").fetchone() == (50,)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("INSERT INTO people VALUES (1001, 'x@example.org')")
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TABLE mine (id int)")
        # Its transactions start read-only, but that is a default: without it, it still holds
        # no privilege to write.
        conn.execute("SET default_transaction_read_only = off")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO people VALUES (1001, 'x@example.org')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE public.mine (id int)")


def test_granting_a_login_again_replaces_its_password_expiry_and_read_only_ness(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    b = _create(pool, made, "acc-again")
    first = grants.grant(pool, "acc-again", login="twice", ttl=3600)
    second = grants.grant(pool, "acc-again", login="twice", read_only=True, ttl=7200)
    assert "password authentication failed" in refused(b, "twice", first.password)
    with (
        login(b, "twice", second.password) as conn,
        pytest.raises(psycopg.errors.ReadOnlySqlTransaction),
    ):
        conn.execute("INSERT INTO people VALUES (1002, 'y@example.org')")
    (row,) = pool.registry.grants("acc-again")
    assert row.read_only and row.expires_at > first.grant.expires_at + 3000


def test_a_read_write_login_made_read_only_loses_its_open_sessions(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    """A session that SET ROLE to the branch role keeps that role past a revoked membership:
    the downgrade ends it, and the next login is read-only."""
    b = _create(pool, made, "acc-down")
    first = grants.grant(pool, "acc-down", login="downgraded", ttl=3600)
    with login(b, "downgraded", first.password) as open_session:
        open_session.execute(f"SET ROLE {pool.settings.branch_user}")
        second = grants.grant(pool, "acc-down", login="downgraded", read_only=True, ttl=3600)
        with pytest.raises(psycopg.OperationalError):
            open_session.execute("INSERT INTO people VALUES (1003, 'z@example.org')")
    with (
        login(b, "downgraded", second.password) as conn,
        pytest.raises(psycopg.errors.ReadOnlySqlTransaction),
    ):
        conn.execute("INSERT INTO people VALUES (1004, 'w@example.org')")


def test_a_ttl_above_the_longest_allowed_is_refused_saying_which_setting(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    _create(pool, made, "acc-long")
    with pytest.raises(RequestError, match="PGOVERLAY_ACCESS_MAX_TTL"):
        grants.grant(pool, "acc-long", login="eager", ttl=pool.settings.access_max_ttl + 1)
    assert pool.registry.grants("acc-long") == []


@pytest.mark.parametrize("bad", ["-lead", "trail-", "dou--ble", "a" * 40, "under_score", ""])
def test_a_login_github_would_not_accept_is_refused(bad: str) -> None:
    with pytest.raises(RequestError, match="not a GitHub login"):
        grants.role_for_login(bad)
    with pytest.raises(RequestError):
        GrantRequest(login=bad)


# -- expiry, revoke, destroy, reset ----------------------------------------------------------


def test_an_expired_credential_cannot_log_in_and_gc_removes_its_role_and_row(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    b = _create(pool, made, "acc-ttl")
    done = grants.grant(pool, "acc-ttl", login="brief", ttl=2)
    with login(b, "brief", done.password):
        pass

    def expired() -> bool | None:
        try:
            with login(b, "brief", done.password):
                return None
        except psycopg.OperationalError:
            return True

    polling.wait_for(expired, timeout=30, what="the credential's expiry")
    report = gc.collect(pool)
    assert "brief in acc-ttl" in report.expired_grants
    assert pool.registry.grants("acc-ttl") == []
    assert role_row(pool, b, "brief") is None
    (line,) = [
        x
        for x in audit_lines(pool)
        if x.get("branch") == "acc-ttl" and x["event"] != "access.grant"
    ]
    assert line["event"] == "access.expire" and line["login"] == "brief"
    assert_never_written(pool, done.password)


def test_revoke_ends_an_open_session_and_the_login_fails_after(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    b = _create(pool, made, "acc-revoke")
    done = grants.grant(pool, "acc-revoke", login="leaver")
    conn = login(b, "leaver", done.password)
    try:
        conn.execute("CREATE TABLE left_behind (id int)")
        assert grants.revoke(pool, "acc-revoke", "Leaver", uid=0)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    finally:
        conn.close()
    assert "leaver" in refused(b, "leaver", done.password)
    assert role_row(pool, b, "leaver") is None
    assert pool.registry.grants("acc-revoke") == []
    # What it made stays, the branch's login role's now.
    with psycopg.connect(**branch.connection(pool, b).connect_kwargs()) as mine:
        owner = mine.execute(
            "SELECT tableowner FROM pg_tables WHERE tablename = 'left_behind'"
        ).fetchone()
        assert owner == (b.user,)
    events = [x["event"] for x in audit_lines(pool) if x.get("branch") == "acc-revoke"]
    assert events == ["access.grant", "access.revoke"]
    assert not grants.revoke(pool, "acc-revoke", "leaver")  # nothing left to revoke


def test_destroy_takes_the_roles_and_their_rows_with_the_branch(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    _create(pool, made, "acc-gone")
    grants.grant(pool, "acc-gone", login="visitor")
    grants.grant(pool, "acc-gone", login=None, app=True)
    assert len(pool.registry.grants("acc-gone")) == 2
    assert branch.destroy(pool, "acc-gone")
    assert pool.registry.grants("acc-gone") == []
    lines = [x for x in audit_lines(pool) if x.get("branch") == "acc-gone"]
    gone = [x for x in lines if x["event"] == "access.revoke"]
    assert {x["role"] for x in gone} == {"visitor", "app_acc_gone"}
    assert all(x["reason"] == "branch destroyed" for x in gone)


def test_a_reset_gives_the_credentials_back_with_the_same_password(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    b = _create(pool, made, "acc-reset")
    done = grants.grant(pool, "acc-reset", login="stayer", read_only=True)
    branch.reset(pool, "acc-reset")
    with login(b, "stayer", done.password) as conn:
        assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("on",)


def test_a_grant_on_one_branch_does_not_open_another(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    _create(pool, made, "acc-a")
    other = _create(pool, made, "acc-b")
    done = grants.grant(pool, "acc-a", login="visitor")
    assert "visitor" in refused(other, "visitor", done.password)
    # Nor another database of its own branch: pg_hba.conf admits the branch's database only.
    a = branch.get(pool, "acc-a")
    with pytest.raises(psycopg.OperationalError, match="pg_hba.conf rejects connection"):
        psycopg.connect(
            host="127.0.0.1",
            port=a.port,
            dbname="postgres",
            user="visitor",
            password=done.password,
            connect_timeout=10,
        )


# -- refusals --------------------------------------------------------------------------------


def test_a_role_of_the_base_with_the_same_name_is_never_taken_over(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    b = _create(pool, made, "acc-prod")
    with as_engine(pool, b, masked) as conn:
        conn.execute('CREATE ROLE "dba-jane" LOGIN')
    with pytest.raises(AccessError, match="dba-jane that pgoverlay did not make"):
        grants.grant(pool, "acc-prod", login="DBA-Jane")
    assert role_row(pool, b, "dba-jane") == (True, False)  # untouched: no password set
    # Nor the branch's own login role, nor the base's superuser, both valid GitHub logins.
    for name in (b.user, masked.superuser):
        with pytest.raises(AccessError, match="never taken over"):
            grants.grant(pool, "acc-prod", login=name)
    assert pool.registry.grants("acc-prod") == []
    with psycopg.connect(**branch.connection(pool, b).connect_kwargs()):
        pass  # the branch's own password still works


def test_a_base_with_its_own_marker_role_is_refused(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    b = _create(pool, made, "acc-marker")
    with as_engine(pool, b, masked) as conn:
        conn.execute("CREATE ROLE pgoverlay_access NOLOGIN")
    with pytest.raises(AccessError, match="pgoverlay did not make"):
        grants.grant(pool, "acc-marker", login="someone")
    assert role_row(pool, b, "someone") is None


def test_an_unmasked_base_is_refused_personal_credentials_unless_allowed(
    pool: Pool, base: BaseVersion, made: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    b = _create(pool, made, "acc-plain", base=base.name, pr=42)
    with pytest.raises(UnmaskedAccessError) as caught:
        grants.grant(pool, "acc-plain", login="curious")
    assert "production's, personal data included" in str(caught.value)
    assert "PGOVERLAY_ACCESS_UNMASKED=true" in str(caught.value)
    assert pool.registry.grants("acc-plain") == []
    # The preview app's role is the pull request's own code: allowed.
    app = grants.grant(pool, "acc-plain", login=None, app=True)
    assert app.grant.role == "app_pr_42" and not app.grant.read_only
    with login(b, "app_pr_42", app.password) as conn:
        conn.execute("CREATE TABLE app_made (id int)")
    # A new run renews it as deployed; only a rotation gives it a new password.
    renewed = grants.grant(pool, "acc-plain", login=None, app=True)
    assert renewed.renewed and renewed.password == app.password
    again = grants.grant(pool, "acc-plain", login=None, app=True, rotate=True)
    assert "password authentication failed" in refused(b, "app_pr_42", app.password)
    with login(b, "app_pr_42", again.password):
        pass
    monkeypatch.setattr(pool.settings, "access_unmasked", True)
    allowed = grants.grant(pool, "acc-plain", login="curious")
    with login(b, "curious", allowed.password):
        pass


def test_a_branch_made_before_credentials_gets_its_pg_hba_conf_at_the_first_grant(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    b = _create(pool, made, "acc-old")
    hba_file = branch.layout(pool, b.key).conf / "pg_hba.conf"
    old = "".join(
        line for line in hba_file.read_text().splitlines(True) if "+pgoverlay_access" not in line
    )
    hba_file.write_text(old)
    with as_engine(pool, b, masked) as conn:
        conn.execute("SELECT pg_reload_conf()")
    done = grants.grant(pool, "acc-old", login="late")
    assert "+pgoverlay_access" in hba_file.read_text()
    with login(b, "late", done.password):
        pass


# -- through the engine service: owners, others, the front door ------------------------------


def ask(socket: Path, user: str, code: str) -> Any:
    """Run ``code`` (which sets ``result``) as ``user`` against the service; its JSON answer, or
    the error it raised as {"error": class name, "message": ..., "exit": ...}."""
    inner = textwrap.indent(textwrap.dedent(code).strip(), "    ")
    body = "\n".join(
        [
            "import json",
            "from pathlib import Path",
            "from pgoverlay.errors import PgoverlayError",
            "from pgoverlay.runner.service.client import RemoteEngine",
            "from pgoverlay.runner.service.models import (",
            "    CreateRequest, GrantRequest, RecordRequest, TraceRequest)",
            "from pgoverlay.runner.service.shape import as_dict",
            f"engine = RemoteEngine(Path({os.fspath(socket)!r}))",
            "try:",
            inner,
            "except PgoverlayError as err:",
            '    result = {"error": type(err).__name__, "message": str(err), '
            '"exit": err.exit_code}',
            "print(json.dumps(as_dict(result)))",
        ]
    )
    done = as_user_call(user, ["pgoverlay"], body)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def users(service: Path) -> None:
    for name in (DOOR, RUNNER, OTHER):
        os_user(name, groups=["pgoverlay"])


def test_the_owner_grants_through_the_service_and_others_may_not(
    pool: Pool, masked: BaseVersion, made: list[str], service: Path, users: None
) -> None:
    made.append("acc-svc")
    created = ask(
        service,
        RUNNER,
        f'result = engine.create(CreateRequest(name="acc-svc", base="{MASKED}", '
        'repository="acme/shop", pr=5))',
    )
    assert created.get("name") == "acc-svc", created
    granted = ask(
        service,
        RUNNER,
        'g = engine.grant("acc-svc", GrantRequest(login="alice", repository="acme/shop"))\n'
        'result = {"view": as_dict(g), "url": g.url}',
    )
    view = granted["view"]
    assert view["role"] == "alice" and view["password"]
    assert view["database"] == "acc-svc" and view["dsn_port"] == pool.settings.door.port
    assert granted["url"].endswith(f":{pool.settings.door.port}/acc-svc?sslmode=verify-full")
    b = branch.get(pool, "acc-svc")
    with login(b, "alice", view["password"]):
        pass
    listed = ask(service, RUNNER, 'result = engine.grants("acc-svc")')
    assert [(g["login"], g["password"]) for g in listed] == [("alice", None)]
    for call in (
        'result = engine.grant("acc-svc", GrantRequest(login="mallory"))',
        'result = engine.grants("acc-svc")',
        'result = engine.revoke("acc-svc", "alice")',
    ):
        answer = ask(service, OTHER, call)
        assert answer["error"] == "NotOwnerError", (call, answer)
    other_repo = ask(
        service,
        RUNNER,
        'result = engine.grant("acc-svc", GrantRequest(login="bob", repository="acme/other"))',
    )
    assert other_repo["error"] == "BranchOwnedError"
    # Only the front door vouches for a person.
    vouched = ask(
        service,
        RUNNER,
        'result = engine.grant("acc-svc", GrantRequest(login="bob", vouched_by="github:bob"))',
    )
    assert vouched["error"] == "NotOwnerError" and "front door" in vouched["message"]
    gone = ask(
        service, RUNNER, 'result = engine.revoke("acc-svc", "alice", repository="acme/shop")'
    )
    assert gone == {"branch": "acc-svc", "login": "alice", "revoked": True}
    assert_never_written(pool, view["password"])


def test_the_front_doors_identity_may_look_and_grant_for_whom_it_vouches_and_nothing_else(
    pool: Pool, masked: BaseVersion, made: list[str], service: Path, users: None
) -> None:
    with FakeGitHub() as fake, service_with(pool, github_api_url=fake.url):
        _the_front_doors_identity(pool, made, service, fake)
        assert fake.violations == []


def _the_front_doors_identity(pool: Pool, made: list[str], service: Path, fake: FakeGitHub) -> None:
    b = _create(pool, made, "acc-door", repository="acme/shop", pr=6)
    # Looking is allowed.
    for call in (
        "result = [x.name for x in engine.bases()]",
        "result = [x.name for x in engine.branches()]",
        'result = engine.branch("acc-door").name',
        'result = engine.size("acc-door").logical_bytes',
    ):
        answer = ask(service, DOOR, call)
        assert not (isinstance(answer, dict) and "error" in answer), (call, answer)
    # Granting for a person it vouches for is allowed with their sign-in (the GitHub token the
    # door forwards, which the engine asks GitHub about itself), and recorded as vouched.
    fake.add_repo("acme/shop", private=True)
    fake.add_collaborator("acme/shop", "carol", "read")
    fake.add_token("gho_carol_of_the_test", "carol")
    granted = ask(
        service,
        DOOR,
        'result = engine.grant("acc-door", GrantRequest(login="Carol", read_only=True, '
        'vouched_by="github:carol", repository="acme/shop"), reader="gho_carol_of_the_test")',
    )
    assert granted.get("role") == "carol" and granted["read_only"], granted
    assert granted["granted_by"] == "github:carol"
    with (
        login(b, "carol", granted["password"]) as conn,
        pytest.raises(psycopg.errors.ReadOnlySqlTransaction),
    ):
        conn.execute("CREATE TABLE door_made (id int)")
    listed = ask(service, DOOR, 'result = engine.grants("acc-door")')
    assert [g["role"] for g in listed] == ["carol"]
    (line,) = [
        x
        for x in audit_lines(pool)
        if x.get("branch") == "acc-door" and x["event"] == "access.grant"
    ]
    assert line["vouched_by"] == "github:carol" and line["uid"] == os_user(DOOR).pw_uid
    # Everything else is refused, each with the rule.
    for call in (
        'result = engine.create(CreateRequest(name="door-made", repository="acme/shop"))',
        'result = engine.reset("acc-door")',
        'result = engine.destroy("acc-door")',
        'result = engine.connection("acc-door")',
        'result = engine.save_record("acc-door", RecordRequest(data="{}"))',
        'result = engine.trace_begin("acc-door", TraceRequest())',
        'result = engine.trace_mark("acc-door")',
        'result = engine.trace_end("acc-door")',
        "result = engine.gc()",
        'result = engine.revoke("acc-door", "carol")',
        'result = engine.grant("acc-door", GrantRequest(login="dave"))',
        'result = engine.grant("acc-door", GrantRequest(app=True))',
        f'result = engine.base_workload("{b.base_name}")',  # production's statements
    ):
        answer = ask(service, DOOR, call)
        assert answer.get("error") == "DoorForbiddenError", (call, answer)
        assert answer["exit"] == 28 and "front door's identity" in answer["message"]
    # It vouches for the person it grants to, no one else.
    other = ask(
        service,
        DOOR,
        'result = engine.grant("acc-door", GrantRequest(login="eve", vouched_by="github:carol"))',
    )
    assert other["error"] == "RequestError"
    assert pool.registry.branch("acc-door") is not None
    assert pool.registry.branch("door-made") is None
    assert [g.role for g in pool.registry.grants("acc-door")] == ["carol"]
    assert_never_written(pool, granted["password"])


def test_an_unmasked_refusal_through_the_service_is_403_and_says_why(
    pool: Pool, base: BaseVersion, made: list[str], service: Path, users: None
) -> None:
    _create(pool, made, "acc-door-plain", base=base.name, repository="acme/shop")
    with FakeGitHub() as fake, service_with(pool, github_api_url=fake.url):
        fake.add_repo("acme/shop", private=True)
        fake.add_collaborator("acme/shop", "carol", "read")
        fake.add_token("gho_carol_of_the_test", "carol")
        answer = ask(
            service,
            DOOR,
            'result = engine.grant("acc-door-plain", GrantRequest(login="carol", '
            'vouched_by="github:carol", read_only=True), reader="gho_carol_of_the_test")',
        )
    assert answer["error"] == "UnmaskedAccessError" and answer["exit"] == 38
    assert "not masked" in answer["message"]


def test_the_engine_refuses_the_door_without_a_service_too(
    pool: Pool, masked: BaseVersion, users: None
) -> None:
    door = LocalEngine(pool, uid=os_user(DOOR).pw_uid)
    assert door.door
    with pytest.raises(NotOwnerError, match="may not run gc"):
        door.gc()
    assert not LocalEngine(pool, uid=0).door


# -- the command -----------------------------------------------------------------------------


def test_the_command_prints_the_url_once_lists_and_revokes(
    pool: Pool, masked: BaseVersion, made: list[str], env: dict[str, str]
) -> None:
    b = _create(pool, made, "acc-cli")
    done = cli(["access", "grant", "acc-cli", "--github-login", "Frank", "--ttl", "2h"], env=env)
    assert done.returncode == 0, done.stderr
    url = next(line for line in done.stdout.splitlines() if line.startswith("postgresql://"))
    found = re.match(
        r"^postgresql://frank:([A-Za-z0-9_-]+)@([^:]+):(\d+)/acc-cli"
        r"\?sslmode=verify-full&sslrootcert=pgoverlay-door.crt$",
        url,
    )
    assert found, url
    password = found.group(1)
    with login(b, "frank", password):
        pass
    (row,) = pool.registry.grants("acc-cli")
    assert 7100 < row.expires_at - row.granted_at <= 7200
    listed = cli(["access", "list", "acc-cli", "--json"], env=env)
    assert listed.returncode == 0, listed.stderr
    assert [g["login"] for g in json.loads(listed.stdout)] == ["frank"]
    assert password not in listed.stdout
    gone = cli(["access", "revoke", "acc-cli", "frank"], env=env)
    assert gone.returncode == 0 and "revoked" in gone.stdout
    refused(b, "frank", password)
    neither = cli(["access", "grant", "acc-cli"], env=env)
    assert neither.returncode == 2 and "--github-login" in neither.stderr
    assert_never_written(pool, password)


@pytest.mark.parametrize("step", ["recorded", "applied"])
def test_a_grant_killed_at_any_step_leaves_a_row_gc_revokes_at_its_expiry(
    pool: Pool, masked: BaseVersion, made: list[str], env: dict[str, str], step: str
) -> None:
    b = _create(pool, made, f"acc-crash-{step}")
    done = cli(
        ["access", "grant", b.name, "--github-login", "crasher"],
        env={**env, "PGOVERLAY_FAULT_POINT": f"grant:{step}"},
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    (row,) = pool.registry.grants(b.name)
    assert (role_row(pool, b, "crasher") is not None) == (step == "applied")
    report = gc.collect(pool, now=row.expires_at + 1)
    assert f"crasher in {b.name}" in report.expired_grants
    assert pool.registry.grants(b.name) == [] and role_row(pool, b, "crasher") is None


def test_a_revoke_killed_after_forgetting_is_finished_by_revoking_again(
    pool: Pool, masked: BaseVersion, made: list[str], env: dict[str, str]
) -> None:
    b = _create(pool, made, "acc-crash-revoke")
    grants.grant(pool, b.name, login="halfway")
    done = cli(
        ["access", "revoke", b.name, "halfway"],
        env={**env, "PGOVERLAY_FAULT_POINT": "revoke:forgotten"},
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert pool.registry.grants(b.name) == []
    assert role_row(pool, b, "halfway") is not None
    assert grants.revoke(pool, b.name, "halfway")
    assert role_row(pool, b, "halfway") is None
    assert not grants.revoke(pool, b.name, "halfway")
