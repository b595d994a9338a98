"""The measured truth table: for each of more than 40 common migration statements, what Postgres
really did (measured without the product, ``truthtable``) against what migration insight
reported when the same statement ran as a migration file through the real apply path, field
by field — locks, rewrites, scans under a lock that blocks writes, and the verdict's kind — at
two table sizes. A subset runs the same way through Alembic and Django in migrate-command mode
(``truthtools``).

Every statement is measured right before the product runs it, on the same branch, so both see
the same state; the two sizes run the same sequence on tables of their own.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import truthtable
import truthtools
from truthtable import STATEMENTS, Statement, Truth

from helpers import as_engine, extra_server, remove_base, source_dsn
from pgoverlay.action import migrations
from pgoverlay.action.insight import locks as locks_mod
from pgoverlay.action.insight.model import MigrationInsight, Thresholds
from pgoverlay.action.insight.observe import Observer
from pgoverlay.action.report import MigrationRun
from pgoverlay.runner import branch, seed
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest

pytestmark = pytest.mark.slow

# Two sizes, ten times apart: the kind of a verdict must not change with the table's size.
SIZES = {
    "small": 20_000,
    "large": int(os.environ.get("PGOVERLAY_TRUTH_ROWS", "200000")),
}
TOOL_ROWS = 20_000
STATEMENT_TIMEOUT = 300.0


@dataclass(frozen=True)
class Row:
    """One statement at one size: the truth, and the product's report (or why it has none)."""

    statement: Statement
    schema: str
    truth: Truth
    insight: MigrationInsight | None
    problem: str = ""


@pytest.fixture(scope="module")
def truth_base(pool: Pool) -> Iterator[BaseVersion]:
    """A base whose every size (and each migration tool) has its own schema of tables."""
    with extra_server(pool, "truth-source", options={"wal_level": "replica"}) as srv:
        with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
            conn.execute("CREATE ROLE truth_owner")
            conn.execute("CREATE DATABASE truth OWNER truth_owner")
        info = srv.conninfo(user="postgres", dbname="truth")
        with psycopg.connect(**info, autocommit=True) as conn:
            conn.execute("SET ROLE truth_owner")
            schemas = {**SIZES, **{tool: TOOL_ROWS for tool in TOOLS}}
            for schema, rows in schemas.items():
                for step in truthtable.setup_sql(schema, rows):
                    conn.execute(step)
            conn.execute("RESET ROLE")
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")
        base = seed.seed(pool, "truth", source_dsn=source_dsn(srv, dbname="truth"))
    yield base
    remove_base(pool, base)


@dataclass
class Bench:
    """The branch both the truth and the product run on."""

    pool: Pool
    base: BaseVersion
    engine: LocalEngine
    name: str
    work: Path
    login: dict[str, Any]  # the superuser's connection keywords

    def superuser(self) -> psycopg.Connection[Any]:
        """The base's superuser on the branch's private socket, not in autocommit; callable
        from any thread (the registry is read once, in ``connect``)."""
        return psycopg.connect(**self.login, connect_timeout=10)

    def observer(self) -> Observer:
        return Observer(
            self.engine,
            self.name,
            repository=None,
            thresholds=Thresholds(),
            pg_major=self.base.pg_major or 15,
            max_seconds=3600,
        )

    def truth(self, statement: Statement, schema: str) -> Truth:
        """What ``statement`` does on ``schema`` now, measured without the product; a statement
        measured outside a transaction is then undone (``Statement.undo``)."""
        text = statement.text(schema)
        if statement.in_transaction:
            return truthtable.measure(self.superuser, text)
        found = truthtable.measure_behind_blocker(
            self.superuser, text, table=f"{schema}.t", timeout=STATEMENT_TIMEOUT
        )
        if statement.undo:
            with self.superuser() as conn:
                conn.execute(statement.undo.replace("{s}", schema))
                conn.commit()
        return found

    def apply(self, files: dict[str, str]) -> dict[str, tuple[MigrationInsight | None, str]]:
        """Apply the migration files (name -> SQL) as the Action does, traced: each file's
        insight, or why there is none."""
        for name, text in files.items():
            (self.work / "db" / name).write_text(text + ";\n")
        with self.observer() as observer:
            runs = migrations.apply_files(
                migrations.RunOptions(
                    target=self.engine.connection(self.name),
                    timeout=STATEMENT_TIMEOUT,
                    watcher=observer,
                ),
                self.work,
                [f"db/{name}" for name in files],
                psql=pgbin.for_major(self.base.pg_major or 15).tool("psql"),
                skip_recorded=True,
            )
        found: dict[str, tuple[MigrationInsight | None, str]] = {}
        for run in runs:
            problem = run.error if run.status != "applied" else observer.problem
            found[Path(run.name).name] = (run.insight, problem or "")
        return found

    def command(self, command: str, cwd: Path, *, traced: bool = True) -> MigrationRun:
        """Run a migration tool's command against the branch as the Action does, traced."""
        target = self.engine.connection(self.name)
        if not traced:
            return migrations.run_command(
                migrations.RunOptions(target=target, timeout=STATEMENT_TIMEOUT), command, cwd=cwd
            )
        with self.observer() as observer:
            run = migrations.run_command(
                migrations.RunOptions(target=target, timeout=STATEMENT_TIMEOUT, watcher=observer),
                command,
                cwd=cwd,
            )
        if observer.problem:
            return dataclasses.replace(run, error=run.error or observer.problem)
        return run


