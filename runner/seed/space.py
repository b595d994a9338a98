"""Will a seed fit in the pool? Estimated before anything is copied, from the source's sizes and
the masking rules, and compared with the pool's free space.

What a seed occupies at its peak (measured in docs/benchmarks.md, "mask"):

- the copy: every database of the source (``pg_basebackup`` copies the cluster), and the WAL it
  streams meanwhile, a small part;
- masking, one table after the other (two at a time only where the pool has room for both
  beyond this estimate, runner/mask/__init__.py): a table rewritten in one pass (``ALTER TABLE
  … USING``) has its new files beside its old ones until it commits, so the largest such table
  is added once; a table that is updated instead (a view reads a masked column) or that the free SQL
  writes is updated (its rows twice, and WAL up to the masking server's ``max_wal_size``) and
  then rewritten by ``VACUUM FULL``: twice its size and that WAL.

:func:`estimate` is pure arithmetic on what :func:`measure` reads from the source.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from pgoverlay.errors import PoolFullError
from pgoverlay.runner.names import SOURCE_MARK
from pgoverlay.runner.units import format_bytes, memory_bytes

if TYPE_CHECKING:  # masking's rules (pydantic) are imported only to mask
    from pgoverlay.runner.mask.rules import QualifiedName, Rules

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[Any, ...]]

# Beyond the databases' own size: the catalog work of preparing, sort files of index builds, and
# the WAL the copy brings and the preparing server keeps, which grow with the copy (an unmasked
# seed of a 1.1 GiB database peaked at 1.2x it, docs/benchmarks.md "mask").
MARGIN = 64 << 20
MARGIN_SHARE = 0.15


@dataclass(frozen=True)
class Table:
    name: QualifiedName
    size_bytes: int  # heap, TOAST and indexes, with its partitions
    viewed: bool  # a view or rule reads a masked column: it is updated, not rewritten in one pass


@dataclass(frozen=True)
class Sizes:
    """What the source holds, as far as the seed's space goes."""

    cluster_bytes: int  # every database
    database_bytes: int  # the DSN's database: what a dump restores
    masked: list[Table]  # the rules' tables (not the truncated ones)
    tables: dict[QualifiedName, int]  # every table of the rules' database, for the free SQL


@dataclass(frozen=True)
class Estimate:
    copy_bytes: int
    masking_bytes: int
    peak_table: str  # the table that sets masking's peak, and why; "" without masking

    @property
    def total(self) -> int:
        return self.copy_bytes + self.masking_bytes + MARGIN + int(self.copy_bytes * MARGIN_SHARE)


def written_by_sql(statements: list[str], tables: dict[QualifiedName, int]) -> list[QualifiedName]:
    """Tables whose name appears, as a word, in the free SQL: what it may update or delete from
    (and then rewrite). A guess on the safe side: a table merely read counts too."""
    text = " ".join(statements).lower()
    words = set(re.findall(r"[a-z_][a-z0-9_$]*", text))
    return [name for name in tables if name.table.lower() in words]


def estimate(sizes: Sizes, rules: Rules | None, *, dump: bool = False) -> Estimate:
    """The pool space a seed of ``sizes`` needs at its peak, masked with ``rules``; a ``dump``
    restores the DSN's database only."""
    copy = sizes.database_bytes if dump else sizes.cluster_bytes
    if rules is None:
        return Estimate(copy_bytes=copy, masking_bytes=0, peak_table="")
    from pgoverlay.runner.mask import SERVER_OPTIONS

    # An update also writes WAL, up to the masking server's max_wal_size before it is recycled.
    wal = memory_bytes("max_wal_size", SERVER_OPTIONS["max_wal_size"]) or 0
    costs: dict[QualifiedName, tuple[int, str]] = {}
    for table in sizes.masked:
        if table.viewed:
            why = "updated, then rewritten: a view reads it"
            costs[table.name] = (2 * table.size_bytes + wal, why)
        else:
            costs[table.name] = (table.size_bytes, "rewritten in one pass")
    for name in written_by_sql(rules.sql, sizes.tables):
        costs[name] = (2 * sizes.tables[name] + wal, "written by the free SQL, then rewritten")
    if not costs:
        return Estimate(copy_bytes=copy, masking_bytes=0, peak_table="")
    name, (peak, why) = max(costs.items(), key=lambda item: item[1][0])
    return Estimate(
        copy_bytes=copy,
        masking_bytes=peak,
        peak_table=f"{name}, {format_bytes(sizes.tables.get(name, 0))}, {why}",
    )


def check(found: Estimate, *, free_bytes: int, base: str) -> None:
    """Refuse, before copying, a seed that would not fit in ``free_bytes``."""
    if found.total <= free_bytes:
        return
    parts = [f"the copy {format_bytes(found.copy_bytes)}"]
    if found.masking_bytes:
        parts.append(
            f"masking {format_bytes(found.masking_bytes)} at its peak ({found.peak_table})"
        )
    raise PoolFullError(
        f"seeding base {base} needs about {format_bytes(found.total)} in the pool "
        f"({'; '.join(parts)}), but the pool has {format_bytes(free_bytes)} free: remove bases "
        "or branches you no longer need (`pgoverlay seed list`, `pgoverlay seed rm NAME`), or "
        "put the pool on a larger disk (docs/engine.md, 'When the pool is full'); nothing was "
        "copied"
    )


_TABLES = (
    SOURCE_MARK
    + """
SELECT n.nspname, c.relname,
       CASE WHEN c.relkind = 'p'
            THEN (SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint
                  FROM pg_partition_tree(c.oid) t)
            ELSE pg_total_relation_size(c.oid) END
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'm') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
"""
)
# Masked columns (by table and name) that a view or rule reads: ALTER TABLE refuses those.
_VIEWED = (
    SOURCE_MARK
    + """
SELECT DISTINCT n.nspname, c.relname
FROM pg_depend d
JOIN pg_class c ON c.oid = d.refobjid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = d.refobjsubid
JOIN unnest(%s::text[], %s::text[], %s::text[]) AS w(nsp, rel, col)
  ON w.nsp = n.nspname AND w.rel = c.relname AND w.col = a.attname
WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
"""
)


def measure(conn: Connection, rules: Rules | None) -> Sizes | None:
    """The source's sizes, over a connection to the rules' database; None when the role may
    not read them (the seed then goes ahead unchecked, as before)."""
    try:
        row = conn.execute(
            SOURCE_MARK + "SELECT sum(pg_database_size(oid))::bigint, "
            "pg_database_size(current_database()) FROM pg_database "
            "WHERE has_database_privilege(oid, 'CONNECT')"
        ).fetchone()
        cluster_bytes, database_bytes = (int(row[0] or 0), int(row[1] or 0)) if row else (0, 0)
        if rules is None:
            return Sizes(cluster_bytes, database_bytes, masked=[], tables={})
        from pgoverlay.runner.mask.rules import QualifiedName

        tables = {QualifiedName(str(n), str(r)): int(size) for n, r, size in conn.execute(_TABLES)}
        wanted = [(t, c) for t, columns in rules.columns().items() for c in columns]
        viewed = {
            QualifiedName(str(n), str(r))
            for n, r in conn.execute(
                _VIEWED,
                (
                    [t.schema for t, _ in wanted],
                    [t.table for t, _ in wanted],
                    [c for _, c in wanted],
                ),
            )
        }
    except psycopg.Error as err:
        log.warning("cannot measure the source to check the pool's space first: %s", err)
        return None
    masked = [Table(name, tables.get(name, 0), name in viewed) for name in rules.columns()]
    return Sizes(cluster_bytes, database_bytes, masked=masked, tables=tables)
