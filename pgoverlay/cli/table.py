"""Tables for the terminal as plain text: each column as wide as its widest cell, two spaces
between columns, nothing cut or wrapped.

rich drew these before, but importing and rendering it took about 60 ms of a listing that must
answer in 150 ms, and it cut cells to the terminal's width. Plain columns read the same to a
person and split on runs of spaces for a script (``--json`` is the stable form).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def render(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """``headers`` over ``rows``, aligned; every row has a cell per header."""
    cells = [list(headers), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = (
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )
    return "\n".join(lines) + "\n"
