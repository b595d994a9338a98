"""The truth table's statements, and what Postgres really does for each, measured on a live
server without the product: its own ``pg_locks``, ``relfilenode``s and statistics.

A statement that may run in a transaction is measured inside its own: ``BEGIN``, the
statement, then this backend's granted relation locks, the relations' files and OIDs, and
``pg_stat_xact_user_tables``; ``ROLLBACK``. Nothing is left changed.

One that may not (``CONCURRENTLY``, ``VACUUM``) runs for real behind a blocker: another session
holds ``ROW EXCLUSIVE`` on the table, the statement queues behind it, and its locks are read
from ``pg_locks`` while it waits (the ones it holds and the one it asks for); then the blocker
lets go, the statement commits, and its files and the statistics views are read before and
after. Its changes stay (``Statement.undo`` puts back what a later statement needs).

Either way a third session samples the statement's locks from inside Postgres while it runs
(``Watch``): the locks it lets go before it ends (``Truth.passing``), and the later phases of
``CONCURRENTLY``. That part is sampling, about every 50 microseconds: a lock held for less than
one look can be missed. For a statement measured behind a blocker only each table's strongest
mode is compared (``Truth.exact`` is False).

The verdict kind follows the rule docs/insight.md states (first that applies; only relations
that existed before count, and not a concurrent drop's last lock on the index it removes, which
is no longer live then): "rewrite" when a table's or matview's storage, or one of
its indexes', was replaced (an index re-created with a new OID included); "blocks reads and
writes" for any lock that conflicts with ACCESS SHARE on a table, matview, index or TOAST
table; "blocks writes" for one that conflicts with ROW EXCLUSIVE; "row locks" when rows of an
existing table were updated or deleted; else "safe online". The conflict sets below are the
documentation's table 13.2, written out here rather than taken from the product's code.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgoverlay.runner import polling

# Modes that conflict with ACCESS SHARE (plain SELECT) and with ROW EXCLUSIVE (INSERT, UPDATE,
# DELETE): PostgreSQL 15 documentation, 13.3.1, "Conflicting Lock Modes".
BLOCKS_READS = frozenset({"ACCESS EXCLUSIVE"})
BLOCKS_WRITES = frozenset({"SHARE", "SHARE ROW EXCLUSIVE", "EXCLUSIVE", "ACCESS EXCLUSIVE"})
ORDER = (
    "ACCESS SHARE",
    "ROW SHARE",
    "ROW EXCLUSIVE",
    "SHARE UPDATE EXCLUSIVE",
    "SHARE",
    "SHARE ROW EXCLUSIVE",
    "EXCLUSIVE",
    "ACCESS EXCLUSIVE",
)
TABLE_KINDS = frozenset("rpm")  # table, partitioned table, materialized view
COUNTED_KINDS = frozenset("rpmiIt")  # and their indexes and TOAST tables

KINDS = ("rewrite", "blocks reads and writes", "blocks writes", "row locks", "safe online")


@dataclass(frozen=True)
class Statement:
    """One row of the table: ``sql`` names its schema ``{s}``; ``undo`` puts back what a
    statement measured outside a transaction changed, before the product runs it again."""

    name: str
    sql: str
    in_transaction: bool = True
    undo: str = ""

    def text(self, schema: str) -> str:
        return self.sql.replace("{s}", schema)


# In order: each runs on what the ones before it left (both sizes run the same sequence on
# tables of their own), so a later statement may use what an earlier one made.
STATEMENTS = (
    Statement("add_column_no_default", "ALTER TABLE {s}.t ADD COLUMN a1 int"),
    Statement("add_column_constant_default", "ALTER TABLE {s}.t ADD COLUMN a2 int DEFAULT 7"),
    Statement(
        "add_column_now_default",
        "ALTER TABLE {s}.t ADD COLUMN a3 timestamptz DEFAULT now()",
    ),
    Statement(
        "add_column_volatile_default",
        "ALTER TABLE {s}.t ADD COLUMN a4 float8 DEFAULT random()",
    ),
    Statement(
        "add_column_not_null_default",
        "ALTER TABLE {s}.t ADD COLUMN a5 int NOT NULL DEFAULT 0",
    ),
    Statement("add_column_bigserial", "ALTER TABLE {s}.t ADD COLUMN a6 bigserial"),
    Statement(
        "add_column_generated_stored",
        "ALTER TABLE {s}.t ADD COLUMN a7 bigint GENERATED ALWAYS AS (id * 2) STORED",
    ),
    Statement("set_default", "ALTER TABLE {s}.t ALTER COLUMN status SET DEFAULT 1"),
    Statement("drop_default", "ALTER TABLE {s}.t ALTER COLUMN status DROP DEFAULT"),
    Statement("drop_not_null", "ALTER TABLE {s}.t ALTER COLUMN c DROP NOT NULL"),
    Statement("set_not_null", "ALTER TABLE {s}.t ALTER COLUMN c SET NOT NULL"),
    Statement("set_statistics", "ALTER TABLE {s}.t ALTER COLUMN c SET STATISTICS 500"),
    Statement("set_fillfactor", "ALTER TABLE {s}.t SET (fillfactor = 90)"),
    Statement("type_int_to_bigint", "ALTER TABLE {s}.t ALTER COLUMN c TYPE bigint"),
    Statement("varchar_widen", "ALTER TABLE {s}.t ALTER COLUMN v TYPE varchar(100)"),
    Statement("varchar_narrow", "ALTER TABLE {s}.t ALTER COLUMN v TYPE varchar(60)"),
    Statement("varchar_to_text", "ALTER TABLE {s}.t ALTER COLUMN v TYPE text"),
    Statement("text_to_varchar", "ALTER TABLE {s}.t ALTER COLUMN note TYPE varchar(200)"),
    Statement("type_using", "ALTER TABLE {s}.t ALTER COLUMN code TYPE text USING code::text"),
    Statement("drop_column", "ALTER TABLE {s}.t DROP COLUMN a1"),
    Statement("rename_column", "ALTER TABLE {s}.t RENAME COLUMN a2 TO a2_renamed"),
    Statement("check", "ALTER TABLE {s}.t ADD CONSTRAINT t_c_positive CHECK (c >= 0)"),
    Statement(
        "check_not_valid",
        "ALTER TABLE {s}.t ADD CONSTRAINT t_status_known CHECK (status >= 0) NOT VALID",
    ),
    Statement("validate_check", "ALTER TABLE {s}.t VALIDATE CONSTRAINT t_status_known"),
    Statement("drop_constraint", "ALTER TABLE {s}.t DROP CONSTRAINT t_c_positive"),
    Statement(
        "foreign_key",
        "ALTER TABLE {s}.t ADD CONSTRAINT t_ref_fk FOREIGN KEY (ref_id) REFERENCES {s}.ref (id)",
    ),
    Statement(
        "foreign_key_not_valid",
        "ALTER TABLE {s}.t ADD CONSTRAINT t_ref_fk2 FOREIGN KEY (ref_id) REFERENCES "
        "{s}.ref (id) NOT VALID",
    ),
    Statement("validate_foreign_key", "ALTER TABLE {s}.t VALIDATE CONSTRAINT t_ref_fk2"),
    Statement("unique_constraint", "ALTER TABLE {s}.t ADD CONSTRAINT t_u_key UNIQUE (u)"),
    Statement("primary_key", "ALTER TABLE {s}.k ADD PRIMARY KEY (id)"),
    Statement("create_index", "CREATE INDEX t_created_idx ON {s}.t (created)"),
    Statement("create_unique_index", "CREATE UNIQUE INDEX t_u2_idx ON {s}.t (u)"),
    Statement(
        "create_index_concurrently",
        "CREATE INDEX CONCURRENTLY t_status_idx ON {s}.t (status)",
        undo="DROP INDEX {s}.t_status_idx",
        in_transaction=False,
    ),
    Statement("drop_index", "DROP INDEX {s}.t_created_idx"),
    Statement(
        "drop_index_concurrently",
        "DROP INDEX CONCURRENTLY {s}.t_u2_idx",
        undo="CREATE UNIQUE INDEX t_u2_idx ON {s}.t (u)",
        in_transaction=False,
    ),
    Statement("reindex_index", "REINDEX INDEX {s}.t_c_idx"),
    Statement(
        "reindex_concurrently", "REINDEX INDEX CONCURRENTLY {s}.t_c_idx", in_transaction=False
    ),
    Statement(
        "create_trigger",
        "CREATE TRIGGER t_touch BEFORE UPDATE ON {s}.t FOR EACH ROW EXECUTE FUNCTION {s}.touch()",
    ),
    Statement("drop_trigger", "DROP TRIGGER t_touch ON {s}.t"),
    Statement("rename_table", "ALTER TABLE {s}.t RENAME TO t_renamed"),
    Statement("rename_table_back", "ALTER TABLE {s}.t_renamed RENAME TO t"),
    Statement(
        "attach_partition",
        "ALTER TABLE {s}.pt ATTACH PARTITION {s}.pt_new FOR VALUES FROM (1000) TO (2000)",
    ),
    Statement("detach_partition", "ALTER TABLE {s}.pt DETACH PARTITION {s}.pt_old"),
    Statement(
        "create_matview",
        "CREATE MATERIALIZED VIEW {s}.mv2 AS SELECT ref_id, count(*) AS n FROM {s}.t "
        "GROUP BY ref_id",
    ),
    Statement("refresh_matview", "REFRESH MATERIALIZED VIEW {s}.mv"),
    Statement("refresh_matview_concurrently", "REFRESH MATERIALIZED VIEW CONCURRENTLY {s}.mv"),
    Statement("create_table", "CREATE TABLE {s}.n (id int PRIMARY KEY, t_id bigint)"),
    Statement("drop_table", "DROP TABLE {s}.n"),
    Statement("create_view", "CREATE VIEW {s}.v AS SELECT id, c, status FROM {s}.t"),
    Statement("comment", "COMMENT ON TABLE {s}.t IS 'orders'"),
    Statement("grant", "GRANT SELECT ON {s}.t TO PUBLIC"),
    Statement("analyze", "ANALYZE {s}.t"),
    Statement("lock_table_share", "LOCK TABLE {s}.t IN SHARE MODE"),
    Statement("set_unlogged", "ALTER TABLE {s}.k SET UNLOGGED"),
    Statement("set_logged", "ALTER TABLE {s}.k SET LOGGED"),
    Statement("cluster", "CLUSTER {s}.t USING t_pkey"),
    Statement("vacuum_full", "VACUUM FULL {s}.t", in_transaction=False),
    Statement(
        "insert_rows",
        "INSERT INTO {s}.t (id, c, u, ref_id, status, code, created) SELECT -g, 1, -g, "
        "1, 1, '1', now() FROM generate_series(1, 1000) g",
    ),
    Statement("update_few", "UPDATE {s}.t SET status = 4 WHERE id <= 100"),
    Statement("update_all", "UPDATE {s}.t SET status = status + 1"),
    Statement("delete_many", "DELETE FROM {s}.t WHERE id % 10 = 0"),
    Statement("truncate", "TRUNCATE {s}.k"),
)


def setup_sql(schema: str, rows: int) -> list[sql.Composed]:
    """The tables one size's statements run on: ``t`` (``rows`` rows, a primary key, an index,
    a TOAST table with values in it), ``ref`` (referenced), ``k`` (no key), a partitioned
    ``pt`` with one partition and a table ready to attach, a matview with a unique index."""
    s = sql.Identifier(schema)
    n = sql.Literal(rows)
    text = [
        "CREATE SCHEMA {s}",
        "CREATE TABLE {s}.ref (id int PRIMARY KEY, name text)",
        "INSERT INTO {s}.ref SELECT g, 'ref ' || g FROM generate_series(1, 1000) g",
        "CREATE TABLE {s}.t (id bigint PRIMARY KEY, c int NOT NULL, u bigint NOT NULL,"
        " ref_id int NOT NULL, status int NOT NULL, code int NOT NULL, v varchar(50),"
        " note text, body text, created timestamptz NOT NULL)",
        "INSERT INTO {s}.t SELECT g, g % 1000, g, 1 + g % 1000, g % 5, g % 97, 'v' || g,"
        " 'note ' || g, CASE WHEN g % 1000 = 0 THEN (SELECT string_agg(md5(g::text || i::text),"
        " '') FROM generate_series(1, 100) i) END,"
        " timestamptz '2024-01-01' + g * interval '1 minute' FROM generate_series(1, {n}) g",
        "CREATE INDEX t_c_idx ON {s}.t (c)",
        "CREATE TABLE {s}.k (id int NOT NULL, x int)",
        "INSERT INTO {s}.k SELECT g, g % 7 FROM generate_series(1, {n}) g",
        "CREATE TABLE {s}.pt (id int NOT NULL, k int NOT NULL) PARTITION BY RANGE (k)",
        "CREATE TABLE {s}.pt_old PARTITION OF {s}.pt FOR VALUES FROM (0) TO (1000)",
        "INSERT INTO {s}.pt SELECT g, g % 1000 FROM generate_series(1, {n}) g",
        "CREATE TABLE {s}.pt_new (id int NOT NULL, k int NOT NULL)",
        "INSERT INTO {s}.pt_new SELECT g, 1000 + g % 1000 FROM generate_series(1, {n}) g",
        "CREATE MATERIALIZED VIEW {s}.mv AS SELECT status, count(*) AS n FROM {s}.t"
        " GROUP BY status",
        "CREATE UNIQUE INDEX mv_status ON {s}.mv (status)",
        "CREATE FUNCTION {s}.touch() RETURNS trigger LANGUAGE plpgsql"
        " AS 'BEGIN NEW.created := now(); RETURN NEW; END'",
    ]  # fmt: skip
    return [sql.SQL(line).format(s=s, n=n) for line in text]


# -- measuring ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rel:
    oid: int
    name: str  # schema-qualified
    kind: str  # pg_class.relkind
    filenode: int
    owner: int  # an index's table, a TOAST table's table; 0 for none


Snapshot = dict[int, Rel]

_SNAPSHOT = """
SELECT c.oid::int8, n.nspname || '.' || c.relname, c.relkind::text, c.relfilenode::int8,
       COALESCE(i.indrelid, t.oid, 0)::int8
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_catalog.pg_index i ON i.indexrelid = c.oid
  LEFT JOIN pg_catalog.pg_class t ON t.reltoastrelid = c.oid
 WHERE c.oid >= 16384 AND n.nspname NOT IN ('pg_catalog', 'information_schema')
   AND n.nspname !~ '^pg_(toast_)?temp_'
