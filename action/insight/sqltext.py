"""Reading a statement's text with sqlparse's tokens: the relations it names, whether it writes
rows, the functions it calls. Pure: no I/O.

sqlparse tokenises; it does not know Postgres's grammar. What is read here is what the tokens
show plainly: a name after FROM, JOIN, INTO, UPDATE, TABLE, REFERENCES, TRUNCATE, LOCK (and ON,
in a CREATE), as Postgres folds it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlparse import engine, lexer
from sqlparse import tokens as T
from sqlparse.sql import Token

__all__ = [
    "Relation",
    "functions",
    "identifier",
    "name_chain",
    "relations",
    "statements",
    "strip_comments",
    "tokenise",
    "writes",
]

# Keywords after which a relation's name follows (ON only in CREATE INDEX/TRIGGER/...).
_BEFORE_RELATION = frozenset(
    {"FROM", "INTO", "UPDATE", "TABLE", "REFERENCES", "TRUNCATE", "LOCK", "ON"}
)
_SKIPPED = frozenset(
    {"ONLY", "IF", "NOT", "EXISTS", "IF EXISTS", "IF NOT EXISTS", "TABLE", "LATERAL"}
)
Relation = tuple[str, str]  # (schema or "", name)


def statements(text: str) -> list[list[Token]]:
    """The tokens of each statement of ``text`` (a tool may send several in one query),
    without whitespace and comments; none for a text of comments only."""
    found = []
    # The lexer and the splitter only: sqlparse's grouping refuses a statement of more than
    # 10,000 tokens (a data migration's INSERT) and nothing read here needs it.
    for statement in engine.FilterStack().run(text):  # type: ignore[no-untyped-call]
        kept = [
            t
            for t in statement.flatten()
            if not t.is_whitespace and t.ttype not in T.Comment and t.ttype is not T.Newline
        ]
        if kept and not (len(kept) == 1 and kept[0].value == ";"):
            found.append(kept)
    return found


def strip_comments(text: str) -> str:
    """``text`` with its comments blanked (as ``sqlparse.format(strip_comments=True)`` does,
    without the grouping that refuses a statement of more than 10,000 tokens)."""
    return "".join(
        " " if ttype in T.Comment else value
        for ttype, value in lexer.tokenize(text)  # type: ignore[no-untyped-call]
    )


def tokenise(text: str) -> list[Token]:
    """The first statement's tokens, without whitespace and comments."""
    return next(iter(statements(text)), [])


def identifier(token: Token) -> str | None:
    """A name as Postgres folds it ("Quoted" kept, unquoted in lower case), or None."""
    if token.ttype in T.Literal.String.Symbol:
        return str(token.value)[1:-1].replace('""', '"')
    if token.ttype in T.Name and token.ttype not in T.Name.Placeholder:
        return str(token.value).lower()
    if token.ttype is T.Keyword and token.normalized.upper() not in _SKIPPED:
        return str(token.value).lower()
    return None


def name_chain(tokens: Sequence[Token], at: int) -> tuple[Relation | None, int]:
    """The (schema, name) at ``at`` (``a``, ``a.b``, ``"a"."b"``) and the position after it."""
    parts: list[str] = []
    while at < len(tokens):
        name = identifier(tokens[at])
        if name is None:
            break
        parts.append(name)
        at += 1
        if at < len(tokens) and tokens[at].value == ".":
            at += 1
            continue
        break
    if not parts:
        return None, at
    return (parts[-2] if len(parts) > 1 else "", parts[-1]), at


def relations(tokens: Sequence[Token]) -> list[Relation]:
    """The relations a statement names: after FROM, JOIN, INTO, UPDATE, TABLE, REFERENCES,
    TRUNCATE, LOCK (and ON, in a CREATE), less functions called in FROM."""
    creating = bool(tokens) and tokens[0].normalized.upper() == "CREATE"
    found: list[Relation] = []
    for i, token in enumerate(tokens):
        if token.ttype not in T.Keyword:
            continue
        word = token.normalized.upper()
        joins = word.endswith("JOIN")
        if not (joins or word in _BEFORE_RELATION) or (word == "ON" and not creating):
            continue
        if word == "FROM" and i and tokens[i - 1].normalized.upper() == "DISTINCT":
            continue  # IS DISTINCT FROM
        at = i + 1
        while at < len(tokens) and tokens[at].normalized.upper() in _SKIPPED:
            at += 1
        if word == "ON" and at < len(tokens) and tokens[at].ttype in T.Keyword:
            continue  # ON DELETE, ON UPDATE of a foreign key
        name, after = name_chain(tokens, at)
        if name is None:
            continue
        if (joins or word == "FROM") and after < len(tokens) and tokens[after].value == "(":
            continue  # a function in FROM
        found.append(name)
    return found


def writes(tokens: Sequence[Token]) -> bool:
    """Whether a statement writes rows (INSERT, UPDATE, DELETE, MERGE, SELECT ... INTO)."""
    for token in tokens:
        word = token.normalized.upper()
        if token.ttype is T.Keyword.DML and word != "SELECT":
            return True
        if token.ttype is T.Keyword and word in ("INTO", "MERGE", "COPY"):
            return True
    return False


def functions(tokens: Sequence[Token]) -> set[str]:
    """The names of the functions a statement calls (a name before "(")."""
    called: set[str] = set()
    for token, after in zip(tokens, tokens[1:], strict=False):
        if after.value == "(" and token.ttype in T.Name:
            called.add(token.value.lower())
    return called
