"""Apply masking rules inside a base while it is prepared, so that no original value is left in
its files.

Runtime-independent: everything here talks to the base through a superuser connection given by
the caller (a local server or a container), except :func:`finish`, which looks at the data
directory after the clean shutdown.

What happens, in order (docs/engine.md, "Masked bases"):

1. the rules are checked against the database's catalog (the same check runs against the source
   before anything is copied);
2. the masking functions are created in the session's temporary schema, so they vanish with the
   session; the fakes and hashes are keyed with a random per-seed key that only this process's
   memory and the session hold (it travels as a bound parameter, never in SQL text);
3. with triggers and foreign-key checks off (``session_replication_role = replica``): tables are
   truncated, and each masked table is updated once, all its masked columns together;
4. the free SQL runs last, normally (triggers on); the tables it updated or deleted from are
   found in ``pg_stat_xact_all_tables`` before each statement commits;
5. materialized views that read a masked table are refreshed; every masked or touched table is
   rewritten with ``VACUUM FULL`` (heap, TOAST and indexes: dead row versions and free space that
   hold old bytes are not carried over); their statistics rows are deleted and recomputed by
   ``ANALYZE`` from the masked data, then ``pg_statistic`` and ``pg_statistic_ext_data`` are
   rewritten too, since their dead rows still hold the old values;
6. after the clean shutdown (:func:`finish`): every file those relations had before is gone, and
   the cumulative statistics files and any server log inside the data directory are removed. The
   caller's ``pg_resetwal`` then drops the WAL that carried the old values.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgoverlay.errors import MaskError, UnsafePathError
from pgoverlay.runner import safefs
from pgoverlay.runner.mask.functions import FUNCTIONS
from pgoverlay.runner.mask.rules import ColumnRule, QualifiedName, Rules
from pgoverlay.runner.mask.schema import Column, Table, catalog, check
from pgoverlay.runner.postgres.sqlerror import reason

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[Any, ...]]
Connect = Callable[[str], Connection]  # database name -> a superuser connection to it

_KEPT_DATABASES = ("template0", "template1", "postgres")


@dataclass
class Masked:
    """What :func:`apply` did; :func:`finish` checks and completes it after the shutdown."""

    old_files: list[str] = field(default_factory=list)  # relative to the data directory
    log_directory: str = ""
    tables_masked: int = 0
    tables_truncated: int = 0
    tables_rewritten: int = 0


# -- applying ----------------------------------------------------------------------------------


def apply(conn: Connection, rules: Rules, *, rules_name: str, statement_timeout: float) -> Masked:
    """Mask the connected database (superuser, autocommit); see the module's docstring."""
    if not conn.autocommit:
        raise ValueError("masking needs an autocommit connection (VACUUM cannot run in one)")
    conn.execute(
        "SELECT set_config('statement_timeout', %s, false)", (f"{int(statement_timeout)}s",)
    )
    check(conn, rules, rules_name=rules_name, where="the base")
    for statement in FUNCTIONS:
        conn.execute(statement.encode())
    key = secrets.token_bytes(32)
    masked = Masked(log_directory=_setting(conn, "log_directory"))
    found = catalog(conn, [*rules.columns(), *rules.truncated()])
    truncated = [found[n].oid for n in rules.truncated()]
    updated = [found[n].oid for n in rules.columns()]
    # Before anything changes: the files that hold original values now.
    masked.old_files += _files(conn, [*truncated, *updated])
    conn.execute("SET session_replication_role = replica")  # no triggers, no FK actions
    try:
        if truncated:
            _run(conn, sql.SQL("TRUNCATE {}").format(_names(conn, truncated)), what="truncate")
            masked.tables_truncated = len(truncated)
        for name, columns in rules.columns().items():
            _run(conn, *_update(name, columns, found[name], key), what=f"mask {name}")
        masked.tables_masked = len(updated)
    finally:
        conn.execute("RESET session_replication_role")
    touched = set(updated)
    for statement in rules.sql:
        touched |= _run_free_sql(conn, statement)
    touched -= set(truncated)
    masked.old_files += _files(conn, sorted(touched - set(updated)))
    for oid, view in _dependent_matviews(conn, [*truncated, *touched]):
        masked.old_files += _files(conn, [oid])
        _run(conn, sql.SQL("REFRESH MATERIALIZED VIEW {}").format(view), what="refresh a view")
    leaves = _leaves(conn, sorted(touched))
    for relation in leaves:
        _run(conn, sql.SQL("VACUUM (FULL) {}").format(relation), what="rewrite a table")
    masked.tables_rewritten = len(leaves)
    _restat(conn, [*truncated, *touched], masked)
    log.info(
        "masked %s tables, truncated %s, rewrote %s",
        masked.tables_masked,
        masked.tables_truncated,
        masked.tables_rewritten,
    )
    return masked


