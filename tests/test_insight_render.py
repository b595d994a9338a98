"""Migration insight shown and wired: the comment's compact table and <details> blocks, the job
summary, the JSON report, the inputs, fail-on-threshold, the record's size bound and the
listener's stored report (pure, except the listener's HTTP route on a real server)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import requests
from pydantic import TypeAdapter
from test_comment import MARK, failed_run, fences, report, table_rows, tokens
from test_webhook_intake import REPO, SECRET, TOKEN, Intake

from pgoverlay.action import cells, details, event, main, record
from pgoverlay.action.comment import MAX_COMMENT, MAX_SUMMARY, render_comment, render_summary
from pgoverlay.action.insight import jsonreport
from pgoverlay.action.insight.model import (
    Finding,
    LockUse,
    MigrationInsight,
    Rewrite,
    RowWrites,
    Scan,
    StatementInsight,
    Thresholds,
    Verdict,
    Volume,
)
from pgoverlay.action.report import MigrationRun, Report
from pgoverlay.action.request import PrRequest, read_inputs
from pgoverlay.action.workflow import Outcome
from pgoverlay.errors import ConfigError, JobFileError, QueueError
from pgoverlay.runner.service.models import MAX_RECORD_BYTES, RecordRequest
from pgoverlay.runner.settings import Settings
from pgoverlay.webhook.queue import MAX_REPORT_BYTES, NewJob, Queue
from pgoverlay.webhook.settings import RepoSettings, WebhookSettings
from pgoverlay.webhook.worker import Done

HOSTILE = "x `` ``` | y </details> --> <!-- z <b>bold</b> \n\n| a | b |\n</summary>"
SHARE = LockUse(
    "public.orders", "table", "SHARE", "writes", 2.3, 0.0, 0, 412 * 1024**2,
    "public.orders", 413 * 1024**2, source="exact",
)  # fmt: skip


def statement(i: int, text: str = "CREATE INDEX orders_created ON orders (created_at)") -> Any:
    scan = Scan("public.orders", 1, 3_000_000, "SHARE", i)
    return StatementInsight(i, i * 2 + 1, text, 2.3, [SHARE], [], [scan])


def insight(
    statements: int = 2,
    findings: int = 1,
    level: str = "over",
    text: str = "CREATE INDEX orders_created ON orders (created_at)",
    notes: int = 1,
) -> MigrationInsight:
    rewrite = Rewrite("public.users", "table", ["column type change"], 1024**2, 2 * 1024**2, 1)
    return MigrationInsight(
        seconds=2.4,
        locks=[
            SHARE,
            LockUse(
                "public.orders_pkey", "index", "ACCESS SHARE", "ddl", 9.0, table="public.orders"
            ),
        ],  # fmt: skip
        rewrites=[rewrite],
        scans=[Scan("public.orders", 1, 3_000_000, "SHARE", 0)],
        volume=Volume(rows_updated=10, wal_bytes=40 * 1024**2, layer_bytes=12 * 1024**2),
        statements=[statement(i, text) for i in range(statements)],
        findings=[
            Finding(
                "require-concurrent-index-creation",
                "use CONCURRENTLY",
                1 + i,
                "confirmed",
                "held SHARE on `public.orders` 2.3 s",
                0,
            )
            for i in range(findings)
        ],
        verdict=Verdict(
            level,  # type: ignore[arg-type]
            "blocks writes to `public.orders` (412.0 MiB) for 2.3 s: consider CREATE INDEX "
            "CONCURRENTLY",
            "blocks writes",
        ),
        interval=0.05,
        notes=[f"note {i}" for i in range(notes)],
        row_writes=[RowWrites("public.orders", 10, 0, 412 * 1024**2)],
    )


def traced(name: str = "db/0041_orders_index.sql", **changes: Any) -> MigrationRun:
    return MigrationRun(name, "applied", 2.41, insight=insight(**changes))


def rich(*runs: MigrationRun, **changes: Any) -> Report:
    return report(migrations=list(runs), **changes)


def table(body: str, first: str) -> list[list[str]]:
    """The rows of the first table whose header starts ``first``."""
    return table_rows(body, [first], prefix=True)


def html_blocks(body: str) -> list[str]:
    """The HTML blocks a GFM renderer sees, but the comment's own marker line."""
    found = [tok.content.strip() for tok in tokens(body) if tok.type == "html_block"]
    return [b for b in found if not b.startswith("<!-- pgoverlay:branch ")]


