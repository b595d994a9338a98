"""The demo: a throwaway local source with sample data, seeded like any other source, and a
branch with the example migrations applied."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgoverlay.errors import SeedError
from pgoverlay.runner import seed
from pgoverlay.runner.demo import data as demo_data
from pgoverlay.runner.pool import Pool, flocks
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster, postmaster, sqlerror

if TYPE_CHECKING:
    from pgoverlay.runner.mask import Progress as MaskProgress

DEFAULT_SCALE = 10
DEMO_OWNER = "shop_owner"


def source_dir(pool: Pool, name: str) -> Path:
    return pool.tmp / f"demo-source-{name}"


def masking_rules() -> Path:
    """The demo's masking rules (its customers' emails, names and phones), shipped with it."""
    import pgoverlay.examples

    return Path(pgoverlay.examples.__file__).parent / "masking-rules.yml"


def seed_demo(
    pool: Pool,
    name: str = "demo",
    *,
    scale: int = DEFAULT_SCALE,
    refresh: bool = False,
    progress: seed.Progress | None = None,
    mask: Path | None = None,
    mask_progress: MaskProgress | None = None,
) -> BaseVersion:
    """Build a local source with sample data, seed base ``name`` from it (masked by the rules
    file ``mask``, as a production source would be), throw the source away."""
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
            _fill(srv, scale=scale)
            dsn = make_conninfo(
                host=os.fspath(srv.socket_dir),
                port=srv.port,
                user="postgres",
                dbname=demo_data.DEMO_DATABASE,
            )
            return seed.seed(
                pool,
                name,
                source_dsn=dsn,
                refresh=refresh,
                progress=progress,
                mask=mask,
                mask_progress=mask_progress,
                workload_top=0,  # a sample made a moment ago: it has no workload to keep
            )
    finally:
        cleanup_source(pool, name)


def _fill(srv: cluster.Running, *, scale: int) -> None:
    """The demo's database, its owner and its rows, in the throwaway source."""
    with sqlerror.wrapped(
        SeedError,
        what="cannot fill the demo's source database",
        fix="run the demo seed again; if it fails again, `pgoverlay doctor` checks the Postgres "
        "installation it uses",
    ):
        # Like most production databases, the schema belongs to an application role, not to
        # a superuser: branch migrations run as a non-superuser member of that role.
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
        if flocks.is_free(pool.lock_path("seed", p.name.removeprefix("demo-source-")))
    ]
