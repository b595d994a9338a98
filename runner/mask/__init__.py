"""Apply masking rules inside a base while it is prepared, so that no original value is left in
its files.

Runtime-independent: everything here talks to the base through a superuser connection given by
the caller (a local server or a container), except :func:`finish`, which looks at the data
directory after the clean shutdown.

What happens, in order (docs/engine.md, "Masked bases"):

1. the rules are checked against the database's catalog (the same check runs against the source
   before anything is copied);
2. the fakes and hashes are SQL expressions (:mod:`pgoverlay.runner.mask.fakes`) keyed with a
   random per-seed key that only this process's memory and the session hold (it travels as a
   bound parameter of ``set_config``, never in SQL text);
3. with triggers and foreign-key checks off (``session_replication_role = replica``): tables are
   truncated, and each masked table is rewritten once, all its masked columns together, by
   ``ALTER TABLE … ALTER COLUMN … TYPE (its own type) USING (the rule)``: heap, TOAST and
   indexes are written anew with the masked values, and the old files are dropped at commit.
   Where Postgres refuses that (a view or rule reads the column, a partition named on its own),
   the table is updated instead and rewritten in step 5;
4. the free SQL runs last, normally (triggers on); the tables it updated or deleted from are
   found in ``pg_stat_xact_all_tables`` before each statement commits;
5. materialized views that read a masked table are refreshed; every updated or touched table is
   rewritten with ``VACUUM FULL`` (heap, TOAST and indexes: dead row versions and free space that
   hold old bytes are not carried over); statistics rows of the masked and touched tables are
   deleted and recomputed by ``ANALYZE`` from the masked data, then ``pg_statistic`` and
   ``pg_statistic_ext_data`` are rewritten too, since their dead rows still hold the old values;
6. after the clean shutdown (:func:`finish`): every file those relations had before is gone, and
   the cumulative statistics files and any server log inside the data directory are removed. The
   caller's ``pg_resetwal`` then drops the WAL that carried the old values.

The server runs with ``SERVER_OPTIONS`` meanwhile, so that rewrites are not also written to WAL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgoverlay.errors import MaskError, UnsafePathError
from pgoverlay.runner import safefs
from pgoverlay.runner.mask import fakes
from pgoverlay.runner.mask.rules import ColumnRule, QualifiedName, Rules
from pgoverlay.runner.mask.schema import Column, Table, catalog, check
from pgoverlay.runner.postgres.sqlerror import reason
from pgoverlay.runner.units import format_bytes

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[Any, ...]]
Connect = Callable[[str], Connection]  # database name -> a superuser connection to it

_KEPT_DATABASES = ("template0", "template1", "postgres")


# The preparing server of a masked base writes no WAL it does not need: the base is shut down
# cleanly and its WAL reset before any branch uses it, and a seed that fails midway removes the
# copy. With wal_level minimal a table rewritten in one transaction is written once (its new
# files are synced at commit) rather than also into WAL, and without full-page writes an UPDATE
# logs its rows, not whole pages.
# A small max_wal_size keeps the WAL of updates (the free SQL's, a table a view reads) from
# taking the pool's space: a checkpoint without full-page writes only writes the dirty buffers.
SERVER_OPTIONS = {
    "wal_level": "minimal",
    "max_wal_senders": "0",
    "full_page_writes": "off",
    "max_wal_size": "128MB",
    "min_wal_size": "32MB",
}

# Why ALTER TABLE may refuse to rewrite a table that an UPDATE can mask: a view, rule, policy,
# trigger definition or generated column uses the column (0A000), a partition or inheritance
# child named on its own (42P16), another object state (55xxx). The table is then updated.
_NOT_IN_ONE_PASS = ("0A", "42", "55")


@dataclass
class Masked:
    """What :func:`apply` did; :func:`finish` checks and completes it after the shutdown."""

    old_files: list[str] = field(default_factory=list)  # relative to the data directory
    log_directory: str = ""
    tables_masked: int = 0
    tables_truncated: int = 0
    tables_rewritten: int = 0  # by VACUUM FULL after an UPDATE
    tables_in_one_pass: int = 0  # rewritten with their masked values by ALTER TABLE


@dataclass(frozen=True)
class Step:
    """One step of masking, told to ``progress`` when it starts (``seconds`` None) and when it
    ends. ``total`` is the number of steps of the whole masking, the same in every step: what
    the updates and the free SQL leave to rewrite is done in the last step, with the
    statistics."""

    what: str  # "mask public.customers"
    index: int  # from 1
    total: int
    size_bytes: int  # of the table (heap, TOAST, indexes) before the step; 0 for other steps
    seconds: float | None = None
    how: str = ""  # once ended: "in one pass", "updated", ...


Progress = Callable[[Step], None]
LABEL_CHARS = 60  # a free SQL statement's label, at most: one line of a terminal with the count


def sql_label(statement: str) -> str:
    """A free SQL statement as a step's label: on one line, and cut with an ellipsis where it is
    longer than ``LABEL_CHARS`` (never silently, so a cut label is not read as the statement)."""
    text = " ".join(statement.split())
    if len(text) > LABEL_CHARS:
        text = text[: LABEL_CHARS - 1].rstrip() + "…"
    return f"sql: {text}"


class _Steps:
    """Steps may run two at a time (tables are masked side by side): a step starts as number
    ``done + 1`` and ends as the next number in the order steps end, so the ends are told
    1, 2, 3… whichever finishes first."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0
        self._lock = threading.Lock()

    def _tell(self, step: Step) -> None:
        if self.progress is not None:
            self.progress(step)

    @contextlib.contextmanager
    def step(self, what: str, *, size_bytes: int = 0) -> Iterator[list[str]]:
        """Time one step; the caller appends how it went to the list it is given."""
        how: list[str] = []
        with self._lock:
            self._tell(Step(what, self.done + 1, self.total, size_bytes))
        started = time.perf_counter()
        yield how
        took = time.perf_counter() - started
        with self._lock:
            self.done += 1
            self._tell(Step(what, self.done, self.total, size_bytes, took, ", ".join(how)))