def _update(
    name: QualifiedName, columns: dict[str, ColumnRule], table: Table, key: bytes
) -> tuple[sql.Composed, list[Any]]:
    assignments = []
    params: list[Any] = []
    for column, rule in columns.items():
        expression, args = _expression(rule, table.columns[column], key)
        assignments.append(sql.SQL("{} = {}").format(sql.Identifier(column), expression))
        params += args
    query = sql.SQL("UPDATE {} SET {}").format(
        sql.Identifier(name.schema, name.table), sql.SQL(", ").join(assignments)
    )
    return query, params


def _expression(rule: ColumnRule, col: Column, key: bytes) -> tuple[sql.Composable, list[Any]]:
    ident = sql.Identifier(col.name)
    if rule.strategy == "null":
        return sql.SQL("NULL"), []
    if rule.strategy == "value":
        return sql.SQL("%s"), [rule.argument]  # untyped: Postgres casts it to the column's type
    if rule.strategy == "fake":
        function = sql.Identifier("pg_temp", f"pgo_fake_{rule.argument}")
        return sql.SQL("{}({}::text, %s)").format(function, ident), [key]
    if rule.strategy == "hash":
        suffix = "_uuid" if col.type_name == "uuid" else ""
        function = sql.Identifier("pg_temp", f"pgo_hash{suffix}")
        return sql.SQL("{}({}::text, %s)").format(function, ident), [key]
    if rule.strategy == "truncate_date":
        if col.type_name == "date":
            return sql.SQL("date_trunc(%s, {}::timestamp)::date").format(ident), [rule.argument]
        return sql.SQL("date_trunc(%s, {})").format(ident), [rule.argument]
    # sql: the administrator's own expression; a literal % must not read as a placeholder.
    return sql.SQL("({})").format(sql.SQL((rule.argument or "").replace("%", "%%"))), []


def _run(
    conn: Connection, query: sql.Composed | sql.SQL, params: list[Any] | None = None, *, what: str
) -> None:
    try:
        conn.execute(query, params)
    except psycopg.Error as err:
        raise MaskError(f"masking failed ({what}): {reason(err)}") from None


def _run_free_sql(conn: Connection, statement: str) -> set[int]:
    """Run one free SQL step; return the tables it updated or deleted rows of."""
    first = " ".join(statement.split())[:60]
    try:
        with conn.transaction():
            conn.execute(statement.encode())
            rows = conn.execute(
                "SELECT relid FROM pg_stat_xact_all_tables "
                "WHERE n_tup_upd + n_tup_del > 0 "
                "AND schemaname NOT IN ('pg_catalog', 'information_schema') "
                "AND schemaname NOT LIKE 'pg_toast%%'"
            ).fetchall()
    except psycopg.Error as err:
        raise MaskError(f"masking failed (sql: {first}): {reason(err)}") from None
    return {int(r[0]) for r in rows}