def statement_items(body: str) -> list[str]:
    """The first line of each statement item (the list under "Statements:") of every block."""
    found: list[str] = []
    toks = tokens(body)
    for n, tok in enumerate(toks):
        if tok.type == "inline" and tok.content == "Statements:":
            depth = 0
            for t in toks[n + 1 :]:
                if t.type == "bullet_list_open":
                    depth += 1
                elif t.type == "bullet_list_close":
                    depth -= 1
                    if depth == 0:
                        break
                elif t.type == "inline" and depth == 1:
                    found.append(t.content)
    return found


def code_spans(body: str) -> list[str]:
    return [
        child.content
        for tok in tokens(body)
        if tok.type == "inline"
        for child in tok.children or []
        if child.type == "code_inline"
    ]


# -- the comment ----------------------------------------------------------------------------


def test_a_traced_migration_gets_a_compact_row_with_its_worst_lock_rewrites_bytes_verdict() -> None:
    body = render_comment(rich(traced(), MigrationRun("db/0042.sql", "applied", 0.01)))
    assert table(body, "Verdict") == [
        [
            "**over**: blocks writes",
            "`db/0041_orders_index.sql`",
            # one line per table, its index folded in: the mode that blocks writes, though the
            # index's ACCESS SHARE was held longer
            "SHARE on `public.orders`, its index: 2.3 s",
            "not probed",
            "2.41\u00a0s",
        ],
        ["applied", "`db/0042.sql`", "", "", "0.01\u00a0s"],
    ]
    # the verdict in words leads, and what the table leaves out is in the block
    assert body.split("\n\n")[1] == (
        "**1 migration over a threshold**: `db/0041_orders_index.sql` blocks writes to "
        "`public.orders` (412.0 MiB) for 2.3 s: consider CREATE INDEX CONCURRENTLY"
    )
    assert "- Applied in 2.41 s; rewrites: 1 (2.0 MiB); wrote 12.0 MiB layer; 40.0 MiB WAL" in body


def test_each_traced_migration_has_a_details_block_with_statements_and_findings() -> None:
    body = render_comment(rich(traced(), traced("db/0043.sql", level="safe")))
    assert html_blocks(body) == [
        "<details open><summary><code>db/0041_orders_index.sql</code>: over: blocks writes to "
        "<code>public.orders</code> (412.0 MiB) for 2.3 s: consider CREATE INDEX "
        "CONCURRENTLY</summary>",
        "</details>",
        "<details><summary><code>db/0043.sql</code>: blocks writes to <code>public.orders</code> "
        "(412.0 MiB) for 2.3 s: consider CREATE INDEX CONCURRENTLY</summary>",
        "</details>",
    ]
    assert (
        "- `CREATE INDEX orders_created ON orders (created_at)` (line 1, 2.3 s)\n"
        "  - SHARE on `public.orders`: 2.3 s\n"
        "  - scanned `public.orders`: 1 scan, 3,000,000 rows under `SHARE`\n"
    ) in body
    assert table(body, "Rule")[0] == [
        "`require-concurrent-index-creation`",
        "1",
        "**confirmed**",
        "held SHARE on `public.orders` 2.3 s",
    ]
    assert "- note 0" in body


def test_a_report_without_insight_renders_as_before() -> None:
    plain = report()
    body = render_comment(plain)
    assert "| File | Duration | Result |" in body and "<details" not in body
    assert render_summary(plain) == body.removeprefix(MARK + "\n")


