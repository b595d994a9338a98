"""The comment's first words under its title: the verdict of the run, in a sentence. Pure.

A reviewer reads this and, often, nothing else, so it says the worst first: a failed migration
(where, and the error's first line), else the migrations over a threshold with their verdicts,
else those with a notice, else that all were safe online. At most ``NAMED`` migrations are
named; the rest are counted and left to the table under it.
"""

from __future__ import annotations

from collections.abc import Callable

from pgoverlay.action import markdown as md
from pgoverlay.action.report import MigrationRun, MigrationStatus

__all__ = ["NAMED", "lead"]

NAMED = 3  # migrations named in the lead; the rest are counted
_ERROR = 300  # characters of the failed migration's first error line
_VERDICT = 500  # characters of a verdict (its advice included)
_ORDER: tuple[MigrationStatus, ...] = ("applied", "skipped", "failed", "not run")


def lead(runs: list[MigrationRun]) -> str:
    """The run's verdict in words, e.g. "**1 migration over a threshold**: `0001_t.sql` rewrites
    `public.t` (181.0 MiB) …"; ``""`` when no migration ran."""
    if not runs:
        return ""
    failed = [m for m in runs if m.status == "failed"]
    over = [m for m in runs if m.insight is not None and m.insight.verdict.level == "over"]
    notices = [m for m in runs if m.insight is not None and m.insight.verdict.level == "notice"]
    said: list[str] = []
    if failed:
        said.append(_named(f"**{_count(len(failed), 'migration')} failed**", failed, _failure))
    if over:
        head = f"**{_count(len(over), 'migration')} over a threshold**"
        said.append(_named(head, over, _verdict))
    elif notices and not failed:
        head = f"{_tally(runs)}, none over a threshold; {_count(len(notices), 'notice')}"
        said.append(_named(head, notices, _verdict))
    elif not failed and any(m.insight is not None for m in runs) and _all_safe(runs):
        said.append(f"{_tally(runs)}, all safe online.")
    elif not failed:
        said.append(f"{_tally(runs)}.")
    return "\n\n".join(said)


def _named(head: str, runs: list[MigrationRun], say: Callable[[MigrationRun], str]) -> str:
    """``head``, then the migrations it is about: inline for one, a list for more."""
    items = [f"{md.code(m.name)} {say(m)}" for m in runs[:NAMED]]
    if len(runs) > NAMED:
        items.append(f"and {len(runs) - NAMED:,} more in the table below")
    if len(items) == 1:
        return f"{head}: {items[0]}"
    return f"{head}:\n\n" + "\n".join(f"- {item}" for item in items)


def _verdict(m: MigrationRun) -> str:
    assert m.insight is not None
    return md.prose(m.insight.verdict.text, _VERDICT, cell=False)


def _failure(m: MigrationRun) -> str:
    """Where it failed and the error's first line (redacted)."""
    where = f"at line {m.line}" if m.line is not None else "failed"
    first = next((x for x in m.error.splitlines() if x.strip()), "")
    return f"{where}: {md.prose(first, _ERROR, cell=False)}" if first else where


def _all_safe(runs: list[MigrationRun]) -> bool:
    return all(m.insight.verdict.level == "safe" for m in runs if m.insight is not None)


def _tally(runs: list[MigrationRun]) -> str:
    """ "3 migrations applied", "2 migrations applied, 1 skipped"."""
    counts = {s: sum(1 for m in runs if m.status == s) for s in _ORDER}
    parts = [f"{n:,} {s}" for s, n in counts.items() if n]
    first = parts[0].split(" ", 1)
    noun = "migration" if first[0] == "1" else "migrations"
    return ", ".join([f"{first[0]} {noun} {first[1]}", *parts[1:]])


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
