"""The locks Postgres documents for statements whose locks the trace cannot always read: no
event trigger fires for them (INSERT, UPDATE, DELETE and MERGE in a migrate command, TRUNCATE,
LOCK TABLE, CLUSTER, REINDEX, VACUUM FULL), or their
locks are gone when the statement ends (the CONCURRENTLY forms, which run outside a
transaction block). Pure code on a statement's text and the relations before it ran.

A statement that completed took these modes for certain (the documentation's "Explicit
Locking", and each command's page); an analysis labels them "inferred". A name that does not
resolve to exactly one relation gives nothing: better a lock left to the sampler than one put
on the wrong table.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from pgoverlay.action.insight import sqltext
from pgoverlay.runner.service.views import RelationState
from pgoverlay.runner.values import flag

_IDENT = r'(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)'
_QNAME = rf"{_IDENT}(?:\s*\.\s*{_IDENT})?"
_LIST_ITEM = re.compile(
    rf"\s*(?:ONLY\s+)?(?P<name>{_QNAME})\s*\*?\s*(?:\([^)]*\))?\s*(?P<comma>,)?", re.I
)
_MODES = (
    "ACCESS SHARE|ROW SHARE|ROW EXCLUSIVE|SHARE UPDATE EXCLUSIVE|SHARE ROW EXCLUSIVE|SHARE|"
    "EXCLUSIVE|ACCESS EXCLUSIVE"
)
_TRUNCATE = re.compile(r"^TRUNCATE\s+(?:TABLE\s+)?", re.I)
_LOCK = re.compile(r"^LOCK\s+(?:TABLE\s+)?", re.I)
_LOCK_MODE = re.compile(rf"^\s*IN\s+(?P<mode>{_MODES})\s+MODE\b", re.I)
_CLUSTER = re.compile(
    rf"^CLUSTER\s+(?:\([^)]*\)\s*)?(?:VERBOSE\s+)?(?P<name>{_QNAME})(?:\s+ON\s+(?P<table>{_QNAME}))?",
    re.I,
)
_VACUUM = re.compile(
    r"^VACUUM\s+(?:\((?P<options>[^)]*)\)|(?P<words>(?:(?:FULL|FREEZE|VERBOSE|ANALYZE|ANALYSE)\s+)+))",
    re.I,
)
_FULL_OPTION = re.compile(r"(?:^|,)\s*FULL\s*(?P<value>\w+)?\s*(?:,|$)", re.I)
_REINDEX = re.compile(
    rf"^REINDEX\s+(?:\((?P<options>[^)]*)\)\s*)?(?P<what>INDEX|TABLE)\s+"
    rf"(?P<concurrently>CONCURRENTLY\s+)?(?P<name>{_QNAME})",
    re.I,
)
_CREATE_INDEX_CONCURRENTLY = re.compile(
    rf"^CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    rf"(?:(?!ON\b){_IDENT}\s+)?ON\s+(?:ONLY\s+)?(?P<table>{_QNAME})",
    re.I,
)
_DROP_INDEX_CONCURRENTLY = re.compile(
    rf"^DROP\s+INDEX\s+CONCURRENTLY\s+(?:IF\s+EXISTS\s+)?(?P<name>{_QNAME})\s*(?:CASCADE|RESTRICT)?\s*;?\s*$",
    re.I,
)
# A data change's target: INSERT, UPDATE, DELETE and MERGE take ROW EXCLUSIVE on it ("Explicit
# Locking": the lock these commands take on the target table), and on each of its indexes
# (the planner and executor open them for the change).
_DML = re.compile(
    rf"^(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*"
    rf"(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|MERGE\s+INTO)\s+(?:ONLY\s+)?(?P<table>{_QNAME})",
    re.IGNORECASE | re.DOTALL,
)
# What a statement this module knows may start with, after comments and blanks.
_CANDIDATE = re.compile(
    r"^(\s+|--[^\n]*(\n|$)|/\*.*?\*/)*(TRUNCATE|LOCK|CLUSTER|VACUUM|REINDEX|"
    r"(CREATE|DROP)\b.*\bCONCURRENTLY)\b",
    re.IGNORECASE | re.DOTALL,
)
# The lock a concurrent drop takes last, on the index it removes (DROP INDEX CONCURRENTLY, and
# REINDEX CONCURRENTLY dropping the index it replaced): by then the index is no longer live, so
# no query uses it or waits on it; taken at the statement's end, for an instant.
DYING = "ACCESS EXCLUSIVE"
_TABLES = ("r", "p", "m")
_INDEXES = ("i", "I")

Relations = Mapping[int, RelationState]
Locks = list[tuple[int, str]]  # (relation oid, mode in capitals)


def locks(text: str, relations: Relations) -> Locks:
    """The relations (by oid, among ``relations``) and modes Postgres takes for ``text``, if
    it is one of the statements this module knows and its names resolve; else []."""
    dml = _DML.match(text)
    if dml is not None:  # read from its head only: a data load's text may be megabytes
        return _data_change(dml.group("table"), relations)
    if not _CANDIDATE.match(text):
        return []  # most statements: no need to strip their comments
    bare = sqltext.strip_comments(text).strip()
    for reader in _READERS:
        found = reader(bare, relations)
        if found is not None:
            return found
    return []


def _names(text: str) -> tuple[list[str], str]:
    """A comma-separated list of (possibly ONLY, possibly starred) names at the start of
    ``text``, and what follows it."""
    names: list[str] = []
    at = 0
    while True:
        found = _LIST_ITEM.match(text, at)
        if found is None:
            break
        names.append(found.group("name"))
        at = found.end()
        if not found.group("comma"):
            break
    return names, text[at:]


def _parts(qname: str) -> tuple[str | None, str]:
    idents = re.findall(_IDENT, qname)
    bare = [i[1:-1].replace('""', '"') if i.startswith('"') else i.lower() for i in idents]
    return (bare[0], bare[1]) if len(bare) == 2 else (None, bare[0])


def resolve(qname: str, relations: Relations, kinds: Iterable[str]) -> int | None:
    """The one relation of ``kinds`` a name can mean, or None (none, or more than one)."""
    schema, name = _parts(qname)
    wanted = set(kinds)
    found = [
        r.oid
        for r in relations.values()
        if r.name == name
        and r.kind in wanted
        and (r.schema_name == schema if schema else r.schema_name not in ("pg_toast",))
    ]
    return found[0] if len(found) == 1 else None


def _each(names: Iterable[str], relations: Relations, mode: str) -> Locks:
    found = []
    for qname in names:
        oid = resolve(qname, relations, _TABLES)
        if oid is not None:
            found.append((oid, mode))
    return found


def _data_change(qname: str, relations: Relations) -> Locks:
    table = resolve(qname, relations, ("r",))  # a partitioned target's partitions: not known
    if table is None:
        return []
    indexes = [r.oid for r in relations.values() if r.table_oid == table and r.kind in _INDEXES]
    return [(table, "ROW EXCLUSIVE"), *((i, "ROW EXCLUSIVE") for i in indexes)]


def _truncate(bare: str, relations: Relations) -> Locks | None:
    head = _TRUNCATE.match(bare)
    if head is None:
        return None
    names, _ = _names(bare[head.end() :])
    return _each(names, relations, "ACCESS EXCLUSIVE")


def _lock_table(bare: str, relations: Relations) -> Locks | None:
    head = _LOCK.match(bare)
    if head is None:
        return None
    names, rest = _names(bare[head.end() :])
    mode = _LOCK_MODE.match(rest)
    return _each(
        names,
        relations,
        " ".join(mode.group("mode").upper().split()) if mode else "ACCESS EXCLUSIVE",
    )


def _cluster(bare: str, relations: Relations) -> Locks | None:
    found = _CLUSTER.match(bare)
    if found is None:
        return None
    # CLUSTER index ON table is the old spelling.
    return _each([found.group("table") or found.group("name")], relations, "ACCESS EXCLUSIVE")


def _vacuum_full(bare: str, relations: Relations) -> Locks | None:
    found = _VACUUM.match(bare)
    if found is None:
        return None
    if found.group("options") is not None:
        option = _FULL_OPTION.search(found.group("options"))
        full = option is not None and flag(option.group("value") or "true") is True
    else:
        full = "FULL" in found.group("words").upper().split()
    if not full:
        return []
    names, _ = _names(bare[found.end() :])
    return _each(names, relations, "ACCESS EXCLUSIVE")


def _reindex(bare: str, relations: Relations) -> Locks | None:
    found = _REINDEX.match(bare)
    if found is None:
        return None
    options = found.group("options") or ""
    concurrently = bool(found.group("concurrently")) or bool(
        re.search(r"\bCONCURRENTLY\b(?!\s+(false|off|0)\b)", options, re.I)
    )
    if found.group("what").upper() == "INDEX":
        index = resolve(found.group("name"), relations, _INDEXES)
        table = relations[index].table_oid if index is not None else None
        if index is None or table is None:
            return []
        indexes = [index]
    else:
        table = resolve(found.group("name"), relations, _TABLES)
        if table is None:
            return []
        indexes = [r.oid for r in relations.values() if r.table_oid == table and r.kind in _INDEXES]
    if concurrently:
        # and, dropping each index it replaced, ACCESS EXCLUSIVE on it (``DYING``)
        return [
            (table, "SHARE UPDATE EXCLUSIVE"),
            *((i, "SHARE UPDATE EXCLUSIVE") for i in indexes),
            *((i, DYING) for i in indexes),
        ]
    return [(table, "SHARE"), *((i, "ACCESS EXCLUSIVE") for i in indexes)]


def _create_index_concurrently(bare: str, relations: Relations) -> Locks | None:
    found = _CREATE_INDEX_CONCURRENTLY.match(bare)
    if found is None:
        return None
    return _each([found.group("table")], relations, "SHARE UPDATE EXCLUSIVE")


def _drop_index_concurrently(bare: str, relations: Relations) -> Locks | None:
    found = _DROP_INDEX_CONCURRENTLY.match(bare)
    if found is None:
        return None
    index = resolve(found.group("name"), relations, _INDEXES)
    table = relations[index].table_oid if index is not None else None
    if index is None or table is None:
        return []
    return [(table, "SHARE UPDATE EXCLUSIVE"), (index, "SHARE UPDATE EXCLUSIVE"), (index, DYING)]


_READERS: tuple[Callable[[str, Relations], Locks | None], ...] = (
    _truncate,
    _lock_table,
    _cluster,
    _vacuum_full,
    _reindex,
    _create_index_concurrently,
    _drop_index_concurrently,
)