"""
_OWN_LOCKS = """
SELECT l.relation::int8, l.mode, l.granted
  FROM pg_catalog.pg_locks l
 WHERE l.pid = %s AND l.locktype = 'relation'
   AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
"""
_ALL_OWN_LOCKS = """
SELECT l.relation::int8, l.mode, l.granted
  FROM pg_catalog.pg_locks l
 WHERE l.pid = %s AND (l.locktype <> 'relation' OR l.database =
       (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()))
"""
_XACT_STATS = "SELECT relid::int8, seq_scan, n_tup_upd + n_tup_del FROM pg_stat_xact_user_tables"
_STATS = "SELECT relid::int8, seq_scan, n_tup_upd + n_tup_del FROM pg_stat_user_tables"
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def snapshot(conn: psycopg.Connection[Any]) -> Snapshot:
    return {row[0]: Rel(*row) for row in conn.execute(_SNAPSHOT).fetchall()}


def mode_name(pg_mode: str) -> str:
    """``ShareRowExclusiveLock`` -> ``SHARE ROW EXCLUSIVE``."""
    return _CAMEL.sub(" ", pg_mode.removesuffix("Lock")).upper()


def table_of(rels: Snapshot, oid: int) -> Rel:
    """The table (or matview, partitioned table) a relation belongs to: itself for a table,
    an index's table, a TOAST table's table, a TOAST index's table."""
    rel = rels[oid]
    while rel.kind not in TABLE_KINDS and rel.owner in rels:
        rel = rels[rel.owner]
    return rel


