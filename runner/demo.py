"""The demo: a throwaway local source with sample data, seeded like any other source, and a
branch with the example migrations applied."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgoverlay.runner import branch as branches
from pgoverlay.runner import cluster, demo_data, locks, pgbin, postmaster, seed
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.registry import BaseVersion, Branch
from pgoverlay.runner.sizes import LayerSize

DEFAULT_SCALE = 10
DEMO_OWNER = "shop_owner"


def source_dir(pool: Pool, name: str) -> Path:
    return pool.tmp / f"demo-source-{name}"


def seed_demo(
    pool: Pool,
    name: str = "demo",
    *,
    scale: int = DEFAULT_SCALE,
    refresh: bool = False,
    progress: seed.Progress | None = None,
) -> BaseVersion:
    """Build a local source with sample data, seed base ``name`` from it, throw the source away."""
    install = pgbin.newest(pool.settings.pg_bindir)
    work = source_dir(pool, name)
    cleanup_source(pool, name)
    work.mkdir(mode=0o700)
    os.chown(work, pool.owner.uid, pool.owner.gid)
    datadir = work / "data"
    try:
        cluster.initdb(install, datadir, owner=pool.owner)
        options = {
            "wal_level": "replica",
            "max_wal_senders": "4",
            "fsync": "off",
            "synchronous_commit": "off",
            "max_wal_size": "4GB",
        }
        with cluster.running(
            install, datadir, owner=pool.owner, scratch=pool.tmp, options=options
        ) as srv:
            # Like most production databases, the schema belongs to an application role, not
            # to a superuser: branch migrations run as a non-superuser member of that role.
            with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(DEMO_OWNER)))
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(demo_data.DEMO_DATABASE), sql.Identifier(DEMO_OWNER)
                    )
                )
            with psycopg.connect(
                **srv.conninfo(user="postgres", dbname=demo_data.DEMO_DATABASE), autocommit=True
            ) as conn:
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(DEMO_OWNER)))
                for statement in demo_data.demo_schema_sql() + demo_data.demo_data_sql(scale):
                    conn.execute(statement.encode())
                conn.execute("RESET ROLE")
                conn.execute("CHECKPOINT")
            dsn = make_conninfo(
                host=os.fspath(srv.socket_dir),
                port=srv.port,
                user="postgres",
                dbname=demo_data.DEMO_DATABASE,
            )
            return seed.seed(pool, name, source_dsn=dsn, refresh=refresh, progress=progress)
    finally:
        cleanup_source(pool, name)


def cleanup_source(pool: Pool, name: str) -> None:
    work = source_dir(pool, name)
    if work.exists():
        postmaster.stop(work / "data" / "postmaster.pid", timeout=pool.settings.stop_timeout)
        shutil.rmtree(work, ignore_errors=True)


def leftover_sources(pool: Pool) -> list[str]:
    """Names whose demo source a killed process left behind (and nobody is seeding now)."""
    return [
        p.name.removeprefix("demo-source-")
        for p in pool.tmp.glob("demo-source-*")
        if locks.is_free(pool.lock_path("seed", p.name.removeprefix("demo-source-")))
    ]


def example_migrations() -> Path:
    import pgoverlay.examples

    return Path(pgoverlay.examples.__file__).parent / "migrations"


@dataclass
class DemoRun:
    base: BaseVersion
    branch: Branch
    url: str
    layer: LayerSize
    migrations: list[tuple[str, str, float]]
    timings: dict[str, float] = field(default_factory=dict)


def run(
    pool: Pool,
    *,
    branch_name: str = "demo",
    base_name: str = "demo",
    scale: int = DEFAULT_SCALE,
    progress: seed.Progress | None = None,
) -> DemoRun:
    from pgoverlay.action import migrations

    timings: dict[str, float] = {}
    started = time.monotonic()
    base = pool.registry.latest_base(base_name)
    if base is None:
        base = seed_demo(pool, base_name, scale=scale, progress=progress)
        timings["seed demo base"] = time.monotonic() - started
    if pool.registry.branch(branch_name) is not None:
        mark = time.monotonic()
        branches.destroy(pool, branch_name)
        timings["destroy previous demo branch"] = time.monotonic() - mark
    mark = time.monotonic()
    branch = branches.create(pool, branch_name, base_name=base.name)
    timings["create branch"] = time.monotonic() - mark
    mark = time.monotonic()
    results = migrations.apply(
        branches.connect_kwargs(pool, branch), migrations.discover(example_migrations())
    )
    timings["apply migrations"] = time.monotonic() - mark
    return DemoRun(
        base=base,
        branch=branch,
        url=branches.url(pool, branch),
        layer=branches.layer_size(pool, branch_name),
        migrations=[
            (r.name, r.status if not r.error else f"{r.status}: {r.error}", r.seconds)
            for r in results
        ],
        timings=timings,
    )
