"""A branch's record: JSON its owner keeps with it, which the engine stores, bounds and removes
with the branch but never reads; the PR workflow's fields are action/record.py's. Pure: a
registry file in a temporary folder, no pool."""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from pgoverlay.action import record
from pgoverlay.action.report import MigrationRun, Report
from pgoverlay.errors import RequestError
from pgoverlay.runner.pool.registry import Branch, Registry, StoredRecord
from pgoverlay.runner.service.models import MAX_RECORD_BYTES, RecordRequest
from pgoverlay.runner.service.views import Record as RecordView

HEAD = "c" * 40


def registry_with_branches(path: Path, *names: str) -> Registry:
    reg = Registry(path)
    version = reg.add_base_version("prod", source="host=x", via="basebackup")
    with reg.transaction() as db:
        for port, name in enumerate(names, start=6000):
            reg.insert_branch(
                db,
                Branch(
                    name=name,
                    base_name="prod",
                    base_version=version,
                    state="ready",
                    step="",
                    port=port,
                    runtime="local",
                    user="u",
                    password="p",
                    database="app",
                    created_at=time.time(),
                    ready_at=time.time(),
                    expires_at=None,
                ),
            )
    return reg


def a_report(status: str = "ready") -> Report:
    return Report(
        repository="acme/shop",
        pr=5,
        branch_name="shop-pr-5",
        head_sha=HEAD,
        status=status,  # type: ignore[arg-type]
        branch=None,
        migrations=[MigrationRun("db/001.sql", "applied", 0.5)],
    )


def test_the_workflows_record_reads_back_what_it_wrote_and_nothing_else() -> None:
    mine = record.PrRecord(HEAD, "ready", a_report())
    assert record.loads(record.dumps(mine)) == mine
    # Someone else's JSON in the record is no record of the workflow's: its work is redone.
    assert record.read(RecordView(data='{"note": "mine"}', updated_at=0.0)) is None
    assert record.read(None) is None


def test_a_record_must_be_json_and_is_bounded_in_bytes_not_characters() -> None:
    RecordRequest(data=json.dumps({"x": "y" * 1000}))
    with pytest.raises(RequestError, match="not JSON"):
        RecordRequest(data="{not json")
    # Two bytes a character: within the limit in characters, over it in bytes.
    wide = json.dumps("é" * (MAX_RECORD_BYTES // 2), ensure_ascii=False)
    assert len(wide) <= MAX_RECORD_BYTES < len(wide.encode())
    with pytest.raises(RequestError, match=f"at most {MAX_RECORD_BYTES}"):
        RecordRequest(data=wide)
    with pytest.raises(RequestError):
        RecordRequest(data="1" * (MAX_RECORD_BYTES + 1))


def test_a_record_lives_and_dies_with_its_branch(tmp_path: Path) -> None:
    reg = registry_with_branches(tmp_path / "registry.db", "shop-pr-5")
    try:
        assert reg.save_record(StoredRecord("shop-pr-5", '{"a": 1}', 1.0))
        assert reg.save_record(StoredRecord("shop-pr-5", '{"a": 2}', 2.0))  # replaced, not added
        assert reg.record("shop-pr-5") == StoredRecord("shop-pr-5", '{"a": 2}', 2.0)
        assert not reg.save_record(StoredRecord("gone", "{}", 1.0))  # no branch, nothing kept
        reg.delete_branch("shop-pr-5")
        assert reg.record("shop-pr-5") is None
        with closing(sqlite3.connect(tmp_path / "registry.db")) as db:
            assert db.execute("SELECT count(*) FROM records").fetchone() == (0,)
    finally:
        reg.close()


def test_an_older_registrys_pr_records_are_moved_and_its_old_tables_dropped(
    tmp_path: Path,
) -> None:
    path = tmp_path / "registry.db"
    registry_with_branches(path, "shop-pr-5", "blog-pr-2").close()
    old_report = json.dumps(
        {
            "repository": "acme/shop",
            "pr": 5,
            "branch_name": "shop-pr-5",
            "head_sha": HEAD,
            "status": "migration failed",
            "branch": None,
            "migrations": [
                {"name": "db/001.sql", "status": "failed", "seconds": 0.1, "error": "boom"}
            ],
            "message": "",
            "merged": None,
            "password_hint": "",
            "run_url": "",
        },
        sort_keys=True,
    )
    with closing(sqlite3.connect(path)) as db, db:  # as the two releases before left it
        db.execute("PRAGMA foreign_keys = ON")
        db.execute(
            "CREATE TABLE pr_record (branch TEXT PRIMARY KEY REFERENCES branches (name)"
            " ON DELETE CASCADE, head_sha TEXT NOT NULL, status TEXT NOT NULL,"
            " report TEXT NOT NULL, updated_at REAL NOT NULL)"
        )
        db.execute(
            "CREATE TABLE pr_state (repository TEXT NOT NULL, branch TEXT NOT NULL, pr INTEGER,"
            " head_sha TEXT NOT NULL, status TEXT NOT NULL, report TEXT NOT NULL,"
            " updated_at REAL NOT NULL, PRIMARY KEY (repository, branch))"
        )
        db.execute(
            "INSERT INTO pr_record VALUES ('shop-pr-5', ?, 'migration failed', ?, 12.5)",
            (HEAD, old_report),
        )
        db.execute(
            "INSERT INTO pr_record VALUES ('blog-pr-2', ?, 'ready', 'not json', 3.0)", (HEAD,)
        )
        db.execute(
            "INSERT INTO pr_state VALUES ('acme/shop', 'shop-pr-5', 5, ?, 'ready', '{}', 1.0)",
            (HEAD,),
        )
    reg = Registry(path)
    try:
        moved = reg.record("shop-pr-5")
        assert moved is not None and moved.updated_at == 12.5
        last = record.loads(moved.data)
        assert (last.head_sha, last.status) == (HEAD, "migration failed")
        assert last.report.migrations == [MigrationRun("db/001.sql", "failed", 0.1, error="boom")]
        assert reg.record("blog-pr-2") is None  # unreadable: left behind, the branch redone
        with closing(sqlite3.connect(path)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        assert "pr_record" not in tables and "pr_state" not in tables
        reg.delete_branch("shop-pr-5")
        assert reg.record("shop-pr-5") is None  # the moved record still dies with its branch
    finally:
        reg.close()
    Registry(path).close()  # opening it again finds nothing to move
