"""Branch behaviour against real Postgres servers on real OverlayFS mounts."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from pathlib import Path

import psycopg
import pytest

from helpers import Undo, assert_no_leaks, postgres_processes_for, server_pid
from pgoverlay.errors import BranchExistsError, BranchMissingError, InvalidNameError
from pgoverlay.runner import branch
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool, gc
from pgoverlay.runner.pool.registry import BaseVersion

pytestmark = pytest.mark.usefixtures("runtime")


def connect(pool: Pool, name: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(
        **branch.connection(pool, branch.get(pool, name)).connect_kwargs(), autocommit=True
    )


def tree_digest(root: Path) -> dict[str, str]:
    digests = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            digests[os.fspath(path.relative_to(root))] = hashlib.sha256(
                path.read_bytes()
            ).hexdigest()
    return digests


def test_branch_serves_the_base_data_over_tcp_with_its_password(
    pool: Pool, base: BaseVersion
) -> None:
    b = branch.create(pool, "serve", base_name=base.name)
    try:
        assert b.state == "ready"
        with connect(pool, "serve") as conn:
            assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (200000,)
            assert conn.execute("SHOW recovery_init_sync_method").fetchone() == ("syncfs",)
            assert conn.execute("SHOW archive_mode").fetchone() == ("off",)
        wrong = {**branch.connection(pool, b).connect_kwargs(), "password": "not-the-password"}
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(**wrong)
        data = branch.layout(pool, "serve").data
        assert (os.stat(data).st_mode & 0o777) == 0o700
        pid = server_pid(pool, "serve")
        owner = Path(f"/proc/{pid}").stat().st_uid
        assert owner == pool.owner.uid and owner != 0, "Postgres must not run as root"
        assert os.getsid(pid) == pid, "Postgres must run in its own session"
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert b.password.encode() not in cmdline
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b.password.encode() not in environ
        assert b.password not in branch.layout(pool, "serve").log_file.read_text()
    finally:
        branch.destroy(pool, "serve")


def test_base_files_are_unchanged_after_branches_write_heavily(
    pool: Pool, base: BaseVersion, undo: Undo
) -> None:
    undo.branch("heavy-a", "heavy-b")
    store = pool.store_dir(base.name, base.version)
    before = tree_digest(store)
    for name in ("heavy-a", "heavy-b"):
        branch.create(pool, name, base_name=base.name)
        with connect(pool, name) as conn:
            conn.execute("UPDATE accounts SET balance = balance + 1")
            conn.execute("DELETE FROM accounts WHERE id % 3 = 0")
            conn.execute("VACUUM FULL accounts")
            conn.execute(
                "CREATE TABLE scratch AS "
                "SELECT g AS id, md5(g::text) FROM generate_series(1, 100000) g"
            )
            conn.execute("CREATE INDEX ON scratch (md5)")
            conn.execute("CHECKPOINT")
    branch.reset(pool, "heavy-a")
    branch.destroy(pool, "heavy-a")
    branch.destroy(pool, "heavy-b")
    assert tree_digest(store) == before


def test_base_is_read_only_even_for_root(pool: Pool, base: BaseVersion) -> None:
    target = pool.base_dir(base.name, base.version) / "PG_VERSION"
    with pytest.raises(OSError) as caught:
        os.open(target, os.O_WRONLY)
    assert caught.value.errno == errno.EROFS


def test_two_branches_see_only_their_own_writes(pool: Pool, base: BaseVersion) -> None:
    branch.create(pool, "iso-a", base_name=base.name)
    branch.create(pool, "iso-b", base_name=base.name)
    try:
        with connect(pool, "iso-a") as a, connect(pool, "iso-b") as b:
            a.execute("UPDATE accounts SET owner = 'changed in a' WHERE id = 1")
            b.execute("CREATE TABLE only_in_b (x int)")
            assert b.execute("SELECT owner FROM accounts WHERE id = 1").fetchone() == ("owner 1",)
            assert a.execute("SELECT to_regclass('only_in_b')").fetchone() == (None,)
            assert a.execute("SELECT owner FROM accounts WHERE id = 1").fetchone() == (
                "changed in a",
            )
    finally:
        branch.destroy(pool, "iso-a")
        branch.destroy(pool, "iso-b")


def test_reset_discards_writes_but_keeps_port_and_password(pool: Pool, base: BaseVersion) -> None:
    created = branch.create(pool, "resettable", base_name=base.name)
    try:
        with connect(pool, "resettable") as conn:
            conn.execute("DROP TABLE accounts")
        after = branch.reset(pool, "resettable")
        assert (after.port, after.password) == (created.port, created.password)
        with connect(pool, "resettable") as conn:
            assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (200000,)
    finally:
        branch.destroy(pool, "resettable")


def test_a_base_prepared_for_another_login_role_still_gives_branches_theirs(
    pool: Pool, base: BaseVersion
) -> None:
    """PGOVERLAY_BRANCH_USER changed after the base was seeded: the fast password path finds no
    such role, and the role is made in full."""
    other = Pool.open(pool.settings.replace(branch_user="renamed_login"))
    try:
        made = branch.create(other, "renamed-role", base_name=base.name)
        assert made.user == "renamed_login"
        with psycopg.connect(**branch.connection(other, made).connect_kwargs()) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("renamed_login",)
            assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (200000,)
    finally:
        branch.destroy(other, "renamed-role")
        other.close()


def test_layer_sizes_are_small_after_create_and_reads_add_no_physical_bytes(
    pool: Pool, base: BaseVersion
) -> None:
    branch.create(pool, "sizes", base_name=base.name)
    try:
        fresh = branch.layer_size(pool, "sizes")
        assert fresh.physical_bytes <= 1024 * 1024
        with connect(pool, "sizes") as conn:
            conn.execute("SELECT sum(balance) FROM accounts").fetchone()
        os.sync()
        read = branch.layer_size(pool, "sizes")
        table_bytes = 200000 * 40  # the heap alone is larger than this
        assert read.logical_bytes > fresh.logical_bytes + table_bytes / 2, "the read copied up"
        assert read.physical_bytes - fresh.physical_bytes < 1024 * 1024, "copy-up was not a clone"
        with connect(pool, "sizes") as conn:
            conn.execute("UPDATE accounts SET balance = 0")
            conn.execute("CHECKPOINT")
        os.sync()
        assert (
            branch.layer_size(pool, "sizes").physical_bytes > read.physical_bytes + table_bytes / 2
        )
    finally:
        branch.destroy(pool, "sizes")


def test_destroy_is_idempotent_and_leaves_nothing(
    pool: Pool, base: BaseVersion, undo: Undo
) -> None:
    undo.branch("gone")
    b = branch.create(pool, "gone", base_name=base.name)
    assert branch.destroy(pool, "gone") is True
    assert branch.destroy(pool, "gone") is False
    assert_no_leaks(pool, "gone", port=b.port)


def test_names_are_validated_and_unique(pool: Pool, base: BaseVersion) -> None:
    for bad in ("", "Upper", "-dash", "a" * 64, "semi;colon", "../up"):
        with pytest.raises(InvalidNameError):
            branch.create(pool, bad, base_name=base.name)
    branch.create(pool, "taken", base_name=base.name)
    try:
        with pytest.raises(BranchExistsError, match="already exists"):
            branch.create(pool, "taken", base_name=base.name)
    finally:
        branch.destroy(pool, "taken")
    with pytest.raises(BranchMissingError):
        branch.reset(pool, "never-made")


def test_gc_restarts_a_ready_branch_whose_server_died(pool: Pool, base: BaseVersion) -> None:
    b = branch.create(pool, "phoenix", base_name=base.name)
    try:
        lay = branch.layout(pool, "phoenix")
        os.kill(server_pid(pool, "phoenix"), 9)
        for pid in postgres_processes_for(lay.root):
            # a child of the killed postmaster may end between the listing and the kill
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        # A local server is seen dead at once; Docker notes a container's death a moment later.
        wait_for(lambda: not branch.status(pool, "phoenix").running, timeout=30, what="death")
        report = gc.collect(pool)
        assert report.restarted == ["phoenix"]
        with connect(pool, "phoenix") as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert branch.get(pool, "phoenix").password == b.password
    finally:
        branch.destroy(pool, "phoenix")


def test_gc_reaps_an_expired_branch(pool: Pool, base: BaseVersion, undo: Undo) -> None:
    undo.branch("short-lived")
    b = branch.create(pool, "short-lived", ttl_seconds=60, base_name=base.name)
    report = gc.collect(pool, now=b.created_at + 61)
    assert report.expired == ["short-lived"]
    assert_no_leaks(pool, "short-lived", port=b.port)


def test_branch_login_is_not_a_superuser_but_can_migrate_the_owners_tables(
    pool: Pool, base: BaseVersion
) -> None:
    branch.create(pool, "deployer", base_name=base.name)
    try:
        with connect(pool, "deployer") as conn:
            assert conn.execute(
                "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
            ).fetchone() == (False,)
            conn.execute("ALTER TABLE accounts ADD COLUMN note text")
            conn.execute("CREATE INDEX accounts_note ON accounts (note)")
            conn.execute("CREATE TABLE new_table (id int)")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("COPY (SELECT 1) TO PROGRAM 'true'")
    finally:
        branch.destroy(pool, "deployer")
