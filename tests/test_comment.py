"""Tests for pgoverlay.action.comment: the sticky PR comment and the job summary (pure)."""

from __future__ import annotations

import dataclasses
import importlib.util
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from pgoverlay.action import comment
from pgoverlay.action import markdown as md
from pgoverlay.action.comment import (
    MAX_COMMENT,
    MAX_SUMMARY,
    has_marker,
    marker,
    render_comment,
    render_summary,
)
from pgoverlay.action.details import NAME
from pgoverlay.action.report import BranchInfo, MigrationRun, Report
from pgoverlay.action.wayin import WayIn
from pgoverlay.runner import units

MARK = "<!-- pgoverlay:branch acme/shop#12 pr-12 -->"
S = "\u00a0s"  # a migration's time in the table is "0.41 s" with a no-break space
WAY_IN = WayIn(
    page="https://db.acme.dev/b/pr-12",
    host="db.acme.dev",
    port=6543,
    database="pr-12",
    sslmode="verify-full",
)
ERROR = 'ERROR:  column "email" of relation "users" already exists'


def branch(**changes: object) -> BranchInfo:
    info = BranchInfo(
        name="pr-12",
        host="runner-3.internal",
        port=54012,
        database="app",
        user="pr_12",
        base_name="prod-nightly",
        base_version=3,
        base_seeded_at=1717243200.0,  # 2024-06-01 12:00 UTC
        layer_logical_bytes=48_234_496,
        layer_physical_bytes=3_221_504,
        create_seconds=1.8372,
    )
    return dataclasses.replace(info, **changes)  # type: ignore[arg-type]


