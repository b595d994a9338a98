"""Postgres's table-level lock modes, what each conflicts with, and what that means in
production.

The conflict table is the documentation's "Conflicting Lock Modes" (explicit locking, table
13.2), kept as data so that what a mode blocks is derived from it rather than restated.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pgoverlay.action.insight.model import Blocks

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


# The shortest hold of a lock that blocks reads or writes worth a notice or a confirmed lint
# finding: below it, a blocked client waits no longer than a slow query.
NOTICEABLE_SECONDS = 0.1


def seconds_text(seconds: float) -> str:
    """How long a lock was held, in words: "3 ms", "412 ms", "2.3 s", "41.2 s"."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f} s"
