"""A table cell of the report, as a few pieces of inline text, and its two renderings: Markdown
for the PR comment and the job summary (``markdown``), HTML for the branch page (``html``).
Pure: strings in, strings out.

A cell is written once, as what it says (plain words of ours, a name in code, a pull request's
text with its `quoted` parts, a strong word, a line break), and each rendering escapes every
piece for where it lands: Markdown's specials and GitHub's mentions in the comment
(``markdown.py``), HTML's entities on the page. No piece carries markup of its own, so nothing a
pull request writes can break a table row, a code span or the page.
"""

from __future__ import annotations

import html as _html
from dataclasses import dataclass

from pgoverlay.action import markdown as md

__all__ = ["BREAK", "Break", "Cell", "Code", "Piece", "Prose", "Strong", "html", "markdown"]


@dataclass(frozen=True)
class Code:
    """A name shown as code: a file, a relation, a command; on one line, cut to ``limit``."""

    text: str
    limit: int = md.CELL


@dataclass(frozen=True)
class Prose:
    """Text a pull request or a tool wrote (a verdict's words, an error): on one line, cut to
    ``limit``, its `quoted` parts as code."""

    text: str
    limit: int = md.CELL


@dataclass(frozen=True)
class Strong:
    """A word of ours that must stand out (``over``, ``failed``)."""

    text: str


@dataclass(frozen=True)
class Break:
    """A line break inside the cell (one line per table of a migration's locks)."""


BREAK = Break()

# A plain ``str`` is words of ours (a duration, "none", a lock mode): escaped all the same.
Piece = str | Code | Prose | Strong | Break
Cell = tuple[Piece, ...]


def markdown(cell: Cell) -> str:
    """``cell`` for a GitHub-flavoured Markdown table cell."""
    return "".join(_markdown(p) for p in cell)


def _markdown(piece: Piece) -> str:
    if isinstance(piece, str):
        return md.escape(piece)
    if isinstance(piece, Code):
        return md.code(piece.text, cell=True, limit=piece.limit)
    if isinstance(piece, Prose):
        return md.prose(piece.text, piece.limit, cell=True)
    if isinstance(piece, Strong):
        return f"**{md.escape(piece.text)}**"
    return "<br>"


def html(cell: Cell) -> str:
    """``cell`` for an HTML table cell: every piece's text entity-escaped."""
    return "".join(_html_piece(p) for p in cell)


def _html_piece(piece: Piece) -> str:
    if isinstance(piece, str):
        return _escape(piece)
    if isinstance(piece, Code):
        body = md.line(piece.text, piece.limit)
        return f"<code>{_escape(body)}</code>" if body else "(none)"
    if isinstance(piece, Prose):
        body = md.line(piece.text, piece.limit)
        spans = body.split("`")
        if len(spans) % 2 == 0:  # an odd number of backticks: no code, all plain text
            spans = [body]
        return "".join(
            f"<code>{_escape(s)}</code>" if i % 2 else _escape(s) for i, s in enumerate(spans)
        )
    if isinstance(piece, Strong):
        return f"<strong>{_escape(piece.text)}</strong>"
    return "<br>"


def _escape(text: str) -> str:
    return _html.escape(text, quote=True)
