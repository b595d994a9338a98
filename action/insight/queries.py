"""Production's own statements, before and after a pull request's migrations.

For each captured statement (pg_stat_statements' normalized text), on a "before" connection (a
branch of the PR's base) and an "after" one (the PR's branch after its migrations), both as the
branch's role:

- **break**: the statement errors after and not before (when it is prepared, planned, or run
  with real values): the highest verdict. One that errors on both sides is not the PR's doing.
- **plan**: the generic plan (`EXPLAIN (GENERIC_PLAN)` on 16+; on 14 and 15 `PREPARE` with the
  parameter types Postgres infers and `EXPLAIN EXECUTE` under `plan_cache_mode =
  force_generic_plan`), reduced to a shape (`shape`): node types, relations, indexes, join order;
  no costs or rows. A different shape is reported with both sides.
- **regression** / **improvement**: each statement run `runs` times per side with values drawn
  from the before side's rows (paramvalues), in a transaction rolled back, with a statement
  timeout per run, before and after in turn; the ratio of the medians. At least `slower` times
  slower and slower by more than `floor_ms` is a regression; `1/slower` and faster by more than
  the floor an improvement.
- The whole check has a time budget: the statements not reached are named.

What is returned holds shapes, times and errors (SQLSTATE and a message with every sampled
value taken out), never a sampled value: a masked base stays masked.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import psycopg
from psycopg import pq, sql

from pgoverlay.action.insight import paramvalues

Verdict = Literal["break", "regression", "plan", "improvement", "unchanged"]
RANK: dict[Verdict, int] = {
    "break": 4,
    "regression": 3,
    "plan": 2,
    "improvement": 1,
    "unchanged": 0,
}
PREPARED = "pgoverlay_workload_check"
TIMED_OUT = "57014"


class Statement(Protocol):
    """A captured statement (the workload's wire type has these fields)."""

    @property
    def queryid(self) -> int: ...
    @property
    def query(self) -> str: ...
    @property
    def calls(self) -> int: ...
    @property
    def per_second(self) -> float: ...
    @property
    def mean_ms(self) -> float: ...


@dataclass(frozen=True)
class Failure:
    """An error a statement met: its SQLSTATE and message, sampled values taken out."""

    sqlstate: str
    message: str


@dataclass(frozen=True)
class Timing:
    """Median times of the runs on each side; `after_timed_out` when after hit the timeout
    (its time is then the timeout, a lower bound)."""

    before_ms: float
    after_ms: float
    runs: int
    after_timed_out: bool = False

    @property
    def ratio(self) -> float:
        return self.after_ms / self.before_ms if self.before_ms > 0 else float("inf")


@dataclass(frozen=True)
class StatementCheck:
    queryid: int
    query: str
    calls: int
    per_second: float
    verdict: Verdict
    before_error: Failure | None = None
    after_error: Failure | None = None
    before_shape: tuple[str, ...] | None = None
    after_shape: tuple[str, ...] | None = None
    timing: Timing | None = None
    note: str | None = None  # why a part was not checked (no timing, no plan)


@dataclass(frozen=True)
class WorkloadCheck:
    statements: tuple[StatementCheck, ...]
    unchecked: tuple[int, ...]  # query ids the budget did not reach
    budget_s: float


def check(
    statements: Sequence[Statement],
    *,
    before: psycopg.Connection[Any],
    after: psycopg.Connection[Any],
    budget_s: float = 60.0,
    runs: int = 5,
    slower: float = 2.0,
    floor_ms: float = 5.0,
    timeout_ms: int = 5000,
) -> WorkloadCheck:
    """Check every statement before and after, within `budget_s` seconds in all. Both
    connections are in autocommit mode (each step opens its own transaction and rolls it back)
    and log in as the branch's role."""
    deadline = time.monotonic() + budget_s
    done: list[StatementCheck] = []
    unchecked: list[int] = []
    for st in statements:
        if time.monotonic() >= deadline:
            unchecked.append(st.queryid)
            continue
        done.append(
            _one(
                st,
                before=before,
                after=after,
                deadline=deadline,
                runs=runs,
                slower=slower,
                floor_ms=floor_ms,
                timeout_ms=timeout_ms,
            )
        )
    done.sort(key=lambda c: -RANK[c.verdict])
    return WorkloadCheck(tuple(done), tuple(unchecked), budget_s)


def _one(
    st: Statement,
    *,
    before: psycopg.Connection[Any],
    after: psycopg.Connection[Any],
    deadline: float,
    runs: int,
    slower: float,
    floor_ms: float,
    timeout_ms: int,
) -> StatementCheck:
    notes: list[str] = []
    values, why = _values(before, st.query, runs)
    if why:
        notes.append(why)
    secret = _secrets(values)
    first = values[0] if values else None
    b_shape, b_err = _plan(before, st.query, first, secret, timeout_ms)
    a_shape, a_err = _plan(after, st.query, first, secret, timeout_ms)
    for side, err in (("before", b_err), ("after", a_err)):
        if err is not None and err.sqlstate == TIMED_OUT:
            # Waiting on a lock or a slow catalog is not an error of the statement's own.
            notes.append(f"not checked: planning it {side} ran past the timeout")
            return StatementCheck(
                queryid=st.queryid,
                query=st.query,
                calls=st.calls,
                per_second=st.per_second,
                verdict="unchanged",
                note="; ".join(notes),
            )
    timing = None
    broke = a_err is not None and b_err is None
    if values and b_err is None and a_err is None:
        timing, b_err, a_err, why = _time(
            st.query, values, before=before, after=after, deadline=deadline,
            runs=runs, timeout_ms=timeout_ms, secret=secret,
        )  # fmt: skip
        # Run with real values, a statement that failed before (an INSERT of an existing key)
        # and fails after for another reason (a new NOT NULL column) fails anew.
        broke = a_err is not None and (b_err is None or b_err.sqlstate != a_err.sqlstate)
        if why:
            notes.append(why)
    verdict: Verdict = "unchanged"
    if broke:
        verdict = "break"
    elif timing is not None and _slower(timing, slower, floor_ms):
        verdict = "regression"
    elif timing is not None and _slower(
        Timing(timing.after_ms, timing.before_ms, timing.runs), slower, floor_ms
    ):
        verdict = "improvement"  # a changed plan that runs faster: its shapes say why
    elif b_shape is not None and a_shape is not None and b_shape != a_shape:
        verdict = "plan"
    return StatementCheck(
        queryid=st.queryid,
        query=st.query,
        calls=st.calls,
        per_second=st.per_second,
        verdict=verdict,
        before_error=b_err,
        after_error=a_err,
        before_shape=b_shape,
        after_shape=a_shape,
        timing=timing,
        note="; ".join(notes) or None,
    )


def _slower(t: Timing, factor: float, floor_ms: float) -> bool:
    return t.after_ms >= factor * t.before_ms and t.after_ms - t.before_ms > floor_ms


def _values(
    conn: psycopg.Connection[Any], query: str, runs: int
) -> tuple[list[paramvalues.Values], str | None]:
    mapping = paramvalues.map_params(query)
    if mapping.unparsed:
        return [], "not timed: the statement does not parse as one statement"
    try:
        mapping = paramvalues.resolve(conn, mapping)
    except psycopg.Error:
        return [], "not timed: its relations could not be read"
    if mapping.unmapped:
        listed = ", ".join(f"${n}" for n in mapping.unmapped)
        return [], f"not timed: no column is compared with {listed}"
    if mapping.params == 0:
        return [()] * runs, None
    try:
        values = paramvalues.sample(conn, mapping, count=runs)
    except psycopg.Error as e:
        return [], f"not timed: its parameters' values could not be sampled ({e.sqlstate})"
    if not values:
        return [], "not timed: no row to draw its parameters' values from"
    return values, None


def _secrets(values: Sequence[paramvalues.Values]) -> list[str]:
    """Every value, longest first, to take out of error messages (with `LIMIT`'s constants:
    taking out more than needed is harmless)."""
    found = {v for row in values for v in row if v}
    return sorted(found, key=len, reverse=True)


def _redact(message: str, secret: Sequence[str]) -> str:
    for v in secret:
        message = re.sub(r"(?<![\w])" + re.escape(v) + r"(?![\w])", "…", message)
    return message


def _failure(e: psycopg.Error, secret: Sequence[str]) -> Failure:
    return Failure(e.sqlstate or "", _redact(e.diag.message_primary or str(e), secret))


def _plan(
    conn: psycopg.Connection[Any],
    query: str,
    values: paramvalues.Values | None,
    secret: Sequence[str],
    timeout_ms: int,
) -> tuple[tuple[str, ...] | None, Failure | None]:
    """The generic plan's shape, or the error preparing or planning the statement met."""
    prepared = False
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(
                sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(timeout_ms))
            )
            if conn.info.server_version >= 160000:
                cur = conn.execute(b"EXPLAIN (GENERIC_PLAN, FORMAT JSON) " + query.encode())
            else:
                conn.execute(
                    sql.SQL("PREPARE {} AS ").format(sql.Identifier(PREPARED)).as_bytes(conn)
                    + query.encode()
                )
                prepared = True
                conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                count = conn.execute(
                    "SELECT cardinality(parameter_types) FROM pg_prepared_statements "
                    "WHERE name = %s",
                    (PREPARED,),
                ).fetchone()
                n = int(count[0]) if count is not None else 0
                given = list(values) if values is not None and len(values) == n else [None] * n
                args = sql.SQL(", ").join(sql.Literal(v) for v in given)
                execute = sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE {}").format(
                    sql.Identifier(PREPARED)
                )
                if n:
                    execute = sql.SQL("{}({})").format(execute, args)
                cur = conn.execute(execute)
            row = cur.fetchone()
    except psycopg.Error as e:
        return None, _failure(e, secret)
    finally:
        if prepared:
            conn.execute(sql.SQL("DEALLOCATE {}").format(sql.Identifier(PREPARED)))
    assert row is not None
    plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return shape(plan[0]["Plan"]), None


