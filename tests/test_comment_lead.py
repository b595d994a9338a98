"""The comment's order and its short forms (pure): the verdict in words under the title, locks
one line per table, names cut to a cell's width, error lines folded to the comment's width."""

from __future__ import annotations

import dataclasses

from test_comment import MARK, failed_run, fences, report, table_rows
from test_insight_render import insight, traced

from pgoverlay.action import cells
from pgoverlay.action.comment import ERROR_COLUMNS, render_comment, render_summary
from pgoverlay.action.details import NAME, lock_cell, name_cell, per_table, verdict_cell
from pgoverlay.action.insight.model import Blocks, LockUse, Verdict
from pgoverlay.action.lead import lead
from pgoverlay.action.report import MigrationRun

OVER = "blocks writes to `public.orders` (412.0 MiB) for 2.3 s: consider CREATE INDEX CONCURRENTLY"


def safe(name: str) -> MigrationRun:
    quiet = dataclasses.replace(insight(), verdict=Verdict("safe", "safe online"))
    return MigrationRun(name, "applied", 0.1, insight=quiet)


def notice(name: str) -> MigrationRun:
    level = dataclasses.replace(insight(), verdict=Verdict("notice", "blocks writes for 4 ms"))
    return MigrationRun(name, "applied", 0.1, insight=level)


def aex(relation: str, kind: str, held: float, table: str = "") -> LockUse:
    return exact(relation, kind, "ACCESS EXCLUSIVE", "reads and writes", held, table=table)


def exact(relation: str, kind: str, mode: str, blocks: Blocks, held: float, table: str) -> LockUse:
    """A lock the trace read exactly, on ``table`` (its own table, an index's, a TOAST's)."""
    return LockUse(relation, kind, mode, blocks, held, table=table, source="exact")


def test_one_migration_over_a_threshold_is_named_with_its_verdict_right_under_the_title() -> None:
    body = render_comment(report(migrations=[safe("db/1.sql"), traced("db/2.sql")]))
    title, said = body.split("\n\n")[:2]
    assert title == MARK + "\n### pgoverlay: **Ready**"
    assert said == f"**1 migration over a threshold**: `db/2.sql` {OVER}"
    summary = render_summary(report(migrations=[safe("db/1.sql"), traced("db/2.sql")]))
    assert summary.split("\n\n")[1] == said  # the job summary leads the same way


def test_several_over_are_listed_three_at_most_and_the_rest_counted() -> None:
    said = lead([traced(f"db/{n}.sql") for n in range(5)])
    assert said.split("\n") == [
        "**5 migrations over a threshold**:",
        "",
        f"- `db/0.sql` {OVER}",
        f"- `db/1.sql` {OVER}",
        f"- `db/2.sql` {OVER}",
        "- and 2 more in the table below",
    ]


def test_a_failure_leads_with_where_and_the_errors_first_line_redacted() -> None:
    error = "\nERROR:  password=hunter2 rejected\nDETAIL: more"
    runs = [traced("db/1.sql"), failed_run(error, name="db/2.sql")]
    said = lead([*runs, MigrationRun("db/3.sql", "not run", 0.0)])
    assert said.split("\n\n") == [
        "**1 migration failed**: `db/2.sql` at line 3: ERROR: password=\\[redacted\\] rejected",
        f"**1 migration over a threshold**: `db/1.sql` {OVER}",
    ]
    body = render_comment(report(status="migration failed", migrations=runs))
    assert "hunter2" not in body
    assert body.index("**1 migration failed**") < body.index("#### Migrations")
    assert body.index("#### Error in") < body.index("| Connection | |")


def test_notices_without_an_over_say_none_is_over_and_name_them() -> None:
    said = lead([safe("db/1.sql"), notice("db/2.sql"), MigrationRun("db/0.sql", "skipped", 0)])
    assert said == (
        "2 migrations applied, 1 skipped, none over a threshold; 1 notice: `db/2.sql` blocks "
        "writes for 4 ms"
    )


def test_all_safe_says_so_and_without_insight_the_lead_counts() -> None:
    assert lead([safe("db/1.sql"), safe("db/2.sql"), safe("db/3.sql")]) == (
        "3 migrations applied, all safe online."
    )
    plain = [MigrationRun("db/1.sql", "applied", 0.1), MigrationRun("db/2.sql", "skipped", 0)]
    assert lead(plain) == "1 migration applied, 1 skipped."
    assert lead([]) == ""
    body = render_comment(report(migrations=[]))
    assert body.split("\n\n")[1].startswith("Branch `pr-12`")  # nothing to lead with


