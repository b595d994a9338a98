"""What the pull request did to the schema, as the report keeps it and the comment shows it:
plain data and pure rendering, no I/O.

The engine reads the diff from the catalogs when the trace ends (``runner/trace/schema.py``
says how, and what it covers); here it becomes the report's ``schema_diff`` and a collapsed
``<details>`` block: a headline that counts the changes ("1 table added, 2 columns changed"),
then one line per change, cut to fit, with a pointer to the JSON report for the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pgoverlay.action import markdown as md
from pgoverlay.runner.service import views

Change = Literal["added", "dropped", "changed"]

FEW = 30  # change lines the PR comment shows; the job summary shows every listed one
ROOM = {False: 8_000, True: 400_000}  # characters of the block: the comment's, the summary's
_VALUE = {False: 120, True: 300}  # characters of one value: in the comment, in the summary
_ATTRIBUTES = 3  # changed attributes named on one line; the rest are counted


@dataclass(frozen=True)
class SchemaAttribute:
    name: str  # "type", "default", "definition", "columns", ...
    before: str = ""  # "" where the object is missing on that side
    after: str = ""


@dataclass(frozen=True)
class SchemaChange:
    kind: str  # "table", "column", "index", "constraint", "trigger", "view", ...
    name: str  # quoted where Postgres would quote it: "public.orders.amount"
    change: Change
    table: str = ""  # the table a column, index, constraint, trigger or grant belongs to
    attributes: list[SchemaAttribute] = field(default_factory=list)


@dataclass(frozen=True)
class SchemaCount:
    kind: str
    change: Change
    count: int


@dataclass(frozen=True)
class SchemaDiff:
    """The branch's schema after the migrations against its base's."""

    base_taken_at: float  # when the base's side was read (0: it was not available)
    changes: list[SchemaChange] = field(default_factory=list)  # at most the engine's cap
    counts: list[SchemaCount] = field(default_factory=list)  # of every change, listed or not
    left_out: int = 0  # changes counted but not listed
    notes: list[str] = field(default_factory=list)  # what could not be compared, and why


def of_view(found: views.SchemaDiff) -> SchemaDiff:
    """The engine's answer as the report keeps it."""
    return SchemaDiff(
        base_taken_at=found.base_taken_at,
        changes=[
            SchemaChange(
                kind=c.kind,
                name=c.name,
                change=c.change,
                table=c.table,
                attributes=[
                    SchemaAttribute(name=a.name, before=a.before, after=a.after)
                    for a in c.attributes
                ],
            )
            for c in found.changes
        ],
        counts=[SchemaCount(kind=n.kind, change=n.change, count=n.count) for n in found.counts],
        left_out=found.left_out,
        notes=list(found.notes),
    )


# -- rendering ----------------------------------------------------------------------------

_PLURAL = {"index": "indexes", "materialized view": "materialized views"}
_MARK: dict[Change, str] = {"added": "+", "dropped": "−", "changed": "~"}


def _noun(kind: str, n: int) -> str:
    return kind if n == 1 else _PLURAL.get(kind, kind + "s")


def headline(diff: SchemaDiff) -> str:
    """ "Schema changes: 1 table added, 2 columns changed", or "no schema changes"."""
    if not diff.counts:
        return "Schema changes: none" if diff.base_taken_at else "Schema changes: not compared"
    counted = ", ".join(f"{n.count} {_noun(n.kind, n.count)} {n.change}" for n in diff.counts)
    return f"Schema changes: {counted}"


