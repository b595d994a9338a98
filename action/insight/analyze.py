"""One migration's trace -> ``MigrationInsight``: pure code on the marks taken before and
after it.

What production would feel is what is reported, so relations of the ledger schema (and, in
command mode, a migration tool's own tables: ``ledgers``) and relations the migration itself
created (nobody else can be using them) take no part in locks, rewrites or scans.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from pgoverlay.action import migrations
from pgoverlay.action.insight import lint as lint_mod
from pgoverlay.action.insight import logparse, marks, sqltext, tools, verdict
from pgoverlay.action.insight.heldlocks import (
    from_documented,
    from_events,
    from_samples,
    from_waits,
    lock_uses,
    longest,
    worst_first,
)
from pgoverlay.action.insight.model import (
    LockUse,
    MigrationInsight,
    Rewrite,
    StatementInsight,
    Thresholds,
    Verdict,
)
from pgoverlay.action.insight.rewrites import (
    find_rewrites,
    first_per_relation,
    migration_scans,
    row_writes,
    rows_written,
    statement_scans,
    volume,
)
from pgoverlay.action.insight.work import Analysis, Relations
from pgoverlay.runner.service.views import RelationState, TraceMark

_TEXT_LIMIT = 500


class Book:
    """The branch's relations as the marks so far describe them: the first mark holds every
    relation, each later one only what changed and what was dropped."""

    def __init__(self, first: TraceMark) -> None:
        self._now: dict[int, RelationState] = {r.oid: r for r in first.relations}

    def advance(self, mark: TraceMark) -> tuple[dict[int, RelationState], dict[int, RelationState]]:
        """Apply the next mark; the relations before it and after it."""
        before = dict(self._now)
        for oid in mark.dropped:
            self._now.pop(oid, None)
        for rel in mark.relations:
            self._now[rel.oid] = rel
        return before, dict(self._now)


def normalise(sql: str) -> str:
    """A statement's text without comments, whitespace or a final semicolon, to match what
    psql sent with what the file holds."""
    bare = sqltext.strip_comments(sql)
    return re.sub(r"\s+", "", bare).rstrip(";")


def analyze(
    *,
    before: TraceMark,
    after: TraceMark,
    relations_before: Relations,
    relations_after: Relations,
    seconds: float,
    statements: Sequence[migrations.Statement] | None,
    ignore_pids: Collection[int],
    lint: Sequence[lint_mod.Raw],
    thresholds: Thresholds,
    marked: marks.Marked | None = None,
) -> MigrationInsight:
    """What one migration did, from the marks around it. ``statements`` are the file's (SQL
    mode); None in command mode, where the logged statements become the statements.
    ``marked`` is the file as psql read it, when its statements were marked."""
    parsed = logparse.parse(after.log, ignore_pids=ignore_pids)
    accepted, mark_notes = marks.accepted(parsed.statements, marked)
    mapped = _map(
        parsed.statements, statements, fixed={p: m.statement for p, m in accepted.items()}
    )
    work = Analysis(relations_before, relations_after, command=statements is None)
    windows = from_events(work, parsed.statements, mapped.index_of, accepted)
    inferred = from_documented(work, parsed.statements, mapped.index_of, accepted, windows)
    sampled = from_samples(
        work,
        before,
        after,
        parsed.statements,
        mapped.index_of,
        ignore_pids,
        [*windows, *(w for found in inferred.values() for w in found)],
    )
    from_waits(work, parsed.statements, mapped.index_of)
    uses = lock_uses(work)
    rewrites = find_rewrites(work, parsed.statements, mapped.index_of, uses)
    timeouts = {
        mapped.index_of[p]: m.lock_timeout_ms / 1000
        for p, m in accepted.items()
        if m.lock_timeout_ms is not None and p in mapped.index_of
    }
    per_statement = [
        StatementInsight(
            index=i,
            line=mapped.lines[i],
            text=mapped.texts[i][:_TEXT_LIMIT],
            seconds=_seconds(parsed.statements, mapped.index_of, i),
            locks=worst_first([u for u in uses if u.statement == i]),
            rewrites=[r for r in rewrites if r.statement == i],
            scans=statement_scans(work, i),
            lock_timeout=timeouts.get(i),
        )
        for i in range(mapped.count)
    ]
    migration_locks = longest(uses)
    rows = rows_written(work, instrumented=before.instrumented and after.instrumented)
    insight = MigrationInsight(
        seconds=seconds,
        locks=migration_locks,
        rewrites=first_per_relation(rewrites),
        scans=migration_scans(work, migration_locks),
        volume=volume(before, after, rows),
        statements=per_statement,
        findings=lint_mod.check(lint, file_statements=statements, measured=per_statement),
        verdict=Verdict("safe", ""),
        interval=after.interval,
        notes=[
            *_notes(before, after, parsed, mapped, sampled),
            *mark_notes,
            *_missed(work, parsed.statements, mapped, uses, rewrites, accepted, inferred, after),
        ],
        row_writes=row_writes(work, rows),
    )
    insight = dataclasses.replace(insight, verdict=verdict.decide(insight, thresholds))
    if statements is not None:
        return insight
    whole = {i: parsed.statements[p] for p, i in mapped.index_of.items()}
    logged = [tools.Logged(whole[i].text, whole[i].parameters) for i in range(mapped.count)]
    return tools.sort_out(insight, logged, thresholds=thresholds, merge=longest)


# -- which statement is which ---------------------------------------------------------------


@dataclass
class StatementMap:
    """Which logged statement is which statement of the migration."""

    index_of: dict[int, int]  # position in the parsed log -> statement index
    count: int
    lines: list[int | None]
    texts: list[str]
    notes: list[str]


def _map(
    logged: Sequence[logparse.Statement],
    statements: Sequence[migrations.Statement] | None,
    *,
    fixed: Mapping[int, int] | None = None,
) -> StatementMap:
    """SQL mode: the file's statements matched in order and by normalised text with the logged
    ones (psql's own BEGIN and COMMIT match nothing, silently), or, for a statement whose
    mark was accepted, by the index it carries (``fixed``). Command mode: the logged
    statements, less transaction control."""
    if statements is None:
        kept = [p for p, s in enumerate(logged) if not s.control]
        return StatementMap(
            index_of={p: i for i, p in enumerate(kept)},
            count=len(kept),
            lines=[None] * len(kept),
            texts=[logged[p].text for p in kept],
            notes=[],
        )
    matcher = difflib.SequenceMatcher(
        None, [normalise(s.text) for s in logged], [normalise(s.text) for s in statements], False
    )
    index_of: dict[int, int] = {}
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            index_of[block.a + k] = block.b + k
    if fixed:
        taken = set(fixed.values())
        index_of = {p: i for p, i in index_of.items() if i not in taken}
        index_of.update({p: i for p, i in fixed.items() if i < len(statements)})
    notes: list[str] = []
    strays = [s for p, s in enumerate(logged) if p not in index_of and not s.control]
    if strays:
        notes.append(
            f"{_count(len(strays), 'logged statement')} matched no statement of the file "
            f"(first: `{_short(strays[0].text)}`)"
        )
    if logged:
        seen = set(index_of.values())
        missing = [s for i, s in enumerate(statements) if i not in seen]
        if missing:
            notes.append(
                f"{_count(len(missing), 'statement')} of the file not seen in the server log "
                f"(first at line {missing[0].start_line})"
            )
    return StatementMap(
        index_of=index_of,
        count=len(statements),
        lines=[s.start_line for s in statements],
        texts=[_without_leading_comments(s.text) for s in statements],
        notes=notes,
    )


def _without_leading_comments(text: str) -> str:
    """A file's statement as psql sends it: the ``--`` lines before it are not part of it (its
    line number is already where the statement itself starts)."""
    lines = text.splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
        lines.pop(0)
    return "\n".join(lines) or text


def _seconds(
    logged: Sequence[logparse.Statement], index_of: Mapping[int, int], index: int
) -> float | None:
    found = [logged[p].seconds for p, i in index_of.items() if i == index]
    return sum(found) if found else None


# -- notes ----------------------------------------------------------------------------------


def _notes(
    before: TraceMark,
    after: TraceMark,
    parsed: logparse.ParsedLog,
    mapped: StatementMap,
    sampled: bool,
) -> list[str]:
    """What was not measured, and why."""
    notes = list(after.notes)
    if not (before.instrumented and after.instrumented):
        notes.append(
            "the trace's event triggers were not in place: locks come from sampling alone, "
            "and rewrite reasons and per-statement scans are unknown"
        )
    if after.log_truncated:
        notes.append("the server log of this migration was larger than is kept: it was cut")
    if not after.log:
        notes.append(
            "the server log had no entries for this migration: statement times are unknown"
        )
    elif not parsed.statements:
        notes.append(
            "the server log had no statement durations for this migration "
            "(log_min_duration_statement must be 0)"
        )
    if parsed.malformed:
        notes.append(f"{_count(parsed.malformed, 'trace line')} could not be read")
    if sampled:
        notes.append(f"locks seen by sampling pg_locks are timed to {after.interval * 1000:.0f} ms")
    return notes + mapped.notes


# Statements that take no lock beyond ACCESS SHARE (or none): a lock missed on them is no loss.
_READ_ONLY = re.compile(
    r"^(SELECT\b(?!.*\bFOR\s+(UPDATE|NO\s+KEY\s+UPDATE|SHARE|KEY\s+SHARE)\b)(?!.*\bINTO\b)"
    r"|SHOW\b|SET\b|RESET\b|SAVEPOINT\b|RELEASE\b|EXPLAIN\b(?!.*\bANALY[SZ]E\b)"
    r"|DISCARD\b|DEALLOCATE\b|LISTEN\b|UNLISTEN\b|VALUES\b)",
    re.IGNORECASE | re.DOTALL,
)


def _missed(
    work: Analysis,
    logged: Sequence[logparse.Statement],
    mapped: StatementMap,
    uses: Sequence[LockUse],
    rewrites: Sequence[Rewrite],
    accepted: Mapping[int, logparse.StatementMark],
    inferred: Collection[int],
    after: TraceMark,
) -> list[str]:
    """Where the sampler may have missed a lock: a relation rewritten with no lock seen on its
    table, and statements whose locks nothing read exactly or inferred that ran for less than
    a sampling interval."""
    notes: list[str] = []
    locked = {u.relation for u in uses}
    by_name = {work.name(oid): oid for oid in work.before}
    unlocked = []
    for r in rewrites:
        oid = by_name.get(r.relation)
        table = work.before[oid].table_oid if oid is not None else None
        names = {r.relation} | ({work.name(table)} if table is not None else set())
        if not names & locked and r.relation not in unlocked:
            unlocked.append(r.relation)
    if unlocked:
        notes.append(
            f"`{unlocked[0]}`{f' and {len(unlocked) - 1} more' if len(unlocked) > 1 else ''} "
            "rewritten with no lock seen on its table: a lock was missed (held for less than "
            f"the sampling interval, {after.interval * 1000:.0f} ms)"
        )
    short = [
        stmt
        for position, stmt in enumerate(logged)
        if position not in accepted
        and position not in inferred
        and not stmt.ddl
        and not stmt.control
        and (mapped.index_of.get(position) is not None)
        and not _READ_ONLY.match(_without_leading_comments(stmt.text).lstrip())
        and stmt.seconds < after.interval
        # a migrate command's bookkeeping (its own tables, the catalogs): not the migration's
        and not (work.command and tools.classify(stmt.text))
    ]
    if short:
        notes.append(
            f"{_count(len(short), 'statement')} whose locks were only sampled ran for less "
            f"than the sampling interval ({after.interval * 1000:.0f} ms): a lock "
            f"{'it' if len(short) == 1 else 'they'} took may be missing (first: "
            f"`{_short(short[0].text)}`)"
        )
    return notes


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= 60 else flat[:57] + "..."
