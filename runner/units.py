"""Sizes as people read them, and as Postgres's memory settings write them. Its own module,
free of the engine's imports: the CLI, the Action's comment and the reports format sizes, and a
branch reads its settings, without importing the branch or seed packages."""

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