def report(**changes: object) -> Report:
    base = Report(
        repository="acme/shop",
        pr=12,
        branch_name="pr-12",
        head_sha="9f1c2e7d4b0a8c3f",
        status="ready",
        branch=branch(),
        migrations=[
            MigrationRun("db/0041_orders_index.sql", "applied", 0.4123),
            MigrationRun("db/0042_add_email.sql", "applied", 0.031),
        ],
        way_in=WAY_IN,
        run_url="https://github.com/acme/shop/actions/runs/987",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def failed_run(error: str = ERROR, name: str = "db/0042_add_email.sql") -> MigrationRun:
    return MigrationRun(name, "failed", 0.03, error=error, file=name, line=3)


def tokens(body: str) -> list[Token]:
    return MarkdownIt("commonmark").enable("table").parse(body)


def table_rows(body: str, header: list[str], *, prefix: bool = False) -> list[list[str]]:
    """The body rows (inline source of each cell, as a GFM renderer sees them) of the first
    table whose header is ``header`` (with ``prefix``: starts with it)."""
    tables: list[list[list[str]]] = []
    inside = False
    for tok in tokens(body):
        if tok.type in ("table_open", "table_close"):
            inside = tok.type == "table_open"
            tables += [[]] if inside else []
        elif inside and tok.type == "tr_open":
            tables[-1].append([])
        elif inside and tok.type == "inline":
            tables[-1][-1].append(tok.content)
    return next(t for t in tables if (t[0][: len(header)] if prefix else t[0]) == header)[1:]


def migration_rows(body: str) -> list[list[str]]:
    """The cells of the migrations table (the one without insight)."""
    return table_rows(body, ["File", "Duration", "Result"])


def fences(body: str) -> list[str]:
    return [tok.content for tok in tokens(body) if tok.type == "fence"]


def test_ready_comment_shows_connection_sizes_base_and_migrations() -> None:
    body = render_comment(report())
    assert body.startswith(MARK + "\n### pgoverlay: **Ready**\n")
    assert "Branch `pr-12`, head `9f1c2e7`, created in 1.84 s." in body
    assert "9f1c2e7d" not in body
    for row in (
        "| Page | [Open the branch page](https://db.acme.dev/b/pr-12): sign in with GitHub |",
        "| URL | `postgresql://<your GitHub login>@db.acme.dev:6543/pr-12?sslmode=verify-full` |",
        "| Host | `db.acme.dev` |",
        "| Port | `6543` |",
        "| Database | `pr-12` |",
        "| User | your GitHub login |",
        "| Password | get your password on the branch page |",
        "| Writable layer | 46.0 MiB logical, 3.1 MiB physical |",
        "| Base | `prod-nightly` version 3, seeded 2024-06-01 12:00 UTC |",
    ):
        assert row in body
    assert "[Workflow run](https://github.com/acme/shop/actions/runs/987)" in body
    assert migration_rows(body) == [
        ["`db/0041_orders_index.sql`", "0.41" + S, "applied"],
        ["`db/0042_add_email.sql`", "0.03" + S, "applied"],
    ]
    assert "Error" not in body and "```" not in body


def test_comment_says_which_rules_masked_the_base_or_plainly_that_it_is_not_masked() -> None:
    sha = "1e4501a1d0574c22d47611478e0ac3d62d74acce56154f43151353c392d87450"
    masked = branch(base_masked=True, base_mask_rules="prod-rules.yml", base_mask_sha256=sha)
    body = render_comment(report(branch=masked))
    assert "| Data | masked by `prod-rules.yml` (sha256 `1e4501a1d057`) |" in body
    plain = render_comment(report(branch=branch(base_masked=False)))
    assert "| Data | **not masked**: a copy of the source's data as it is |" in plain
    unknown = render_comment(report(branch=branch(base_masked=None)))
    assert "| Data |" not in unknown


def test_ready_without_migrations_says_so() -> None:
    body = render_comment(report(migrations=[]))
    assert "No migrations in this pull request." in body
    assert "| File |" not in body


def test_migration_failed_shows_the_failed_row_and_an_error_excerpt_at_file_and_line() -> None:
    ok = MigrationRun("db/0041_orders_index.sql", "applied", 0.41)
    body = render_comment(
        report(
            status="migration failed",
            migrations=[ok, failed_run()],
            message="Migration db/0042_add_email.sql failed",
        )
    )
    assert "### pgoverlay: **Migration failed**" in body
    assert "Migration db/0042\\_add\\_email.sql failed" in body
    assert migration_rows(body)[1] == ["`db/0042_add_email.sql`", "0.03" + S, "**failed**"]
    assert "#### Error in `db/0042_add_email.sql:3`" in body
    assert fences(body) == [ERROR + "\n"]


def test_failed_before_the_branch_existed_keeps_marker_and_reason_but_claims_no_migrations() -> (
    None
):
    body = render_comment(
        report(status="failed", branch=None, migrations=[], message="pool full: 20 of 20 in use")
    )
    assert has_marker(body, MARK)  # same sticky comment as the runs that had a branch
    assert "### pgoverlay: **Failed**" in body
    assert "pool full: 20 of 20 in use" in body
    assert "No migrations" not in body and "| Host |" not in body


@pytest.mark.parametrize(
    ("merged", "says"),
    [
        (True, "the pull request was merged."),
        (False, "the pull request was closed without merging."),
        (None, "whether the pull request was merged is unknown."),
    ],
)
def test_destroyed_says_so_with_merge_state_and_final_layer(merged: bool | None, says: str) -> None:
    body = render_comment(report(status="destroyed", merged=merged))
    assert body.startswith(MARK + "\n### pgoverlay: **Destroyed**\n")
    assert f"Branch `pr-12` was destroyed: {says}" in body
    assert "Final writable layer: 46.0 MiB logical, 3.1 MiB physical." in body
    assert "| Host |" not in body and "created in" not in body  # the branch is gone


def test_marker_round_trips_and_tells_pull_requests_apart() -> None:
    assert marker("acme/shop", 12, "pr-12") == MARK
    assert has_marker(render_comment(report()), MARK)
    assert not has_marker(render_comment(report()), marker("acme/shop", 1, "pr-1"))
    assert not has_marker(MARK.replace("#12", "#123"), MARK)
    assert marker("acme/shop", None, "nightly") == "<!-- pgoverlay:branch acme/shop nightly -->"


def test_has_marker_is_false_for_a_missing_or_empty_body() -> None:
    assert not has_marker(None, MARK)
    assert not has_marker("", MARK)


def test_a_marker_quoted_in_a_human_reply_does_not_count() -> None:
    assert not has_marker(f"> {MARK}\n> ### pgoverlay: **Ready**\n\nwhy is it slow?", MARK)
    assert not has_marker(f"thanks!\n{MARK}", MARK)


def test_marker_cannot_be_closed_early_by_an_odd_name() -> None:
    mark = marker("acme/shop --> x", 3, "a-->b <!-- c")
    assert mark.count("-->") == 1 and mark.endswith(" -->") and mark.count("<!--") == 1


def test_table_cells_escape_pipes_backticks_and_newlines() -> None:
    nasty = "a|b`c``d\ne\\|f<!-- g"
    body = render_comment(report(migrations=[MigrationRun(nasty, "applied", 1.0)]))
    rows = migration_rows(body)
    assert len(rows) == 1 and rows[0][1:] == ["1.00" + S, "applied"]  # still three cells
    code = [t for t in tokens(body) if t.type == "inline" and "a|b" in t.content][0]
    spans = [c.content for c in code.children or [] if c.type == "code_inline"]
    assert spans == ["a|b`c``d e\\|f<!-- g"]  # the text, on one line, as written
    assert "Error" not in body and "| Base |" in body  # nothing swallowed after the cell


def test_error_excerpt_with_backtick_fences_cannot_close_its_block() -> None:
    error = "before\n```\n````\nafter <!-- not a comment -->"
    body = render_comment(report(status="migration failed", migrations=[failed_run(error)]))
    assert fences(body) == [error + "\n"]
    assert "`````text\n" in body


def test_thousands_of_migrations_are_cut_below_the_limit_with_marker_status_and_failure() -> None:
    runs = [MigrationRun(f"db/{i:05d}_{'x' * 60}.sql", "applied", 0.01) for i in range(5000)]
    runs[4321] = failed_run("ERROR: boom", name="db/04321_broken.sql")
    body = render_comment(report(status="migration failed", migrations=runs))
    assert len(body) < MAX_COMMENT
    assert has_marker(body, MARK) and "**Migration failed**" in body
    rows = migration_rows(body)
    shown = len(rows)
    assert 100 < shown < 5000
    assert f"… {5000 - shown:,} more migrations not shown (see the job summary)" in body
    assert ["`db/04321_broken.sql`", "0.03" + S, "**failed**"] in rows
    assert fences(body) == ["ERROR: boom\n"]
    summary = render_summary(report(status="migration failed", migrations=runs))
    assert len(migration_rows(summary)) == 5000 and "not shown" not in summary


def test_a_huge_error_is_cut_keeping_its_start_and_end() -> None:
    error = "ERROR: first line\n" + "x" * 200_000 + "\nHINT: last line"
    ok = MigrationRun("db/0041_orders_index.sql", "applied", 0.41)
    body = render_comment(report(status="migration failed", migrations=[ok, failed_run(error)]))
    assert len(body) < MAX_COMMENT and has_marker(body, MARK)
    (excerpt,) = fences(body)
    assert excerpt.startswith("ERROR: first line") and excerpt.endswith("HINT: last line\n")
    assert re.search(r"… [\d,]+ characters not shown \(see the job summary\) …", excerpt)
    assert len(migration_rows(body)) == 2  # the table is kept whole


def test_everything_huge_still_fits_in_the_comment_and_the_summary() -> None:
    big = "ü|`\n" * 50_000
    runs = [failed_run(big * 2, name=big) for _ in range(20)]
    runs += [MigrationRun(big, "not run", 0.0) for _ in range(3000)]
    huge = report(
        status="migration failed",
        branch_name=big,
        branch=branch(name=big, host=big, database=big, user=big, base_name=big, runtime=big),
        migrations=runs,
        message=big,
        way_in=WayIn(page="https://x/" + big, host=big, port=1, database=big, sslmode=big),
        run_url="https://x/" + big,
    )
    body = render_comment(huge)
    assert len(body) < MAX_COMMENT
    assert body.startswith(marker("acme/shop", 12, big) + "\n### pgoverlay: **Migration failed**")
    assert "more error" in body and "more migrations not shown" in body
    summary = render_summary(huge)
    assert len(summary.encode()) < MAX_SUMMARY < len(summary) * 4  # cut by bytes, not characters
    # names cut to a table cell's width: every row fits in the summary
    assert len(migration_rows(summary)) == len(runs)


def test_random_nasty_text_never_breaks_the_table_or_the_limit() -> None:
    rng = random.Random(20240601)
    alphabet = "|`\\\n\r<>!-*_[]()&#@ aé😀~"

    def text(n: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(n)))

    for _ in range(15):
        runs = [
            MigrationRun(
                "x" + text(80), rng.choice(["applied", "failed", "not run"]), 0.5, error=text(3000)
            )
            for _ in range(rng.randrange(1, 400))
        ]
        r = report(
            status="migration failed",
            migrations=runs,
            message=text(300),
            way_in=WayIn(
                page=text(100), host=text(50), port=5, database=text(50), sslmode=text(10)
            ),
            branch=branch(host=text(50), user=text(50)),
        )
        body = render_comment(r)
        assert len(body) < MAX_COMMENT and has_marker(body, MARK)
        assert "**Migration failed**" in body
        cut = re.search(r"… ([\d,]+) more migrations? not shown", body)
        rows = migration_rows(body)
        assert len(rows) + (int(cut.group(1).replace(",", "")) if cut else 0) == len(runs)
        names = sorted(md.middle(m.name, NAME) for m in runs)
        spans = sorted(
            child.content
            for tok in tokens(body)
            if tok.type == "inline" and tok.content in {row[0] for row in rows}
            for child in tok.children or []
            if child.type == "code_inline"
        )
        assert len(spans) == len(rows) and set(spans) <= set(names)  # each cell: the name
        assert all(row[1] == "0.50" + S for row in rows)
        assert any(t.content == "Runtime" for t in tokens(body) if t.type == "inline")


