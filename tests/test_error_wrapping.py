"""Library errors leave the engine (and the Action's ledger, and the service's client) as ours: a
real failing psycopg call, a damaged or locked registry, or an answer of another protocol raises
a PgoverlayError with its exit code and a message that says what to do, and no password."""

from __future__ import annotations

import json
import os
import socketserver
import sqlite3
import threading
from contextlib import closing
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import psycopg
import pytest

from helpers import Undo
from pgoverlay.action import migrations
from pgoverlay.errors import BranchStartError, MigrationError, RegistryError, ServiceError
from pgoverlay.runner import branch
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion, Registry
from pgoverlay.runner.service.client import RemoteEngine
from pgoverlay.runner.service.views import Connection


def test_a_damaged_registry_file_raises_the_registrys_error(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    path.write_bytes(b"this is not an SQLite database\n" * 256)
    with pytest.raises(RegistryError) as caught:
        Registry(path)
    assert caught.value.exit_code == 34
    message = str(caught.value)
    assert f"the pool's registry {path} cannot be used (file is not a database)" in message
    assert "PRAGMA integrity_check" in message and "restore it from a backup" in message


def test_a_registry_locked_past_the_wait_raises_the_registrys_error_and_keeps_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "registry.db"
    registry = Registry(path, busy_timeout=0.05)
    try:
        with closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")  # another process in the middle of a change
            with pytest.raises(RegistryError) as caught:
                registry.add_base_version("app", source="db:5432", via="basebackup")
            assert caught.value.exit_code == 34
            assert "database is locked" in str(caught.value)
            assert f"`fuser {path}`" in str(caught.value)
            assert registry.bases() == []  # reads go on meanwhile (WAL)
            other.execute("ROLLBACK")
        # The failed change left no transaction open: the next one goes through.
        assert registry.add_base_version("app", source="db:5432", via="basebackup") == 1
        assert [(b.name, b.version, b.state) for b in registry.bases()] == [("app", 1, "seeding")]
    finally:
        registry.close()


def test_a_failing_login_role_update_in_create_raises_branch_start_error_and_undoes_it(
    pool: Pool, base: BaseVersion, monkeypatch: pytest.MonkeyPatch, undo: Undo
) -> None:
    # A predefined role cannot be made a login role: Postgres refuses the ALTER ROLE.
    undo.branch("reserved-login")
    monkeypatch.setattr(pool.settings, "branch_user", "pg_monitor")
    with pytest.raises(BranchStartError) as caught:
        branch.create(pool, "reserved-login", base_name=base.name)
    assert caught.value.exit_code == 19
    message = str(caught.value)
    assert message.startswith(
        "branch reserved-login started but its login role pg_monitor could not be given the "
        "branch's password: "
    )
    assert "a create is undone" in message
    assert "SCRAM-SHA-256$" not in message and "PASSWORD" not in message
    assert pool.registry.branch("reserved-login") is None
    assert not branch.layout(pool, "reserved-login").root.exists()


def test_a_ledger_a_migration_broke_raises_migration_error_naming_the_fix(
    pool: Pool, base: BaseVersion
) -> None:
    b = branch.create(pool, "broken-ledger", base_name=base.name)
    try:
        target = Connection(
            host=pool.settings.public_host,
            port=b.port,
            database=b.database,
            user=b.user,
            password=b.password,
        )

        def read_ledger() -> list[object]:
            # No files: applying only reads the ledger (and makes it when missing).
            return list(
                migrations.apply_files(
                    migrations.RunOptions(target=target, timeout=60),
                    Path("/"),
                    [],
                    psql=Path("psql"),
                    skip_recorded=True,
                )
            )

        assert read_ledger() == []
        with psycopg.connect(**target.connect_kwargs(), autocommit=True) as conn:
            # what a careless migration could do to the ledger it cannot see
            conn.execute("DROP TABLE pgoverlay_ledger.migrations")
            conn.execute("CREATE TABLE pgoverlay_ledger.migrations (name text PRIMARY KEY)")
        with pytest.raises(MigrationError) as caught:
            read_ledger()
        assert caught.value.exit_code == 21
        message = str(caught.value)
        assert message.startswith(
            "cannot read the migration ledger (pgoverlay_ledger.migrations) of database app on "
            f'port {b.port}: column "checksum" does not exist; '
        )
        assert "reset the branch" in message
        assert b.password not in message
    finally:
        branch.destroy(pool, "broken-ledger")


class _OldService(BaseHTTPRequestHandler):
    """A service of another release: its connection answer lacks fields this client needs."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps({"host": "127.0.0.1", "port": 5432, "secret": "pw-of-the-branch"})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def test_an_answer_that_does_not_fit_the_protocol_is_a_service_error(tmp_path: Path) -> None:
    path = tmp_path / "engine.sock"
    server = socketserver.UnixStreamServer(os.fspath(path), _OldService)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(ServiceError) as caught:
            RemoteEngine(path, timeout=30).connection("pr-1")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert caught.value.exit_code == 30
    message = str(caught.value)
    assert message.startswith(
        "the engine service's answer (Connection) does not fit its protocol: database: "
        "missing; restart the service"
    )
    assert "pw-of-the-branch" not in message