@pytest.mark.parametrize(
    "text",
    [
        HOSTILE,
        "</details>",
        "-->",
        "<!--",
        "````",
        "`",
        "|||",
        "\\|",
        "a\\",
        "<details><summary>",
    ],
)
def test_hostile_statement_text_stays_inside_its_code_span(text: str) -> None:
    hostile = insight(text=text)
    hostile = dataclasses.replace(
        hostile,
        findings=[dataclasses.replace(hostile.findings[0], evidence=text, rule=text)],
        notes=[text],
        verdict=Verdict("over", text),
    )
    runs = [MigrationRun(text, "applied", 1.0, insight=hostile), failed_run("ERROR: after")]
    for body in (render_comment(rich(*runs)), render_summary(rich(*runs))):
        blocks = html_blocks(body)
        # Exactly one opening and one closing block per migration: nothing opened or closed
        # early, nothing hidden in an HTML comment (the error after it is still a fence).
        assert len(blocks) == 2 and blocks[1] == "</details>"
        assert blocks[0].startswith("<details open><summary><code>")
        tags = re.findall(r"<[^>]*>", blocks[0])
        assert tags == ["<details open>", "<summary>", "<code>", "</code>", "</summary>"]
        assert fences(body) == ["ERROR: after\n"]
        one_line = " ".join(text.split())
        statements = statement_items(body)
        assert len(statements) == 2 and all(item.startswith("`") for item in statements)
        assert one_line.strip("`") in " ".join(code_spans(body)) or not one_line.strip("`")
        inline_html = [
            child
            for tok in tokens(body)
            if tok.type == "inline"
            for child in tok.children or []
            if child.type == "html_inline"
        ]
        assert {child.content for child in inline_html} <= {"<br>"}  # the lock cell's own


def test_statements_that_look_like_passwords_are_redacted() -> None:
    secret = insight(text="ALTER ROLE app PASSWORD 'hunter2-very-secret'")
    body = render_comment(rich(MigrationRun("db/1.sql", "applied", 1.0, insight=secret)))
    assert "hunter2" not in body and "PASSWORD '[redacted]'" not in body
    assert "PASSWORD [redacted]" in body


def test_details_go_before_rows_when_the_comment_would_not_fit() -> None:
    runs = [traced(f"db/{i:03d}.sql", statements=40, findings=40) for i in range(30)]
    runs[17] = traced("db/017.sql", statements=40, findings=40, level="over")
    for i, m in enumerate(runs):
        if i != 17:
            assert m.insight is not None
            runs[i] = dataclasses.replace(
                m, insight=dataclasses.replace(m.insight, verdict=Verdict("safe", "safe online"))
            )
    body = render_comment(rich(*runs))
    assert len(body) < MAX_COMMENT and body.startswith(MARK)
    assert len(table(body, "Verdict")) == 30, "every row stays while details go"
    shown = [b for b in html_blocks(body) if b.startswith("<details")]
    assert 0 < len(shown) < 30
    assert any("db/017.sql" in b for b in shown), "the over verdict keeps its details first"
    assert f"… details of {30 - len(shown)} migrations not shown (see the job summary)" in body
    summary = render_summary(rich(*runs))
    assert len([b for b in html_blocks(summary) if b.startswith("<details")]) == 30
    assert "not shown" not in summary


def test_the_comment_caps_a_blocks_tables_and_the_summary_shows_every_statement() -> None:
    big = rich(traced(statements=300, findings=120, notes=30))
    body = render_comment(big)
    assert len(statement_items(body)) == 50 and len(table(body, "Rule")) == 50
    assert "… 250 more statements not shown (see the job summary)" in body
    assert "… 70 more findings not shown (see the job summary)" in body
    assert "… 20 more notes (see the job summary)" in body
    summary = render_summary(big)
    assert len(statement_items(summary)) == 300 and len(table(summary, "Rule")) == 120
    assert "- note 29" in summary
    assert "Locks were sampled every 50 ms" in summary
    assert "Rows: 0 inserted, 10 updated, 0 deleted; WAL 40.0 MiB" in summary
    assert table(summary, "Rule")[0][-1] == "use CONCURRENTLY"


def test_enormous_insights_stay_under_both_limits() -> None:
    long = "ü|`<!--" * 200
    runs = [traced(f"db/{i}.sql", statements=3000, findings=2000, text=long) for i in range(20)]
    runs += [failed_run("ERROR: " + long * 20, name=f"db/f{i}.sql") for i in range(3)]
    huge = rich(*runs, status="migration failed")
    body = render_comment(huge)
    assert len(body) < MAX_COMMENT and body.startswith(MARK)
    assert "**Migration failed**" in body and len(fences(body)) == 3
    summary = render_summary(huge)
    assert len(summary.encode()) < MAX_SUMMARY
    assert "see the JSON report, output `report-path`" in summary
    # thousands of migrations, each traced: rows are cut too, failures kept
    many = [traced(f"db/{i:05d}_{'x' * 60}.sql") for i in range(3000)]
    many[2500] = failed_run("ERROR: boom", name="db/02500_broken.sql")
    body = render_comment(rich(*many, status="migration failed"))
    assert len(body) < MAX_COMMENT
    assert any(row[1] == "`db/02500_broken.sql`" for row in table(body, "Verdict"))
    assert "<details" not in body and "more migrations not shown" in body


