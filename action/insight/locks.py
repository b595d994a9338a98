"""Postgres's table-level lock modes, what each conflicts with, and what that means in
production.

The conflict table is the documentation's "Conflicting Lock Modes" (explicit locking, table
13.2), kept as data so that what a mode blocks is derived from it rather than restated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pgoverlay.action.insight import sqltext
from pgoverlay.action.insight.model import Blocks, LockUse, StatementInsight
from pgoverlay.runner.values import flag

# From weakest to strongest, in the documentation's order and spelling.
MODES = (
    "ACCESS SHARE",
    "ROW SHARE",
    "ROW EXCLUSIVE",
    "SHARE UPDATE EXCLUSIVE",
    "SHARE",
    "SHARE ROW EXCLUSIVE",
    "EXCLUSIVE",
    "ACCESS EXCLUSIVE",
)

# Each mode and the modes it conflicts with (the table is symmetric; test_insight_analysis
# checks that it is).
CONFLICTS: dict[str, frozenset[str]] = {
    "ACCESS SHARE": frozenset({"ACCESS EXCLUSIVE"}),
    "ROW SHARE": frozenset({"EXCLUSIVE", "ACCESS EXCLUSIVE"}),
    "ROW EXCLUSIVE": frozenset({"SHARE", "SHARE ROW EXCLUSIVE", "EXCLUSIVE", "ACCESS EXCLUSIVE"}),
    "SHARE UPDATE EXCLUSIVE": frozenset(
        {
            "SHARE UPDATE EXCLUSIVE",
            "SHARE",
            "SHARE ROW EXCLUSIVE",
            "EXCLUSIVE",
            "ACCESS EXCLUSIVE",
        }
    ),
    "SHARE": frozenset(
        {
            "ROW EXCLUSIVE",
            "SHARE UPDATE EXCLUSIVE",
            "SHARE ROW EXCLUSIVE",
            "EXCLUSIVE",
            "ACCESS EXCLUSIVE",
        }
    ),
    "SHARE ROW EXCLUSIVE": frozenset(
        {
            "ROW EXCLUSIVE",
            "SHARE UPDATE EXCLUSIVE",
            "SHARE",
            "SHARE ROW EXCLUSIVE",
            "EXCLUSIVE",
            "ACCESS EXCLUSIVE",
        }
    ),
    "EXCLUSIVE": frozenset(MODES[1:]),
    "ACCESS EXCLUSIVE": frozenset(MODES),
}

# What plain reads (SELECT) and plain writes (INSERT, UPDATE, DELETE) take on a table.
_READ = "ACCESS SHARE"
_WRITE = "ROW EXCLUSIVE"
_SEVERITY: dict[Blocks, int] = {"reads and writes": 2, "writes": 1, "ddl": 0}
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def sql_name(mode: str) -> str:
    """``AccessExclusiveLock`` (pg_locks) -> ``ACCESS EXCLUSIVE``; a name already in that form
    is returned as it is. A mode that is no table lock mode (``SIReadLock``) is refused."""
    name = mode.upper() if mode.upper() in CONFLICTS else None
    if name is None and mode.endswith("Lock"):
        name = _CAMEL.sub(" ", mode.removesuffix("Lock")).upper()
    if name not in CONFLICTS:
        raise ValueError(f"{mode!r} is not a table lock mode; expected one of {', '.join(MODES)}")
    return name


def pg_name(mode: str) -> str:
    """``ACCESS EXCLUSIVE`` -> ``AccessExclusiveLock``, as pg_locks and the server log name it."""
    return "".join(word.capitalize() for word in sql_name(mode).split()) + "Lock"


def strongest(modes: Iterable[str]) -> str:
    """The strongest of ``modes`` (either spelling), in ``MODES`` order; "" for none."""
    ranked = [MODES.index(sql_name(m)) for m in modes]
    return MODES[max(ranked)] if ranked else ""


def conflicts(a: str, b: str) -> bool:
    """Whether a lock in mode ``a`` makes a request for mode ``b`` wait (either spelling)."""
    return sql_name(b) in CONFLICTS[sql_name(a)]


def blocks(mode: str) -> Blocks:
    """What a lock in ``mode`` stops other sessions doing while it is held."""
    if conflicts(mode, _READ):
        return "reads and writes"
    if conflicts(mode, _WRITE):
        return "writes"
    return "ddl"


def severity(what: Blocks) -> int:
    """Orders ``Blocks`` from harmless (0) to worst (2), for "worst first" lists."""
    return _SEVERITY[what]


def covers(what: Blocks, claim: Blocks) -> bool:
    """Whether a lock that blocks ``what`` blocks at least what ``claim`` says."""
    return severity(what) >= severity(claim)


def strength(mode: str) -> int:
    """A mode's place from ACCESS SHARE (0) to ACCESS EXCLUSIVE (7)."""
    return MODES.index(sql_name(mode))