def test_summary_is_the_comment_without_the_marker() -> None:
    r = report(status="migration failed", migrations=[failed_run()])
    assert render_summary(r) == render_comment(r).removeprefix(MARK + "\n")
    assert "pgoverlay:branch" not in render_summary(r)


def test_rendering_is_deterministic_and_dates_are_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    r = report(status="migration failed", migrations=[failed_run()])
    first = render_comment(r)
    monkeypatch.setenv("TZ", "Pacific/Auckland")
    time.tzset()
    try:
        assert render_comment(r) == first
        assert render_summary(r) == render_summary(r)
        assert "seeded 2024-06-01 12:00 UTC" in first
    finally:
        monkeypatch.undo()
        time.tzset()


def test_report_has_no_password_field_and_the_comment_shows_the_way_in_not_a_secret() -> None:
    kinds = (Report, BranchInfo, WayIn)
    names = {f.name for kind in kinds for f in dataclasses.fields(kind)}
    assert not {n for n in names if "pass" in n or "secret" in n or "token" in n}
    body = render_comment(report())
    link = [
        child.attrs["href"]
        for tok in tokens(body)
        if tok.type == "inline"
        for child in tok.children or []
        if child.type == "link_open"
    ]
    assert "https://db.acme.dev/b/pr-12" in link  # the page is a link
    assert "| Password | get your password on the branch page |" in body
    assert re.search(r"postgresql://[^@`]*:[^@`]*@", body) is None  # no user:password@
    # an older record's report has no way in: no connection table, the branch table still
    older = render_comment(report(way_in=None))
    assert "| Connection |" not in older and "| Password |" not in older
    assert "| Writable layer |" in older