@pytest.fixture(scope="module")
def bench(
    pool: Pool, truth_base: BaseVersion, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bench]:
    engine = LocalEngine(pool)
    engine.create(CreateRequest(name="truth", base=truth_base.name))
    work = tmp_path_factory.mktemp("truth-repo")
    (work / "db").mkdir()
    try:
        with as_engine(pool, branch.get(pool, "truth"), truth_base) as conn:
            info = conn.info
            login = {"host": info.host, "port": info.port, "user": info.user, "dbname": info.dbname}
        yield Bench(pool, truth_base, engine, "truth", work, login)
    finally:
        engine.destroy("truth")


@pytest.fixture(scope="module")
def table(bench: Bench) -> dict[tuple[str, str], Row]:
    """Every statement at every size: (statement, size) -> its row."""
    rows: dict[tuple[str, str], Row] = {}
    for number, statement in enumerate(STATEMENTS, start=1):
        truths = {schema: bench.truth(statement, schema) for schema in SIZES}
        files = {
            f"{number:03d}_{statement.name}_{schema}.sql": statement.text(schema)
            for schema in SIZES
        }
        reported = bench.apply(files)
        for file, schema in zip(files, SIZES, strict=True):
            insight, problem = reported.get(file, (None, "not run"))
            rows[(statement.name, schema)] = Row(
                statement, schema, truths[schema], insight, problem
            )
    return rows


# -- comparing ---------------------------------------------------------------------------------


def compare(
    truth: Truth, *, locks: list[Any], rewrites: list[Any], scans: list[Any], kind: str
) -> list[str]:
    """Where the report differs from the truth, field by field, in the truth's terms
    (rewrites folded onto their tables by the truth's own catalog readings).

    Locks: every lock the statement held when it ended, and nothing it was not seen holding;
    one it let go before it ended (an INSERT's ROW EXCLUSIVE on the table's indexes), seen by
    sampling here as in the product, may be reported or not, and so may a mode taken in
    passing on a relation the statement held a lock on at its end that conflicts with all the
    weaker one does (an ALTER's ACCESS SHARE on the TOAST table it holds in ACCESS EXCLUSIVE:
    it blocks nothing more, and this sampler, on a loaded machine, may miss what the product's
    saw). A statement measured behind a blocker is compared by each table's strongest mode,
    all its truth can tell."""
    wrong = []
    pairs = frozenset((lock.relation, lock.mode) for lock in locks)
    if truth.exact:
        covered = frozenset(
            (relation, mode)
            for relation, mode in pairs
            if any(
                r == relation and locks_mod.CONFLICTS[mode] <= locks_mod.CONFLICTS[held]
                for r, held in truth.locks
            )
        )
        if not truth.locks <= pairs <= truth.locks | truth.passing | covered:
            extra = f" (and in passing {_show(truth.passing)})" if truth.passing else ""
            wrong.append(f"locks: measured {_show(truth.locks)}{extra}, reported {_show(pairs)}")
    else:
        live = {(relation, mode) for relation, mode in pairs if relation not in truth.dying}
        strongest = truthtable.strongest_per_table(live, truth.names)
        if strongest != truth.strongest():
            wrong.append(f"locks: measured {truth.strongest()}, reported {strongest}")
    measured: dict[str, object] = {
        "rewrites": truth.rewritten,
        "scans": truth.scanned,
        "kind": truth.kind,
    }
    reported: dict[str, object] = {
        "rewrites": frozenset(truth.names.get(r.relation, r.relation) for r in rewrites),
        "scans": frozenset(s.relation for s in scans),
        "kind": kind,
    }
    return wrong + [
        f"{key}: measured {_show(measured[key])}, reported {_show(reported[key])}"
        for key in measured
        if measured[key] != reported[key]
    ]


def _show(value: object) -> str:
    if isinstance(value, frozenset):
        return "{" + ", ".join(sorted(map(str, value))) + "}"
    return repr(value)


