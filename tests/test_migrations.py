"""Migration selection, statement positions, error-to-line mapping, and applying for real."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
import pytest

from pgoverlay.action import migrations
from pgoverlay.action.migrations import needs_no_transaction, parse_psql_error, statements
from pgoverlay.errors import MigrationError
from pgoverlay.runner import branch
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.service.views import Connection

FILE = """-- add a column
ALTER TABLE accounts ADD COLUMN memo text;

/* a block comment
   over two lines */
SELECT id,
       nosuchcol
  FROM accounts;
CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$;
"""


def test_statements_know_where_psql_starts_and_ends_them() -> None:
    found = [(s.start_line, s.end_line) for s in statements(FILE)]
    # A leading -- comment is not sent by psql; a block comment is.
    assert found == [(2, 2), (4, 8), (9, 9)]


def test_a_psql_error_maps_to_the_line_in_the_file() -> None:
    stderr = (
        'psql:db/migrations/002_x.sql:8: ERROR:  column "nosuchcol" does not exist\n'
        "LINE 4:        nosuchcol\n"
        "               ^\n"
        'HINT:  Perhaps you meant to reference the column "accounts.note".\n'
    )
    error = parse_psql_error(stderr, FILE)
    assert error is not None
    assert (error.file, error.line) == ("db/migrations/002_x.sql", 7)
    assert error.message.startswith('column "nosuchcol" does not exist')
    assert "HINT:" in error.message


def test_an_error_without_a_position_points_at_the_statement() -> None:
    stderr = 'psql:m.sql:2: ERROR:  relation "accounts" does not exist\n'
    error = parse_psql_error(stderr, FILE)
    assert error is not None and error.line == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("CREATE INDEX CONCURRENTLY i ON t (a);", True),
        ("create unique index concurrently i on t (a);", True),
        ("-- CONCURRENTLY in a comment\nCREATE INDEX i ON t (a);", False),
        ("SELECT 'VACUUM';", False),
        ("VACUUM ANALYZE t;", True),
        ("BEGIN;\nUPDATE t SET a = 1;\nCOMMIT;", True),
        ("ALTER TABLE t ADD COLUMN b int;", False),
        ("REINDEX TABLE CONCURRENTLY t;", True),
    ],
)
def test_files_that_cannot_run_in_a_transaction_are_recognised(text: str, expected: bool) -> None:
    assert needs_no_transaction(text) is expected


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.com",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.com",
            "PATH": "/usr/bin:/bin",
        },
    ).stdout.strip()


def test_only_files_the_pr_adds_or_changes_are_selected_in_lexical_order(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "db" / "migrations").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "db/migrations/001_old.sql").write_text("SELECT 1;\n")
    (repo / "db/migrations/002_edited.sql").write_text("SELECT 2;\n")
    (repo / "db/migrations/003_deleted.sql").write_text("SELECT 3;\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-qb", "feature")
    (repo / "db/migrations/002_edited.sql").write_text("SELECT 22;\n")
    (repo / "db/migrations/003_deleted.sql").unlink()
    (repo / "db/migrations/010_new.sql").write_text("SELECT 10;\n")
    (repo / "db/migrations/009_new.sql").write_text("SELECT 9;\n")
    (repo / "db/migrations/notes.md").write_text("not sql\n")
    (repo / "elsewhere.sql").write_text("SELECT 0;\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "feature")
    head = git(repo, "rev-parse", "HEAD")
    assert migrations.changed_files(repo, "db/migrations", base_sha=base, head_sha=head) == [
        "db/migrations/002_edited.sql",
        "db/migrations/009_new.sql",
        "db/migrations/010_new.sql",
    ]
    assert migrations.all_files(repo, "db/migrations") == [
        "db/migrations/001_old.sql",
        "db/migrations/002_edited.sql",
        "db/migrations/009_new.sql",
        "db/migrations/010_new.sql",
    ]
    with pytest.raises(MigrationError, match="fetch-depth: 0"):
        migrations.changed_files(repo, "db/migrations", base_sha="0" * 40, head_sha=head)
    with pytest.raises(MigrationError, match="does not exist"):
        migrations.all_files(repo, "no/such/folder")


def test_a_migration_runs_in_the_environment_its_options_make() -> None:
    """psql gets the branch's libpq variables; the migrate command also DATABASE_URL, without
    our application name. The password travels in these environments only."""
    target = Connection(host="127.0.0.1", port=5433, database="shop", user="u", password="p w")
    options = migrations.RunOptions(target=target, timeout=60)
    psql = options.child_env()
    assert psql == target.libpq_env() and psql["PGPASSWORD"] == "p w"
    assert "DATABASE_URL" not in psql
    command = options.child_env(command=True)
    assert command["DATABASE_URL"] == "postgresql://u:p%20w@127.0.0.1:5433/shop"
    assert "PGAPPNAME" not in command
    assert {k: v for k, v in psql.items() if k != "PGAPPNAME"}.items() <= command.items()


def target_for(pool: Pool, name: str) -> Connection:
    return branch.connection(pool, branch.get(pool, name))


def test_apply_files_on_a_real_branch_stops_at_the_failure_with_its_line(
    pool: Pool, base: BaseVersion, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (repo / "m/001_ok.sql").write_text("ALTER TABLE accounts ADD COLUMN note text;\n")
    (repo / "m/002_concurrent.sql").write_text(
        "CREATE INDEX CONCURRENTLY acc_note ON accounts (note);\n"
    )
    (repo / "m/003_bad.sql").write_text(FILE)
    (repo / "m/004_never.sql").write_text("CREATE TABLE never (x int);\n")
    files = migrations.all_files(repo, "m")
    branch.create(pool, "migrating", base_name=base.name)
    try:
        target = target_for(pool, "migrating")
        psql = pgbin.for_major(15).tool("psql")
        results = migrations.apply_files(
            migrations.RunOptions(target=target, timeout=60),
            repo,
            files,
            psql=psql,
            skip_recorded=True,
        )
        assert [r.status for r in results] == ["applied", "applied", "failed", "not run"]
        failed = results[2]
        assert (failed.file, failed.line) == ("m/003_bad.sql", 7)
        assert "nosuchcol" in failed.error
        assert target.password not in failed.error
        with psycopg.connect(**target.connect_kwargs()) as conn:
            # The failing file ran in one transaction: its first statement is rolled back too.
            assert conn.execute(
                "SELECT count(*) FROM information_schema.columns WHERE column_name = 'note'"
            ).fetchone() == (1,)
            assert conn.execute(
                "SELECT count(*) FROM information_schema.columns WHERE column_name = 'memo'"
            ).fetchone() == (0,)
            assert conn.execute("SELECT to_regclass('acc_note') IS NOT NULL").fetchone() == (True,)
            assert conn.execute("SELECT to_regclass('never')").fetchone() == (None,)
            ledger = conn.execute("SELECT name FROM pgoverlay_ledger.migrations ORDER BY 1")
            assert [r[0] for r in ledger] == ["m/001_ok.sql", "m/002_concurrent.sql"]
        # A second run skips what is recorded and refuses an edited, already-applied file.
        (repo / "m/003_bad.sql").write_text("SELECT 1;\n")
        again = migrations.apply_files(
            migrations.RunOptions(target=target, timeout=60),
            repo,
            files,
            psql=psql,
            skip_recorded=True,
        )
        assert [r.status for r in again] == ["skipped", "skipped", "applied", "applied"]
        (repo / "m/001_ok.sql").write_text("SELECT 'edited';\n")
        edited = migrations.apply_files(
            migrations.RunOptions(target=target, timeout=60),
            repo,
            files,
            psql=psql,
            skip_recorded=True,
        )
        assert edited[0].status == "failed" and "changed after it was applied" in edited[0].error
    finally:
        branch.destroy(pool, "migrating")


def test_a_migrate_command_sees_the_branch_in_its_environment(
    pool: Pool, base: BaseVersion, tmp_path: Path
) -> None:
    branch.create(pool, "by-command", base_name=base.name)
    try:
        target = target_for(pool, "by-command")
        ok = migrations.run_command(
            migrations.RunOptions(target=target, timeout=60),
            'psql "$DATABASE_URL" -c "CREATE TABLE made_by_tool (x int)" && '
            'psql -c "INSERT INTO made_by_tool VALUES (1)"',
            cwd=tmp_path,
        )
        assert ok.status == "applied", ok.error
        bad = migrations.run_command(
            migrations.RunOptions(target=target, timeout=60),
            'echo "using $PGPASSWORD"; exit 3',
            cwd=tmp_path,
        )
        assert bad.status == "failed"
        assert target.password not in bad.error and "using ***" in bad.error
        with psycopg.connect(**target.connect_kwargs()) as conn:
            assert conn.execute("SELECT count(*) FROM made_by_tool").fetchone() == (1,)
    finally:
        branch.destroy(pool, "by-command")


def test_sql_files_run_as_the_owner_of_the_checkout_not_as_root(
    pool: Pool, base: BaseVersion
) -> None:
    import os
    import pwd
    import shutil
    import tempfile

    from pgoverlay.action.sandbox import AsUser
    from pgoverlay.runner.proc import OsUser

    nobody = pwd.getpwnam("nobody")
    repo = Path(tempfile.mkdtemp(prefix="pgoverlay-checkout-", dir="/var/tmp"))
    try:
        (repo / "m").mkdir()
        (repo / "m/001_escape.sql").write_text("\\! id -u > whoami.txt\nSELECT 1;\n")
        for path in (repo, repo / "m", repo / "m/001_escape.sql"):
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
        branch.create(pool, "unprivileged", base_name=base.name)
        target = target_for(pool, "unprivileged")
        runs = migrations.apply_files(
            migrations.RunOptions(target=target, timeout=60, sandbox=AsUser(OsUser.owner_of(repo))),
            repo,
            ["m/001_escape.sql"],
            psql=pgbin.for_major(15).tool("psql"),
            skip_recorded=True,
        )
        assert [r.status for r in runs] == ["applied"], runs
        assert (repo / "whoami.txt").read_text().strip() == str(nobody.pw_uid)
        command = migrations.run_command(
            migrations.RunOptions(target=target, timeout=60, sandbox=AsUser(OsUser.owner_of(repo))),
            "id -u > by-command.txt",
            cwd=repo,
        )
        assert command.status == "applied", command.error
        assert (repo / "by-command.txt").read_text().strip() == str(nobody.pw_uid)
    finally:
        branch.destroy(pool, "unprivileged")
        shutil.rmtree(repo, ignore_errors=True)


def test_connection_details_never_show_their_password_in_a_repr() -> None:
    from pgoverlay.runner.seed import Source

    target = Connection(host="h", port=1, user="u", password="s3cret-pw", database="d")
    source = Source.parse("host=db user=replicator dbname=app").using(password="s3cret-pw")
    assert "s3cret-pw" not in repr(target) + repr(source) + source.conninfo
    assert source.env == {"PGPASSWORD": "s3cret-pw"}
