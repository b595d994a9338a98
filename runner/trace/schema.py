"""What the pull request did to the schema: the branch's catalogs against its base's.

The base's side is read once per base version, in a branch fresh from it (``keep_base``,
in a create, reset or warm start once the server is up and before the branch's login role gets
its password: until then it has the one the base was prepared with, which nobody kept), kept
in the pool, root's alone (``Pool.schema_file``): the base's data directory has no server of
its own, and a branch where pull-request code has run could show anything. Every later branch
of that version is diffed against it when its trace ends, so a re-run diffs the branch as it
is now against the base, not against the run before.

The reads follow ``instrument``'s rule for a branch where PR code may have run: catalog
queries and ``pg_get_*def``/``format_type``/``pg_get_expr`` (which print a definition and call
nothing the role made: a constant's output function and a type modifier's are those of a base
type, which only a superuser can make), every function qualified, in the engine's sessions
whose ``search_path`` is pinned to ``pg_catalog, pg_temp``. No DDL, no DML.

Read from the catalogs, not from ``pg_dump`` text: migra and schemainspect (unmaintained since
2022) and pg-schema-diff (a young CLI that writes migration SQL) were looked at; none reads
through a session the engine controls, so the queries are written here.

Left out: pgoverlay's own schemas, objects of extensions (the extension itself is listed),
objects initdb made, and a function's text (only whether its body changed, by digest).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from pgoverlay.runner import safefs
from pgoverlay.runner.names import LEDGER_SCHEMA
from pgoverlay.runner.service.views import (
    SchemaAttribute,
    SchemaChange,
    SchemaChangeKind,
    SchemaCount,
    SchemaDiff,
)
from pgoverlay.runner.trace import instrument

FORMAT = 1  # of the stored base snapshot: one of another format is not compared
OWN_SCHEMAS = (instrument.SCHEMA, LEDGER_SCHEMA)
MAX_OBJECTS = 500_000  # per kind: a schema past it is not compared (the note says so)
MAX_CHANGES = 500  # listed in a diff; past it, changes are counted only
MAX_VALUE = 400  # characters of an attribute's value kept in a diff
MAX_FILE = 512 * 1024 * 1024  # bytes of a stored base snapshot read back

# Which objects a table's own (folded into it when the table is added or dropped), and which
# kinds of relation own them.
TABLE_PARTS = ("column", "index", "constraint", "trigger", "grant")
RELATIONS = ("table", "view", "materialized view", "sequence")

# A namespace of the branch's own: %(excluded)s is OWN_SCHEMAS plus the catalogs'.
_NAMESPACES = """
  FROM pg_catalog.pg_namespace n
 WHERE NOT n.nspname = ANY(%(excluded)s)
   AND n.nspname !~ '^pg_(toast_)?temp_'
"""

# Not an extension's member (%(catalog)s: the catalog of the object's oid column).
_NOT_EXTENSIONS = """
   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend e
                    WHERE e.classid = {catalog}::pg_catalog.regclass AND e.objid = {oid}
                      AND e.deptype = 'e')
"""


def _own(catalog: str, oid: str) -> str:
    return _NOT_EXTENSIONS.format(catalog=f"'pg_catalog.{catalog}'", oid=oid)


_RELKIND = (
    "CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'partitioned table' "
    "WHEN 'f' THEN 'foreign table' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' "
    "WHEN 'S' THEN 'sequence' END"
)
_QNAME = "pg_catalog.format('%%I.%%I', n.nspname, c.relname)"

# Relations: kind, persistence, partitioning, owner, RLS, a view's definition.
_RELATIONS = f"""
SELECT c.oid, {_RELKIND}, {_QNAME},
       CASE c.relpersistence WHEN 'u' THEN 'unlogged' ELSE '' END,
       COALESCE((SELECT pg_catalog.format('%%I.%%I', pn.nspname, pc.relname)
                   FROM pg_catalog.pg_inherits h
                   JOIN pg_catalog.pg_class pc ON pc.oid = h.inhparent
                   JOIN pg_catalog.pg_namespace pn ON pn.oid = pc.relnamespace
                  WHERE h.inhrelid = c.oid AND c.relispartition LIMIT 1)
                || ' ' || pg_catalog.pg_get_expr(c.relpartbound, c.oid), ''),
       CASE WHEN c.relkind = 'p' THEN pg_catalog.pg_get_partkeydef(c.oid) ELSE '' END,
       pg_catalog.pg_get_userbyid(c.relowner),
       CASE WHEN c.relrowsecurity THEN 'enabled' ELSE '' END
       || CASE WHEN c.relforcerowsecurity THEN ', forced' ELSE '' END
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p', 'f', 'v', 'm', 'S') AND c.oid >= 16384::pg_catalog.oid
   AND n.oid IN (SELECT n.oid {_NAMESPACES})
   {_own("pg_class", "c.oid")}
 ORDER BY 2 LIMIT %(limit)s
