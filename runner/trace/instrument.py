"""The trace's instrumentation in a branch: made once, in the base, when it is prepared; switched
on when a trace begins and off when it ends.

Two event triggers log a ``pgoverlay-trace {json}`` line for every DDL command and table
rewrite, and two role settings make the server log every statement of the branch's login role
with its duration, and its lock waits. A procedure, ``STATEMENT_END``, logs the same kind of
line when a session calls it: the engine's SQL-folder mode appends a call to it after each
statement of a migration file (``pgoverlay.action.insight.marks``), so every lock of every
statement is read from ``pg_locks`` while its transaction still holds it.

The rule: after the PR's code could have run in a branch, the engine's superuser runs nothing
there that can fire code the PR can create or change. PR code reaches a superuser session in
three ways, and the engine gives it none:

- event triggers fire for DDL (``CREATE``/``ALTER``/``DROP``/``COMMENT``/``GRANT`` on objects,
  ``CREATE SCHEMA IF NOT EXISTS`` included), in the session that runs it, and their functions,
  or the tables and helpers those reach, may be the role's: the engine runs no such DDL in a
  branch. ``create`` makes the trace's objects while the base is prepared, before any branch
  exists; a trace only runs ``ALTER EVENT TRIGGER ... ENABLE ALWAYS | DISABLE`` (event
  triggers never fire for event-trigger commands) and ``ALTER ROLE ... IN DATABASE ...
  SET | RESET`` (a role is a shared object: no event trigger fires for it);
- DML fires row and statement triggers: the engine writes to no table in a branch;
- a call, cast or operator resolved by name may be the role's: the engine's sessions pin
  ``search_path`` to ``pg_catalog, pg_temp`` and read only the catalogs and statistics
  functions (``snapshot``, ``sampler``), and the trace's functions qualify every name.

What the engine's superuser runs in a branch, all of it: this module's switches; the reads of
``snapshot``, ``sampler``, ``schema`` and ``installed`` (catalogs, statistics functions and
``pg_get_*def``, in read-only transactions where they are several, names pinned);
and the branch role's password (``roles.set_password``: one ``ALTER ROLE``, on create, reset,
restart and a warm claim). ``roles.set_login``, whose ``CREATE SCHEMA`` is DDL, runs only in a
branch fresh from the base (no PR code has run there); a restarted branch whose role is gone is
refused instead. The test ``test_what_the_engine_runs_in_a_branch_fires_no_event_trigger``
runs these statements beside event triggers that fail whatever fires them.

Beside that rule, the seed's lockdown disables production's own event triggers (those no
extension owns, for every event: a ``login`` one, from Postgres 17, would fire when the engine
connects), and ``enable`` refuses to switch the trace on beside any enabled event trigger it
did not make.

The role cannot switch any of it off or fake it:

- the triggers, their functions and their schema (``SCHEMA``) are the bootstrap superuser's,
  and the role may not create in that schema: it can neither replace, alter, drop nor disable
  them; ``ENABLE ALWAYS`` fires them even where ``session_replication_role`` is replica (a
  superuser's setting too);
- ``log_min_duration_statement`` and ``log_lock_waits`` are superuser settings, which the role
  can neither set nor reset, in its session or on itself;
- the functions run as whoever runs the DDL (no SECURITY DEFINER), with ``search_path`` pinned
  to ``pg_catalog, pg_temp`` and every name qualified; and a line the role logs itself lacks
  their CONTEXT (see ``logfile``);
- the statement procedure is the one object of the schema the role may use (``USAGE`` on the
  schema and ``EXECUTE`` on it, to ``PUBLIC``): it runs as its caller, reads the caller's own
  locks, settings and statistics, and writes only a log line. A call the role makes itself
  logs what is true at that moment; the log reader accepts a mark only with the migration's
  nonce, on the query that holds the statement it names, once (``analyze``).

``installed`` checks, at every mark, that what is in place is what ``create`` made: the same
oids as when the trace began, owned by a superuser, not SECURITY DEFINER.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgoverlay.errors import SeedError, TraceError

SCHEMA = "pgoverlay_trace"
TRIGGERS = {
    # event trigger: (its event, its function in SCHEMA)
    "pgoverlay_trace_ddl": ("ddl_command_end", "trace_ddl"),
    "pgoverlay_trace_rewrite": ("table_rewrite", "trace_rewrite"),
}
ROLE_SETTINGS = {"log_min_duration_statement": "0", "log_lock_waits": "on"}
PREFIX = "pgoverlay-trace "

# What this transaction scanned and wrote of the relations in ``held`` (the trace's functions,
# after reading the backend's locks into ``held``): its sequential scans and the rows they
# returned, and the rows it inserted, updated and deleted (a transaction that writes a table
# holds a lock on it until it ends, so every table it wrote is among them). These are the
# transaction's own counters: another session's writes never reach them.
_SCANS_OF_HELD = """\
    SELECT COALESCE(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
               'rel', r.rel::pg_catalog.int8,
               'seq_scan', pg_catalog.pg_stat_get_xact_numscans(r.rel),
               'seq_tup_read', pg_catalog.pg_stat_get_xact_tuples_returned(r.rel),
               'ins', pg_catalog.pg_stat_get_xact_tuples_inserted(r.rel),
               'upd', pg_catalog.pg_stat_get_xact_tuples_updated(r.rel),
               'del', pg_catalog.pg_stat_get_xact_tuples_deleted(r.rel))
               ORDER BY r.rel), '[]')
      INTO scans
      FROM (SELECT DISTINCT (e OPERATOR(pg_catalog.->>) 'rel')::pg_catalog.oid AS rel
              FROM pg_catalog.jsonb_array_elements(held) e) r;