def line(c: SchemaChange, *, full: bool = False) -> str:
    """One change: "+ index `public.orders_amount_idx` on `public.orders`: btree (amount)",
    "~ column `public.orders.amount`: type `integer` → `bigint`". Values are cut shorter in
    the comment (``full`` False) than in the job summary."""
    limit = _VALUE[full]
    head = f"{_MARK[c.change]} {c.kind} {md.code(c.name, limit=limit)}"
    if c.table and c.kind not in ("column", "grant"):
        head += f" on {md.code(c.table, limit=limit)}"
    if c.change == "changed":
        parts = [_changed(a, limit) for a in c.attributes[:_ATTRIBUTES]]
        more = len(c.attributes) - _ATTRIBUTES
        if more > 0:
            parts.append(f"and {more} more")
        return f"{head}: {'; '.join(parts)}" if parts else head
    if c.change == "dropped":
        return head
    shown = _added(c, limit)
    return f"{head}: {shown}" if shown else head


def _changed(a: SchemaAttribute, limit: int) -> str:
    if a.name == "body":
        return "body changed"
    if a.name == "definition" and (len(a.before) > 60 or len(a.after) > 60):
        return f"definition changed, now {md.code(a.after, limit=limit)}"
    before = md.code(a.before, limit=limit) if a.before else "(none)"
    after = md.code(a.after, limit=limit) if a.after else "(none)"
    return f"{md.prose(a.name, 40, cell=False)} {before} → {after}"


def _added(c: SchemaChange, limit: int) -> str:
    values = {a.name: a.after for a in c.attributes}
    if c.kind == "column":
        words = [values.get("type", "")]
        if values.get("nullability") == "not null":
            words.append("not null")
        if values.get("identity"):
            words.append(f"identity {values['identity']}")
        if values.get("collation"):
            words.append(f"collate {values['collation']}")
        if values.get("default"):
            words.append(f"default {values['default']}")
        if values.get("generated"):
            words.append(f"generated as {values['generated']}")
        return md.code(" ".join(w for w in words if w), limit=limit)
    if c.kind == "index":
        definition = values.get("definition", "")
        using = definition.find(" USING ")
        shown = definition[using + len(" USING ") :] if using >= 0 else definition
        extra = [w for w in (values.get("unique", ""), values.get("validity", "")) if w]
        extra = [w for w in extra if w != "valid"]
        return md.code(shown, limit=limit) + (f" ({', '.join(extra)})" if extra else "")
    if c.kind in ("constraint", "trigger", "view", "materialized view"):
        return md.code(values.get("definition", ""), limit=limit)
    if c.kind == "table":
        kind = values.get("kind", "table")
        columns = values.get("columns", "")
        shown = md.code(columns, limit=limit) if columns else ""
        prefix = kind if kind != "table" else ""
        if values.get("persistence"):
            prefix = f"{values['persistence']} {prefix}".strip()
        return " ".join(w for w in (prefix, shown) if w)
    if c.kind == "function":
        returns = values.get("returns", "")
        text = f"{values.get('kind', '')}{f' returning {returns}' if returns else ''}"
        return md.code(text, limit=limit)
    shown = "; ".join(f"{a.name} {a.after}" for a in c.attributes if a.after and a.name != "grants")
    return md.code(shown, limit=limit) if shown else ""


def markdown(diff: SchemaDiff | None, *, full: bool, see: str) -> str:
    """The collapsed block: the headline, then one line per change (all that are listed with
    ``full``, else ``FEW``), what was left out and why, pointing to ``see`` for the rest. ""
    when there is no diff (the migrations were not measured)."""
    if diff is None:
        return ""
    rows = diff.changes if full else diff.changes[:FEW]
    lines: list[str] = []
    room = ROOM[full]
    for c in rows:
        text = f"- {line(c, full=full)}"
        room -= len(text) + 1
        if room < 0:
            break
        lines.append(text)
    hidden = len(diff.changes) - len(lines) + diff.left_out
    if hidden:
        lines.append(f"- … {hidden} more {'change' if hidden == 1 else 'changes'} in {see}")
    lines += [f"- {md.prose(note, 500, cell=False)}" for note in diff.notes]
    summary = md.html_text(headline(diff), 300)
    body = "\n".join(lines) if lines else "The migrations left the schema as the base has it."
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"