def _names(conn: Connection, oids: list[int]) -> sql.Composed:
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN unnest(%s::oid[]) WITH ORDINALITY AS w(oid, i) ON w.oid = c.oid ORDER BY w.i",
        (oids,),
    ).fetchall()
    return sql.SQL(", ").join(sql.Identifier(str(n), str(r)) for n, r in rows)


_FAMILY = """
WITH RECURSIVE tree(oid) AS (
    SELECT unnest(%s::oid[])
    UNION
    SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid
), heaps AS (
    SELECT oid FROM tree
    UNION SELECT c.reltoastrelid FROM pg_class c JOIN tree USING (oid) WHERE c.reltoastrelid <> 0
)
SELECT oid FROM heaps
UNION SELECT x.indexrelid FROM pg_index x JOIN heaps h ON x.indrelid = h.oid
"""


def _family(conn: Connection, oids: list[int]) -> list[int]:
    """The relations, their partitions and inheritance children, TOAST tables and indexes."""
    if not oids:
        return []
    return sorted(int(r[0]) for r in conn.execute(_FAMILY, (oids,)))


def _files(conn: Connection, oids: list[int]) -> list[str]:
    family = _family(conn, oids)
    rows = conn.execute(
        "SELECT pg_relation_filepath(oid) FROM unnest(%s::oid[]) AS f(oid) "
        "WHERE pg_relation_filepath(oid) IS NOT NULL",
        (family,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def _leaves(conn: Connection, oids: list[int]) -> list[sql.Identifier]:
    """Tables with storage among ``oids`` and their descendants (partitions, children)."""
    family = _family(conn, oids)
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = ANY(%s::oid[]) AND c.relkind IN ('r', 'm') ORDER BY 1, 2",
        (family,),
    ).fetchall()
    return [sql.Identifier(str(n), str(r)) for n, r in rows]


def _dependent_matviews(conn: Connection, oids: list[int]) -> list[tuple[int, sql.Identifier]]:
    """Populated materialized views that read any of ``oids``, directly or through views,
    in an order that refreshes a view before the views built on it."""
    if not oids:
        return []
    rows = conn.execute(
        """
        WITH RECURSIVE deps(oid, depth) AS (
            SELECT unnest(%s::oid[]), 0
            UNION ALL
            SELECT r.ev_class, deps.depth + 1
            FROM deps
            JOIN pg_depend d ON d.refobjid = deps.oid AND d.refclassid = 'pg_class'::regclass
                            AND d.classid = 'pg_rewrite'::regclass
            JOIN pg_rewrite r ON r.oid = d.objid
            WHERE r.ev_class <> deps.oid AND deps.depth < 32
        )
        SELECT c.oid, n.nspname, c.relname, max(deps.depth)
        FROM deps JOIN pg_class c USING (oid) JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relkind = 'm' AND c.relispopulated
        GROUP BY 1, 2, 3 ORDER BY 4, 2, 3
        """,
        (_family(conn, oids),),
    ).fetchall()
    return [(int(o), sql.Identifier(str(n), str(r))) for o, n, r, _ in rows]


def _restat(conn: Connection, oids: list[int], masked: Masked) -> None:
    """Replace the statistics of ``oids`` with statistics of the masked data, leaving no old
    statistics row behind (not even a dead one)."""
    family = _family(conn, oids)
    _run(
        conn,
        sql.SQL("DELETE FROM pg_statistic WHERE starelid = ANY(%s::oid[])"),
        [family],
        what="clear statistics",
    )
    _run(
        conn,
        sql.SQL(
            "DELETE FROM pg_statistic_ext_data WHERE stxoid IN "
            "(SELECT oid FROM pg_statistic_ext WHERE stxrelid = ANY(%s::oid[]))"
        ),
        [family],
        what="clear extended statistics",
    )
    if oids:
        _run(conn, sql.SQL("ANALYZE {}").format(_names(conn, sorted(set(oids)))), what="analyze")
    catalogs = [
        int(r[0])
        for r in conn.execute(
            "SELECT oid FROM pg_class WHERE oid IN "
            "('pg_catalog.pg_statistic'::regclass, 'pg_catalog.pg_statistic_ext_data'::regclass)"
        )
    ]
    masked.old_files += _files(conn, catalogs)
    for name in ("pg_statistic", "pg_statistic_ext_data"):
        target = sql.Identifier("pg_catalog", name)
        _run(conn, sql.SQL("VACUUM (FULL) {}").format(target), what=f"rewrite {name}")


def _setting(conn: Connection, name: str) -> str:
    row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    return str(row[0]) if row else ""


# -- other databases -----------------------------------------------------------------------------


def drop_other_databases(conn: Connection, connect: Connect, *, keep: str) -> list[str]:
    """A masked base holds only the database its rules cover: drop the others. ``postgres`` and
    the templates stay (tools expect them), so they must not hold tables of their own."""
    names = [
        str(r[0])
        for r in conn.execute("SELECT datname FROM pg_database ORDER BY datname")
        if str(r[0]) not in (keep, *_KEPT_DATABASES)
    ]
    for kept in ("postgres", "template1"):
        if kept != keep:
            _refuse_tables(connect, kept, keep)
    for name in names:
        _run(conn, sql.SQL("DROP DATABASE {}").format(sql.Identifier(name)), what=f"drop {name}")
    return names


def _refuse_tables(connect: Connect, database: str, served: str) -> None:
    with connect(database) as conn:
        rows = conn.execute(
            """
            SELECT n.nspname || '.' || c.relname FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE c.relkind IN ('r', 'p', 'm') AND c.relpersistence <> 't'
              AND n.nspname NOT IN ('pg_catalog', 'information_schema')
              AND n.nspname NOT LIKE 'pg_toast%%'
              AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                              AND d.objid = c.oid AND d.deptype = 'e')
            ORDER BY 1 LIMIT 3
            """
        ).fetchall()
    if rows:
        raise MaskError(
            f"database {database} in the source holds tables ({', '.join(str(r[0]) for r in rows)}"
            f"), which rules for database {served} cannot mask: move them out of {database} in "
            f"the source, or seed with --via dump, which copies only {served}"
        )


# -- after the clean shutdown ----------------------------------------------------------------------


def finish(datadir: Path, masked: Masked) -> None:
    """Check no old relation file survived, and remove other copies of values from the files:
    cumulative statistics (they may hold query texts, e.g. pg_stat_statements) and server logs
    written inside the data directory (error messages quote values)."""
    left = [path for path in masked.old_files if _relation_files(datadir / path)]
    if left:
        raise MaskError(
            f"{len(left)} file(s) of masked tables (e.g. {left[0]}) are still in the base after "
            "its clean shutdown; the base was not kept: report this as a bug"
        )
    # The copy is the Postgres user's: no link in it is followed (safefs).
    for name in ("pg_stat", "pg_stat_tmp"):
        _empty(datadir, name)
    (datadir / "current_logfiles").unlink(missing_ok=True)
    if masked.log_directory and not Path(masked.log_directory).is_absolute():
        logs = os.path.normpath(masked.log_directory)
        if logs != "." and not logs.startswith(".."):
            _empty(datadir, logs)


def _relation_files(path: Path) -> list[Path]:
    """The main file of a relation and its segments and forks (``16384.1``, ``16384_fsm``)."""
    found = [path] if path.exists() else []
    return found + [*path.parent.glob(f"{path.name}.*"), *path.parent.glob(f"{path.name}_*")]


def _empty(datadir: Path, relative: str) -> None:
    """Remove everything in directory ``datadir/relative``, reached through no link."""
    try:
        with safefs.dir_under(datadir, relative) as fd:
            safefs.empty_fd(fd)
    except (FileNotFoundError, NotADirectoryError, UnsafePathError):
        return
