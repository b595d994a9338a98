"""Production's workload: the source's top statements, read from ``pg_stat_statements`` when a
base is seeded (or later, `pgoverlay base workload`), kept with the base version.

What is kept of each statement: its query id, its normalized text (constants are ``$n``), calls,
mean and total execution time, rows, and its calls per second since the source's statistics
were reset (``pg_stat_statements_info.stats_reset``). The same query id counted for several
roles or nesting levels is one statement, its counts added. Only plannable statements
(SELECT, INSERT, UPDATE, DELETE, MERGE, and a WITH before one of them), their comments
stripped: a utility statement's text is not normalized (``ALTER ROLE ... PASSWORD '...'``
would be kept whole), so none is ever kept. The statement's kind is sqlparse's reading of its
first keywords, from its lexer alone: lighter to load than a full Postgres parser (and loaded
only when there are statements to read), and what decides here is only which statement it is,
not what it means. The first ``top`` are kept, by total time, then calls.

A source without the extension (or whose role may read only its own statements: the
``pg_read_all_stats`` role reads every role's) is said in one line; the seed goes on. The file
is root's alone, like the base's schema snapshot (``trace.schema``), at
``Pool.workload_file``, written whole and renamed into place, removed with the version.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgoverlay.errors import ConfigError
from pgoverlay.runner import safefs
from pgoverlay.runner.names import SOURCE_MARK
from pgoverlay.runner.service import wire
from pgoverlay.runner.service.shape import as_dict
from pgoverlay.runner.service.views import BaseWorkload, WorkloadStatement

DEFAULT_TOP = 200
MAX_TOP = 10_000
FORMAT = 1
MAX_FILE = 64 * 1024 * 1024  # a stored workload, or an export given with --file
PLANNABLE = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE", "MERGE"})
HIDDEN = "<insufficient privilege>"  # pg_stat_statements' text of another role's statement
# What the capture itself runs starts with this comment (pg_stat_statements keeps a statement's
# comments), so a later capture knows its own reads are not production's.
MARK = "/* pgoverlay workload */ "

# The columns an export may have (`--file`), each with the names it is known by: those of
# pg_stat_statements since Postgres 13, those of 12 and before, and this file's own.
COLUMNS: dict[str, tuple[str, ...]] = {
    "queryid": ("queryid",),
    "query": ("query",),
    "calls": ("calls",),
    "total_ms": ("total_exec_time", "total_time", "total_ms"),
    "rows": ("rows",),
    "per_second": ("per_second",),
}


@dataclass(frozen=True)
class Counted:
    """One row of pg_stat_statements (or of an export), before statements are chosen."""

    queryid: int
    query: str
    calls: int
    total_ms: float
    rows: int
    per_second: float | None = None  # an export's own rate, when it has one


def check_top(top: int | None) -> int:
    """How many statements to keep: ``top``, or ``DEFAULT_TOP`` for None."""
    if top is None:
        return DEFAULT_TOP
    if top < 0 or top > MAX_TOP:
        raise ConfigError(
            f"{top} statements of the workload is out of range: give 0 (none) to {MAX_TOP}"
        )
    return top


# -- which statements: pure -----------------------------------------------------------------


def plannable(text: str) -> str | None:
    """``text`` without its comments if it is one plannable statement, else None. Read from
    sqlparse's lexer alone: its grouping costs milliseconds a statement (seconds for a source's
    thousands) and refuses one of more than 10,000 tokens, and nothing read here needs it."""
    from sqlparse import lexer  # loaded only when there are statements to read: a seed of
    from sqlparse import tokens as T  # a source without pg_stat_statements never pays for it

    lexed = list(lexer.tokenize(text))  # type: ignore[no-untyped-call]
    stripped = "".join(" " if ttype in T.Comment else value for ttype, value in lexed).strip()
    words = [
        (ttype, value)
        for ttype, value in lexed
        if ttype not in T.Comment and ttype not in T.Whitespace and ttype is not T.Newline
    ]
    kind = _kind(words, T.Keyword)
    return stripped if kind in PLANNABLE else None


def _kind(words: list[tuple[Any, str]], keyword: Any) -> str | None:
    """The kind of the one statement ``words`` make (its significant tokens): SELECT, INSERT,
    ... or another word; None for none, or several."""
    depth = 0
    kind: str | None = None
    for at, (ttype, value) in enumerate(words):
        if value == "(":
            depth += 1
        elif value == ")":
            depth -= 1
        elif value == ";" and depth == 0:
            if any(v != ";" for _, v in words[at + 1 :]):
                return None  # a text of several statements
        elif ttype in keyword and kind is None:  # the first word, maybe after brackets
            word = value.upper()
            kind = {"VALUES": "SELECT", "TABLE": "SELECT"}.get(word, word)
        elif ttype in keyword and depth == 0:
            word = value.upper()
            if kind == "WITH" and word in PLANNABLE:
                kind = word  # the statement after the WITH's queries
            elif kind == "SELECT" and word == "INTO":
                return "SELECT INTO"  # CREATE TABLE AS: a utility statement
        elif kind is None:
            return "OTHER"  # it starts with a name, a literal: no statement we know
    return kind


def choose(
    counted: Iterable[Counted], *, top: int, elapsed: float | None
) -> list[WorkloadStatement]:
    """The first ``top`` plannable statements by total time, then calls; each query id once,
    its counts added (one row per role and nesting level), its rate over ``elapsed`` seconds
    (an export's own, when it has one). Statements are read in that order until ``top`` are
    found: a source keeps thousands, and only the ones kept are worth parsing."""
    merged: dict[int, Counted] = {}
    for c in counted:
        if c.query == HIDDEN or c.query.startswith((MARK, SOURCE_MARK)):
            continue
        was = merged.get(c.queryid)
        merged[c.queryid] = c if was is None else _added(was, c)
    chosen: list[WorkloadStatement] = []
    for c in sorted(merged.values(), key=lambda c: (-c.total_ms, -c.calls, c.queryid)):
        if len(chosen) == top:
            break
        text = plannable(c.query)
        if text is None:
            continue
        chosen.append(
            WorkloadStatement(
                queryid=c.queryid,
                query=text,
                calls=c.calls,
                mean_ms=c.total_ms / c.calls if c.calls else 0.0,
                total_ms=c.total_ms,
                rows=c.rows,
                per_second=_rate(c, elapsed),
            )
        )
    return chosen


def _added(was: Counted, c: Counted) -> Counted:
    rate = None
    if was.per_second is not None or c.per_second is not None:
        rate = (was.per_second or 0.0) + (c.per_second or 0.0)
    return Counted(
        was.queryid,
        was.query,
        was.calls + c.calls,
        was.total_ms + c.total_ms,
        was.rows + c.rows,
        per_second=rate,
    )


def _rate(c: Counted, elapsed: float | None) -> float:
    if c.per_second is not None:
        return c.per_second
    return c.calls / elapsed if elapsed else 0.0


# -- from the source ------------------------------------------------------------------------


def capture(conn: psycopg.Connection[Any], *, top: int, source: str, base: str) -> BaseWorkload:
    """The source's workload through ``conn`` (a session in the seed's database). Without the
    extension, or without the right to read it, no statement and a ``note`` saying what to do."""
    later = f"give it later with `pgoverlay base workload {base} --from DSN` or `--file PATH`"
    with conn.transaction():
        # Only the catalog's names, whatever the source's roles put first on their path.
        conn.execute(MARK + "SET LOCAL search_path = pg_catalog, pg_temp")
        found = conn.execute(
            MARK + "SELECT n.nspname FROM pg_catalog.pg_extension e "
            "JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace "
            "WHERE e.extname = 'pg_stat_statements'"
        ).fetchone()
    database = conn.info.dbname
    if found is None:
        return BaseWorkload(
            source=source,
            note=f"no workload captured: the source's database {database} has no "
            "pg_stat_statements (add it to shared_preload_libraries and run CREATE EXTENSION "
            f"pg_stat_statements), or {later}",
        )
    schema = sql.Identifier(found[0])
    try:
        with conn.transaction():
            conn.execute(MARK + "SET LOCAL search_path = pg_catalog, pg_temp")
            reset, elapsed, everyone = conn.execute(
                sql.SQL(
                    MARK + "SELECT extract(epoch FROM i.stats_reset)::float8, "
                    "extract(epoch FROM now() - i.stats_reset)::float8, "
                    "pg_catalog.pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') "
                    "FROM {}.pg_stat_statements_info i"
                ).format(schema)
            ).fetchone() or (None, None, False)
            rows = conn.execute(
                sql.SQL(
                    MARK + "SELECT s.queryid, s.query, s.calls, s.total_exec_time, s.rows "
                    "FROM {}.pg_stat_statements s "
                    "WHERE s.dbid = (SELECT oid FROM pg_catalog.pg_database "
                    "WHERE datname = pg_catalog.current_database()) AND s.queryid IS NOT NULL"
                ).format(schema)
            ).fetchall()
    except psycopg.Error as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        fix = (
            "add pg_stat_statements to the source's shared_preload_libraries and restart it"
            if "shared_preload_libraries" in reason
            else "grant the seed's role pg_read_all_stats (and SELECT on the view)"
        )
        return BaseWorkload(
            source=source,
            note=f"no workload captured: the source's pg_stat_statements cannot be read "
            f"({reason}): {fix}, or {later}",
        )
    counted = [
        Counted(int(q), str(text or ""), int(calls), float(total), int(n))
        for q, text, calls, total, n in rows
    ]
    note = ""
    if not everyone:
        note = (
            f"the workload holds only role {conn.info.user}'s own statements: grant it "
            f"pg_read_all_stats to read every role's, then run `pgoverlay base workload {base} "
            "--from DSN`"
        )
    return BaseWorkload(
        captured_at=time.time(),
        source=source,
        stats_reset=reset,
        statements=choose(counted, top=top, elapsed=elapsed),
        note=note,
    )


# -- from an export (--file) ----------------------------------------------------------------


def from_file(path: Path, *, top: int) -> BaseWorkload:
    """The workload in an export of pg_stat_statements: CSV with a header line, or JSON (a list
    of objects); the columns ``COLUMNS`` names (queryid, query, calls, total_exec_time; rows and
    per_second if it has them)."""
    raw = safefs.read_regular(path, limit=MAX_FILE, what=f"the workload file {path}")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"the workload file {path} is not UTF-8 text") from None
    records = _records(text, path)
    counted = [_counted(r, path, i) for i, r in enumerate(records, start=1)]
    return BaseWorkload(
        captured_at=time.time(),
        source=f"file {path.name}",
        statements=choose(counted, top=top, elapsed=None),
        note=""
        if any(c.per_second is not None for c in counted)
        else (f"{path.name} has no per_second column: rates are not known"),
    )


def _records(text: str, path: Path) -> list[Mapping[str, Any]]:
    if text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
        except ValueError as err:
            raise ConfigError(f"the workload file {path} is not valid JSON: {err}") from None
        if isinstance(data, dict):
            data = data.get("statements")
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise ConfigError(
                f"the workload file {path} must hold a JSON list of objects, one per statement "
                "(or an object whose `statements` is that list)"
            )
        return data
    return list(csv.DictReader(io.StringIO(text)))


def _counted(record: Mapping[str, Any], path: Path, line: int) -> Counted:
    values: dict[str, Any] = {}
    for key, names in COLUMNS.items():
        for name in names:
            if record.get(name) not in (None, ""):
                values[key] = record[name]
                break
    missing = [COLUMNS[k][0] for k in ("queryid", "query", "calls", "total_ms") if k not in values]
    if missing:
        raise ConfigError(
            f"statement {line} of the workload file {path} has no {', '.join(missing)}: an "
            "export needs the columns queryid, query, calls and total_exec_time (rows and "
            "per_second are read when given)"
        )
    try:
        rate = float(values["per_second"]) if "per_second" in values else None
        found = Counted(
            queryid=int(values["queryid"]),
            query=str(values["query"]),
            calls=int(values["calls"]),
            total_ms=float(values["total_ms"]),
            rows=int(values.get("rows", 0)),
            per_second=rate,
        )
    except (TypeError, ValueError):
        raise ConfigError(
            f"statement {line} of the workload file {path} has a value that is not a number "
            "in queryid, calls, total_exec_time, rows or per_second"
        ) from None
    if not all(math.isfinite(v) for v in (found.total_ms, found.per_second or 0.0)):
        raise ConfigError(f"statement {line} of the workload file {path} has a value not finite")
    return found


# -- kept with the base version -------------------------------------------------------------


def dumps(workload: BaseWorkload) -> str:
    return json.dumps(
        {"format": FORMAT, **as_dict(workload)}, separators=(",", ":"), sort_keys=True
    )


def loads(text: str) -> BaseWorkload | None:
    """A stored workload, or None when it is not one this release wrote."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
        return None
    try:
        return wire.decode(BaseWorkload, data)
    except ValueError:
        return None


def keep(path: Path, workload: BaseWorkload) -> None:
    """Keep ``workload`` at ``path``, root's alone, replacing what was there: written whole,
    then renamed into place, so a reader sees all of it or none."""
    for directory in (path.parent.parent, path.parent):  # workloads/ is new to older pools
        safefs.make_dir(directory, uid=0, gid=0, mode=0o700, exist_ok=True)
    safefs.write_whole(path, dumps(workload), uid=0, gid=0, mode=0o600)


def load(path: Path) -> BaseWorkload | None:
    """The workload kept at ``path``; None if there is none this release reads."""
    if not path.is_file():
        return None
    raw = safefs.read_regular(path, limit=MAX_FILE, what=f"the base's workload {path}")
    return loads(raw.decode())


def named(workload: BaseWorkload, name: str, version: int) -> BaseWorkload:
    """``workload`` as kept with version ``version`` of base ``name``."""
    return BaseWorkload(
        name=name,
        version=version,
        captured_at=workload.captured_at,
        source=workload.source,
        stats_reset=workload.stats_reset,
        statements=list(workload.statements),
        note=workload.note,
    )