@dataclass(frozen=True)
class Truth:
    locks: frozenset[tuple[str, str]]  # (relation, mode) on relations that existed before
    passing: frozenset[tuple[str, str]]  # seen held while it ran, let go before it ended
    rewritten: frozenset[str]  # tables whose storage, or an index's, was replaced
    scanned: frozenset[str]  # tables scanned in full under a lock that blocks writes
    rows_changed: frozenset[str]  # existing tables with rows updated or deleted
    kind: str
    exact: bool  # False: measured behind a blocker (the locks held when it queued)
    names: dict[str, str]  # every relation's name before and after -> its table's name
    # indexes it dropped concurrently: their last lock, an instant on a dead index, decides
    # nothing and is seen or not by sampling's luck
    dying: frozenset[str] = frozenset()

    def strongest(self) -> dict[str, str]:
        """Each table's strongest mode, its indexes' and TOAST table's folded onto it (a
        dying index's last lock aside)."""
        live = {(r, m) for r, m in self.locks | self.passing if r not in self.dying}
        return strongest_per_table(live, self.names)


def strongest_per_table(locks: Iterable[tuple[str, str]], names: dict[str, str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for relation, mode in locks:
        table = names.get(relation, relation)
        if ORDER.index(mode) >= ORDER.index(found.get(table, ORDER[0])):
            found[table] = mode
    return found


def judge(
    before: Snapshot,
    after: Snapshot,
    held: Iterable[tuple[int, str]],
    passing: Iterable[tuple[int, str]],
    scans: dict[int, int],
    changed: dict[int, int],
    *,
    exact: bool,
    dying: Iterable[int] = (),
) -> Truth:
    """What Postgres did, and the verdict kind the rule gives it. ``dying``: indexes a statement
    dropped concurrently; their last lock decides no kind (the index is no longer live when it
    is taken: Postgres documents these commands as blocking neither reads nor writes)."""
    held = list(held)
    dead = set(dying)
    locks = {(before[oid].name, mode) for oid, mode in held if oid in before}
    taken = set(held) | set(passing)
    seen = {(before[oid].name, mode) for oid, mode in taken if oid in before} - locks
    rewritten = {
        table_of(before, oid).name
        for oid, rel in before.items()
        if rel.kind in COUNTED_KINDS and (_refiled(rel, after) or _recreated(rel, before, after))
    }
    modes_on: dict[int, set[str]] = {}
    for oid, mode in taken:
        modes_on.setdefault(oid, set()).add(mode)
    scanned = {
        before[oid].name
        for oid, n in scans.items()
        if n > 0 and oid in before and modes_on.get(oid, set()) & BLOCKS_WRITES
    }
    rows = {before[oid].name for oid, n in changed.items() if n > 0 and oid in before}
    counted = [
        mode
        for oid, mode in taken
        if oid in before and before[oid].kind in COUNTED_KINDS and oid not in dead
    ]
    if rewritten:
        kind = "rewrite"
    elif set(counted) & BLOCKS_READS:
        kind = "blocks reads and writes"
    elif set(counted) & BLOCKS_WRITES:
        kind = "blocks writes"
    elif rows:
        kind = "row locks"
    else:
        kind = "safe online"
    names = {
        rel.name: table_of(snap, oid).name for snap in (after, before) for oid, rel in snap.items()
    }
    return Truth(
        frozenset(locks), frozenset(seen), frozenset(rewritten), frozenset(scanned),
        frozenset(rows), kind, exact, names,
        frozenset(before[oid].name for oid in dead if oid in before),
    )  # fmt: skip


def _refiled(rel: Rel, after: Snapshot) -> bool:
    now = after.get(rel.oid)
    return now is not None and rel.filenode != 0 and now.filenode != rel.filenode


def _recreated(rel: Rel, before: Snapshot, after: Snapshot) -> bool:
    """An index gone whose table has an index of the same name with a new OID."""
    if rel.kind not in "iI" or rel.oid in after:
        return False
    return any(
        new.name == rel.name and new.owner == rel.owner and new.oid not in before
        for new in after.values()
    )


# The watching session's loop, inside Postgres: pg_lock_status() about every 50 microseconds,
# a transaction each, each lock the backend is granted kept once, until the session that runs
# the statement lets go of the advisory lock it holds meanwhile.
_WATCH = """
DO $watch$
DECLARE
  seen text[] := '{{}}';
  lock text;
BEGIN
  LOOP
    FOR lock IN SELECT l.relation || ' ' || l.mode FROM pg_catalog.pg_lock_status() l
                 WHERE l.pid = {pid} AND l.locktype = 'relation' AND l.granted LOOP
      IF NOT lock = ANY (seen) THEN
        seen := seen || lock;
      END IF;
    END LOOP;
    COMMIT;  -- no snapshot held: CONCURRENTLY waits for older snapshots
    EXIT WHEN pg_catalog.pg_try_advisory_lock({key});
  END LOOP;
  PERFORM pg_catalog.pg_advisory_unlock({key});
  INSERT INTO pg_temp.truth_seen SELECT split_part(x, ' ', 1)::oid, substr(x, strpos(x, ' ') + 1)
    FROM unnest(seen) x;
END
$watch$
"""


class Watch:
    """Another session sampling one backend's granted relation locks from inside Postgres
    (about every 50 microseconds) from ``with`` to its end: what a statement holds while it
    runs, the ones it lets go before it ends included."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], pid: int) -> None:
        self.seen: set[tuple[int, str]] = set()
        self._pid = pid
        self._control = connect()
        self._look = connect()
        for conn in (self._control, self._look):
            conn.autocommit = True
        self._look.execute(
            "CREATE TEMP TABLE truth_seen (relation oid, mode text, PRIMARY KEY (relation, mode))"
        )
        self._failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="truth-watch")

    def __enter__(self) -> Watch:
        self._control.execute("SELECT pg_catalog.pg_advisory_lock(%s)", (self._pid,))
        self._thread.start()
        watcher = self._look.info.backend_pid

        def looping() -> bool:
            row = self._control.execute(
                "SELECT state = 'active' FROM pg_catalog.pg_stat_activity WHERE pid = %s",
                (watcher,),
            ).fetchone()
            return bool(row and row[0]) or bool(self._failed)

        polling.wait_for(looping, timeout=30, what="the watching session to start")
        if self._failed:
            raise self._failed[0]
        return self

    def __exit__(self, *exc: object) -> None:
        self._control.execute("SELECT pg_catalog.pg_advisory_unlock(%s)", (self._pid,))
        self._thread.join(60)
        try:
            if self._failed:
                raise self._failed[0]
            rows = self._look.execute("SELECT relation::int8, mode FROM pg_temp.truth_seen")
            self.seen = {(int(oid), mode_name(mode)) for oid, mode in rows}
        finally:
            self._control.close()
            self._look.close()

    def _run(self) -> None:
        try:
            self._look.execute(
                sql.SQL(_WATCH).format(pid=sql.Literal(self._pid), key=sql.Literal(self._pid))
            )
        except BaseException as err:  # noqa: BLE001 - raised again in the measuring thread
            self._failed.append(err)


def measure(connect: Callable[[], psycopg.Connection[Any]], text: str) -> Truth:
    """Run ``text`` in a transaction of its own, read what it did from inside (and, while it
    runs, from another session), and roll it back."""
    with connect() as conn:
        conn.autocommit = False
        pid = conn.info.backend_pid
        try:
            before = snapshot(conn)
            with Watch(connect, pid) as watch:
                conn.execute(text)
            held = [
                (o, mode_name(m)) for o, m, granted in conn.execute(_OWN_LOCKS, (pid,)) if granted
            ]
            after = snapshot(conn)
            stats = conn.execute(_XACT_STATS).fetchall()
        finally:
            conn.rollback()
    scans = {oid: n for oid, n, _ in stats}
    changed = {oid: n for oid, _, n in stats}
    return judge(before, after, held, watch.seen, scans, changed, exact=True)


def measure_behind_blocker(
    connect: Callable[[], psycopg.Connection[Any]], text: str, *, table: str, timeout: float
) -> Truth:
    """Run ``text`` (which cannot run in a transaction) for real while another session holds
    ROW EXCLUSIVE on ``table``; read its locks from ``pg_locks`` once it queues, then let it
    finish. Its changes stay."""
    with connect() as look, connect() as blocker, connect() as runner:
        for c in (look, blocker, runner):
            c.autocommit = True
        before = snapshot(look)
        stats_before = {oid: (s, n) for oid, s, n in look.execute(_STATS)}
        blocker.execute("BEGIN")
        blocker.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(
            sql.Identifier(*table.split("."))))  # fmt: skip
        failed: list[BaseException] = []

        def run() -> None:
            try:
                runner.execute(text)
                runner.execute("SELECT pg_catalog.pg_stat_force_next_flush()")
            except BaseException as err:  # noqa: BLE001 - handed to the measuring thread
                failed.append(err)

        worker = threading.Thread(target=run, name="truth-statement")
        worker.start()
        pid = runner.info.backend_pid

        def queued() -> list[tuple[int, str, bool]] | None:
            rows = look.execute(_ALL_OWN_LOCKS, (pid,))
            found = [(int(o or 0), mode_name(m), bool(g)) for o, m, g in rows]
            waiting = any(not g for _, _, g in found)
            return found if waiting or failed else None

        with Watch(connect, pid) as watch:
            try:
                seen = polling.wait_for(queued, timeout=timeout, what=f"{text!r} to queue")
            finally:
                blocker.execute("ROLLBACK")
                worker.join(timeout)
        assert not worker.is_alive(), f"{text!r} did not finish within {timeout} s"
        if failed:
            raise failed[0]
        after = snapshot(look)
        stats_after = {oid: (s, n) for oid, s, n in look.execute(_STATS)}
    held = [(oid, mode) for oid, mode, _ in seen if oid]  # held, or asked for, while queued
    scans = {o: s - stats_before.get(o, (0, 0))[0] for o, (s, _) in stats_after.items()}
    changed = {o: n - stats_before.get(o, (0, 0))[1] for o, (_, n) in stats_after.items()}
    # A concurrent drop (DROP INDEX CONCURRENTLY, the old index REINDEX CONCURRENTLY replaces)
    # takes ACCESS EXCLUSIVE on an index that is dead by then: no query uses it or waits on it.
    dying = {oid for oid, rel in before.items() if rel.kind in "iI" and oid not in after}
    return judge(before, after, held, watch.seen, scans, changed, exact=False, dying=dying)