"""

# This backend's granted locks on user relations of this database, and what this transaction
# scanned of those relations: the DDL's real lock modes and whether it read the whole table.
_DDL_BODY = """
DECLARE
    held pg_catalog.jsonb;
    scans pg_catalog.jsonb;
    vxid pg_catalog.text;
BEGIN
    SELECT l.virtualxid INTO vxid FROM pg_catalog.pg_locks l
     WHERE l.locktype OPERATOR(pg_catalog.=) 'virtualxid'
       AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
     LIMIT 1;
    SELECT COALESCE(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
               'rel', l.relation::pg_catalog.int8, 'mode', l.mode)
               ORDER BY l.relation, l.mode), '[]')
      INTO held
      FROM pg_catalog.pg_locks l
     WHERE l.locktype OPERATOR(pg_catalog.=) 'relation' AND l.granted
       AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
       AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
            WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
       AND l.relation OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid;
""" + _SCANS_OF_HELD + """    RAISE LOG 'pgoverlay-trace %', pg_catalog.jsonb_build_object(
        'event', 'ddl', 'tag', TG_TAG, 'vxid', vxid, 'locks', held, 'scans', scans);
END
"""

_REWRITE_BODY = """
DECLARE
    vxid pg_catalog.text;
BEGIN
    SELECT l.virtualxid INTO vxid FROM pg_catalog.pg_locks l
     WHERE l.locktype OPERATOR(pg_catalog.=) 'virtualxid'
       AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
     LIMIT 1;
    RAISE LOG 'pgoverlay-trace %', pg_catalog.jsonb_build_object(
        'event', 'rewrite',
        'rel', pg_catalog.pg_event_trigger_table_rewrite_oid()::pg_catalog.int8,
        'reason', pg_catalog.pg_event_trigger_table_rewrite_reason(),
        'vxid', vxid);
