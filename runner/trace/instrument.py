"""What a trace installs in a branch, as the base's superuser, and removes at its end.

Two event triggers log a ``pgoverlay-trace {json}`` line for every DDL command and table
rewrite, and two role settings make the server log every statement of the branch's login role
with its duration, and its lock waits. The role cannot switch any of it off or fake it:

- event triggers and their ``ENABLE ALWAYS`` are a superuser's (``session_replication_role``
  too), and the functions are the superuser's, so the role can neither replace nor alter them;
  it owns the schema they live in (``pgoverlay_ledger``), so it can drop them, which drops the
  triggers: a mark's ``instrumented`` then says so;
- ``log_min_duration_statement`` and ``log_lock_waits`` are superuser settings, which the role
  can neither set nor reset, in its session or on itself;
- the functions run as whoever runs the DDL (no SECURITY DEFINER), with ``search_path`` pinned
  to ``pg_catalog, pg_temp`` and every name qualified, so a superuser's DDL runs nothing the
  role defined; and a line the role logs itself lacks their CONTEXT (see ``logfile``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgoverlay.errors import TraceError

SCHEMA = "pgoverlay_ledger"
TRIGGERS = {
    # event trigger: (its event, its function in SCHEMA)
    "pgoverlay_trace_ddl": ("ddl_command_end", "trace_ddl"),
    "pgoverlay_trace_rewrite": ("table_rewrite", "trace_rewrite"),
}
ROLE_SETTINGS = {"log_min_duration_statement": "0", "log_lock_waits": "on"}
PREFIX = "pgoverlay-trace "

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
    SELECT COALESCE(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
               'rel', r.rel::pg_catalog.int8,
               'seq_scan', pg_catalog.pg_stat_get_xact_numscans(r.rel),
               'seq_tup_read', pg_catalog.pg_stat_get_xact_tuples_returned(r.rel))
               ORDER BY r.rel), '[]')
      INTO scans
      FROM (SELECT DISTINCT (e OPERATOR(pg_catalog.->>) 'rel')::pg_catalog.oid AS rel
              FROM pg_catalog.jsonb_array_elements(held) e) r;
    RAISE LOG 'pgoverlay-trace %', pg_catalog.jsonb_build_object(
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


@dataclass(frozen=True)
class Installed:
    """The oids of what ``install`` made: a mark checks they are all still there, unchanged."""

    namespace: int
    triggers: frozenset[int]
    functions: frozenset[int]


def _remove_objects(conn: psycopg.Connection[Any]) -> None:
    """Drop the triggers first: event triggers never fire for event trigger commands, so the
    DDL that follows runs with none of ours (or a left-over one) in place."""
    for trigger in TRIGGERS:
        conn.execute(sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(sql.Identifier(trigger)))
    for function in BODIES:
        conn.execute(
            sql.SQL("DROP FUNCTION IF EXISTS {}.{}()").format(
                sql.Identifier(SCHEMA), sql.Identifier(function)
            )
        )


def install(conn: psycopg.Connection[Any], *, user: str, database: str) -> Installed:
    """Install the triggers, their functions and the role's settings, in one transaction.

    Whatever has the functions' names is dropped first, never replaced: ``CREATE OR REPLACE``
    of a function the role made would keep the role as its owner."""
    with conn.transaction():
        _remove_objects(conn)
        for function, body in BODIES.items():
            conn.execute(
                sql.SQL(
                    "CREATE FUNCTION {}.{}() RETURNS event_trigger LANGUAGE plpgsql "
                    "SET search_path = pg_catalog, pg_temp AS {}"
                ).format(sql.Identifier(SCHEMA), sql.Identifier(function), sql.Literal(body))
            )
        for trigger, (event, function) in TRIGGERS.items():
            conn.execute(
                sql.SQL("CREATE EVENT TRIGGER {} ON {} EXECUTE FUNCTION {}.{}()").format(
                    sql.Identifier(trigger),
                    sql.Identifier(event),
                    sql.Identifier(SCHEMA),
                    sql.Identifier(function),
                )
            )
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
        found = installed(conn)
    if found is None:
        raise TraceError(
            "the trace's event triggers were not in place right after they were made: another "
            "superuser session changed them; open the trace again"
        )
    return found


def remove(conn: psycopg.Connection[Any], *, user: str, database: str) -> None:
    """Undo ``install``; idempotent."""
    with conn.transaction():
        _remove_objects(conn)
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
  JOIN pg_catalog.pg_roles r ON r.oid = p.proowner
 WHERE (e.evtname, e.evtevent, p.proname) IN
       (SELECT * FROM unnest(%s::text[], %s::text[], %s::text[]))
   AND n.nspname = %s AND e.evtenabled = 'A' AND r.rolsuper AND NOT p.prosecdef
"""


def installed(conn: psycopg.Connection[Any]) -> Installed | None:
    """What is in place now, if both triggers are, enabled always, with superuser-owned
    functions in ``SCHEMA``; None otherwise."""
    names = list(TRIGGERS)
    rows = conn.execute(
        _INSTALLED,
        (
            names,
            [TRIGGERS[t][0] for t in names],
            [TRIGGERS[t][1] for t in names],
            SCHEMA,
        ),
    ).fetchall()
    if len(rows) != len(TRIGGERS):
        return None
    return Installed(
        namespace=int(rows[0][0]),
        triggers=frozenset(int(r[1]) for r in rows),
        functions=frozenset(int(r[2]) for r in rows),
    )
