"""`pgoverlay demo`: the product's main job on sample data, on this machine.

Seeds the demo base if it is missing, creates a branch, applies the example migrations the way
the PR workflow applies a pull request's, and reports what each step took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pgoverlay.action import migrations
from pgoverlay.action.insight.model import Thresholds
from pgoverlay.action.insight.observe import Observer
from pgoverlay.action.report import MigrationRun
from pgoverlay.runner import branch as branches
from pgoverlay.runner import demo, seed
from pgoverlay.runner.branch.sizes import LayerSize
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.service.engine import LocalEngine

if TYPE_CHECKING:
    from pgoverlay.runner.mask import Progress as MaskProgress


def examples_dir() -> Path:
    import pgoverlay.examples

    return Path(pgoverlay.examples.__file__).parent


@dataclass
class DemoRun:
    base: BaseVersion
    branch: Branch
    layer: LayerSize
    migrations: list[MigrationRun]
    timings: dict[str, float] = field(default_factory=dict)


def run(
    pool: Pool,
    *,
    branch_name: str = "demo",
    base_name: str = "demo",
    scale: int = demo.DEFAULT_SCALE,
    progress: seed.Progress | None = None,
    mask: Path | None = None,
    mask_progress: MaskProgress | None = None,
) -> DemoRun:
    """The demo on base ``base_name``, seeded (masked by the rules file ``mask``) if it is
    missing, or if it is not masked and ``mask`` is given."""
    timings: dict[str, float] = {}
    started = time.monotonic()
    base = pool.registry.latest_base(base_name)
    if base is None or (mask is not None and not base.mask_sha256):
        base = demo.seed_demo(
            pool,
            base_name,
            scale=scale,
            progress=progress,
            mask=mask,
            mask_progress=mask_progress,
            refresh=base is not None,
        )
        timings["seed demo base"] = time.monotonic() - started
    if pool.registry.branch(branch_name) is not None:
        mark = time.monotonic()
        branches.destroy(pool, branch_name)
        timings["destroy previous demo branch"] = time.monotonic() - mark
    mark = time.monotonic()
    branch = branches.create(pool, branch_name, base_name=base.name)
    timings["create branch"] = time.monotonic() - mark
    mark = time.monotonic()
    repo = examples_dir()
    # Measured as a pull request's migrations are: locks, rewrites, scans, verdict.
    with Observer(
        LocalEngine(pool),
        branch.name,
        repository=None,
        thresholds=Thresholds(),
        pg_major=base.pg_major or 0,
        max_seconds=pool.settings.command_timeout * 3,
    ) as observer:
        results = migrations.apply_files(
            migrations.RunOptions(
                target=branches.connection(pool, branch),
                timeout=pool.settings.command_timeout,
                watcher=observer,
            ),
            repo,
            migrations.all_files(repo, "migrations"),
            psql=pgbin.for_major(base.pg_major or 0, pool.settings.pg_bindir).tool("psql"),
            skip_recorded=True,
        )
    timings["apply migrations"] = time.monotonic() - mark
    return DemoRun(
        base=base,
        branch=branch,
        layer=branches.layer_size(pool, branch),
        migrations=results,
        timings=timings,
    )