END
"""

BODIES = {"trace_ddl": _DDL_BODY, "trace_rewrite": _REWRITE_BODY}

# The statement procedure: called after each statement of a migration file, in the same query
# (so in the same transaction), with the migration's nonce and the statement's index. It logs
# this backend's granted relation locks, what this transaction scanned of those relations, the
# server's clock and the lock_timeout in force (milliseconds, 0 = none).
STATEMENT_END = "statement_end"
STATEMENT_END_ARGS = "nonce pg_catalog.text, statement pg_catalog.int4"
_STATEMENT_BODY = """
DECLARE
    held pg_catalog.jsonb;
    scans pg_catalog.jsonb;
    vxid pg_catalog.text;
BEGIN
    SELECT pg_catalog.max(l.virtualxid) FILTER (
               WHERE l.locktype OPERATOR(pg_catalog.=) 'virtualxid'),
           COALESCE(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
               'rel', l.relation::pg_catalog.int8, 'mode', l.mode)
               ORDER BY l.relation, l.mode) FILTER (
               WHERE l.locktype OPERATOR(pg_catalog.=) 'relation' AND l.granted
                 AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                      WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                 AND l.relation OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid), '[]')
      INTO vxid, held
      FROM pg_catalog.pg_locks l
     WHERE l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid();
""" + _SCANS_OF_HELD + """    RAISE LOG 'pgoverlay-trace %', pg_catalog.jsonb_build_object(
        'event', 'statement', 'nonce', nonce, 'statement', statement, 'vxid', vxid,
        'at', pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()),
        'lock_timeout_ms', pg_catalog.round(pg_catalog.date_part('epoch',
            pg_catalog.current_setting('lock_timeout')::pg_catalog.interval)
            OPERATOR(pg_catalog.*) 1000),
        'locks', held, 'scans', scans);
END
"""


@dataclass(frozen=True)
class Installed:
    """The oids of the trace's objects: a mark checks they are all still there, unchanged."""

    namespace: int
    triggers: frozenset[int]
    functions: frozenset[int]
    # The statement procedure's oid; None in a base prepared before it existed (statement
    # marks are then not used, and locks of statements no event trigger sees are sampled).
    statement_end: int | None = None


def create(conn: psycopg.Connection[Any]) -> None:
    """Make the schema, the functions and the event triggers, disabled, in the connected
    database of a base being prepared, as its bootstrap superuser (before any branch exists,
    so before any PR code could have run). A source that has a schema of that name is
    refused: it is pgoverlay's."""
    if conn.execute(
        "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s", (SCHEMA,)
    ).fetchone():
        raise SeedError(
            f"database {conn.info.dbname} of the source has a schema named {SCHEMA}, which "
            "pgoverlay keeps for the trace of migrations in a branch: rename it in the source "
            "(ALTER SCHEMA ... RENAME TO ...) and seed again"
        )
    schema = sql.Identifier(SCHEMA)
    with conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(schema))
        for function, body in BODIES.items():
            conn.execute(
                sql.SQL(
                    "CREATE FUNCTION {}.{}() RETURNS event_trigger LANGUAGE plpgsql "
                    "SET search_path = pg_catalog, pg_temp AS {}"
                ).format(schema, sql.Identifier(function), sql.Literal(body))
            )
        for trigger, (event, function) in TRIGGERS.items():
            conn.execute(
                sql.SQL("CREATE EVENT TRIGGER {} ON {} EXECUTE FUNCTION {}.{}()").format(
                    sql.Identifier(trigger),
                    sql.Identifier(event),
                    schema,
                    sql.Identifier(function),
                )
            )
            conn.execute(sql.SQL("ALTER EVENT TRIGGER {} DISABLE").format(sql.Identifier(trigger)))
        procedure = sql.SQL("{}.{}").format(schema, sql.Identifier(STATEMENT_END))
        conn.execute(
            sql.SQL(
                "CREATE PROCEDURE {}({}) LANGUAGE plpgsql "
                "SET search_path = pg_catalog, pg_temp AS {}"
            ).format(procedure, sql.SQL(STATEMENT_END_ARGS), sql.Literal(_STATEMENT_BODY))
        )
        # Every role may call it (a migration may SET ROLE), and nothing else of the schema.
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO PUBLIC").format(schema))
        conn.execute(
            sql.SQL("REVOKE ALL ON PROCEDURE {}({}) FROM PUBLIC").format(
                procedure, sql.SQL(STATEMENT_END_ARGS)
            )
        )
        conn.execute(
            sql.SQL("GRANT EXECUTE ON PROCEDURE {}({}) TO PUBLIC").format(
                procedure, sql.SQL(STATEMENT_END_ARGS)
            )
        )