# -- applying ----------------------------------------------------------------------------------


def apply(
    conn: Connection,
    rules: Rules,
    *,
    rules_name: str,
    statement_timeout: float,
    progress: Progress | None = None,
    lane: Callable[[], Connection] | None = None,
    datadir: Path | None = None,
) -> Masked:
    """Mask the connected database (superuser, autocommit); see the module's docstring.
    ``progress`` is told of each step as it starts and ends. ``lane`` opens one more
    connection to the same database: with it, tables are masked two at a time where the
    filesystem of ``datadir`` has room for both (see :func:`_mask_tables`)."""
    if not conn.autocommit:
        raise ValueError("masking needs an autocommit connection (VACUUM cannot run in one)")
    key = secrets.token_hex(32)
    _timeout(conn, statement_timeout)
    check(conn, rules, rules_name=rules_name, where="the base")
    _keyed(conn, key)
    try:
        return _apply(
            conn, rules, progress, _Lane(lane, key, statement_timeout, datadir) if lane else None
        )
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.execute("SELECT set_config(%s, '', false)", (fakes.KEY_SETTING,))


def _timeout(conn: Connection, statement_timeout: float) -> None:
    conn.execute(
        "SELECT set_config('statement_timeout', %s, false)", (f"{int(statement_timeout)}s",)
    )


def _keyed(conn: Connection, key: str) -> None:
    """Make the session able to compute the fakes: their function and the seed's key."""
    for statement in fakes.FUNCTIONS:
        conn.execute(statement.encode())
    # The key lives in the sessions' memory only; a bound parameter, never SQL text.
    conn.execute("SELECT set_config(%s, %s, false)", (fakes.KEY_SETTING, key))


@dataclass(frozen=True)
class _Lane:
    """How to open the second connection that masks tables beside the first."""

    connect: Callable[[], Connection]
    key: str
    statement_timeout: float
    datadir: Path | None

    @contextlib.contextmanager
    def open(self) -> Iterator[Connection]:
        """A session like the first one's; the key and the function go with it when it closes."""
        with self.connect() as conn:
            _timeout(conn, self.statement_timeout)
            _keyed(conn, self.key)
            conn.execute("SET session_replication_role = replica")
            yield conn


