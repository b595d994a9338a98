"""The parts of a warm claim that need no server: the SCRAM verifier computed without libpq,
the password handed out with it, and the registry's transactions that skip the disk's flush."""

from __future__ import annotations

import base64
import secrets
import sqlite3
from pathlib import Path

import pytest
from psycopg import pq

from pgoverlay.runner.branch import primed
from pgoverlay.runner.pool.registry import Registry
from pgoverlay.runner.postgres import roles


def _libpq_verifier(password: str) -> str:
    """libpq's own verifier of ``password`` (a connection that never connected will do)."""
    conn = pq.PGconn.connect_start(b"host=/nonexistent")
    try:
        return conn.encrypt_password(password.encode(), b"anyone", b"scram-sha-256").decode()
    finally:
        conn.finish()


def _salt(verifier: str) -> bytes:
    return base64.b64decode(verifier.split("$")[1].split(":")[1])


def test_the_verifier_is_libpqs_for_the_same_salt() -> None:
    for _ in range(5):
        password = secrets.token_urlsafe(24)
        expected = _libpq_verifier(password)
        assert roles.scram_verifier(password, salt=_salt(expected)) == expected
        assert roles.scram_verifier(password).startswith("SCRAM-SHA-256$4096:")


@pytest.mark.parametrize("password", ["", "pass word", "pässword", "a:b"])
def test_the_verifier_refuses_passwords_saslprep_could_change(password: str) -> None:
    with pytest.raises(ValueError):
        roles.scram_verifier(password)


def test_each_password_is_new_and_comes_with_its_own_verifier() -> None:
    pairs = [primed.password() for _ in range(4)]
    assert len({p for p, _ in pairs}) == 4
    for password, secret in pairs:
        verifier = secret.result(timeout=30)
        assert roles.scram_verifier(password, salt=_salt(verifier)) == verifier


def test_a_transaction_that_is_not_durable_commits_and_leaves_the_next_one_durable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "registry.db"
    registry = Registry(path)
    try:
        with registry.transaction(durable=False) as db:
            db.execute("INSERT INTO warm_targets VALUES ('app', 'local', 2)")
        assert registry._db.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL again
        with pytest.raises(RuntimeError), registry.transaction(durable=False) as db:
            db.execute("INSERT INTO warm_targets VALUES ('other', 'local', 1)")
            raise RuntimeError("undo")
        assert registry._db.execute("PRAGMA synchronous").fetchone() == (2,)
        # another connection (another process) sees the first commit, not the rolled back one
        with sqlite3.connect(path) as other:
            rows = other.execute("SELECT base_name, count FROM warm_targets").fetchall()
        assert rows == [("app", 2)]
    finally:
        registry.close()