"""
_RELATION_ATTRIBUTES = ("persistence", "partition of", "partitioned by", "owner", "row security")

# A view's definition: pg_get_viewdef locks the view (ACCESS SHARE) until the transaction
# ends, so they are read VIEW_BATCH at a time, each batch in its own transaction, and a
# schema of many views does not fill the branch's lock table (max_locks_per_transaction).
_VIEWS = """
SELECT c.oid, pg_catalog.pg_get_viewdef(c.oid)
  FROM pg_catalog.pg_class c
 WHERE c.oid = ANY(%s::pg_catalog.oid[]) AND c.relkind IN ('v', 'm')
"""
VIEW_BATCH = 200

_COLUMNS = f"""
SELECT {_QNAME}, pg_catalog.quote_ident(a.attname),
       pg_catalog.format_type(a.atttypid, a.atttypmod),
       CASE WHEN a.attnotnull THEN 'not null' ELSE 'null' END,
       CASE WHEN a.attgenerated = '' THEN COALESCE(pg_catalog.pg_get_expr(d.adbin, d.adrelid), '')
            ELSE '' END,
       CASE a.attidentity WHEN 'a' THEN 'generated always' WHEN 'd' THEN 'by default'
            ELSE '' END,
       CASE WHEN a.attgenerated = 's'
            THEN COALESCE(pg_catalog.pg_get_expr(d.adbin, d.adrelid), '') ELSE '' END,
       CASE WHEN a.attcollation <> t.typcollation
            THEN pg_catalog.format('%%I.%%I', cn.nspname, co.collname) ELSE '' END
  FROM pg_catalog.pg_attribute a
  JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
  LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
  LEFT JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation
  LEFT JOIN pg_catalog.pg_namespace cn ON cn.oid = co.collnamespace
 WHERE c.relkind IN ('r', 'p', 'f') AND c.oid >= 16384::pg_catalog.oid
   AND a.attnum > 0 AND NOT a.attisdropped
   AND n.oid IN (SELECT n.oid {_NAMESPACES})
   {_own("pg_class", "c.oid")}
 ORDER BY 1, a.attnum LIMIT %(limit)s
"""
_COLUMN_ATTRIBUTES = ("type", "nullability", "default", "identity", "generated", "collation")

# Indexes, but those of a primary key, unique or exclusion constraint (listed as that).
_INDEXES = f"""
SELECT {_QNAME}, pg_catalog.format('%%I.%%I', n.nspname, ic.relname),
       pg_catalog.pg_get_indexdef(i.indexrelid),
       CASE WHEN i.indisunique THEN 'unique' ELSE '' END,
       CASE WHEN i.indisvalid THEN 'valid' ELSE 'invalid' END
  FROM pg_catalog.pg_index i
  JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
  JOIN pg_catalog.pg_class c ON c.oid = i.indrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = ic.relnamespace
 WHERE c.relkind IN ('r', 'p', 'm', 'f') AND ic.oid >= 16384::pg_catalog.oid
   AND n.oid IN (SELECT n.oid {_NAMESPACES})
   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint k
                    WHERE k.conindid = i.indexrelid AND k.conrelid = i.indrelid
                      AND k.contype IN ('p', 'u', 'x'))
   {_own("pg_class", "c.oid")}
 ORDER BY 2 LIMIT %(limit)s
"""
_INDEX_ATTRIBUTES = ("definition", "unique", "validity")

_CONSTRAINTS = f"""
SELECT {_QNAME}, pg_catalog.quote_ident(k.conname),
       pg_catalog.pg_get_constraintdef(k.oid),
       CASE WHEN k.convalidated THEN 'validated' ELSE 'not valid' END
  FROM pg_catalog.pg_constraint k
  JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE k.conrelid <> 0 AND c.oid >= 16384::pg_catalog.oid
   AND n.oid IN (SELECT n.oid {_NAMESPACES})
   {_own("pg_class", "c.oid")}
 ORDER BY 1, 2 LIMIT %(limit)s