def _apply(conn: Connection, rules: Rules, progress: Progress | None, lane: _Lane | None) -> Masked:
    masked = Masked(log_directory=_setting(conn, "log_directory"))
    found = catalog(conn, [*rules.columns(), *rules.truncated()])
    truncated = [found[n].oid for n in rules.truncated()]
    updated = [found[n].oid for n in rules.columns()]
    # Before anything changes: the files that hold original values now.
    masked.old_files += _files(conn, [*truncated, *updated])
    sizes = _sizes(conn, updated)
    needs_rewrite: set[int] = set()
    conn.execute("SET session_replication_role = replica")  # no triggers, no FK actions
    keys = _foreign_keys(conn, {found[n].oid: set(c) for n, c in rules.columns().items()})
    # Every step is counted before the first starts, so the count a person reads never moves:
    # what the updates and the free SQL leave to rewrite is one last step with the statistics.
    steps = _Steps(
        progress,
        bool(truncated) + len(updated) + bool(keys) + len(rules.sql) + 1,
    )
    try:
        for key in keys:  # ALTER TABLE would check them before the other side is masked
            _run(conn, key.drop(), what=f"set foreign key {key.name} aside")
        if truncated:
            with steps.step(f"truncate {len(truncated)} table(s)"):
                _run(conn, sql.SQL("TRUNCATE {}").format(_names(conn, truncated)), what="truncate")
            masked.tables_truncated = len(truncated)
        for name, in_one_pass in _mask_tables(conn, lane, rules, found, sizes, steps).items():
            if in_one_pass:
                masked.tables_in_one_pass += 1
            else:
                needs_rewrite.add(found[name].oid)
        masked.tables_masked = len(updated)
        if keys:
            with steps.step(f"restore {len(keys)} foreign key(s)"):
                for key in keys:
                    _run(conn, key.add(), what=f"restore foreign key {key.name}")
    finally:
        conn.execute("RESET session_replication_role")
    touched: set[int] = set()
    for statement in rules.sql:
        with steps.step(sql_label(statement)):
            touched |= _run_free_sql(conn, statement)
    touched -= set(truncated)
    needs_rewrite |= touched
    masked.old_files += _files(conn, sorted(touched - set(updated)))
    views = _dependent_matviews(conn, [*truncated, *updated, *touched])
    for oid, _ in views:
        masked.old_files += _files(conn, [oid])
    leaves = _leaves(conn, sorted(needs_rewrite))
    rewrite_sizes = _sizes(conn, [oid for oid, _ in leaves])
    finish = [f"refresh {len(views)} view(s)"] if views else []
    finish += [f"rewrite {len(leaves)} table(s)"] if leaves else []
    with steps.step(
        ", ".join([*finish, "statistics"]), size_bytes=sum(rewrite_sizes.values())
    ) as how:
        for _, view in views:
            _run(conn, sql.SQL("REFRESH MATERIALIZED VIEW {}").format(view), what="refresh a view")
            how.append(f"refreshed {view.as_string(conn)}")
        for oid, relation in leaves:
            started = time.perf_counter()
            _run(conn, sql.SQL("VACUUM (FULL) {}").format(relation), what="rewrite a table")
            how.append(
                f"rewrote {relation.as_string(conn)} ({format_bytes(rewrite_sizes.get(oid, 0))}, "
                f"{time.perf_counter() - started:.1f} s)"
            )
        masked.tables_rewritten = len(leaves)
        _restat(conn, [*truncated, *updated, *touched], masked)
    log.info(
        "masked %s tables (%s in one pass), truncated %s, rewrote %s",
        masked.tables_masked,
        masked.tables_in_one_pass,
        masked.tables_truncated,
        masked.tables_rewritten,
    )
    return masked


def _mask_tables(
    conn: Connection,
    lane: _Lane | None,
    rules: Rules,
    found: dict[QualifiedName, Table],
    sizes: dict[int, int],
    steps: _Steps,
) -> dict[QualifiedName, bool]:
    """Mask each table of the rules; return whether each was rewritten in one pass.

    Masking a table runs in one backend, on one core. With a ``lane``, the tables are split in
    two (:func:`_lanes`) and the second part is masked on the lane's connection meanwhile,
    where the filesystem has room for the new files of both parts' largest tables at once
    (one after the other, only the largest is ever there twice: what the seed's space check
    counts, runner/seed/space.py). Otherwise one after the other, in the rules' order."""
    columns = rules.columns()

    def mask(c: Connection, name: QualifiedName) -> bool:
        table = found[name]
        with steps.step(f"mask {name}", size_bytes=sizes.get(table.oid, 0)) as how:
            in_one_pass = _rewrite(c, name, columns[name], table)
            how.append("rewritten in one pass" if in_one_pass else "updated (rewritten below)")
        return in_one_pass

    masked = {name: found[name] for name in columns}
    parts = _lanes(conn, masked, sizes) if lane is not None else []
    if lane is None or len(parts) < 2 or not _room_for_both(lane.datadir, parts, found, sizes):
        return {name: mask(conn, name) for name in columns}
    stop = threading.Event()

    def second(c: Connection) -> dict[QualifiedName, bool]:
        return {name: mask(c, name) for name in parts[1] if not stop.is_set()}

    with lane.open() as other, ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(second, other)
        try:
            done = {name: mask(conn, name) for name in parts[0]}
        except BaseException:
            stop.set()
            other.cancel()
            with contextlib.suppress(Exception):
                future.result()
            raise
        done.update(future.result())
    return {name: done[name] for name in columns}


