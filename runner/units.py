"""Sizes as people read them. Its own module, free of the engine's imports: the CLI, the
Action's comment and the reports format sizes without importing the branch package."""

from __future__ import annotations

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