"""
_CONSTRAINT_ATTRIBUTES = ("definition", "validation")

_TRIGGERS = f"""
SELECT {_QNAME}, pg_catalog.quote_ident(g.tgname),
       pg_catalog.pg_get_triggerdef(g.oid),
       CASE g.tgenabled WHEN 'O' THEN 'enabled' WHEN 'D' THEN 'disabled'
            WHEN 'R' THEN 'replica' WHEN 'A' THEN 'always' END
  FROM pg_catalog.pg_trigger g
  JOIN pg_catalog.pg_class c ON c.oid = g.tgrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE NOT g.tgisinternal AND c.oid >= 16384::pg_catalog.oid
   AND n.oid IN (SELECT n.oid {_NAMESPACES})
   {_own("pg_class", "c.oid")}
 ORDER BY 1, 2 LIMIT %(limit)s
"""
_TRIGGER_ATTRIBUTES = ("definition", "enabled")

# Relation ACLs, one row per grantee: Postgres's default (the owner's) where none was set.
_GRANTS = f"""
SELECT {_QNAME},
       CASE WHEN a.grantee = 0 THEN 'PUBLIC'
            ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END,
       pg_catalog.string_agg(a.privilege_type
                             || CASE WHEN a.is_grantable THEN ' (grantable)' ELSE '' END,
                             ', ' ORDER BY a.privilege_type)
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  CROSS JOIN LATERAL pg_catalog.aclexplode(COALESCE(c.relacl, pg_catalog.acldefault(
        CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::pg_catalog."char", c.relowner))) a
 WHERE c.relkind IN ('r', 'p', 'f', 'v', 'm', 'S') AND c.oid >= 16384::pg_catalog.oid
   AND n.oid IN (SELECT n.oid {_NAMESPACES})
   AND NOT (c.relkind = 'S' AND EXISTS (  -- an identity column's sequence
            SELECT 1 FROM pg_catalog.pg_depend d
             WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
               AND d.objid = c.oid AND d.deptype = 'i'))
   {_own("pg_class", "c.oid")}
 GROUP BY 1, 2 ORDER BY 1, 2 LIMIT %(limit)s
"""
_GRANT_ATTRIBUTES = ("privileges",)

_FUNCTIONS = f"""
SELECT pg_catalog.format('%%I.%%I(%%s)', n.nspname, p.proname,
                         pg_catalog.pg_get_function_identity_arguments(p.oid)),
       CASE p.prokind WHEN 'f' THEN 'function' WHEN 'p' THEN 'procedure'
            WHEN 'a' THEN 'aggregate' WHEN 'w' THEN 'window function' END,
       COALESCE(pg_catalog.pg_get_function_result(p.oid), ''),
       l.lanname,
       CASE p.provolatile WHEN 'i' THEN 'immutable' WHEN 's' THEN 'stable'
            ELSE 'volatile' END
       || CASE WHEN p.proisstrict THEN ', strict' ELSE '' END
       || CASE WHEN p.prosecdef THEN ', security definer' ELSE '' END,
       COALESCE(pg_catalog.array_to_string(p.proconfig, ', '), ''),
       pg_catalog.pg_get_userbyid(p.proowner),
       p.prosrc || COALESCE(' ' || p.probin, '')
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_catalog.pg_language l ON l.oid = p.prolang
 WHERE p.oid >= 16384::pg_catalog.oid
   AND n.oid IN (SELECT n.oid {_NAMESPACES})
   {_own("pg_proc", "p.oid")}
 ORDER BY 1 LIMIT %(limit)s
