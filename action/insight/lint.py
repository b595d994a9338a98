"""squawk's findings on a migration, checked against what the trace measured.

squawk reads the migration's text on stdin, never its path, and runs in a fresh empty
directory with an empty configuration file, so nothing of the pull request (a
``.squawk.toml``) steers it. A missing binary or output that is not squawk's JSON gives a
reason, not an exception: lint is advice, and its absence must not fail a migration.

Each finding is then checked against its statement's measurement: a rule about a rewrite is
confirmed iff the statement rewrote a table; a rule about a lock iff the statement took a lock
that blocks what the rule says, however briefly (in production it waits in the lock queue);
``require-lock-timeout`` iff the statement took a lock that blocks reads or writes while no
lock_timeout was in force (``locks.timeout_in_force``); a rule about style or compatibility
cannot be measured.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pgoverlay.action import migrations
from pgoverlay.action.insight import locks
from pgoverlay.action.insight.model import (
    Blocks,
    Finding,
    FindingStatus,
    LockUse,
    StatementInsight,
)
from pgoverlay.action.insight.verdict import WITH_TABLE
from pgoverlay.errors import CommandError, TimeoutExpiredError
from pgoverlay.runner import proc


@dataclass(frozen=True)
class Raw:
    """One squawk finding as squawk gave it, with 1-based lines."""

    rule: str
    message: str
    line: int
    line_end: int


@dataclass(frozen=True)
class Lint:
    findings: list[Raw]
    reason: str = ""  # why squawk gave no answer; "" when it did


@dataclass(frozen=True)
class _Check:
    rewrite: bool = False  # confirmed by a rewrite of a table
    blocks: Blocks | None = None  # confirmed by a lock blocking at least this, however short
    timeout: bool = False  # confirmed by such a lock taken with no lock_timeout in force


# What each of squawk's measurable rules says a statement does. The messages of squawk 2.70
# name the lock and what it blocks; rules not listed are about style or compatibility.
RULES: dict[str, _Check] = {
    "changing-column-type": _Check(rewrite=True),
    "adding-field-with-default": _Check(rewrite=True),
    "adding-serial-primary-key-field": _Check(rewrite=True, blocks="reads and writes"),
    "prefer-repack": _Check(rewrite=True),
    "require-concurrent-index-creation": _Check(blocks="writes"),
    "require-concurrent-index-deletion": _Check(blocks="reads and writes"),
    "require-concurrent-reindex": _Check(blocks="reads and writes"),
    "require-concurrent-partition-detach": _Check(blocks="reads and writes"),
    "adding-foreign-key-constraint": _Check(blocks="writes"),
    "constraint-missing-not-valid": _Check(blocks="writes"),
    "adding-not-nullable-field": _Check(blocks="reads and writes"),
    "setting-not-nullable-field": _Check(blocks="reads and writes"),
    "disallowed-unique-constraint": _Check(blocks="reads and writes"),
    "require-lock-timeout": _Check(blocks="writes", timeout=True),
}


def squawk_binary() -> str | None:
    """squawk next to this Python (the package's own dependency), else on PATH."""
    beside = Path(sys.executable).with_name("squawk")
    return str(beside) if beside.is_file() else shutil.which("squawk")


def run(sql_text: str, *, pg_version: int, in_transaction: bool, timeout: float = 60) -> Lint:
    """Lint one migration's text with squawk."""
    binary = squawk_binary()
    if binary is None:
        return Lint([], "squawk is not installed (pip install squawk-cli)")
    with tempfile.TemporaryDirectory(prefix="pgoverlay-lint-") as scratch:
        config = Path(scratch, "squawk.toml")
        config.write_text("")
        argv = [binary, "--reporter", "json", "--pg-version", str(pg_version)]
        argv += ["--config", str(config), "--stdin-filepath", "migration.sql"]
        if in_transaction:
            argv.append("--assume-in-transaction")
        try:
            done = proc.run(
                argv,
                timeout=timeout,
                cwd=scratch,
                env={"HOME": scratch},
                input_text=sql_text,
                check=False,
            )
        except (CommandError, TimeoutExpiredError) as exc:
            return Lint([], f"squawk could not run: {exc}")
    return parse(done.stdout, returncode=done.returncode, stderr=done.stderr)


def parse(stdout: str, *, returncode: int = 0, stderr: str = "") -> Lint:
    """squawk's JSON report (0-based lines) -> ``Raw`` findings (1-based lines)."""
    try:
        report = json.loads(stdout)
        found = [
            Raw(
                rule=str(item["rule_name"]),
                message=str(item["message"]),
                line=int(item["line"]) + 1,
                line_end=int(item.get("line_end", item["line"])) + 1,
            )
            for item in report
        ]
    except (ValueError, KeyError, TypeError):
        detail = proc.last_lines(stderr or stdout, 2) or f"exit {returncode}"
        return Lint([], f"squawk's output was not its JSON report: {detail}")
    return Lint(found)


def statement_at(line: int, statements: Sequence[migrations.Statement]) -> int | None:
    """The index of the file's statement that holds ``line``; None between statements."""
    for index, stmt in enumerate(statements):
        if stmt.start_line <= line <= stmt.end_line:
            return index
    return None


def check(
    findings: Sequence[Raw],
    *,
    file_statements: Sequence[migrations.Statement] | None,
    measured: Sequence[StatementInsight],
) -> list[Finding]:
    """Each finding with its statement and what the trace says about it."""
    checked: list[Finding] = []
    for raw in findings:
        index = statement_at(raw.line, file_statements) if file_statements else None
        stmt = measured[index] if index is not None and index < len(measured) else None
        status: FindingStatus = "not measurable"
        evidence = "the finding's line is in no statement"
        if index is not None or raw.rule not in RULES:
            earlier = measured[:index] if index is not None else ()
            status, evidence = judge(raw.rule, stmt, earlier=earlier)
        checked.append(Finding(raw.rule, raw.message, raw.line, status, evidence, index))
    return checked


def judge(
    rule: str, stmt: StatementInsight | None, *, earlier: Sequence[StatementInsight] = ()
) -> tuple[FindingStatus, str]:
    """(status, evidence) for one rule against one measured statement; ``earlier`` are the
    statements that ran before it in the same file (whose SET lock_timeout may be in force)."""
    rule_check = RULES.get(rule)
    if rule_check is None:
        return "not measurable", "a rule of style or compatibility: nothing to measure"
    if stmt is None or stmt.seconds is None:
        return "not measurable", "the statement was not seen in the server log"
    tables = [r for r in stmt.rewrites if WITH_TABLE not in r.reasons]
    if rule_check.rewrite and tables:
        names = ", ".join(f"`{r.relation}`" for r in tables)
        return "confirmed", f"rewrote {names}"
    if rule_check.blocks is not None:
        claim = rule_check.blocks
        blocking = [x for x in stmt.locks if locks.covers(x.blocks, claim)]
        worst = min(
            blocking,
            key=lambda x: (
                -locks.severity(x.blocks),
                -x.held_seconds,
                bool(x.table) and x.relation != x.table,  # a table before its index or TOAST
                x.relation,
            ),
            default=None,
        )
        if worst is not None and rule_check.timeout:
            return _timeout(worst, [*earlier, stmt], len(earlier))
        if worst is not None:
            return "confirmed", _held(worst)
        if not rule_check.rewrite:
            return "not observed", f"no lock that blocks {claim} was taken"
    return "not observed", _no_rewrite(stmt)


def _timeout(
    lock: LockUse, statements: Sequence[StatementInsight], index: int
) -> tuple[FindingStatus, str]:
    """require-lock-timeout: confirmed when the lock was taken with no lock_timeout in force."""
    timeout = locks.timeout_in_force(statements, index)
    own = statements[index].lock_timeout
    if timeout > 0:
        return "not observed", f"lock_timeout was {locks.seconds_text(timeout)} when it " + (
            f"took {lock.mode} on `{lock.table or lock.relation}`"
        )
    how = "" if own is not None else " (none set before it in the file)"
    return "confirmed", f"{_held(lock)} with no lock_timeout in force{how}"


def _held(lock: LockUse) -> str:
    on = f"`{lock.relation}`"
    if lock.table and lock.table != lock.relation:
        on += f" (of `{lock.table}`)"
    return f"held {lock.mode} on {on} for {locks.seconds_text(lock.held_seconds)}"


def _no_rewrite(stmt: StatementInsight) -> str:
    """Evidence that names the tables the statement locked but did not rewrite."""
    names = sorted({x.relation for x in stmt.locks if x.kind.endswith("table")})
    if not names:
        return "no table was rewritten"
    return "no rewrite of " + ", ".join(f"`{n}`" for n in names)
