"""What the probe's samples say, and how the comment says it: pure functions, no I/O
(the sessions are ``probe.py``'s).

Which tables a migration's probe watches (``choose``: the existing tables a SQL file names,
directly or by one of their indexes, or those a migrate command locks), when a probe query
counts as blocked (``classify``), and per table how long reads and writes were kept waiting
(``summarise``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pgoverlay.action import markdown as md
from pgoverlay.action.cells import Cell, Code
from pgoverlay.action.insight import ledgers
from pgoverlay.action.insight.model import MigrationInsight, TableBlocking

if TYPE_CHECKING:
    from psycopg import sql

Kind = Literal["read", "write"]
_SYSTEM_SCHEMA = re.compile(r"^(pg_|information_schema$|pgoverlay_)")


@dataclass(frozen=True)
class Table:
    oid: int
    schema: str
    name: str
    pages: int
    readable: bool
    writable: bool

    @property
    def relation(self) -> str:
        return f"{self.schema}.{self.name}"

    def identifier(self) -> sql.Identifier:
        from psycopg import sql

        return sql.Identifier(self.schema, self.name)


@dataclass(frozen=True)
class Sample:
    """One probe query: when it ran (monotonic seconds) and whether it was kept waiting."""

    start: float
    end: float
    blocked: bool


# -- which tables (pure) --------------------------------------------------------------------

_IDENT = r'(?:"[^"]*(?:""[^"]*)*"|[A-Za-z_\u0080-\uffff][A-Za-z0-9_$\u0080-\uffff]*)'
_CHAIN = re.compile(rf"{_IDENT}(?:\s*\.\s*{_IDENT})*")
_PART = re.compile(_IDENT)
# String literals and comments, whichever starts first: one pass, left to right (a file may be
# tens of megabytes; this is done before each migration starts).
_NOT_NAMES = re.compile(r"'[^']*(?:''[^']*)*'|--[^\n]*|/\*.*?\*/", re.DOTALL)


def names_in(text: str) -> set[tuple[str | None, str]]:
    """Every name in ``text`` that could be a table: (schema or None, name), folded as
    Postgres folds them (unquoted to lower case). Comments and string literals are left out;
    a name inside a function body is kept (probing one table too many costs little)."""
    bare = _NOT_NAMES.sub(" ", text)
    found: set[tuple[str | None, str]] = set()
    for chain in set(_CHAIN.findall(bare)):  # each distinct spelling once
        parts = [_fold(p) for p in _PART.findall(chain)]
        if len(parts) == 1:
            found.add((None, parts[0]))
        else:
            found.add((parts[-2], parts[-1]))
    return found


def _fold(part: str) -> str:
    if part.startswith('"'):
        return part[1:-1].replace('""', '"')
    return part.lower()


def choose(
    tables: Sequence[Table],
    *,
    text: str | None,
    search_path: Sequence[str],
    limit: int,
    indexes: Sequence[tuple[str, int]] = (),
) -> list[Table]:
    """The tables to probe, largest first, at most ``limit``. With ``text`` (a SQL file): the
    existing tables and materialized views it names, or whose index it names (``indexes``:
    each index's name and its table's oid; an index lives in its table's schema), schema-
    qualified or found through ``search_path`` (the role's schemas, in order; a file that
    sets ``search_path`` may reach others, so then an unqualified name matches in every
    schema). Without (the tables a migrate command locked, which ``probe`` finds as it runs):
    those, but the migration tools' own (``ledgers``)."""
    candidates = [t for t in tables if t.readable and not _SYSTEM_SCHEMA.match(t.schema)]
    if text is not None:
        names = names_in(text)
        anywhere = "search_path" in text.lower()
        by_name: dict[str, list[Table]] = {}
        for t in candidates:
            by_name.setdefault(t.name, []).append(t)
        of_oid = {t.oid: t for t in candidates}
        for index, table_oid in indexes:
            if table_oid in of_oid:
                by_name.setdefault(index, []).append(of_oid[table_oid])
        chosen: dict[int, Table] = {}
        for schema, name in names:
            found = by_name.get(name, [])
            if schema is not None:
                found = [t for t in found if t.schema == schema]
            elif not anywhere:
                found = sorted(
                    (t for t in found if t.schema in search_path),
                    key=lambda t: list(search_path).index(t.schema),
                )[:1]
            chosen.update((t.oid, t) for t in found)
        candidates = list(chosen.values())
    else:  # a migration tool's own tables are its bookkeeping, not what production feels
        candidates = [t for t in candidates if not ledgers.is_tool_table(t.name)]
    return sorted(candidates, key=lambda t: (-t.pages, t.relation))[:limit]


HEADROOM = 10  # connections the probe leaves free for the migration (its tool may pool some)


def tables_within(*, free: int, role_limit: int, role_used: int, holder: bool) -> int:
    """How many tables the probe may watch (two sessions each, beside its monitor and the queue
    simulation's ``holder``) and still leave HEADROOM connections to the migration: of the
    server's ``free`` ones, and of the role's own limit (``role_limit`` -1: none) less the
    ``role_used`` it has."""
    if role_limit >= 0:
        free = min(free, role_limit - role_used)
    return max(0, (free - HEADROOM - (2 if holder else 1)) // 2)


# -- what the samples say (pure) ------------------------------------------------------------


def _stretches(samples: Sequence[Sample]) -> list[tuple[float, float]]:
    """Runs of consecutive blocked samples, as (start of the first, end of the last): how long
    a query that kept waiting would have waited."""
    runs: list[tuple[float, float]] = []
    current: tuple[float, float] | None = None
    for s in sorted(samples, key=lambda s: s.start):
        if s.blocked:
            current = (current[0], s.end) if current else (s.start, s.end)
        elif current is not None:
            runs.append(current)
            current = None
    if current is not None:
        runs.append(current)
    return runs


def summarise(
    relation: str,
    reads: Sequence[Sample],
    writes: Sequence[Sample],
    *,
    window: tuple[float, float] | None = None,
) -> TableBlocking:
    """The table's blocking: per kind, the sum of the blocked probes' waits and the longest
    run of them; with a long transaction's ``window``, the longest run of blocked reads that
    overlaps it (how long reads queued behind the migration meanwhile)."""

    def worst(runs: Iterable[tuple[float, float]]) -> float:
        return round(max((end - start for start, end in runs), default=0.0), 3)

    def blocked(samples: Sequence[Sample]) -> float:
        return round(sum(s.end - s.start for s in samples if s.blocked), 3)

    read_runs = _stretches(reads)
    queued = None
    if window is not None:
        queued = worst(r for r in read_runs if r[0] < window[1] and r[1] > window[0])
    return TableBlocking(
        relation=relation,
        reads_blocked=blocked(reads),
        reads_worst=worst(read_runs),
        writes_blocked=blocked(writes),
        writes_worst=worst(_stretches(writes)),
        reads=len(reads),
        writes=len(writes),
        reads_queued=queued,
    )


def classify(runs: Sequence[tuple[float, float, bool]], sightings: Sequence[float]) -> list[Sample]:
    """Probe queries (start, end, ran out of lock_timeout) as samples: blocked when they timed
    out waiting, or when the monitor saw their session waiting on a lock meanwhile."""
    seen = sorted(sightings)
    samples = []
    for start, end, timed_out in runs:
        waited = timed_out or any(start <= at <= end for at in seen)
        samples.append(Sample(start, end, waited))
    return samples


# -- the comment (pure) ---------------------------------------------------------------------


def cell(insight: MigrationInsight) -> Cell:
    """The migrations table's cell: the table whose probes waited longest, e.g. "reads 2.1 s,
    writes 2.3 s on `public.t`" (the longest wait of each kind); "none" when no probe waited;
    "not probed" without a probe."""
    if not insight.blocking:
        return ("not probed",)
    worst = max(insight.blocking, key=lambda b: (max(b.reads_worst, b.writes_worst), b.relation))
    waited = _waits(worst, worst.reads_worst, worst.writes_worst)
    if not waited:
        return ("none",)
    queued = f" (reads queued {_seconds(worst.reads_queued)})" if worst.reads_queued else ""
    return (f"{waited} on ", Code(worst.relation), queued)


def lines(insight: MigrationInsight) -> list[str]:
    """One line per probed table, for the details block: "`public.t`: writes waited 2.3 s in
    all, 2.3 s at most; reads never; 18 reads and 17 writes probed", and the queue
    simulation's "reads on `public.t` queue for 30.4 s behind this migration while a 30 s
    transaction runs"."""
    found = []
    for b in insight.blocking:
        waits = []
        for kind, total, longest in (
            ("reads", b.reads_blocked, b.reads_worst),
            ("writes", b.writes_blocked, b.writes_worst),
        ):
            if total:
                waits.append(f"{kind} waited {_seconds(total)} in all, {_seconds(longest)} at most")
            else:
                waits.append(f"{kind} never waited")
        writes = f"{b.writes:,} writes" if b.writes else "no writes (the role may not update it)"
        found.append(
            f"{md.code(b.relation, cell=False)}: {'; '.join(waits)}; {b.reads:,} reads and "
            f"{writes} probed"
        )
        if b.reads_queued is not None:
            found.append(
                f"reads on {md.code(b.relation, cell=False)} queue for "
                f"{_seconds(b.reads_queued)} behind this migration while a "
                f"{_seconds(insight.long_transaction)} transaction runs"
            )
    return found


def _waits(b: TableBlocking, reads: float, writes: float) -> str:
    parts = [f"reads {_seconds(reads)}"] if reads else []
    parts += [f"writes {_seconds(writes)}"] if writes else []
    return ", ".join(parts)


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 0.1 or value == 0 else f"{value * 1000:.0f} ms"