"""
_FUNCTION_ATTRIBUTES = ("kind", "returns", "language", "properties", "settings", "owner", "body")

# Sequences but identity columns' (the column says ``identity``).
_SEQUENCES = f"""
SELECT {_QNAME}, pg_catalog.format_type(s.seqtypid, NULL),
       pg_catalog.format('start %%s, increment %%s, min %%s, max %%s, cache %%s%%s',
                         s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache,
                         CASE WHEN s.seqcycle THEN ', cycle' ELSE '' END),
       COALESCE((SELECT pg_catalog.format('%%I.%%I.%%I', tn.nspname, t.relname, a.attname)
                   FROM pg_catalog.pg_depend d
                   JOIN pg_catalog.pg_class t ON t.oid = d.refobjid
                   JOIN pg_catalog.pg_namespace tn ON tn.oid = t.relnamespace
                   JOIN pg_catalog.pg_attribute a
                     ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                  WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
                    AND d.objid = c.oid AND d.deptype = 'a' LIMIT 1), '')
  FROM pg_catalog.pg_sequence s
  JOIN pg_catalog.pg_class c ON c.oid = s.seqrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE c.oid >= 16384::pg_catalog.oid
   AND n.oid IN (SELECT n.oid {_NAMESPACES})
   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                    WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
                      AND d.objid = c.oid AND d.deptype = 'i')
   {_own("pg_class", "c.oid")}
 ORDER BY 1 LIMIT %(limit)s
"""
_SEQUENCE_ATTRIBUTES = ("type", "options", "owned by")

_ENUMS = f"""
SELECT pg_catalog.format('%%I.%%I', n.nspname, t.typname),
       pg_catalog.string_agg(pg_catalog.quote_literal(e.enumlabel), ', '
                             ORDER BY e.enumsortorder)
  FROM pg_catalog.pg_type t
  JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
  JOIN pg_catalog.pg_enum e ON e.enumtypid = t.oid
 WHERE t.typtype = 'e' AND t.oid >= 16384::pg_catalog.oid
   AND n.oid IN (SELECT n.oid {_NAMESPACES})
   {_own("pg_type", "t.oid")}
 GROUP BY 1 ORDER BY 1 LIMIT %(limit)s
"""
_ENUM_ATTRIBUTES = ("labels",)

_SCHEMAS = f"""
SELECT pg_catalog.quote_ident(n.nspname), pg_catalog.pg_get_userbyid(n.nspowner)
  {_NAMESPACES}
   AND n.nspname <> 'pg_toast'
   {_own("pg_namespace", "n.oid")}
 ORDER BY 1 LIMIT %(limit)s
"""
_SCHEMA_ATTRIBUTES = ("owner",)

_EXTENSIONS = """
SELECT pg_catalog.quote_ident(x.extname), x.extversion, pg_catalog.quote_ident(n.nspname)
  FROM pg_catalog.pg_extension x
  JOIN pg_catalog.pg_namespace n ON n.oid = x.extnamespace
 ORDER BY 1 LIMIT %(limit)s