# Tables linked by inheritance (a statement on a parent also locks its children) or by a foreign
# key left in place: masked in the same lane, so that two lanes never wait for each other.
_LINKS = """
WITH RECURSIVE up(oid, above) AS (
    SELECT o, o FROM unnest(%(oids)s::oid[]) AS o
    UNION
    SELECT up.oid, i.inhparent FROM up JOIN pg_inherits i ON i.inhrelid = up.above
)
SELECT oid, above FROM up WHERE oid <> above
UNION
SELECT conrelid, confrelid FROM pg_constraint
WHERE contype = 'f' AND conrelid = ANY(%(oids)s::oid[]) AND confrelid = ANY(%(oids)s::oid[])
"""


def _lanes(
    conn: Connection, found: dict[QualifiedName, Table], sizes: dict[int, int]
) -> list[list[QualifiedName]]:
    """The masked tables in two parts of about equal bytes, the largest linked group first;
    linked tables (``_LINKS``) stay in one part. Fewer parts when there are fewer groups."""
    group = {table.oid: table.oid for table in found.values()}

    def root(oid: int) -> int:
        while group.setdefault(oid, oid) != oid:
            oid = group[oid]
        return oid

    oids = [table.oid for table in found.values()]
    for a, b in conn.execute(_LINKS, {"oids": oids}).fetchall():
        group[root(int(a))] = root(int(b))
    groups: dict[int, list[QualifiedName]] = {}
    for name, table in found.items():
        groups.setdefault(root(table.oid), []).append(name)
    parts: list[list[QualifiedName]] = [[], []]
    filled = [0, 0]

    def size(names: list[QualifiedName]) -> int:
        return sum(sizes.get(found[n].oid, 0) for n in names)

    for names in sorted(groups.values(), key=size, reverse=True):
        emptier = filled.index(min(filled))
        parts[emptier] += names
        filled[emptier] += size(names)
    return [part for part in parts if part]


def _room_for_both(
    datadir: Path | None,
    parts: list[list[QualifiedName]],
    found: dict[QualifiedName, Table],
    sizes: dict[int, int],
) -> bool:
    """Whether the filesystem has room for what the largest table of each part may add at the
    same time: its size twice (updated, then rewritten, where Postgres refuses the one pass)."""
    if datadir is None:
        return False
    largest = [max(sizes.get(found[n].oid, 0) for n in part) for part in parts]
    return shutil.disk_usage(datadir).free > 2 * sum(largest) + (256 << 20)


def _rewrite(
    conn: Connection, name: QualifiedName, columns: dict[str, ColumnRule], table: Table
) -> bool:
    """Mask one table. Rewritten by one ``ALTER TABLE … ALTER COLUMN … TYPE (its own type)
    USING (the rule)``, it is written once, with its masked values, its indexes built anew, and
    its old files dropped at commit: no dead row versions, nothing for ``VACUUM FULL`` to do.
    Where Postgres refuses that (see ``_NOT_IN_ONE_PASS``), the table is updated, and rewritten
    later. Returns whether it was rewritten in one pass."""
    target = sql.Identifier(name.schema, name.table)
    changes = []
    for column, rule in columns.items():
        col = table.columns[column]
        collate = (
            sql.SQL(" COLLATE {}").format(sql.Identifier(*col.collation))
            if col.collation
            else sql.SQL("")
        )
        # format_type's text: the column's type as Postgres spells it in SQL (identifiers
        # quoted), with its modifier, which sql.Identifier cannot express.
        changes.append(
            sql.SQL("ALTER COLUMN {} TYPE {}{} USING {}").format(
                sql.Identifier(column), sql.SQL(col.sql_type), collate, _expression(rule, col)
            )
        )
    try:
        with conn.transaction():
            conn.execute(sql.SQL("ALTER TABLE {} {}").format(target, sql.SQL(", ").join(changes)))
        return True
    except psycopg.Error as err:
        if not (err.sqlstate or "").startswith(_NOT_IN_ONE_PASS):
            raise MaskError(f"masking failed (mask {name}): {reason(err)}") from None
        log.info("%s cannot be rewritten in one pass (%s): updating it", name, reason(err))
    assignments = [
        sql.SQL("{} = {}").format(sql.Identifier(column), _expression(rule, table.columns[column]))
        for column, rule in columns.items()
    ]
    query = sql.SQL("UPDATE {} SET {}").format(target, sql.SQL(", ").join(assignments))
    _run(conn, query, what=f"mask {name}")
    return False