def phrase(what: Blocks, relation: str) -> str:
    """``blocks reads and writes of `public.orders```, ``blocks writes of ...``, or ``blocks
    other DDL only``."""
    if what == "ddl":
        return "blocks other DDL only"
    return f"blocks {what} of `{relation}`"


# How much longer than its statement a lock must be held for the verdict to say that it was
# held until COMMIT. Only that hint uses it: a lock that blocks reads or writes is reported
# however short (in production it waits in the lock queue, and every query waits behind it).
NOTICEABLE_SECONDS = 0.1


def seconds_text(seconds: float) -> str:
    """How long a lock was held, in words: "3 ms", "412 ms", "2.3 s", "41.2 s"."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f} s"


# -- one line per table ---------------------------------------------------------------------

_INDEX_KINDS = ("index", "partitioned index")


def _backticks(name: str) -> str:
    return f"`{name}`"


@dataclass(frozen=True)
class TableLock:
    """The locks a migration (or a statement) took on one table, its indexes and its TOAST
    table, folded: the strongest mode, what it blocks and the longest hold of that mode."""

    table: str  # schema-qualified; the relation itself for what belongs to no table
    mode: str
    blocks: Blocks
    held_seconds: float
    waited_seconds: float  # the longest wait for any of the folded locks
    table_bytes: int  # the table's whole size before the migration (table, TOAST, indexes)
    itself: bool  # the table itself was locked (not only an index or its TOAST)
    indexes: int  # how many of its indexes were locked
    toast: bool  # its TOAST table was locked
    statement: int | None  # the first statement that took the strongest mode
    # Every lock of the strongest mode was only seen by sampling (``LockUse.source``): its
    # time is to the sampler's interval, and a shorter hold may have been missed.
    sampled: bool = False

    def what(self, code: Callable[[str], str] = _backticks, *, size: str = "") -> str:
        """``ACCESS EXCLUSIVE on `public.t`, its 2 indexes and TOAST``; ``code`` quotes the
        table's name (markdown escaping, in the comment), ``size`` follows it in brackets."""
        name = code(self.table) + (f" ({size})" if size else "")
        if self.itself:
            parts = []
            if self.indexes:
                parts.append("its index" if self.indexes == 1 else f"its {self.indexes:,} indexes")
            if self.toast:
                parts.append("TOAST")
            return f"{self.mode} on {name}" + (f", {' and '.join(parts)}" if parts else "")
        parts = []
        if self.indexes:
            parts.append("an index" if self.indexes == 1 else f"{self.indexes:,} indexes")
        if self.toast:
            parts.append("the TOAST")
        return f"{self.mode} on {' and '.join(parts) or 'part'} of {name}"

    def line(self, code: Callable[[str], str] = _backticks) -> str:
        """``ACCESS EXCLUSIVE on `public.t`, its 2 indexes and TOAST: 5.9 s``, or after a wait
        for it, ``...: waited 1.5 s, then held 5.9 s``."""
        if self.waited_seconds > 0:
            return (
                f"{self.what(code)}: waited {seconds_text(self.waited_seconds)}, then held "
                f"{seconds_text(self.held_seconds)}"
            )
        return f"{self.what(code)}: {seconds_text(self.held_seconds)}"