def shape(node: dict[str, Any], depth: int = 0) -> tuple[str, ...]:
    """A plan reduced to what does not move with costs: one line per node, indented by depth
    (the join order), with its node type, join type or strategy, index and relation."""
    parts = [("Parallel " if node.get("Parallel Aware") else "") + node["Node Type"]]
    for key in ("Join Type", "Strategy", "Command"):
        if key in node:
            parts.append(f"[{node[key]}]")
    if "Index Name" in node:
        parts.append(f"using {node['Index Name']}")
    for key in ("Relation Name", "CTE Name", "Function Name"):
        if key in node:
            parts.append(f"on {node[key]}")
    if node.get("Parent Relationship") in ("SubPlan", "InitPlan"):
        parts.append(f"({node['Parent Relationship']})")
    lines = ["  " * depth + " ".join(parts)]
    for child in node.get("Plans", ()):
        lines.extend(shape(child, depth + 1))
    return tuple(lines)


def _time(
    query: str,
    values: Sequence[paramvalues.Values],
    *,
    before: psycopg.Connection[Any],
    after: psycopg.Connection[Any],
    deadline: float,
    runs: int,
    timeout_ms: int,
    secret: Sequence[str],
) -> tuple[Timing | None, Failure | None, Failure | None, str | None]:
    """Run the statement with real values on each side in turn, after one warm-up run each."""
    times: dict[str, list[float]] = {"before": [], "after": []}
    timed_out = False
    for i in range(runs + 1):
        given = values[i % len(values)]
        for side, conn in (("before", before), ("after", after)):
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return None, None, None, "not timed: the time budget ran out"
            limit = min(timeout_ms, left_ms)
            ms, err = _run(conn, query, given, limit, secret)
            if err is not None and err.sqlstate == TIMED_OUT and limit == timeout_ms:
                if side == "before":
                    return None, None, None, "not timed: it runs past the timeout before"
                timed_out, ms, err = True, float(timeout_ms), None
            if err is not None and side == "before":
                _, again = _run(after, query, given, limit, secret)
                why = f"not timed: it fails with the sampled values before ({err.sqlstate})"
                return None, err, again, why
            if err is not None:
                return None, None, err, None
            if i > 0:
                times[side].append(ms)
    if not times["before"]:
        return None, None, None, "not timed: the time budget ran out"
    timing = Timing(
        before_ms=statistics.median(times["before"]),
        after_ms=statistics.median(times["after"]),
        runs=len(times["before"]),
        after_timed_out=timed_out,
    )
    return timing, None, None, None


def _run(
    conn: psycopg.Connection[Any],
    query: str,
    values: paramvalues.Values,
    timeout_ms: int,
    secret: Sequence[str],
) -> tuple[float, Failure | None]:
    """One run, its writes rolled back: the parameters go untyped, as text, the way a driver
    sends them, so Postgres infers their types from the statement."""
    with conn.transaction(force_rollback=True):
        conn.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(timeout_ms)))
        params = [v.encode() if v is not None else None for v in values]
        started = time.perf_counter()
        res = conn.pgconn.exec_params(query.encode(), params)
        ms = (time.perf_counter() - started) * 1000
        if res.status in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            return ms, None
        state = (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
        text = (res.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or b"").decode()
        return ms, Failure(state, _redact(text, secret))