@dataclass(frozen=True)
class _ForeignKey:
    """A foreign key on or to a masked column, set aside while the tables are rewritten and put
    back, checked, with its own definition (``pg_get_constraintdef``) and comment."""

    table: sql.Identifier
    name: str
    definition: str
    comment: str | None

    def drop(self) -> sql.Composed:
        return sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
            self.table, sql.Identifier(self.name)
        )

    def add(self) -> sql.Composed:
        add = sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
            self.table, sql.Identifier(self.name), sql.SQL(self.definition)
        )
        if self.comment is None:
            return add
        return sql.SQL("{}; COMMENT ON CONSTRAINT {} ON {} IS {}").format(
            add, sql.Identifier(self.name), self.table, sql.Literal(self.comment)
        )


def _foreign_keys(conn: Connection, masked: dict[int, set[str]]) -> list[_ForeignKey]:
    """Foreign keys (the partitioned table's own, not its partitions' copies) whose columns,
    on either side, include a masked column of ``masked`` (table oid -> column names)."""
    rows = conn.execute(
        """
        SELECT k.conrelid, k.confrelid, n.nspname, c.relname, k.conname,
               pg_get_constraintdef(k.oid), obj_description(k.oid, 'pg_constraint'),
               ARRAY(SELECT attname FROM pg_attribute
                     WHERE attrelid = k.conrelid AND attnum = ANY(k.conkey))::text[],
               ARRAY(SELECT attname FROM pg_attribute
                     WHERE attrelid = k.confrelid AND attnum = ANY(k.confkey))::text[]
        FROM pg_constraint k
        JOIN pg_class c ON c.oid = k.conrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE k.contype = 'f' AND k.conparentid = 0
          AND (k.conrelid = ANY(%s::oid[]) OR k.confrelid = ANY(%s::oid[]))
        ORDER BY 3, 4, 5
        """,
        (list(masked), list(masked)),
    ).fetchall()
    return [
        _ForeignKey(sql.Identifier(str(nsp), str(rel)), str(name), str(definition), comment)
        for relid, frelid, nsp, rel, name, definition, comment, cols, fcols in rows
        if masked.get(int(relid), set()) & set(cols) or masked.get(int(frelid), set()) & set(fcols)
    ]


def _expression(rule: ColumnRule, col: Column) -> sql.Composed:
    """The rule as an expression of the row: no bound parameter (``ALTER TABLE`` takes none)."""
    ident = sql.Identifier(col.name)
    value = sql.SQL("{}::text").format(ident)
    if rule.strategy == "null":
        return sql.Composed([sql.SQL("NULL")])
    if rule.strategy == "value":  # untyped: Postgres casts it to the column's type
        return sql.Composed([sql.Literal(rule.argument)])
    if rule.strategy == "fake":
        return fakes.fake(rule.argument or "", value)
    if rule.strategy == "hash":
        return fakes.hashed(value, uuid=col.type_name == "uuid")
    if rule.strategy == "truncate_date":
        if col.type_name == "date":
            return sql.SQL("date_trunc({}, {}::timestamp)::date").format(
                sql.Literal(rule.argument), ident
            )
        return sql.SQL("date_trunc({}, {})").format(sql.Literal(rule.argument), ident)
    # sql: the administrator's own expression, as written.
    return sql.SQL("({})").format(sql.SQL(rule.argument or ""))


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


def _leaves(conn: Connection, oids: list[int]) -> list[tuple[int, sql.Identifier]]:
    """Tables with storage among ``oids`` and their descendants (partitions, children)."""
    family = _family(conn, oids)
    rows = conn.execute(
        "SELECT c.oid, n.nspname, c.relname FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = ANY(%s::oid[]) AND c.relkind IN ('r', 'm') ORDER BY 2, 3",
        (family,),
    ).fetchall()
    return [(int(o), sql.Identifier(str(n), str(r))) for o, n, r in rows]


def _sizes(conn: Connection, oids: list[int]) -> dict[int, int]:
    """Bytes on disk of each table of ``oids`` with its partitions, TOAST and indexes."""
    sizes = {}
    for oid in oids:
        row = conn.execute(
            "SELECT sum(pg_relation_size(f))::bigint FROM unnest(%s::oid[]) AS f",
            (_family(conn, [oid]),),
        ).fetchone()
        sizes[oid] = int(row[0] or 0) if row else 0
    return sizes


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