# Enabled event triggers other than the trace's (whose oids are the parameter), with the
# extension that owns each, if one does.
_OTHERS = """
SELECT e.evtname, e.evtevent,
       pg_catalog.format('%%I.%%I(%%s)', n.nspname, p.proname,
                         pg_catalog.pg_get_function_identity_arguments(p.oid)),
       x.extname
  FROM pg_catalog.pg_event_trigger e
  JOIN pg_catalog.pg_proc p ON p.oid = e.evtfoid
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
  LEFT JOIN pg_catalog.pg_depend d
         ON d.classid = 'pg_catalog.pg_event_trigger'::pg_catalog.regclass
        AND d.objid = e.oid AND d.deptype = 'e'
  LEFT JOIN pg_catalog.pg_extension x ON x.oid = d.refobjid
 WHERE e.evtenabled <> 'D' AND NOT e.oid = ANY(%s::pg_catalog.oid[])
 ORDER BY 1
"""


def _refusal(others: list[tuple[Any, ...]], *, base_name: str) -> str:
    named = "; ".join(
        f"{name} ({event}, {function}" + (f", of extension {extension})" if extension else ")")
        for name, event, function, extension in others
    )
    fix = (
        f"seed the base again (`pgoverlay base seed {base_name} --refresh --from DSN`: the seed "
        "disables production's own event triggers), then reset the branch"
    )
    if any(extension for *_, extension in others):
        fix += (
            "; an extension's event trigger is kept by the seed: run these migrations without "
            "the trace (the Action's `insight: false`)"
        )
    return (
        f"the trace was not begun: an event trigger it did not make is enabled in the branch "
        f"({named}), and a trace never runs beside one, which could run code the pull request "
        f"changed; {fix}"
    )


def enable(conn: psycopg.Connection[Any], *, user: str, database: str, base_name: str) -> Installed:
    """Switch the trace on: its triggers ``ENABLE ALWAYS`` and the role's log settings, in one
    transaction, with statements that fire no event trigger. Refused, with nothing switched,
    when the base has no trace objects (prepared by an older pgoverlay: they are never made
    late, in a branch) or when another event trigger is enabled."""
    with conn.transaction():
        found = installed(conn, enabled=False)
        if found is None:
            raise TraceError(
                f"base {base_name} has no trace instrumentation in schema {SCHEMA} (it was "
                "prepared by an older pgoverlay, or a superuser changed it), and a trace never "
                f"makes it in a branch: seed the base again with `pgoverlay base seed {base_name} "
                "--refresh --from DSN`, then reset or create the branch again"
            )
        others = conn.execute(_OTHERS, (sorted(found.triggers),)).fetchall()
        if others:
            raise TraceError(_refusal(others, base_name=base_name))
        switch_on(conn, user=user, database=database)
        now = installed(conn)
    if now is None or now != found:
        raise TraceError(
            "the trace's event triggers changed while they were switched on: another "
            "superuser session changed them; open the trace again"
        )
    return now


def switch_on(conn: psycopg.Connection[Any], *, user: str, database: str) -> None:
    """The triggers ``ENABLE ALWAYS`` and the role's log settings, unchecked (``enable``
    checks first): statements that fire no event trigger."""
    for trigger in TRIGGERS:
        # Fired even where session_replication_role is replica.
        conn.execute(
            sql.SQL("ALTER EVENT TRIGGER {} ENABLE ALWAYS").format(sql.Identifier(trigger))
        )
    for setting, value in ROLE_SETTINGS.items():
        conn.execute(
            sql.SQL("ALTER ROLE {} IN DATABASE {} SET {} = {}").format(
                sql.Identifier(user),
                sql.Identifier(database),
                sql.Identifier(setting),
                sql.Literal(value),
            )
        )


