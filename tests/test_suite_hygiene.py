"""The suite's own hygiene, checked by running the suite's fixtures in a nested session: a base
a test leaves in the session pool, failing or passing, is gone before the next test, so one
failed clean-up cannot fail the tests after it (`several bases exist (app, wrongly-seeded)`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import checkout

from helpers import os_user, require_root, top_ports

TESTS = Path(__file__).resolve().parent

NESTED = """
from helpers import source_dsn
from pgoverlay.runner import branch, seed


def test_seeds_a_base_and_fails_before_removing_it(pool, source, base):
    seed.seed(pool, "wrongly-seeded", source_dsn=source_dsn(source))
    made = branch.create(pool, "on-wrongly-seeded", base_name="wrongly-seeded")
    assert made is None, "failed before removing what it made"


def test_a_later_test_finds_only_the_sessions_base(pool, base):
    assert [b.name for b in pool.registry.bases()] == [base.name]
    assert pool.registry.branch("on-wrongly-seeded") is None
    branch.create(pool, "names-no-base")  # the one base is taken: nothing else is left
    branch.destroy(pool, "names-no-base")


def test_passes_yet_leaves_a_base(pool, source, base):
    seed.seed(pool, "left-by-a-pass", source_dsn=source_dsn(source))


def test_that_base_is_gone_too(pool, base):
    assert [b.name for b in pool.registry.bases()] == [base.name]
"""


def test_a_base_a_test_leaves_behind_is_removed_before_the_next_test(tmp_path: Path) -> None:
    require_root()
    (tmp_path / "test_nested.py").write_text(NESTED)
    low, high = top_ports(70, 10)  # apart from this session's pools
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider"]
        + ["-q", "-rA", "-o", "pythonpath=", os.fspath(tmp_path / "test_nested.py")],
        env={
            **{k: v for k, v in os.environ.items() if k != "PGOVERLAY_TEST_DECOY_BASE"},
            "PYTHONPATH": os.fspath(TESTS),
            "PGOVERLAY_TEST_PORTS": f"{low}-{high}",
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    outcomes = {
        line.split()[1].rsplit("::", 1)[-1]: line.split()[0]
        for line in done.stdout.splitlines()
        if line.startswith(("PASSED ", "FAILED ", "ERROR "))
    }
    assert outcomes == {
        "test_seeds_a_base_and_fails_before_removing_it": "FAILED",
        "test_a_later_test_finds_only_the_sessions_base": "PASSED",
        "test_passes_yet_leaves_a_base": "ERROR",
        "test_that_base_is_gone_too": "PASSED",
    }, done.stdout[-5000:]
    assert "the test left bases behind (removed now): left-by-a-pass v1" in done.stdout


def test_the_users_the_tests_start_read_the_installed_copy_never_the_checkout() -> None:
    """Wherever the checkout lives, the tests run as a clone under /root does: another user
    cannot read the checkout's files (a test that runs them fails here, not only there), and
    reads the installed copy's (``checkout.readable()``)."""
    require_root()
    user = os_user("pgo-runner")

    def can_read(path: Path) -> bool:
        done = subprocess.run(
            ["test", "-r", os.fspath(path)], user=user.pw_uid, extra_groups=[], check=False
        )
        return done.returncode == 0

    assert checkout.installed_source() is not None, "the tests run the installed copy"
    assert not can_read(checkout.ROOT / "action" / "setup.sh")
    assert can_read(checkout.readable() / "action" / "setup.sh")
