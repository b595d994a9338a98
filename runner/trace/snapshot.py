"""Snapshots of the branch's relations, and what changed between two of them.

Every relation of the branch's own schemas is kept (not pg_catalog, information_schema or a
session's temporary schema; TOAST tables with the table they belong to, indexes with their
table), with its storage (filenode, size of the main fork) and pg_stat_all_tables' counters.
A backend sends its statistics when it exits: a mark first waits, briefly, for the role's
backends that started since the previous mark to end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgoverlay.errors import TimeoutExpiredError
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.service.views import STAT_COUNTERS, RelationState

FLUSH_WAIT = 2.0  # seconds a mark waits for the role's new backends to exit

# OIDs from 16384 (FirstNormalObjectId) on: what initdb made (the catalogs' own TOAST tables
# in pg_toast, information_schema) is older. {counters}: STAT_COUNTERS, each COALESCE(s.x, 0).
RELATIONS = """
SELECT c.oid, n.nspname, c.relname, c.relkind,
       CASE WHEN c.relkind IN ('i', 'I') THEN i.indrelid
            WHEN c.relkind = 't' THEN (SELECT o.oid FROM pg_catalog.pg_class o
                                         WHERE o.reltoastrelid = c.oid LIMIT 1) END,
       COALESCE(pg_catalog.pg_relation_filenode(c.oid), 0),
       CASE WHEN c.relkind IN ('r', 'p', 'i', 'I', 'm', 'S', 't')
            THEN COALESCE(pg_catalog.pg_relation_size(c.oid), 0) ELSE 0 END,
       {counters}
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_catalog.pg_index i ON i.indexrelid = c.oid
  LEFT JOIN pg_catalog.pg_stat_all_tables s ON s.relid = c.oid
 WHERE c.oid >= 16384::pg_catalog.oid
   AND n.nspname NOT IN ('pg_catalog', 'information_schema')
   AND n.nspname !~ '^pg_(toast_)?temp_'
 ORDER BY c.oid
"""

NEW_BACKENDS = """
SELECT count(*) FROM pg_catalog.pg_stat_activity
 WHERE usename = %s AND backend_type = 'client backend'
   AND datname = pg_catalog.current_database()
   AND backend_start >= pg_catalog.to_timestamp(%s)
"""


@dataclass(frozen=True)
class Taken:
    """One snapshot: the server's time, its WAL position, and the relations by oid."""

    at: float
    wal_lsn: int
    relations: dict[int, RelationState]


def wait_for_exits(conn: psycopg.Connection[Any], *, user: str, since: float) -> bool:
    """Wait (at most ``FLUSH_WAIT`` s) until no backend of ``user`` that started at or after
    ``since`` (server clock) runs; False if some still do. Then drop the session's cached
    statistics, so the snapshot reads what the exited backends sent."""
    try:
        wait_for(
            lambda: conn.execute(NEW_BACKENDS, (user, since)).fetchone() == (0,),
            timeout=FLUSH_WAIT,
            what="the branch role's sessions to end",
            first_interval=0.01,
            max_interval=0.1,
        )
        ended = True
    except TimeoutExpiredError:
        ended = False
    conn.execute("SELECT pg_catalog.pg_stat_clear_snapshot()")
    return ended


def _relations() -> sql.Composed:
    counters = sql.SQL(", ").join(
        sql.SQL("COALESCE({}, 0)").format(sql.Identifier("s", counter)) for counter in STAT_COUNTERS
    )
    return sql.SQL(RELATIONS).format(counters=counters)


def take(conn: psycopg.Connection[Any]) -> Taken:
    """Every relation of the branch's schemas, the WAL position and the server's time."""
    with conn.transaction():
        at, lsn = conn.execute(
            "SELECT pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()), "
            "(pg_catalog.pg_current_wal_lsn() - '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8"
        ).fetchone() or (0, 0)
        rows = conn.execute(_relations()).fetchall()
    relations = {}
    for oid, schema, name, kind, table, filenode, size, *counters in rows:
        relations[int(oid)] = RelationState(
            oid=int(oid),
            schema_name=str(schema),
            name=str(name),
            kind=str(kind),
            table_oid=int(table) if table is not None else None,
            filenode=int(filenode),
            bytes=int(size),
            **{counter: int(value) for counter, value in zip(STAT_COUNTERS, counters, strict=True)},
        )
    return Taken(at=float(at), wal_lsn=int(lsn), relations=relations)


def changes(
    before: dict[int, RelationState] | None, now: dict[int, RelationState]
) -> tuple[list[RelationState], list[int]]:
    """Relations new or changed since ``before`` (all of them without one), and the oids of
    those gone."""
    if before is None:
        return list(now.values()), []
    changed = [r for oid, r in now.items() if before.get(oid) != r]
    dropped = sorted(oid for oid in before if oid not in now)
    return changed, dropped