def disable(conn: psycopg.Connection[Any], *, user: str, database: str) -> None:
    """Switch the trace off (idempotent), with statements that fire no event trigger."""
    with conn.transaction():
        present = conn.execute(
            "SELECT evtname FROM pg_catalog.pg_event_trigger WHERE evtname = ANY(%s) ORDER BY 1",
            (list(TRIGGERS),),
        ).fetchall()
        for (trigger,) in present:
            conn.execute(sql.SQL("ALTER EVENT TRIGGER {} DISABLE").format(sql.Identifier(trigger)))
        if not conn.execute(
            "SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (user,)
        ).fetchone():
            return  # a job's role, dropped with its credential: its settings went with it
        for setting in ROLE_SETTINGS:
            conn.execute(
                sql.SQL("ALTER ROLE {} IN DATABASE {} RESET {}").format(
                    sql.Identifier(user), sql.Identifier(database), sql.Identifier(setting)
                )
            )


_INSTALLED = """
SELECT n.oid, e.oid, p.oid
  FROM pg_catalog.pg_event_trigger e
  JOIN pg_catalog.pg_proc p ON p.oid = e.evtfoid
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_catalog.pg_roles fo ON fo.oid = p.proowner
  JOIN pg_catalog.pg_roles eo ON eo.oid = e.evtowner
  JOIN pg_catalog.pg_roles so ON so.oid = n.nspowner
 WHERE (e.evtname, e.evtevent, p.proname) IN
       (SELECT * FROM unnest(%s::pg_catalog.text[], %s::pg_catalog.text[],
                             %s::pg_catalog.text[]))
   AND n.nspname = %s AND fo.rolsuper AND eo.rolsuper AND so.rolsuper AND NOT p.prosecdef
   AND (e.evtenabled = 'A' OR NOT %s)
"""


# The statement procedure, if it is the one ``create`` made: a superuser's plpgsql procedure of
# the trace's schema, not SECURITY DEFINER, with search_path pinned.
_STATEMENT_END = """
SELECT p.oid
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_catalog.pg_roles fo ON fo.oid = p.proowner
  JOIN pg_catalog.pg_language l ON l.oid = p.prolang
 WHERE n.oid = %s AND p.proname = %s AND p.prokind = 'p' AND fo.rolsuper
   AND NOT p.prosecdef AND l.lanname = 'plpgsql'
   AND p.proargtypes = '25 23'::pg_catalog.oidvector
   AND p.proconfig = ARRAY['search_path=pg_catalog, pg_temp']
"""


def installed(conn: psycopg.Connection[Any], *, enabled: bool = True) -> Installed | None:
    """The trace's objects, if both triggers are in place with superuser-owned functions in
    ``SCHEMA``, a superuser's schema (and, with ``enabled``, switched on); None otherwise.
    The statement procedure is looked for too, but a base without it is still traced (it
    was prepared before the procedure existed)."""
    names = list(TRIGGERS)
    rows = conn.execute(
        _INSTALLED,
        (
            names,
            [TRIGGERS[t][0] for t in names],
            [TRIGGERS[t][1] for t in names],
            SCHEMA,
            enabled,
        ),
    ).fetchall()
    if len(rows) != len(TRIGGERS):
        return None
    namespace = int(rows[0][0])
    procedure = conn.execute(_STATEMENT_END, (namespace, STATEMENT_END)).fetchone()
    return Installed(
        namespace=namespace,
        triggers=frozenset(int(r[1]) for r in rows),
        functions=frozenset(int(r[2]) for r in rows),
        statement_end=int(procedure[0]) if procedure else None,
    )