# -- inputs -----------------------------------------------------------------------------------


def test_threshold_inputs_have_defaults_and_accept_durations_and_sizes() -> None:
    assert PrRequest().thresholds() == Thresholds(5.0, 1024**3, False)
    inputs = read_inputs(
        {
            "INPUT_INSIGHT": "false",
            "INPUT_MAX_BLOCKING_LOCK": "1.5s",
            "INPUT_MAX_REWRITE": "512MiB",
            "INPUT_FAIL_ON_THRESHOLD": "true",
        }
    )
    assert inputs.insight is False
    assert inputs.thresholds() == Thresholds(1.5, 512 * 1024**2, True)
    for text, seconds in (("500ms", 0.5), ("5s", 5.0), ("2m", 120.0), ("1.5s", 1.5)):
        assert PrRequest(max_blocking_lock=text).thresholds().max_blocking_lock == seconds
    for text, size in (("1GiB", 1024**3), ("10GB", 10 * 1000**3), ("4096", 4096)):
        assert PrRequest(max_rewrite=text).thresholds().max_rewrite == size
    # the listener's repositories set them too
    repo = RepoSettings.model_validate({"max_rewrite": "10GB", "fail_on_threshold": True})
    assert repo.request().thresholds() == Thresholds(5.0, 10 * 1000**3, True)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("MAX_BLOCKING_LOCK", "5", "`max-blocking-lock`: cannot read duration '5': use a positive"),
        ("MAX_BLOCKING_LOCK", "0s", "unit ms, s, m or h (e.g. 500ms, 5s, 1.5s, 2m)"),
        ("MAX_BLOCKING_LOCK", "five seconds", "cannot read duration 'five seconds'"),
        ("MAX_REWRITE", "lots", "`max-rewrite`: cannot read size 'lots'"),
        ("MAX_REWRITE", "-1GiB", "KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB"),
        ("FAIL_ON_THRESHOLD", "maybe", "`fail-on-threshold`"),
    ],
)
def test_bad_threshold_inputs_say_what_is_accepted(name: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read_inputs({f"INPUT_{name}": value})
    assert says in str(caught.value)


# -- the JSON report and the Action's outputs --------------------------------------------------


def test_a_sampled_lock_is_marked_as_sampled_in_the_lock_cell() -> None:
    sampled = dataclasses.replace(SHARE, source="sampled")
    inferred = dataclasses.replace(SHARE, source="inferred")
    assert cells.markdown(details.lock_cell([sampled])) == (
        "SHARE on `public.orders`: 2.3 s (sampled)"
    )
    assert cells.markdown(details.lock_cell([inferred])) == cells.markdown(
        details.lock_cell([SHARE])
    )
    assert "sampled" not in cells.markdown(details.lock_cell([SHARE]))


def test_the_json_report_is_the_report_with_a_schema_version() -> None:
    r = rich(traced())
    doc = json.loads(jsonreport.dumps(r))
    assert doc["schema_version"] == jsonreport.SCHEMA_VERSION == 2 and doc["detail"] == "full"
    lock = doc["migrations"][0]["insight"]["statements"][0]["locks"][0]
    assert lock == {
        "relation": "public.orders",
        "kind": "table",
        "mode": "SHARE",
        "blocks": "writes",
        "held_seconds": 2.3,
        "waited_seconds": 0.0,
        "statement": 0,
        "bytes": 412 * 1024**2,
        "table": "public.orders",
        "table_bytes": 413 * 1024**2,
        "source": "exact",
        "dying": False,
    }
    insight = doc["migrations"][0]["insight"]
    assert insight["verdict"]["kind"] == "blocks writes"
    assert insight["row_writes"] == [
        {"relation": "public.orders", "rows_updated": 10, "rows_deleted": 0, "bytes": 412 * 1024**2}
    ]
    del doc["schema_version"], doc["detail"]
    assert TypeAdapter(Report).validate_python(doc) == r


def test_a_json_report_over_its_limit_drops_statements_then_findings_then_insight() -> None:
    r = rich(*[traced(f"db/{i}.sql", statements=200, findings=200) for i in range(5)])
    sizes = {}
    for detail in jsonreport.DETAILS:
        sizes[detail] = len(json.dumps(jsonreport.document(jsonreport.trim(r, detail))))
    assert sizes["full"] > sizes["no statements"] > sizes["no findings"] > sizes["no insight"]
    for detail in jsonreport.DETAILS:
        doc = json.loads(jsonreport.dumps(r, limit=sizes[detail] + 200))
        assert doc["detail"] == detail
        runs = doc["migrations"]
        if detail == "no statements":
            assert runs[0]["insight"]["statements"] == [] and runs[0]["insight"]["findings"]
            assert "per-statement detail left out" in runs[0]["insight"]["notes"][-1]
        if detail == "no findings":
            assert runs[0]["insight"]["findings"] == []
        if detail == "no insight":
            assert runs[0]["insight"] is None
    tiny = json.loads(jsonreport.dumps(r, limit=700))
    assert tiny["migrations"] == [] and tiny["status"] == "ready"


def job_environ(tmp_path: Path, **inputs: str) -> dict[str, str]:
    payload = {
        "action": "opened",
        "number": 12,
        "pull_request": {
            "number": 12,
            "head": {"sha": "9f1c2e7d4b0a8c3f", "ref": "f", "repo": {"full_name": "acme/shop"}},
            "base": {"sha": "b" * 40, "ref": "main", "repo": {"full_name": "acme/shop"}},
        },
        "repository": {"full_name": "acme/shop"},
    }
    (tmp_path / "event.json").write_text(json.dumps(payload))
    (tmp_path / "temp").mkdir()
    return {
        "GITHUB_EVENT_PATH": str(tmp_path / "event.json"),
        "GITHUB_EVENT_NAME": "pull_request",
        "GITHUB_REPOSITORY": "acme/shop",
        "GITHUB_OUTPUT": str(tmp_path / "output"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"),
        "RUNNER_TEMP": str(tmp_path / "temp"),
        **{f"INPUT_{k.upper()}": v for k, v in inputs.items()},
    }


def run_action(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    found: Report,
    *,
    reused: bool = False,
    **inputs: str,
) -> tuple[int, str, dict[str, str]]:
    """The entry point's last steps on ``found`` (as if the workflow had made it; ``reused``:
    as a re-run finds it)."""
    environ = job_environ(tmp_path, **inputs)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    outcome = Outcome(report=found, branch=None, reused=reused)
    monkeypatch.setattr(main, "handle", lambda *a, **k: outcome)
    job = main.JobEnv.from_environ()
    ev = event.parse(
        "pull_request",
        json.loads((tmp_path / "event.json").read_text()),
        repository="acme/shop",
        sha="",
        ref="",
    )
    out = io.StringIO()
    code = main._run(cast(Any, None), cast(Settings, None), job, ev, read_inputs(environ), out)
    from helpers import read_outputs

    return code, out.getvalue(), read_outputs(tmp_path / "output")


def test_the_action_writes_the_json_report_in_runner_temp_and_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = rich(traced())
    code, _, values = run_action(tmp_path, monkeypatch, found)
    assert code == 0
    path = Path(values["report-path"])
    assert path.parent == tmp_path / "temp" and path.name.startswith("pgoverlay-report-")
    info = os.lstat(path)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert json.loads(path.read_text()) == jsonreport.document(found)


def test_a_runner_temp_that_is_not_a_folder_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    environ = job_environ(tmp_path)
    (tmp_path / "temp").rmdir()
    (tmp_path / "temp").symlink_to(tmp_path / "event.json")
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(main, "handle", lambda *a, **k: pytest.fail("work was done"))
    payload = json.loads((tmp_path / "event.json").read_text())
    ev = event.parse("pull_request", payload, repository="acme/shop", sha="", ref="")
    with pytest.raises(JobFileError, match="RUNNER_TEMP=.*not a folder"):
        main._run(
            cast(Any, None),
            cast(Settings, None),
            main.JobEnv.from_environ(),
            ev,
            read_inputs(environ),
            io.StringIO(),
        )


@pytest.mark.parametrize("fail", [True, False])
def test_fail_on_threshold_fails_the_step_naming_the_migration_and_its_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: bool
) -> None:
    found = rich(traced("db/0041_orders_index.sql"), traced("db/0043.sql", level="notice"))
    code, log, _ = run_action(tmp_path, monkeypatch, found, fail_on_threshold=str(fail).lower())
    assert code == (1 if fail else 0)
    level = "error" if fail else "warning"
    assert (
        f"::{level} title=Migration db/0041_orders_index.sql is over a threshold::"
        "db/0041_orders_index.sql: blocks writes to `public.orders` (412.0 MiB) for 2.3 s: "
        "consider CREATE INDEX CONCURRENTLY\n"
    ) in log
    assert "db/0043.sql is over" not in log
    assert "**over**" in (tmp_path / "summary").read_text(), "the summary is written first"


def test_fail_on_threshold_passes_when_no_verdict_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = rich(traced(level="notice"), MigrationRun("db/plain.sql", "applied", 0.1))
    code, log, _ = run_action(tmp_path, monkeypatch, found, fail_on_threshold="true")
    assert code == 0 and "::error" not in log


def test_a_close_is_never_over_a_threshold_though_it_lists_the_last_runs_verdicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close runs no migration: its report carries the last run's, over verdict included,
    for the closing comment; fail-on-threshold does not fail it."""
    found = rich(traced("db/0041_orders_index.sql"), status="destroyed")
    code, log, values = run_action(tmp_path, monkeypatch, found, fail_on_threshold="true")
    assert code == 0, log
    assert "is over a threshold" not in log
    assert values["status"] == "destroyed"


def test_a_rerun_of_the_same_head_reports_its_over_verdict_and_fails_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-run that reuses the head's runs fails on their verdict as the first run did:
    re-running a job is no way past fail-on-threshold."""
    found = rich(traced("db/0041_orders_index.sql"))
    code, log, _ = run_action(tmp_path, monkeypatch, found, fail_on_threshold="true", reused=True)
    assert code == 1
    assert "Migration db/0041_orders_index.sql is over a threshold" in log


# -- the PR record ------------------------------------------------------------------------------


def test_the_record_drops_detail_rather_than_fail_for_size() -> None:
    small = rich(traced())
    assert record.loads(record.dumps(record.PrRecord("abc", "ready", small))).report == small
    for statements, findings, kept in ((400, 10, "findings"), (400, 1500, "neither")):
        runs = [traced(f"db/{i}.sql", statements=statements, findings=findings) for i in range(4)]
        big = rich(*runs)
        assert len(jsonreport.dumps(big).encode()) > MAX_RECORD_BYTES
        text = record.dumps(record.PrRecord("abc", "ready", big))
        assert len(text.encode()) <= MAX_RECORD_BYTES
        RecordRequest(data=text)  # what the engine keeps
        back = record.loads(text).report.migrations[0].insight
        assert back is not None and back.statements == []
        assert back.verdict == runs[0].insight.verdict  # type: ignore[union-attr]
        assert bool(back.findings) is (kept == "findings")
    # past the ladder: the run's status stays
    monster = rich(*[traced(f"db/{i}.sql", text="é" * 500) for i in range(2000)])
    text = record.dumps(record.PrRecord("abc", "ready", monster))
    assert len(text.encode()) <= MAX_RECORD_BYTES
    assert record.loads(text).status == "ready"


# -- the listener --------------------------------------------------------------------------------


def finished_job(queue: Queue, text: str) -> int:
    job = NewJob(repository=REPO, pr=1, kind="open", head_sha="a" * 40, payload="{}")
    queue.accept(delivery_id="d-1", event="pull_request", action="opened", job=job)
    claimed = queue.claim(worker="w", lease_seconds=60)
    assert claimed is not None
    queue.finish(claimed.id, worker="w", state="done", result="ready", report=text)
    return claimed.id


def test_the_queue_keeps_a_jobs_report_bounded_and_apart_from_its_listing(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "queue.db")
    try:
        done = Done("ready", rich(*[traced(f"{i}", statements=500) for i in range(40)]))
        text = done.json()
        assert len(text.encode()) <= MAX_REPORT_BYTES
        assert json.loads(text)["detail"] != "full"
        job_id = finished_job(queue, text)
        assert queue.report(job_id) == text and queue.report(job_id + 1) is None
        assert not hasattr(queue.jobs()[0], "report")
        with pytest.raises(QueueError, match="at most 1,048,576 are kept"):
            queue.finish(job_id, worker="w", state="done", report="x" * (MAX_REPORT_BYTES + 1))
    finally:
        queue.close()


def test_a_queue_from_before_reports_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    Queue(path).close()
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE jobs DROP COLUMN report")
    queue = Queue(path)
    try:
        assert queue.report(finished_job(queue, '{"schema_version": 1}')) is not None
    finally:
        queue.close()


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Intake]:
    settings = WebhookSettings(
        secret=SECRET, token="t", repositories={REPO: {}}, metrics_token=TOKEN
    )
    queue = Queue(tmp_path / "queue.db")
    finished_job(queue, jsonreport.dumps(rich(traced())))
    queue.close()
    with Intake(settings, tmp_path / "queue.db") as running:
        yield running