def verdict_kind(insight: MigrationInsight) -> str:
    return insight.verdict.kind


CASES = [(s.name, size) for s in STATEMENTS for size in SIZES]


def test_the_table_covers_forty_statements_and_every_verdict_kind(
    table: dict[tuple[str, str], Row],
) -> None:
    assert len(STATEMENTS) >= 40
    measured = {row.truth.kind for row in table.values()}
    assert measured == set(truthtable.KINDS), measured


def test_postgres_gives_each_statement_the_same_kind_at_both_sizes(
    table: dict[tuple[str, str], Row],
) -> None:
    """The rule's promise holds in Postgres itself: the kind never depends on the size."""
    differ = {
        s.name: {size: table[(s.name, size)].truth.kind for size in SIZES}
        for s in STATEMENTS
        if len({table[(s.name, size)].truth.kind for size in SIZES}) > 1
    }
    assert differ == {}


@pytest.mark.parametrize(("statement", "size"), CASES)
def test_the_report_matches_what_postgres_did(
    table: dict[tuple[str, str], Row], statement: str, size: str
) -> None:
    row = table[(statement, size)]
    assert row.insight is not None and not row.problem, row.problem or "not measured"
    insight = row.insight
    wrong = compare(
        row.truth, locks=insight.locks, rewrites=insight.rewrites, scans=insight.scans,
        kind=verdict_kind(insight),
    )  # fmt: skip
    assert wrong == [], f"{row.statement.text(row.schema)}:\n  " + "\n  ".join(wrong)


# -- the same through migration tools ------------------------------------------------------------

# Statements run through each tool, in the table's order (the later ones use what the earlier
# ones made): one migration per statement, one run of the tool's migrate command per migration.
THROUGH_TOOLS = (
    "add_column_no_default",
    "add_column_volatile_default",
    "set_default",
    "type_int_to_bigint",
    "varchar_widen",
    "check_not_valid",
    "validate_check",
    "foreign_key_not_valid",
    "create_index",
    "create_index_concurrently",
    "drop_index",
    "create_trigger",
    "update_few",
    "create_table",
)
Project = Callable[[Path, Sequence[Statement], str], list[str]]
TOOLS: dict[str, Project] = {
    "via_alembic": truthtools.alembic_project,
    "via_django": truthtools.django_project,
}


@dataclass(frozen=True)
class ToolRow:
    truth: Truth
    run: MigrationRun


@pytest.fixture(scope="module")
def tool_table(
    bench: Bench, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], ToolRow]:
    """Every statement of ``THROUGH_TOOLS`` through each tool: (statement, tool) -> its row."""
    statements = [s for s in STATEMENTS if s.name in THROUGH_TOOLS]
    projects = {}
    for tool, write in TOOLS.items():
        folder = tmp_path_factory.mktemp(tool)
        start, *commands = write(folder, statements, tool)
        first = bench.command(start, folder, traced=False)
        assert first.status == "applied", first.error
        projects[tool] = (folder, commands)
    rows: dict[tuple[str, str], ToolRow] = {}
    for number, statement in enumerate(statements):
        for tool, (folder, commands) in projects.items():
            truth = bench.truth(statement, tool)
            rows[(statement.name, tool)] = ToolRow(truth, bench.command(commands[number], folder))
    return rows


def _words(text: str) -> str:
    return " ".join(re.sub(r"\s+", " ", text).split()).rstrip(";").lower()


@pytest.mark.parametrize(
    ("statement", "tool"), [(name, tool) for name in THROUGH_TOOLS for tool in TOOLS]
)
def test_a_migration_tool_gets_the_same_report(
    tool_table: dict[tuple[str, str], ToolRow], statement: str, tool: str
) -> None:
    """The user's statement, found among those the tool sent, has the truth's locks, rewrites
    and scans; the migration's verdict has the truth's kind (the tool's own bookkeeping is no
    part of the statement's truth)."""
    row = tool_table[(statement, tool)]
    assert row.run.status == "applied" and not row.run.error, row.run.error
    insight = row.run.insight
    assert insight is not None, "not measured"
    (text,) = [s.text(tool) for s in STATEMENTS if s.name == statement]
    mine = [s for s in insight.statements if _words(text) in _words(s.text)]
    sent = "\n  ".join(s.text for s in insight.statements)
    assert len(mine) == 1, f"{text!r} is not once among the statements sent:\n  {sent}"
    wrong = compare(
        row.truth, locks=mine[0].locks, rewrites=mine[0].rewrites, scans=mine[0].scans,
        kind=verdict_kind(insight),
    )  # fmt: skip
    assert wrong == [], f"{text} ({tool}):\n  " + "\n  ".join(wrong)
