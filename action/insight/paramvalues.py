"""Real values for a normalized statement's parameters, drawn from the branch's own rows.

pg_stat_statements keeps a statement's text with its constants replaced by `$1..$n`. To time the
statement as production runs it, each `$n` is mapped, with Postgres's own parser (pglast), to
the expression it is compared with (`lower(c.email) = $1`, `o.id IN ($2, $3)`, `ref = ANY($4)`,
`BETWEEN $5 AND $6`), the column it is assigned to (`SET total = $1`, `VALUES ($1, ...)`), or to
`LIMIT`/`OFFSET` (a fixed 100 and 0: not a value of the data). A parameter used anywhere else
(`SELECT $1 + id`) has no mapping and the statement is not timed. Values are then sampled, one
row per relation per run, from rows that exist (`TABLESAMPLE SYSTEM`, then the first rows), as
text: they are sent untyped, and Postgres infers each parameter's type as the application's
driver lets it. The values stay in memory: nothing here logs or returns them to a report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pglast import ast, parse_sql
from pglast.enums.parsenodes import A_Expr_Kind
from pglast.stream import RawStream
from pglast.visitors import Visitor
from psycopg import sql

SAMPLE_TIMEOUT_MS = 5000

# The operators whose other side is the expression a parameter stands for.
COMPARED = {
    A_Expr_Kind.AEXPR_OP,
    A_Expr_Kind.AEXPR_OP_ANY,
    A_Expr_Kind.AEXPR_OP_ALL,
    A_Expr_Kind.AEXPR_IN,
    A_Expr_Kind.AEXPR_LIKE,
    A_Expr_Kind.AEXPR_ILIKE,
    A_Expr_Kind.AEXPR_BETWEEN,
    A_Expr_Kind.AEXPR_NOT_BETWEEN,
    A_Expr_Kind.AEXPR_DISTINCT,
    A_Expr_Kind.AEXPR_NOT_DISTINCT,
}
OPERATORS = {A_Expr_Kind.AEXPR_OP, A_Expr_Kind.AEXPR_OP_ANY, A_Expr_Kind.AEXPR_OP_ALL}
# Of plain and `ANY` operators, the comparisons: `$1 + id` says nothing of `$1`'s values.
COMPARISONS = {"=", "<>", "!=", "<", ">", "<=", ">=", "~~", "~~*", "!~~", "!~~*"}


@dataclass(frozen=True)
class Source:
    """A relation a statement reads or writes, as written: `relation` deparsed, `alias` if any."""

    relation: str
    alias: str | None
    name: str  # the relation's own name, which qualifies a column when there is no alias
    schema: str | None = None


@dataclass(frozen=True)
class Target:
    """Where a parameter's values come from: `expression` over one relation of the statement.
    `source` is None when the expression's columns are unqualified and the statement names
    several relations: the catalog decides (`resolve`)."""

    expression: str
    columns: frozenset[str]
    source: Source | None
    array: bool = False  # `= ANY($n)`: the value is an array of one


@dataclass(frozen=True)
class Mapping:
    """Each `$n` of one statement: a target in the data, a fixed constant, or unmapped."""

    params: int
    targets: dict[int, Target] = field(default_factory=dict)
    constants: dict[int, str] = field(default_factory=dict)
    sources: tuple[Source, ...] = ()
    unparsed: bool = False

    @property
    def unmapped(self) -> tuple[int, ...]:
        known = self.targets.keys() | self.constants.keys()
        return tuple(n for n in range(1, self.params + 1) if n not in known)


def _param(node: Any) -> int | None:
    """The number of a parameter, also under casts (`$1::numeric`)."""
    while isinstance(node, ast.TypeCast):
        node = node.arg
    return node.number if isinstance(node, ast.ParamRef) else None


class _Collect(Visitor):
    def __init__(self) -> None:
        super().__init__()
        self.params: set[int] = set()
        self.refs: list[ast.ColumnRef] = []
        self.sublink = False

    def visit_ParamRef(self, ancestors: Any, node: ast.ParamRef) -> None:
        if node.number is not None:
            self.params.add(node.number)

    def visit_ColumnRef(self, ancestors: Any, node: ast.ColumnRef) -> None:
        self.refs.append(node)

    def visit_SubLink(self, ancestors: Any, node: ast.SubLink) -> None:
        self.sublink = True


def _contents(node: Any) -> _Collect:
    found = _Collect()
    found(node)
    return found


def _deparse(node: Any) -> str:
    return str(RawStream()(node))


def _column(name: str) -> str:
    return _deparse(ast.ColumnRef(fields=(ast.String(sval=name),)))


class _Map(Visitor):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[Source] = []
        self.found: list[tuple[int, Any, bool, Source | None]] = []
        self.constants: dict[int, str] = {}

    def visit_RangeVar(self, ancestors: Any, node: ast.RangeVar) -> None:
        bare = ast.RangeVar(
            relname=node.relname, schemaname=node.schemaname, inh=True, relpersistence="p"
        )
        alias = node.alias.aliasname if node.alias is not None else None
        self.sources.append(Source(_deparse(bare), alias, node.relname or "", node.schemaname))

    def visit_A_Expr(self, ancestors: Any, node: ast.A_Expr) -> None:
        if node.kind not in COMPARED:
            return
        operator = node.name[-1].sval if node.name else ""
        if node.kind in OPERATORS and operator not in COMPARISONS:
            return
        array = node.kind in (A_Expr_Kind.AEXPR_OP_ANY, A_Expr_Kind.AEXPR_OP_ALL)
        for mine, other in ((node.rexpr, node.lexpr), (node.lexpr, node.rexpr)):
            items = mine if isinstance(mine, tuple) else (mine,)
            numbers = [_param(i) for i in items]
            if other is None or not numbers or None in numbers:
                continue
            for n in numbers:
                assert n is not None
                self.found.append((n, other, array, None))

    def visit_SelectStmt(self, ancestors: Any, node: ast.SelectStmt) -> None:
        for clause, value in ((node.limitCount, "100"), (node.limitOffset, "0")):
            n = _param(clause)
            if n is not None:
                self.constants[n] = value

    def visit_UpdateStmt(self, ancestors: Any, node: ast.UpdateStmt) -> None:
        if node.relation is None:
            return
        source = Source(
            _relation(node.relation), None, node.relation.relname or "", node.relation.schemaname
        )
        for target in node.targetList or ():
            n = _param(target.val)
            if n is not None and target.name:
                self.found.append((n, _column(target.name), False, source))

    def visit_InsertStmt(self, ancestors: Any, node: ast.InsertStmt) -> None:
        select = node.selectStmt
        if (
            not node.cols
            or node.relation is None
            or not isinstance(select, ast.SelectStmt)
            or not select.valuesLists
        ):
            return
        source = Source(
            _relation(node.relation), None, node.relation.relname or "", node.relation.schemaname
        )
        names = [c.name for c in node.cols]
        for row in select.valuesLists:
            for name, value in zip(names, row, strict=False):
                n = _param(value)
                if n is not None:
                    self.found.append((n, _column(name), False, source))


def _relation(node: ast.RangeVar) -> str:
    return _deparse(
        ast.RangeVar(relname=node.relname, schemaname=node.schemaname, inh=True, relpersistence="p")
    )


def _qualifier(ref: ast.ColumnRef) -> tuple[str | None, str | None]:
    fields = ref.fields or ()
    names = [str(f.sval) for f in fields if isinstance(f, ast.String)]
    if not names or len(names) != len(fields):
        return None, None
    return (names[-2] if len(names) > 1 else None), names[-1]


def map_params(query: str) -> Mapping:
    """Map each `$n` of a normalized statement to what its value is compared with (pure)."""
    try:
        tree = parse_sql(query)
    except Exception:  # pglast's ParseError and its C parser's own; an unparsed text is untimed
        return Mapping(params=query.count("$"), unparsed=True)
    if len(tree) != 1:
        return Mapping(params=0, unparsed=True)
    everything = _contents(tree)
    mapper = _Map()
    mapper(tree)
    targets: dict[int, Target] = {}
    for n, node, array, given in mapper.found:
        if n in targets:
            continue
        if isinstance(node, str):
            targets[n] = Target(node, frozenset(), given, array)
            continue
        inner = _contents(node)
        if inner.params or inner.sublink or not inner.refs:
            continue
        qualifiers = set()
        columns = set()
        for ref in inner.refs:
            qualifier, column = _qualifier(ref)
            if column is None:
                break
            qualifiers.add(qualifier)
            columns.add(column)
        else:
            source = _source_for(qualifiers, mapper.sources)
            if source is None and qualifiers != {None}:
                continue
            targets[n] = Target(_deparse(node), frozenset(columns), source, array)
    return Mapping(
        params=max(everything.params, default=0),
        targets=targets,
        constants=mapper.constants,
        sources=tuple(dict.fromkeys(mapper.sources)),
    )


def _source_for(qualifiers: set[str | None], sources: Sequence[Source]) -> Source | None:
    if len(qualifiers) != 1:
        return None
    (qualifier,) = qualifiers
    if qualifier is None:
        return sources[0] if len({s.relation for s in sources}) == 1 else None
    for s in sources:
        if s.alias == qualifier or (s.alias is None and s.name == qualifier):
            return s
    return None


def resolve(conn: psycopg.Connection[Any], mapping: Mapping) -> Mapping:
    """Give each unqualified target the one relation of the statement that has its columns."""
    columns: dict[str, set[str]] = {}
    for s in mapping.sources:
        if s.relation not in columns:
            rows = conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                "AND attnum > 0 AND NOT attisdropped",
                (s.relation,),
            ).fetchall()
            columns[s.relation] = {r[0] for r in rows}
    targets = {}
    for n, t in mapping.targets.items():
        if t.source is None:
            fits = [s for s in mapping.sources if t.columns <= columns[s.relation]]
            if len({s.relation for s in fits}) != 1:
                continue
            t = Target(t.expression, t.columns, fits[0], t.array)
        targets[n] = t
    return Mapping(mapping.params, targets, mapping.constants, mapping.sources, mapping.unparsed)


Values = tuple[str | None, ...]


def sample(conn: psycopg.Connection[Any], mapping: Mapping, *, count: int) -> list[Values]:
    """`count` sets of values for `$1..$n` (fewer when the rows are fewer; none when a relation
    has no row to draw from), each set drawn from existing rows: the parameters of one relation
    from one row. Read-only, in a transaction rolled back, under a statement timeout."""
    groups: dict[Source, list[int]] = {}
    for n, t in sorted(mapping.targets.items()):
        assert t.source is not None
        groups.setdefault(t.source, []).append(n)
    drawn: dict[int, list[str | None]] = {}
    rows_each = count
    with conn.transaction(force_rollback=True):
        conn.execute(
            sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(SAMPLE_TIMEOUT_MS))
        )
        for source, numbers in groups.items():
            rows = _draw(conn, source, [mapping.targets[n] for n in numbers], count)
            rows_each = min(rows_each, len(rows))
            for i, n in enumerate(numbers):
                column = [r[i] for r in rows]
                if mapping.targets[n].array:
                    column = [_array_of_one(v) for v in column]
                drawn[n] = column
    if rows_each == 0:
        return []
    out = []
    for k in range(rows_each):
        one = []
        for n in range(1, mapping.params + 1):
            one.append(mapping.constants[n] if n in mapping.constants else drawn[n][k])
        out.append(tuple(one))
    return out


def _draw(
    conn: psycopg.Connection[Any], source: Source, targets: list[Target], count: int
) -> list[tuple[str | None, ...]]:
    names = (source.schema, source.name) if source.schema else (source.name,)
    named: sql.Composable = sql.Identifier(*names)
    if source.alias:
        named = sql.SQL("{} AS {}").format(named, sql.Identifier(source.alias))
    # The expressions are pglast's deparse of the statement's own (without a parameter or a
    # subquery): they read what the statement reads, with the rights it runs with.
    exprs = [sql.SQL(t.expression) for t in targets]
    picked = sql.SQL(", ").join(sql.SQL("({})::text").format(e) for e in exprs)
    present = sql.SQL(" AND ").join(sql.SQL("({}) IS NOT NULL").format(e) for e in exprs)
    kind = conn.execute(
        "SELECT relkind, reltuples FROM pg_class WHERE oid = to_regclass(%s)", (source.relation,)
    ).fetchone()
    rows: list[tuple[str | None, ...]] = []
    query = sql.SQL("SELECT {} FROM {} {} WHERE {} LIMIT {}")
    if kind is not None and kind[0] in ("r", "m") and kind[1] > count * 20:
        # About 20 rows a run, from pages spread over the table, without reading all of it.
        percent = min(100.0, 100.0 * count * 20 / float(kind[1]))
        sampled = sql.SQL("TABLESAMPLE SYSTEM ({})").format(sql.Literal(percent))
        rows = conn.execute(
            query.format(picked, named, sampled, present, sql.Literal(count))
        ).fetchall()
    if len(rows) < count:
        rows = conn.execute(
            query.format(picked, named, sql.SQL(""), present, sql.Literal(count))
        ).fetchall()
    return rows


def _array_of_one(value: str | None) -> str | None:
    if value is None:
        return None
    return '{"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"}'
