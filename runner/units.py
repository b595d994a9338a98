"""Sizes and durations as people read them, and sizes as Postgres's memory settings write them.
Its own module, free of the engine's imports: the CLI, the Action's comment and the reports
format sizes, and a branch reads its settings, without importing the branch or seed packages."""

from __future__ import annotations

import re

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: int) -> str:
    """Human-readable binary size: "0 B", "40.0 KiB", "1.0 MiB", "5.20 GiB"."""
    if n < 0:
        return "-" + format_bytes(-n)
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    index = 0
    # move up a unit while the rounded figure would read 1024 or more
    while index < len(_UNITS) - 1 and round(value, 1 if index < 2 else 2) >= 1024:
        value /= 1024
        index += 1
    return f"{value:.{1 if index < 2 else 2}f} {_UNITS[index]}"


_DURATION_UNITS = (("d", 86400), ("h", 3600), ("m", 60))


def format_duration(seconds: float) -> str:
    """Seconds as the largest unit that counts them whole, as a duration is written in the
    inputs and settings ("10m", "2h", "7d", "90s", "1.5s"): what `runner.names` reads back."""
    for unit, size in _DURATION_UNITS:
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def idle_rule(seconds: float) -> str:
    """What happens to a branch nobody uses, after ``seconds`` of it (0: never): the words the
    CLI, the branch page and the PR comment say it in."""
    if seconds <= 0:
        return "never suspended"
    return (
        f"suspended after {format_duration(seconds)} with no connection: wakes on the next "
        "connection"
    )


_SETTING_UNITS = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3, "tb": 1024**4}
_MEMORY = re.compile(r"^\s*(\d+)\s*([kmgt]?b)?\s*$", re.IGNORECASE)
# The unit of a bare number, per setting (Postgres's own base units).
_BASE_UNIT = {
    "shared_buffers": 8192,
    "work_mem": 1024,
    "maintenance_work_mem": 1024,
    "max_wal_size": 1024**2,
    "min_wal_size": 1024**2,
}


def memory_bytes(name: str, value: str) -> int | None:
    """``value`` of memory setting ``name`` in bytes, or None if it cannot be read."""
    match = _MEMORY.match(value)
    if not match:
        return None
    unit = match.group(2)
    return int(match.group(1)) * (_SETTING_UNITS[unit.lower()] if unit else _BASE_UNIT.get(name, 1))