"""
_EXTENSION_ATTRIBUTES = ("version", "schema")

Objects = dict[str, dict[str, dict[str, str]]]  # kind -> name -> attribute -> value


@dataclass(frozen=True)
class Snapshot:
    """A database's schema: every object of ``KINDS``, by kind and name, with its attributes
    (and, under ``TABLE``, the table it belongs to)."""

    taken_at: float
    objects: Objects
    notes: tuple[str, ...] = ()


TABLE = "_table"  # the attribute naming the table a column, index, ... belongs to


def _keyed(rows: Iterable[tuple[Any, ...]], names: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """Rows of (name, *values) as name -> {attribute: value}."""
    return {str(row[0]): dict(zip(names, (str(v) for v in row[1:]), strict=True)) for row in rows}


def _parts(rows: Iterable[tuple[Any, ...]], names: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """Rows of (table, part name, *values) as "table.part" -> {TABLE: table, attribute...}."""
    return {
        f"{row[0]}.{row[1]}": {TABLE: str(row[0])}
        | dict(zip(names, (str(v) for v in row[2:]), strict=True))
        for row in rows
    }


def take(conn: psycopg.Connection[Any], *, limit: int = MAX_OBJECTS) -> Snapshot:
    """The schema of the connected database, in one read-only transaction (one view of the
    catalogs). ``conn`` is an engine session: ``search_path`` pinned to the catalog."""
    params = {"excluded": ["pg_catalog", "information_schema", *OWN_SCHEMAS], "limit": limit + 1}
    objects: Objects = {}
    views: dict[int, dict[str, str]] = {}
    with conn.transaction():
        conn.execute("SET TRANSACTION READ ONLY")

        def rows(query: str) -> list[tuple[Any, ...]]:
            return conn.execute(query, params).fetchall()

        for oid, kind, name, *values in rows(_RELATIONS):
            attributes = dict(zip(_RELATION_ATTRIBUTES, (str(v) for v in values), strict=True))
            group = "table" if kind in ("table", "partitioned table", "foreign table") else kind
            if group == "table":
                attributes = {"kind": str(kind), **attributes}
            if group in ("view", "materialized view"):
                views[int(oid)] = attributes
            objects.setdefault(str(group), {})[str(name)] = attributes
        objects["column"] = _parts(rows(_COLUMNS), _COLUMN_ATTRIBUTES)
        indexes = rows(_INDEXES)
        objects["index"] = {
            str(name): {TABLE: str(table)}
            | dict(zip(_INDEX_ATTRIBUTES, map(str, values), strict=True))
            for table, name, *values in indexes
        }
        objects["constraint"] = _parts(rows(_CONSTRAINTS), _CONSTRAINT_ATTRIBUTES)
        objects["trigger"] = _parts(rows(_TRIGGERS), _TRIGGER_ATTRIBUTES)
        objects["grant"] = {
            f"{table} to {grantee}": {TABLE: str(table), "privileges": str(privileges)}
            for table, grantee, privileges in rows(_GRANTS)
        }
        functions = {}
        for name, *values, body in rows(_FUNCTIONS):
            attributes = dict(zip(_FUNCTION_ATTRIBUTES[:-1], map(str, values), strict=True))
            attributes["body"] = hashlib.sha256(str(body).encode()).hexdigest()[:16]
            functions[str(name)] = attributes
        objects["function"] = functions
        objects["sequence"] = _keyed(rows(_SEQUENCES), _SEQUENCE_ATTRIBUTES)
        objects["enum"] = _keyed(rows(_ENUMS), _ENUM_ATTRIBUTES)
        objects["schema"] = _keyed(rows(_SCHEMAS), _SCHEMA_ATTRIBUTES)
        objects["extension"] = _keyed(rows(_EXTENSIONS), _EXTENSION_ATTRIBUTES)
    oids = sorted(views)
    for start in range(0, len(oids), VIEW_BATCH):
        with conn.transaction():
            conn.execute("SET TRANSACTION READ ONLY")
            for oid, definition in conn.execute(_VIEWS, (oids[start : start + VIEW_BATCH],)):
                views[int(oid)]["definition"] = str(definition).strip()
    notes = tuple(
        f"more than {limit:,} objects of kind {kind}: the schema is too large to compare it"
        for kind, found in objects.items()
        if len(found) > limit
    )
    for kind in KINDS:
        objects.setdefault(kind, {})
    return Snapshot(taken_at=time.time(), objects=objects, notes=notes)


# Every kind, in the order a diff lists them.
KINDS = (
    "schema",
    "extension",
    "enum",
    "sequence",
    "table",
    "column",
    "constraint",
    "index",
    "trigger",
    "grant",
    "view",
    "materialized view",
    "function",
)


# -- the base's side, kept in the pool -----------------------------------------------------


def dumps(snapshot: Snapshot) -> str:
    return json.dumps(
        {
            "format": FORMAT,
            "taken_at": snapshot.taken_at,
            "objects": snapshot.objects,
            "notes": list(snapshot.notes),
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def loads(text: str) -> Snapshot | None:
    """A stored snapshot, or None when it is not one this release wrote."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    objects = data.get("objects")
    if not isinstance(objects, dict):
        return None
    notes = data.get("notes", [])
    return Snapshot(
        taken_at=float(data.get("taken_at", 0.0)),
        objects=objects,
        notes=tuple(str(n) for n in notes) if isinstance(notes, list) else (),
    )


def keep_base(path: Path, connect: Callable[[], psycopg.Connection[Any]]) -> bool:
    """Read the base's schema through ``connect`` (an engine session on a branch fresh from
    the base) and keep it at ``path``, unless it is kept already; True if it was read now. The
    file is written whole, then renamed into place: a reader sees all of it or none."""
    if path.is_file():
        return False
    with connect() as conn:
        taken = take(conn)  # too large to compare: kept with its note, which every diff says
    for directory in (path.parent.parent, path.parent):  # schemas/ is new to older pools
        safefs.make_dir(directory, uid=0, gid=0, mode=0o700, exist_ok=True)
    # the service creates branches in threads of one process: a partial file of this call's own
    safefs.write_whole(path, dumps(taken), uid=0, gid=0, mode=0o600)
    return True