def test_secret_looking_values_in_error_text_are_not_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGPASSWORD", "env-s3cret")
    error = (
        "connection to 'host=h password=hunter2 user=u' failed\n"
        "DATABASE_URL=postgresql://app:Tr0ub4dor@db:5432/app\n"
        "PASSWORD: 'with spaces'"
    )
    r = report(
        status="migration failed",
        migrations=[failed_run(error, name="migrate --url postgres://u:pw9@h/db")],
        message="psql password=hunter2 failed",
    )
    for body in (render_comment(r), render_summary(r)):
        for secret in ("hunter2", "Tr0ub4dor", "with spaces", "pw9", "env-s3cret"):
            assert secret not in body
        assert "password=[redacted]" in body and "postgresql://app:[redacted]@db" in body


def test_format_bytes_is_the_runners_own() -> None:
    assert comment.format_bytes is units.format_bytes


def _comment_examples() -> Any:
    """scripts/comment_examples.py, which renders docs/action.md's comment examples."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "comment_examples.py"
    spec = importlib.util.spec_from_file_location("comment_examples", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_comment_examples_in_the_docs_are_what_the_code_renders() -> None:
    examples = _comment_examples()
    text = examples.DOC.read_text()
    assert examples.stale(text) == [], (
        "docs/action.md's comment examples differ from what render_comment makes of them: "
        "run `python scripts/comment_examples.py --update`"
    )
    # every example is in the doc, and the ready branch shows the insight table
    shown = re.findall(r"<!-- comment example: ([a-z-]+) -->", text)
    assert sorted(shown) == sorted(examples.EXAMPLES)
    assert "| Verdict | Migration | Locks | Time |" in text
    assert "-408.0 KiB layer" in examples.quoted("ready")


def test_the_comment_examples_update_rewrites_a_stale_block() -> None:
    examples = _comment_examples()
    text = examples.DOC.read_text()
    broken = text.replace("> ### pgoverlay: **Destroyed**", "> ### pgoverlay: **Gone**", 1)
    assert examples.stale(broken) == ["destroyed"]
    assert examples.update(broken) == text
