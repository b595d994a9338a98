"""Statement marks: a migration file, as psql reads it, with a call to the trace's statement
procedure after each statement, so that every lock of every statement is read from
``pg_locks`` while its transaction still holds it (SQL-folder mode).

A statement ``S;`` becomes ``S\\; CALL pgoverlay_trace.statement_end('NONCE', K);`` on the same
line: psql sends both in one query, which Postgres runs in one transaction (an implicit one
outside a transaction block), so the call sees what ``S`` took even when ``S`` commits on its
own. Lines do not move, so psql's ``psql:FILE:LINE`` and the server's ``LINE k:`` keep pointing
at the file's own lines; the call prints nothing under ``psql -q`` and logs one line.

Statements are left unmarked (their locks come from the event triggers, from what Postgres
documents for them, or from sampling) where a call could change what psql or the server
does:

- ``COPY`` (``FROM STDIN`` data follows the statement) and the lines of its data;
- settings (``SET``, ``RESET``, ``SHOW``): they take no lock, and ``SET TRANSACTION`` must
  come before any query of its transaction, which a call after an earlier ``SET`` would be;
- a statement holding a backslash: a psql meta-command (``\\i``, ``\\if``, ``\\gexec``,
  ``\\set``) or an escape string, where psql's reading and this module's may part;
- statements that cannot run in a transaction block (``CREATE INDEX CONCURRENTLY``, ``VACUUM``,
  ...) and transaction control (a lock ends at ``COMMIT``: nothing is left to read);
- outside ``--single-transaction``: ``CALL`` and ``DO``, which may commit (they cannot in a
  query of two statements), and ``LOCK``, ``DECLARE``, ``SAVEPOINT``, ``RELEASE``, ``SET
  LOCAL | TRANSACTION | CONSTRAINTS``, which Postgres refuses or warns about outside a
  transaction block (a query of two statements is one: they would pass where the file alone
  fails);
- a last statement without its semicolon.

At most ``MAX_MARKED`` statements of a file are marked (a note says so beyond that).

A file is not marked at all when psql could not read it from its standard input as it reads
the file: one that includes another relative to itself (``\\ir`` would look in another
folder), or runs what may read psql's standard input (``\\!``, ``\\copy``, ``\\g |``,
``\\o |``, ``\\w |``: they would read the rest of the file).

The nonce is random per migration; the log reader accepts a mark only with it, on the query
that holds the statement it names, once (``analyze``).
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from pgoverlay.action import migrations
from pgoverlay.action.insight import logparse

PROCEDURE = "pgoverlay_trace.statement_end"
# The most statements of one file marked: a mark costs a round of pg_locks and a log line
# (about a millisecond, measured), which a file of thousands of one-row writes would feel.
MAX_MARKED = 500
_CALL = PROCEDURE + "('{nonce}', {index});"
# The same in psql's messages (``LINE 2: ... ; CALL ...``), which reach the report.
_IN_MESSAGES = re.compile(r"(?<=;) CALL pgoverlay_trace\.statement_end\('[0-9a-f]+', \d+\);")
_LEADING = re.compile(r"^(\s+|--[^\n]*(\n|$)|/\*.*?\*/)*", re.DOTALL)
_CONTROL = re.compile(
    r"^(BEGIN|START\s+TRANSACTION|COMMIT|END|ROLLBACK|ABORT|PREPARE\s+TRANSACTION)\b",
    re.IGNORECASE,
)
_COPY = re.compile(r"^COPY\b", re.IGNORECASE)
_FROM_STDIN = re.compile(r"\bFROM\s+STDIN\b", re.IGNORECASE)
_MAY_COMMIT = re.compile(r"^(CALL|DO)\b", re.IGNORECASE)
# Settings take no lock, and a query after one could change what follows: SET TRANSACTION
# must come before any query of its transaction.
_SETTING = re.compile(r"^(SET|RESET|SHOW)\b", re.IGNORECASE)
# Statements Postgres refuses, or warns about, outside a transaction block: in a query of two
# statements (an implicit block) they would pass where the file alone fails.
_NEEDS_BLOCK = re.compile(
    r"^(LOCK|DECLARE|SAVEPOINT|RELEASE|SET\s+(LOCAL|TRANSACTION|CONSTRAINTS)\b)\b",
    re.IGNORECASE,
)
_RELATIVE_INCLUDE = re.compile(r"^\s*\\(ir|include_relative)\b", re.MULTILINE)
# psql commands whose children or data may read psql's standard input, which would then be the
# rest of the marked file: a shell escape, \copy, output piped to a command.
_READS_STDIN = re.compile(r"\\(!|copy\b|[gow]\s*\|)", re.IGNORECASE)


@dataclass(frozen=True)
class Marked:
    """A migration file as psql is to read it: ``text``, with a call after each statement of
    ``marked`` (indexes into ``migrations.statements``); ``reason`` says why a file holds
    none."""

    text: str
    nonce: str
    marked: frozenset[int]
    reason: str = ""
    # The file's statements (``migrations.statements``), when they were split to mark them.
    statements: tuple[migrations.Statement, ...] | None = None


def new_nonce() -> str:
    return secrets.token_hex(16)


def _bare(text: str) -> str:
    return _LEADING.sub("", text)


def markable(statement: migrations.Statement, *, single_transaction: bool) -> bool:
    """Whether a call may follow ``statement`` without changing what it does."""
    bare = _bare(statement.text)
    return not (
        statement.semicolon is None
        or "\\" in statement.text
        or _COPY.match(bare)
        or _CONTROL.match(bare)
        or _SETTING.match(bare)
        or migrations.cannot_run_in_transaction(bare)
        or (not single_transaction and (_MAY_COMMIT.match(bare) or _NEEDS_BLOCK.match(bare)))
    )


def instrument(sql_text: str, *, nonce: str, single_transaction: bool) -> Marked:
    """``sql_text`` with a call after each statement a call may follow (see the module)."""
    if _RELATIVE_INCLUDE.search(sql_text) or _READS_STDIN.search(sql_text):
        return Marked(
            sql_text,
            nonce,
            frozenset(),
            reason="the file uses a psql command that cannot read it from standard input "
            "(\\ir, \\!, \\copy or a pipe), so its statements were not marked: their locks "
            "come from the event triggers, what Postgres documents, and sampling",
        )
    found = migrations.statements(sql_text)
    copy_data_end = -1  # offset where the data of the last COPY ... FROM STDIN ends
    last_end = -1  # offset of the previous statement's semicolon
    cuts: list[tuple[int, int]] = []  # (offset of the semicolon, statement index)
    for index, statement in enumerate(found):
        semicolon, after = statement.semicolon, last_end
        last_end = semicolon if semicolon is not None else last_end
        bare = _bare(statement.text)
        if semicolon is not None and _COPY.match(bare) and _FROM_STDIN.search(bare):
            copy_data_end = _copy_data_end(sql_text, semicolon)
            continue
        if semicolon is None or semicolon <= copy_data_end:
            continue
        if copy_data_end > after:
            # The splitter glued the COPY's data to this statement: psql's statement is what
            # follows the data.
            statement = dataclasses.replace(
                statement, text=sql_text[copy_data_end : semicolon + 1].strip()
            )
        if markable(statement, single_transaction=single_transaction):
            cuts.append((semicolon, index))
    reason = ""
    if len(cuts) > MAX_MARKED:
        reason = (
            f"only the first {MAX_MARKED} of the file's {len(cuts)} statements that could be "
            "marked were (a mark costs about a millisecond): the locks of the rest are "
            "inferred or sampled"
        )
        cuts = cuts[:MAX_MARKED]
    pieces: list[str] = []
    at = 0
    for semicolon, index in cuts:
        pieces.append(sql_text[at:semicolon])
        pieces.append("\\; CALL " + _CALL.format(nonce=nonce, index=index))
        at = semicolon + 1
    pieces.append(sql_text[at:])
    return Marked(
        "".join(pieces),
        nonce,
        frozenset(i for _, i in cuts),
        reason=reason,
        statements=tuple(found),
    )


def _copy_data_end(text: str, semicolon: int) -> int:
    """Where the data after a ``COPY ... FROM STDIN`` ends: the end of its ``\\.`` line (psql
    reads the data from the line after the statement), or the end of the file."""
    start = text.find("\n", semicolon)
    if start < 0:
        return len(text)
    found = re.compile(r"^\\\.[ \t]*$", re.MULTILINE).search(text, start + 1)
    return found.end() if found else len(text)


def accepted(
    logged: Sequence[logparse.Statement], marked: Marked | None
) -> tuple[dict[int, logparse.StatementMark], list[str]]:
    """The statement marks to trust, by position in the log, and notes on the others. A mark
    is trusted when it is the last one its query logged, carries the migration's nonce and
    the index of a statement that was marked, on the query psql sent for that statement (its
    text ends with the call of that index), and no other query claims that statement. Any
    other mark (the role can call the procedure itself, or make a line that looks like one) is
    left out: it cannot hide a lock, only fail to show one, which the sampler may still see."""
    claims: dict[int, list[int]] = defaultdict(list)
    ignored = 0
    for position, stmt in enumerate(logged):
        if not stmt.marks:
            continue
        last = stmt.marks[-1]
        ours = (
            marked is not None
            and last.nonce == marked.nonce
            and last.statement in marked.marked
            and stmt.called == (marked.nonce, last.statement)
        )
        ignored += len(stmt.marks) - ours
        if ours:
            claims[last.statement].append(position)
    accepted = {ps[0]: logged[ps[0]].marks[-1] for ps in claims.values() if len(ps) == 1}
    notes = []
    if ignored:
        notes.append(
            f"{ignored} statement mark{'' if ignored == 1 else 's'} not made by the engine "
            "for this migration (another nonce, or not on the query of the statement named) "
            f"{'was' if ignored == 1 else 'were'} left out"
        )
    twice = sorted(k for k, ps in claims.items() if len(ps) > 1)
    if twice:
        notes.append(
            f"the mark of statement {twice[0] + 1} came from more than one query: the marks "
            "of that statement were left out, its locks are sampled"
        )
    return accepted, notes


def scrub(message: str) -> str:
    """psql's messages without the calls marks added (a failed statement's ``LINE`` echo)."""
    return _IN_MESSAGES.sub("", message)