def test_the_listener_serves_a_jobs_report_to_the_token_only(listener: Intake) -> None:
    url = f"{listener.url}/jobs/1/report"
    assert requests.get(url, timeout=10).status_code == 401
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    answer = requests.get(url, headers=bearer, timeout=10)
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    assert answer.json()["migrations"][0]["insight"]["verdict"]["level"] == "over"
    missing = requests.get(f"{listener.url}/jobs/2/report", headers=bearer, timeout=10)
    assert missing.status_code == 404


def test_without_a_token_the_listener_serves_no_report(tmp_path: Path) -> None:
    settings = WebhookSettings(secret=SECRET, token="t", repositories={REPO: {}})
    with Intake(settings, tmp_path / "queue.db") as running:
        answer = requests.get(f"{running.url}/jobs/1/report", timeout=10)
        assert answer.status_code == 403 and "metrics_token" in answer.json()["message"]


def test_a_failed_migrations_details_never_call_it_safe() -> None:
    safe = dataclasses.replace(insight(level="safe"), verdict=Verdict("safe", "safe online"))
    failed = MigrationRun("db/0042_broken.sql", "failed", 0.3, error="ERROR: boom", insight=safe)
    summary = details.details(failed, full=False, see="x").split("</summary>")[0]
    assert "safe online" not in summary and "failed" in summary, summary
    # what it did before it failed is still said, after that it failed
    over = MigrationRun("db/0043_broken.sql", "failed", 0.3, error="ERROR: boom",
                        insight=insight(level="over"))  # fmt: skip
    summary = details.details(over, full=False, see="x").split("</summary>")[0]
    assert "failed (its error is above); before it failed: over: " in summary, summary