def per_table(uses: Sequence[LockUse]) -> list[TableLock]:
    """``uses`` folded onto their tables (``LockUse.table``; the relation itself when it is
    unset), worst first: what it blocks, then how long, then the stronger mode, then the name."""
    groups: dict[str, list[LockUse]] = {}
    for use in uses:
        if use.dying:  # a concurrent drop's instant on a dead index: nobody waits on it
            continue
        groups.setdefault(use.table or use.relation, []).append(use)
    folded = []
    for table, group in groups.items():
        worst = max(strength(u.mode) for u in group)
        strongest_uses = [u for u in group if strength(u.mode) == worst]
        first = min(
            strongest_uses,
            key=lambda u: (u.statement is None, u.statement or 0, -u.held_seconds),
        )
        folded.append(
            TableLock(
                table=table,
                mode=MODES[worst],
                blocks=blocks(MODES[worst]),
                held_seconds=max(u.held_seconds for u in strongest_uses),
                waited_seconds=max(u.waited_seconds for u in group),
                table_bytes=max(
                    u.table_bytes or (u.bytes if u.relation == table else 0) for u in group
                ),
                itself=any(u.relation == table for u in group),
                indexes=len({u.relation for u in group if u.kind in _INDEX_KINDS}),
                toast=any(u.kind == "TOAST table" for u in group),
                statement=first.statement,
                sampled=all(u.source == "sampled" for u in strongest_uses),
            )
        )
    # A table before an index or a TOAST table held as long (one whose table is not known):
    # the reader knows the table.
    parts = {
        table
        for table, group in groups.items()
        if all(u.kind in _INDEX_KINDS or u.kind == "TOAST table" for u in group)
    }
    return sorted(
        folded,
        key=lambda t: (
            -severity(t.blocks),
            -t.held_seconds,
            -strength(t.mode),
            t.table in parts,
            t.table,
        ),
    )


# -- lock_timeout ---------------------------------------------------------------------------

_SET_TIMEOUT = re.compile(
    r"^SET\s+(?P<scope>SESSION\s+|LOCAL\s+)?LOCK_TIMEOUT\s*(?:=|\bTO\b)\s*(?P<value>.+?)\s*;?$",
    re.IGNORECASE | re.DOTALL,
)
_RESET_TIMEOUT = re.compile(r"^RESET\s+(LOCK_TIMEOUT|ALL)\s*;?$", re.IGNORECASE)
_SET_CONFIG = re.compile(
    r"\bSET_CONFIG\s*\(\s*'LOCK_TIMEOUT'\s*,\s*'(?P<value>[^']*)'\s*,\s*(?P<local>\w+)\s*\)",
    re.IGNORECASE,
)
_TRANSACTION_END = re.compile(
    r"^(COMMIT|END|ROLLBACK|ABORT)\b(?!\s+(PREPARED|TO)\b)(?!\s+WORK\s+TO\b)", re.IGNORECASE
)
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_VALUE = re.compile(r"^(?P<number>[0-9]*\.?[0-9]+)\s*(?P<unit>us|ms|s|min|h|d)?$", re.IGNORECASE)


def timeout_seconds(value: str) -> float | None:
    """A lock_timeout setting in seconds (``'2s'``, ``2000``, ``'1min'``; DEFAULT is 0);
    None when it is not a value Postgres would accept."""
    bare = value.strip().strip("'\"").strip()
    if bare.upper() == "DEFAULT":
        return 0.0
    found = _VALUE.match(bare)
    if found is None:
        return None
    unit = (found["unit"] or "ms").lower()
    return float(found["number"]) * _UNITS[unit]


def timeout_in_force(statements: Sequence[StatementInsight], index: int) -> float:
    """The lock_timeout in force when statement ``index`` ran, in seconds (0: none): what the
    trace measured (``StatementInsight.lock_timeout``) when it did, else what the statements
    before it in the same session set (``SET [SESSION|LOCAL] lock_timeout``, ``RESET``,
    ``set_config``; a LOCAL setting lasts until the transaction's COMMIT or ROLLBACK). A
    setting of the role or the database is known only from the trace."""
    if 0 <= index < len(statements) and statements[index].lock_timeout is not None:
        return statements[index].lock_timeout or 0.0
    session = 0.0
    local: float | None = None
    for stmt in statements[:index]:
        text = " ".join(_strip_comments(stmt.text).split())
        if _TRANSACTION_END.match(text):
            local = None
            continue
        if _RESET_TIMEOUT.match(text):
            session, local = 0.0, None
            continue
        found = _SET_TIMEOUT.match(text)
        value = timeout_seconds(found["value"]) if found else None
        is_local = bool(found and (found["scope"] or "").strip().upper() == "LOCAL")
        called = _SET_CONFIG.search(text)
        if found is None and called is not None:
            value = timeout_seconds(called["value"])
            is_local = flag(called["local"]) is True
        if value is None:
            continue
        if is_local:
            local = value
        else:
            session, local = value, None
    return local if local is not None else session


def _strip_comments(text: str) -> str:
    return sqltext.strip_comments(text)