def load_base(path: Path) -> Snapshot | None:
    """The base's schema kept at ``path``; None if there is none this release reads."""
    if not path.is_file():
        return None
    raw = safefs.read_regular(path, limit=MAX_FILE, what=f"the base's schema snapshot {path}")
    return loads(raw.decode())


# -- the diff: pure ------------------------------------------------------------------------


def _cut(value: str) -> str:
    return value if len(value) <= MAX_VALUE else value[: MAX_VALUE - 1] + "…"


def _attributes(
    before: dict[str, str] | None, after: dict[str, str] | None
) -> list[SchemaAttribute]:
    """The attributes that differ (all of them, where one side is missing), but TABLE."""
    names = [n for n in {**(before or {}), **(after or {})} if n != TABLE]
    found = []
    for name in names:
        old = (before or {}).get(name, "")
        new = (after or {}).get(name, "")
        if before is not None and after is not None and old == new:
            continue
        if (before is None or after is None) and not (old or new):
            continue  # an empty attribute of an added or dropped object says nothing
        found.append(SchemaAttribute(name=name, before=_cut(old), after=_cut(new)))
    return found


def diff(base: Snapshot, branch: Snapshot, *, limit: int = MAX_CHANGES) -> SchemaDiff:
    """What ``branch`` has that ``base`` has not, has differently, or lacks, kind by kind. The
    parts of a table added or dropped whole (columns, indexes, ...) go with it: listed as its
    ``columns`` (and so on) attribute, not one by one."""
    if base.notes or branch.notes:  # a side was cut short: its objects are not all there
        return SchemaDiff(base_taken_at=base.taken_at, notes=[*base.notes, *branch.notes])
    changes: list[SchemaChange] = []
    counts: dict[tuple[str, SchemaChangeKind], int] = {}
    whole = set().union(
        *(set(base.objects.get(k, {})) ^ set(branch.objects.get(k, {})) for k in RELATIONS)
    )
    for kind in KINDS:
        old, new = base.objects.get(kind, {}), branch.objects.get(kind, {})
        for name in sorted(set(old) | set(new)):
            before, after = old.get(name), new.get(name)
            table = (after or before or {}).get(TABLE, "")
            if kind in TABLE_PARTS and table in whole:
                continue
            change: SchemaChangeKind
            if before is None:
                change = "added"
            elif after is None:
                change = "dropped"
            elif before != after:
                change = "changed"
            else:
                continue
            attributes = _attributes(before, after)
            if kind in RELATIONS and change != "changed":
                attributes += _folded(base if change == "dropped" else branch, name, change)
            changes.append(
                SchemaChange(
                    kind=kind, name=name, change=change, table=table, attributes=attributes
                )
            )
            counts[kind, change] = counts.get((kind, change), 0) + 1
    return SchemaDiff(
        base_taken_at=base.taken_at,
        changes=changes[:limit],
        counts=[SchemaCount(kind=k, change=c, count=n) for (k, c), n in counts.items()],
        left_out=max(0, len(changes) - limit),
    )


def _folded(snapshot: Snapshot, table: str, change: SchemaChangeKind) -> list[SchemaAttribute]:
    """A whole table's parts, one attribute per kind: "columns": "id bigint not null, ..."."""
    found = []
    for kind in TABLE_PARTS:
        parts = [
            (name, attributes)
            for name, attributes in snapshot.objects.get(kind, {}).items()
            if attributes.get(TABLE) == table
        ]
        if not parts:
            continue
        text = ", ".join(_part(kind, table, name, attributes) for name, attributes in parts)
        value = _cut(text)
        found.append(
            SchemaAttribute(
                name=_PLURAL.get(kind, f"{kind}s"),
                before=value if change == "dropped" else "",
                after=value if change == "added" else "",
            )
        )
    return found


_PLURAL = {"index": "indexes"}


def _part(kind: str, table: str, name: str, attributes: dict[str, str]) -> str:
    short = name[len(table) + 1 :] if name.startswith(table + ".") else name
    if kind == "column":
        words = [short, attributes.get("type", "")]
        if attributes.get("nullability") == "not null":
            words.append("not null")
        if attributes.get("default"):
            words.append(f"default {attributes['default']}")
        return " ".join(words)
    if kind in ("index", "constraint", "trigger"):
        return attributes.get("definition", short)
    return f"{short.split(' to ', 1)[-1]}: {attributes.get('privileges', '')}"