def test_a_tables_toast_and_indexes_rebuilt_with_it_are_one_line() -> None:
    t, toast = "public.users", "pg_toast.pg_toast_16391"
    rewrites = [
        Rewrite(t, "table", ["column type change"], 150 * 1024**2, 181 * 1024**2, 0, t),
        Rewrite(toast, "TOAST table", ["rebuilt with its table"], 0, 0, 0, t),
        Rewrite(f"{toast}_index", "index", ["rebuilt with its table"], 8192, 8192, 0, t),
        Rewrite(f"{t}_pkey", "index", ["rebuilt with its table"], 43 * 1024**2, 43 * 1024**2, 0, t),
    ]
    found = dataclasses.replace(
        insight(),
        rewrites=rewrites,
        statements=[StatementInsight(0, 1, "ALTER TABLE users ALTER id TYPE bigint", 5.9, [],
                                     rewrites, [])],
    )  # fmt: skip
    block = details.details(MigrationRun("db/0044_type.sql", "applied", 6.0, insight=found),
                            full=True, see="x")  # fmt: skip
    rewrote = [line for line in block.splitlines() if "rewrote" in line]
    assert rewrote == [
        "  - rewrote `public.users` 150.0 MiB → 181.0 MiB (column type change), with its TOAST "
        "table and 2 indexes: 43.0 MiB → 43.0 MiB"
    ], rewrote
    assert "0 B → 0 B" not in block
    listed = block.split("Rewrites:")[1].split("\n\n")[1]
    assert len(listed.splitlines()) == 1, listed
