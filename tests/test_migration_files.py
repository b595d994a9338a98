"""Migration files are read safely: a pull request's links, FIFOs, devices, directories and huge
files fail that file with a clear error, quickly, and never show what lies outside the checkout.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgoverlay.action import migrations
from pgoverlay.action.comment import render_comment
from pgoverlay.action.report import MigrationRun, Report
from pgoverlay.action.sandbox import AsUser
from pgoverlay.errors import MigrationError, UnsafeFileError
from pgoverlay.runner import branch
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.proc import OsUser
from pgoverlay.runner.service.views import Connection


@pytest.fixture
def checkout() -> Iterator[Path]:
    """A checkout owned by `nobody`, as the runner user owns a job's checkout."""
    repo = Path(tempfile.mkdtemp(prefix="pgoverlay-checkout-", dir="/var/tmp"))
    nobody = pwd.getpwnam("nobody")
    os.chown(repo, nobody.pw_uid, nobody.pw_gid)
    yield repo
    shutil.rmtree(repo, ignore_errors=True)


@pytest.fixture
def outside() -> Iterator[tuple[Path, str]]:
    """A root-only file outside every checkout, and its secret content."""
    content = f"root-only-{secrets.token_hex(12)}"
    fd, name = tempfile.mkstemp(prefix="pgoverlay-outside-", dir="/var/tmp")  # 0600, root's
    with os.fdopen(fd, "w") as handle:
        handle.write(f"SELECT '{content}';\n")
    yield Path(name), content
    Path(name).unlink(missing_ok=True)


def _plant(kind: str, path: Path, outside: Path) -> None:
    if kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "link out of the checkout":
        path.symlink_to(outside)
    elif kind == "directory":
        path.mkdir()
        (path / "inner.txt").write_text("SELECT 1;\n")
    elif kind == "oversized":
        with path.open("wb") as handle:  # sparse: no disk is used
            handle.truncate(migrations.MAX_FILE_BYTES + 1)
    else:
        raise AssertionError(kind)


KINDS: dict[str, str] = {
    "link to /dev/zero": "leads out of the checkout",
    "FIFO": "is a FIFO",
    "link out of the checkout": "leads out of the checkout",
    "directory": "is a directory",
    "oversized": "more than the 67108864 bytes allowed",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_file_that_is_not_a_regular_file_in_the_checkout_is_refused_unread(
    checkout: Path, outside: tuple[Path, str], kind: str
) -> None:
    (checkout / "m").mkdir()
    _plant(kind, checkout / "m/002_bad.sql", outside[0])
    listed = migrations.all_files(checkout, "m")
    assert listed == ["m/002_bad.sql"], "the bad entry is listed, to be reported, not skipped"
    with pytest.raises(UnsafeFileError, match=KINDS[kind]) as caught:
        migrations.read_migration(checkout, "m/002_bad.sql")
    assert "m/002_bad.sql" in str(caught.value)
    assert outside[1] not in str(caught.value)


def test_a_link_inside_the_checkout_is_followed_and_a_folder_out_of_it_refused(
    checkout: Path, outside: tuple[Path, str]
) -> None:
    (checkout / "common").mkdir()
    (checkout / "common/real.sql").write_text("SELECT 1;\r\n")
    (checkout / "m").mkdir()
    (checkout / "m/001_alias.sql").symlink_to("../common/real.sql")
    assert migrations.read_migration(checkout, "m/001_alias.sql") == "SELECT 1;\n"
    (checkout / "escape").symlink_to(outside[0].parent)
    with pytest.raises(MigrationError, match="leads out of the checkout"):
        migrations.all_files(checkout, "escape")
    with pytest.raises(MigrationError, match="leads out of the checkout"):
        migrations.all_files(checkout, "../")
    # A link to a folder under the migrations folder is not walked into.
    (checkout / "m/more").symlink_to(outside[0].parent, target_is_directory=True)
    assert migrations.all_files(checkout, "m") == ["m/001_alias.sql"]


def test_changed_between_counts_an_unreadable_file_as_changed(
    checkout: Path, outside: tuple[Path, str], tmp_path: Path
) -> None:
    base = tmp_path / "base"
    (base / "m").mkdir(parents=True)
    (base / "m/001.sql").write_text("SELECT 1;\n")
    (checkout / "m").mkdir()
    (checkout / "m/001.sql").write_text("SELECT 1;\n")
    os.mkfifo(checkout / "m/002.sql")
    (checkout / "m/003.sql").symlink_to(outside[0])
    assert migrations.changed_between(base, checkout, "m") == ["m/002.sql", "m/003.sql"]


def _target(pool: Pool, name: str) -> Connection:
    return branch.connection(pool, branch.get(pool, name))


@pytest.fixture(scope="module")
def hostile_branch(pool: Pool, base: BaseVersion) -> Iterator[Connection]:
    branch.create(pool, "hostile-files", base_name=base.name)
    try:
        yield _target(pool, "hostile-files")
    finally:
        branch.destroy(pool, "hostile-files")


def _comment(runs: list[MigrationRun]) -> str:
    return render_comment(
        Report(
            repository="o/r",
            pr=1,
            branch_name="hostile-files",
            head_sha="0" * 40,
            status="migration failed",
            branch=None,
            migrations=runs,
        )
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_hostile_file_fails_alone_after_the_good_files_are_applied(
    pool: Pool, hostile_branch: Connection, checkout: Path, outside: tuple[Path, str], kind: str
) -> None:
    folder = "m_" + kind.replace(" ", "_").replace("/", "_")
    (checkout / folder).mkdir()
    table = f"good_{secrets.token_hex(4)}"
    (checkout / folder / "001_good.sql").write_text(f"CREATE TABLE {table} (x int);\n")
    _plant(kind, checkout / folder / "002_bad.sql", outside[0])
    (checkout / folder / "003_after.sql").write_text("CREATE TABLE never_made (x int);\n")
    for path in [checkout / folder, *(checkout / folder).iterdir()]:
        os.lchown(path, pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid)
    files = migrations.all_files(checkout, folder)
    runs = migrations.apply_files(
        migrations.RunOptions(
            target=hostile_branch, timeout=30, sandbox=AsUser(OsUser.owner_of(checkout))
        ),
        checkout,
        files,
        psql=pgbin.for_major(15).tool("psql"),
        skip_recorded=True,
    )
    assert [(r.name.split("/")[-1], r.status) for r in runs] == [
        ("001_good.sql", "applied"),
        ("002_bad.sql", "failed"),
        ("003_after.sql", "not run"),
    ]
    assert KINDS[kind] in runs[1].error and runs[1].file == f"{folder}/002_bad.sql"
    body = _comment(runs)
    assert outside[1] not in body and KINDS[kind] in body
    with psycopg.connect(**hostile_branch.connect_kwargs()) as conn:
        assert conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone() == (True,)
        assert conn.execute("SELECT to_regclass('never_made')").fetchone() == (None,)