def test_each_migrations_details_come_before_the_connection_and_branch_tables() -> None:
    body = render_comment(report(migrations=[traced("db/1.sql")]))
    order = ["#### Migrations", "<details open>", "| Connection | |", "| Branch | |"]
    assert [body.index(x) for x in order] == sorted(body.index(x) for x in order)
    layer = ["Writable layer", "46.0 MiB logical, 3.1 MiB physical"]
    assert table_rows(body, ["Branch", ""])[0] == layer


def test_a_tables_indexes_and_toast_fold_onto_it_in_one_line() -> None:
    locks = [
        aex("pg_toast.pg_toast_16391", "TOAST table", 5.9, table="public.t"),
        aex("pg_toast.pg_toast_16391_index", "index", 5.9, table="public.t"),
        aex("public.t_pkey", "index", 5.9, table="public.t"),
        aex("public.t", "table", 5.9, table="public.t"),
        exact("public.u", "table", "SHARE", "writes", 9.0, table="public.u"),
    ]
    folded = per_table(locks)
    assert [(t.table, t.mode, t.indexes, t.toast) for t in folded] == [
        ("public.t", "ACCESS EXCLUSIVE", 2, True),
        ("public.u", "SHARE", 0, False),
    ]
    assert cells.markdown(lock_cell(locks)) == (
        "ACCESS EXCLUSIVE on `public.t`, its 2 indexes and TOAST: 5.9 s<br>"
        "SHARE on `public.u`: 9.0 s"
    )


def test_without_an_owner_a_table_comes_before_a_toast_table_held_as_long() -> None:
    locks = [aex("pg_toast.pg_toast_16391", "TOAST table", 5.9), aex("public.t", "table", 5.9)]
    assert [t.table for t in per_table(locks)] == ["public.t", "pg_toast.pg_toast_16391"]


def test_a_lock_cell_lists_three_tables_and_counts_the_rest() -> None:
    locks = [aex(f"public.t{n}", "table", 1.0 + n) for n in range(5)]
    assert cells.markdown(lock_cell(locks)).split("<br>") == [
        "ACCESS EXCLUSIVE on `public.t4`: 5.0 s",
        "ACCESS EXCLUSIVE on `public.t3`: 4.0 s",
        "ACCESS EXCLUSIVE on `public.t2`: 3.0 s",
        "and 2 more tables",
    ]
    assert cells.markdown(lock_cell([])) == "none"


def test_a_long_name_keeps_its_file_name_in_a_cell_and_whole_in_its_block() -> None:
    path = "services/billing/db/migrations/versions/2024_06_01_add_lifetime_value.sql"
    assert cells.markdown(name_cell(path)) == "`…/2024_06_01_add_lifetime_value.sql`"
    longer = "db/" + "x" * 100 + ".sql"
    cell = cells.markdown(name_cell(longer))
    assert cell.startswith("`…/xxx") and cell.endswith("x.sql`") and cell.count("…") == 2
    assert len(cell) == NAME + 2  # and its backticks
    assert cells.markdown(name_cell("alembic upgrade head")) == "`alembic upgrade head`"
    body = render_comment(report(migrations=[traced(path)]))
    assert f"<summary><code>{path}</code>" in body


def test_long_error_lines_are_folded_to_the_comments_width_losing_nothing() -> None:
    error = "ERROR: " + "y" * 250 + "\nLINE 3: short"
    body = render_comment(report(status="migration failed", migrations=[failed_run(error)]))
    (shown,) = fences(body)
    lines = shown.rstrip("\n").split("\n")
    assert max(len(x) for x in lines) == ERROR_COLUMNS
    assert "".join(lines[:-1]) == error.split("\n")[0] and lines[-1] == "LINE 3: short"


def test_the_verdict_cell_is_its_level_and_kind_in_a_few_words() -> None:
    assert cells.markdown(
        verdict_cell(Verdict("over", "rewrites `public.t` …", kind="rewrite"))
    ) == ("**over**: rewrite")
    assert (
        cells.markdown(verdict_cell(Verdict("notice", "…", kind="blocks writes")))
        == "notice: blocks writes"
    )
    assert cells.markdown(verdict_cell(Verdict("safe", "safe online"))) == "safe\u00a0online"
