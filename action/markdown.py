"""Escaping for GitHub-flavoured markdown: pure functions on strings.

Everything a pull request controls (file names, statements, error text, relation names) reaches
the comment through one of these, so it cannot break a table, close a code fence or a
``<details>`` block, or hide the rest of the comment in an HTML comment. Text is also put on one
line, cut to a limit, and what looks like a password is redacted.

Outside code, such text is also made :func:`inert`: GitHub turns ``@login``, ``@org/team``,
``#12``, ``owner/repo#12`` and ``GH-12`` in a comment, a job summary, an annotation or a
description into a notification or a cross-reference, so a pull request's SQL could ping
anyone. Inside a code span or block GitHub links nothing; outside, a zero-width joiner after
``@`` or ``#`` keeps the text as it reads and links nothing. Every plain-text field the Action
and the listener send GitHub (``github.py``'s descriptions, ``outputs.annotation``) passes
through it too.
"""

from __future__ import annotations

import html
import re
from urllib.parse import quote

CELL = 200  # characters kept of one table cell or one value

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&])")
# "password=x", "password: x", and SQL's "PASSWORD 'x'" (CREATE ROLE, ALTER ROLE)
_SECRET = re.compile(
    r"(?i)\b(password|passwd|pwd)(\s*[=:]\s*|\s+(?='))('[^']*'|\"[^\"]*\"|[^\s,;]+)"
)
_URL_SECRET = re.compile(r"(://[^:/@\s]+:)[^@\s]+@")
# What GitHub links in prose: a mention (``@login``, ``@org/team``: a word character after the
# ``@``) and an issue reference (``#12``, ``owner/repo#12``, ``GH-12``).
_LINKED = re.compile(r"(@)(?=\w)|(#)(?=\d)|(?i:\b(GH)-(?=\d))")
JOINER = "\u200d"  # zero width joiner: invisible, and no longer a mention or a reference


def inert(text: str) -> str:
    """``text`` with nothing GitHub would turn into a mention or an issue reference: a zero
    width joiner after each ``@`` or ``#`` (and ``GH-``) that would start one. For text outside
    code only: code spans and blocks link nothing, and their text must paste as it was."""
    return _LINKED.sub(lambda m: m.group(0) + JOINER, text)


def escape(text: str) -> str:
    """``text`` with every character markdown would read as markup backslash-escaped; for words
    of ours, which need neither a limit nor :func:`inert`."""
    return _MD_SPECIAL.sub(r"\\\1", text)


def token(text: str) -> str:
    """Only characters that cannot end an HTML comment (no ">", no "!", no spaces)."""
    return re.sub(r"[^A-Za-z0-9._/-]", "_", text[:CELL]) or "_"


def fence(text: str) -> str:
    """A fenced code block that ``text`` cannot close: the fence outruns any backtick run."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}text\n{text}\n{ticks}"


def code(text: str, *, cell: bool = False, limit: int = CELL) -> str:
    """Inline code on one line; in a table cell its pipes are escaped (GFM unescapes them)."""
    body = line(text, limit)
    if not body:
        return "(none)"
    if cell:
        body = body.replace("|", "\\|")
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", body)), default=0) + 1)
    pad = " " if len(ticks) > 1 else ""
    return f"{ticks}{pad}{body}{pad}{ticks}"


def prose(text: str, limit: int, *, cell: bool, redact: bool = True) -> str:
    """One line of plain text, markdown and HTML escaped; `quoted` parts become inline code."""
    body = line(text, limit, redact=redact)
    pieces = body.split("`")
    if len(pieces) % 2 == 0:  # an odd number of backticks: no code, all plain text
        pieces = [body]
    return "".join(
        code(p, cell=cell) if i % 2 else inert(escape(p))
        for i, p in enumerate(pieces)
    )


def html_text(text: str, limit: int) -> str:
    """One line for an HTML context (a ``<summary>``): entities escaped, `quoted` parts in
    ``<code>``. No tag or comment can start in it: every ``<`` becomes ``&lt;``."""
    body = line(text, limit)
    pieces = body.split("`")
    if len(pieces) % 2 == 0:
        pieces = [body]
    return "".join(
        (f"<code>{html.escape(p)}</code>" if p else "``") if i % 2 else inert(html.escape(p))
        for i, p in enumerate(pieces)
    )


def hide_secrets(text: str) -> str:
    """Hide what looks like a password (``password=...``, ``PASSWORD '...'``,
    ``scheme://user:secret@``)."""
    return _URL_SECRET.sub(r"\1[redacted]@", _SECRET.sub(r"\1\2[redacted]", text))


def line(text: str, limit: int, *, redact: bool = True) -> str:
    """``text`` on one line (whitespace runs become one space), cut to ``limit`` characters."""
    head = text[: limit * 8]  # bounded work on huge input
    one = " ".join((hide_secrets(head) if redact else head).split())
    if len(one) > limit or len(head) < len(text):
        one = one[: limit - 1] + "…"
    return one


def middle(text: str, limit: int) -> str:
    """``text`` on one line, cut in its middle to ``limit`` characters: a long path or relation
    keeps its start and its end (``db/migrations/0041…order_notes.sql``), what looks like a
    password redacted before the cut."""
    one = " ".join(hide_secrets(text[: limit * 8]).split())
    if len(one) <= limit and len(text) <= limit * 8:
        return one
    head = (limit - 1) // 2
    return one[:head] + "…" + one[len(one) - (limit - 1 - head) :]


def url(address: str) -> str:
    """Percent-encode what would end a markdown link destination early (spaces, parentheses)."""
    return quote(line(address, 2000, redact=False), safe=":/?#[]@!$&'*+,;=%~")
