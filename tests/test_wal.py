"""How bases and branches write WAL: the segment size a base is prepared with, the settings a
branch runs with, and what a branch's first writes cost in its layer (real servers, reflink
pool)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import as_engine, remove_base, source_dsn
from pgoverlay.runner import branch, seed
from pgoverlay.runner.branch import conf as branchconf
from pgoverlay.runner.branch import lookup
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.settings import Settings

MiB = 1024 * 1024


def show(pool: Pool, made: Branch, base: BaseVersion, names: list[str]) -> dict[str, str]:
    with as_engine(pool, made, base) as conn:
        return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]


def segments(pg_wal: Path) -> list[Path]:
    return [p for p in pg_wal.iterdir() if p.is_file() and len(p.name) == 24]


def test_the_shipped_wal_configuration_is_the_measured_one() -> None:
    """docs/benchmarks.md ("wal") chose these; changing one is a decision to measure again."""
    s = Settings()
    assert (s.wal_segsize_mb, s.wal_init_zero, s.wal_recycle) == (16, True, False)
    assert (s.max_wal_size, s.checkpoint_timeout) == ("512MB", "5min")


@pytest.mark.parametrize(
    ("min_wal_size", "segment", "expected"),
    [
        ("16MB", 1 * MiB, "16MB"),  # a base prepared with 1 MiB segments: two fit
        ("16MB", 16 * MiB, "32MB"),  # Postgres refuses to start below two segments
        ("16MB", 64 * MiB, "128MB"),
        ("1GB", 16 * MiB, "1GB"),
        ("80", 16 * MiB, "80"),  # a bare number is in MB, as Postgres reads it
        ("16MB", None, "16MB"),  # no segment to look at: left as set
    ],
)
def test_min_wal_size_is_raised_to_two_segments_of_the_base(
    min_wal_size: str, segment: int | None, expected: str
) -> None:
    options = branchconf.wal_options(Settings(min_wal_size=min_wal_size), segment)
    assert options["min_wal_size"] == expected


def test_wal_options_follow_the_settings() -> None:
    options = branchconf.wal_options(
        Settings(
            wal_init_zero=True, wal_recycle=True, max_wal_size="2GB", checkpoint_timeout="30min"
        ),
        16 * MiB,
    )
    assert options == {
        "min_wal_size": "32MB",
        "max_wal_size": "2GB",
        "wal_init_zero": "on",
        "wal_recycle": "on",
        "checkpoint_timeout": "30min",
    }


def test_a_branch_runs_with_the_pools_wal_settings_on_a_base_of_its_segment_size(
    pool: Pool, base: BaseVersion
) -> None:
    store = pool.base_dir(base.name, base.version)
    assert {p.stat().st_size for p in segments(store / "pg_wal")} == {16 * MiB}
    assert branchconf.wal_segment_bytes(store) == 16 * MiB
    made = branch.create(pool, "wal-settings", base_name=base.name)
    try:
        s = pool.settings
        assert show(
            pool,
            made,
            base,
            ["wal_segment_size", "wal_init_zero", "wal_recycle", "min_wal_size", "max_wal_size"],
        ) == {
            "wal_segment_size": "16MB",
            "wal_init_zero": "on" if s.wal_init_zero else "off",
            "wal_recycle": "on" if s.wal_recycle else "off",
            "min_wal_size": "32MB",  # 16MB set, two segments needed
            "max_wal_size": "512MB",
        }
        imposed = {o.name: o.branch_value for o in lookup.overrides(pool, "wal-settings")}
        assert imposed["wal_recycle"] == "off"
        assert "wal_init_zero" not in imposed  # Postgres's default: not an override
    finally:
        branch.destroy(pool, "wal-settings")


def test_a_base_keeps_the_segment_size_it_was_prepared_with(
    pool: Pool, source: cluster.Running
) -> None:
    """Bases prepared before the default changed (1 MiB) still make branches that start."""
    pool.settings.wal_segsize_mb = 1
    try:
        old = seed.seed(pool, "wal-one-mib", source_dsn=source_dsn(source))
    finally:
        pool.settings.wal_segsize_mb = Settings().wal_segsize_mb
    try:
        made = branch.create(pool, "wal-old-base", base_name="wal-one-mib")
        names = ["wal_segment_size", "min_wal_size"]
        assert show(pool, made, old, names) == {"wal_segment_size": "1MB", "min_wal_size": "16MB"}
    finally:
        remove_base(pool, old)


def test_a_branchs_whole_wal_segment_is_a_clone_and_a_small_write_costs_far_less(
    pool: Pool, base: BaseVersion
) -> None:
    """Create writes WAL (the branch's password), so the base's 16 MiB segment is copied up:
    logically whole, physically a reflink clone. A small write then adds a few blocks, not a
    segment: it stays in that segment, and copy-up clones share the base's blocks."""
    made = branch.create(pool, "wal-small-write", base_name=base.name)
    try:
        os.sync()
        fresh = branch.layer_size(pool, "wal-small-write")
        upper_wal = branch.layout(pool, "wal-small-write").upper / "pg_wal"
        assert [p.stat().st_size for p in segments(upper_wal)] == [16 * MiB]
        assert fresh.logical_bytes >= 16 * MiB
        assert fresh.physical_bytes <= 1 * MiB
        with as_engine(pool, made, base) as conn:
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id <= 100")
            conn.execute("CHECKPOINT")
        os.sync()
        after = branch.layer_size(pool, "wal-small-write")
        assert after.physical_bytes - fresh.physical_bytes < 2 * MiB
    finally:
        branch.destroy(pool, "wal-small-write")
