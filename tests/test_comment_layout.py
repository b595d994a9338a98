"""The PR comment as a reviewer sees it: rendered as GitHub renders it and laid out in headless
Chromium at GitHub's comment width.

The markdown goes through cmark-gfm (``cmarkgfm``: GitHub's own fork of cmark, with its table,
strikethrough, autolink and tag-filter extensions; raw HTML kept, as GitHub keeps ``<details>``
and ``<br>``), into a page styled by GitHub's markdown CSS (``github-markdown-css``, generated
from github.com's own stylesheet; tests/fixtures/github/markdown-css). Its tables are
``display: block; width: max-content; max-width: 100%; overflow: auto``: a table wider than the
comment does not push the page wider, it scrolls, and what is past its right edge is out of
sight until the reader scrolls it.

The width, from Primer's documented layout (github.com's CSS framework), not measured on
github.com: at a window 1,280 px wide or wider a pull request's conversation is ``container-xl``
(1,280 px) less its padding (32 px each side), 1,216 px, of which the sidebar takes 320 px and
the gutter 32 px (``Layout``'s defaults at the xl breakpoint; 296 and 24 at lg, which would leave
32 px more); a comment sits 56 px in (its avatar), inside a 1 px border and 16 px of padding
(``.comment-body``, font-size 14 px). That leaves ``COMMENT_WIDTH`` = 864 - 56 - 2 - 32 = 774 px
for the markdown: the narrower reading, so a comment that fits it fits the other. A narrower
window narrows it further.

Each shape is a report as the Action makes it from a real run (the int→bigint rewrite at 2 M
rows as issue 27 measured it, many migrations, a failure, long names, command mode). Every
layout is screenshotted into the test's tmp dir, named in a failing assertion.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cmarkgfm
import pytest
from cmarkgfm.cmark import Options
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from test_comment import failed_run, report

from pgoverlay.action.comment import render_comment
from pgoverlay.action.insight.model import (
    Finding,
    LockUse,
    MigrationInsight,
    Rewrite,
    Scan,
    StatementInsight,
    Verdict,
    Volume,
)
from pgoverlay.action.report import MigrationRun, Report

COMMENT_WIDTH = 774  # px of markdown in a PR comment on github.com (see the module's docstring)
FIRST_SCREEN = 300  # px from the comment's top within which the verdict in words must end
CSS = Path(__file__).parent / "fixtures" / "github" / "markdown-css" / "github-markdown-light.css"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
MiB = 1024**2

# What the page reports: the markdown's content box, each visible table's widths, every visible
# element whose right edge is past the content box's, and where the lead (the paragraph right
# under the title) is.
MEASURE = """
const body = document.querySelector('.markdown-body');
const box = body.getBoundingClientRect();
const style = getComputedStyle(body);
const left = box.left + parseFloat(style.paddingLeft);
const right = box.right - parseFloat(style.paddingRight);
const shown = (e) => e.getClientRects().length > 0;
const tables = [...body.querySelectorAll('table')].filter(shown).map((t) => ({
  scroll: t.scrollWidth, client: t.clientWidth, text: t.innerText.slice(0, 120)}));
const past = [...body.querySelectorAll('*')].filter(shown)
  .map((e) => [e, e.getBoundingClientRect()])
  .filter(([e, r]) => r.width > 0 && r.right > right + 0.5)
  .map(([e, r]) => ({tag: e.tagName, right: r.right, text: (e.textContent || '').slice(0, 120)}));
const lead = body.querySelector('h3 + p');
const place = lead && shown(lead) ? lead.getBoundingClientRect() : null;
return {
  width: right - left,
  tables: tables,
  past: past,
  lead: lead ? lead.innerText : '',
  leadBottom: place ? place.bottom - box.top : null,
  height: document.documentElement.scrollHeight,
};
"""


@dataclass(frozen=True)
class Layout:
    width: float
    tables: list[dict[str, Any]]
    past: list[dict[str, Any]]
    lead: str
    lead_bottom: float | None
    screenshot: Path


def html(body: str) -> str:
    """The comment's markdown as GitHub's HTML inside GitHub's comment box."""
    rendered = cmarkgfm.github_flavored_markdown_to_html(body, options=Options.CMARK_OPT_UNSAFE)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><style>{CSS.read_text()}
body {{ margin: 0; background: #fff; }}
.comment-body {{ box-sizing: border-box; width: {COMMENT_WIDTH + 2 * 16}px; padding: 16px;
  margin: 8px; font-size: 14px; border: 0; }}
</style></head>
<body><div class="comment-body markdown-body">{rendered}</div></body></html>"""


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[webdriver.Chrome]:
    """Debian's headless Chromium through its WebDriver, with a fresh profile in ``profile``."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            pytest.fail(
                f"{path} is missing: the comment's layout is checked in Debian's Chromium. "
                "Install it with `apt-get install chromium chromium-driver fonts-liberation` "
                "(scripts/test.sh does)"
            )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",  # the tests run as root
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        driver.set_window_size(1280, 900)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


def look(browser: webdriver.Chrome, body: str, folder: Path, name: str) -> Layout:
    """Lay ``body`` out as GitHub would, screenshot it whole, and measure it."""
    page = folder / f"{name}.html"
    page.write_text(html(body))
    browser.set_window_size(1280, 900)
    browser.get(page.as_uri())
    found = browser.execute_script(MEASURE)
    browser.set_window_size(1280, min(16000, int(found["height"]) + 16))
    shot = folder / f"{name}.png"
    browser.save_screenshot(str(shot))
    return Layout(
        width=found["width"],
        tables=found["tables"],
        past=found["past"],
        lead=found["lead"],
        lead_bottom=found["leadBottom"],
        screenshot=shot,
    )


# -- the shapes -------------------------------------------------------------------------------


def _lock(relation: str, kind: str, mode: str, held: float, statement: int = 0) -> LockUse:
    blocks = "reads and writes" if mode == "ACCESS EXCLUSIVE" else "writes"
    if mode in ("SHARE UPDATE EXCLUSIVE", "ACCESS SHARE"):
        blocks = "ddl"
    return LockUse(relation, kind, mode, blocks, held, statement=statement, bytes=0)  # type: ignore[arg-type]


def int_to_bigint(table: str = "public.t", toast: str = "pg_toast.pg_toast_16391") -> Any:
    """``ALTER TABLE t ALTER COLUMN id TYPE bigint`` on 2 M rows with a text column, as the
    trace reports it: ACCESS EXCLUSIVE on the table, its TOAST table and its index, its two
    indexes, all rewritten (issue 27: six locks for one statement)."""
    name = table.split(".", 1)[1]
    locks = [
        _lock(table, "table", "ACCESS EXCLUSIVE", 5.9),
        _lock(toast, "TOAST table", "ACCESS EXCLUSIVE", 5.9),
        _lock(f"{toast}_index", "index", "ACCESS EXCLUSIVE", 5.9),
        _lock(f"{table}_pkey", "index", "ACCESS EXCLUSIVE", 5.9),
        _lock(f"{table}_created_idx", "index", "ACCESS EXCLUSIVE", 5.9),
        _lock("public.accounts", "table", "ACCESS SHARE", 5.9),
    ]
    rewrites = [
        Rewrite(table, "table", ["column type change"], 150 * MiB, 181 * MiB, 0),
        Rewrite(toast, "TOAST table", ["rebuilt with its table"], 0, 0, 0),
        Rewrite(f"{table}_pkey", "index", ["rebuilt with its table"], 43 * MiB, 43 * MiB, 0),
    ]
    statement = StatementInsight(
        0,
        1,
        f"ALTER TABLE {name} ALTER COLUMN id TYPE bigint",
        5.9,
        locks=locks,
        rewrites=rewrites,
        scans=[Scan(table, 1, 2_000_000, "ACCESS EXCLUSIVE", 0)],
    )
    return MigrationInsight(
        seconds=6.1,
        locks=locks,
        rewrites=rewrites,
        scans=statement.scans,
        volume=Volume(rows_updated=0, wal_bytes=230 * MiB, layer_bytes=224 * MiB),
        statements=[statement],
        findings=[
            Finding(
                "changing-column-type",
                "Changing a column type requires an ACCESS EXCLUSIVE lock on the table",
                1,
                "confirmed",
                f"rewrote {table} (181.0 MiB)",
                statement=0,
            ),
            Finding(
                "require-lock-timeout",
                "Missing `set lock_timeout` before potentially slow operations",
                1,
                "not measurable",
                "",
                statement=0,
            ),
        ],
        verdict=Verdict(
            "over",
            f"blocks reads and writes to `{toast}` (0 B) for 5.9 s, rewriting it "
            "(rebuilt with its table)",
            kind="rewrite",
        ),
        interval=0.05,
        notes=["Locks were sampled every 50 ms: a shorter hold may be missed."],
    )


def add_column(n: int, level: str = "safe") -> Any:
    lock = _lock("public.orders", "table", "ACCESS EXCLUSIVE", 0.004)
    text = f"ALTER TABLE orders ADD COLUMN note_{n} text NOT NULL DEFAULT ''"
    return MigrationInsight(
        seconds=0.02,
        locks=[lock],
        rewrites=[],
        scans=[],
        volume=Volume(wal_bytes=24576, layer_bytes=8192),
        statements=[StatementInsight(0, 1, text, 0.004, locks=[lock])],
        findings=[],
        verdict=Verdict(
            level,  # type: ignore[arg-type]
            "safe online"
            if level == "safe"
            else "blocks reads and writes to `public.orders` (412.0 MiB) for 4 ms",
        ),
        interval=0.05,
    )


def the_rewrite() -> Report:
    run = MigrationRun("db/migrations/0001_type_int_bigint.sql", "applied", 6.1)
    return report(migrations=[dataclasses.replace(run, insight=int_to_bigint())])


def many() -> Report:
    runs = [
        MigrationRun(f"db/migrations/{n:04d}_add_note_{n}.sql", "applied", 0.02)
        for n in range(1, 31)
    ]
    runs = [
        dataclasses.replace(m, insight=add_column(n, "notice" if n % 7 == 0 else "safe"))
        for n, m in enumerate(runs)
    ]
    runs[12] = dataclasses.replace(runs[12], insight=int_to_bigint(), seconds=6.1)
    return report(migrations=runs)


def a_failure() -> Report:
    error = (
        'ERROR:  column "email" of relation "customers" already exists\n'
        "CONTEXT:  " + "x" * 300 + "\nLINE 3: ALTER TABLE customers ADD COLUMN email text;"
    )
    ok = MigrationRun("db/migrations/0041_order_notes.sql", "applied", 0.02, insight=add_column(1))
    broken = failed_run(error, name="db/migrations/0042_add_email.sql")
    later = MigrationRun("db/migrations/0043_backfill_email.sql", "not run", 0.0)
    return report(
        status="migration failed",
        migrations=[ok, broken, later],
        message="Migration db/migrations/0042_add_email.sql failed",
    )


def long_names() -> Report:
    table = "public." + "customer_lifetime_value_by_acquisition_channel_and_region_2024"[:63]
    toast = "pg_toast.pg_toast_1234567890"
    path = "services/billing/db/migrations/versions/" + "2024_06_01_1200_" + "x" * 90 + ".sql"
    insight = int_to_bigint(table, toast)
    long_statement = (
        f"ALTER TABLE {table} ALTER COLUMN {'lifetime_value_in_customer_currency_minor_units'} "
        "TYPE numeric(20, 4) USING lifetime_value_in_customer_currency_minor_units::numeric"
    )
    insight = dataclasses.replace(
        insight,
        statements=[dataclasses.replace(insight.statements[0], text=long_statement)],
        verdict=Verdict(
            "over",
            f"rewrites `{table}` (181.0 MiB, column type change) and blocks reads and writes "
            "for 5.9 s: add a new column and backfill it in batches instead of changing the "
            "type in place",
        ),
    )
    run = MigrationRun(path, "applied", 6.1, insight=insight)
    failed = failed_run("ERROR: " + "y" * 400, name=path.replace("x" * 90, "z" * 90))
    return report(
        status="migration failed",
        migrations=[run, failed],
        branch_name="a" * 60,
    )


def command_mode() -> Report:
    lock = _lock("public.django_migrations", "table", "ROW EXCLUSIVE", 0.01)
    statements = [
        StatementInsight(i, None, f"SELECT 1 FROM django_content_type WHERE app = 'a{i}'", 0.001)
        for i in range(40)
    ]
    insight = dataclasses.replace(
        int_to_bigint(),
        statements=[*statements, *int_to_bigint().statements],
        locks=[*int_to_bigint().locks, lock],
    )
    run = MigrationRun("python manage.py migrate --noinput", "applied", 7.4, insight=insight)
    return report(migrations=[run])


SHAPES = {
    "int-to-bigint": the_rewrite,
    "many-migrations": many,
    "failure": a_failure,
    "long-names": long_names,
    "command-mode": command_mode,
}

LEADS = {
    "int-to-bigint": "1 migration over a threshold",
    "many-migrations": "1 migration over a threshold",
    "failure": "1 migration failed",
    "long-names": "1 migration failed",
    "command-mode": "1 migration over a threshold",
}


def assert_fits(layout: Layout, lead: str) -> None:
    """Nothing wider than the comment, and ``lead`` said right under the title."""
    seen = f"(screenshot: {layout.screenshot})"
    assert layout.width == pytest.approx(COMMENT_WIDTH, abs=1), seen
    scrolled = [t for t in layout.tables if t["scroll"] > t["client"]]
    assert scrolled == [], f"a table is wider than the comment and scrolls {seen}"
    assert layout.past == [], f"something reaches past the comment's right edge {seen}"
    assert lead in layout.lead, f"the verdict in words is not right under the title {seen}"
    assert layout.lead_bottom is not None and layout.lead_bottom <= FIRST_SCREEN, seen


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_comment_fits_githubs_width_and_leads_with_its_verdict(
    browser: webdriver.Chrome, tmp_path: Path, shape: str
) -> None:
    assert_fits(look(browser, render_comment(SHAPES[shape]()), tmp_path, shape), LEADS[shape])


def test_a_table_wider_than_the_comment_is_caught(
    browser: webdriver.Chrome, tmp_path: Path
) -> None:
    """The check itself: the old seven-column table, with a verdict as long as the one issue 27
    saw cut off, scrolls at GitHub's width."""
    verdict = (
        "**over**: blocks reads and writes to `pg_toast.pg_toast_16391` (0 B) for 5.9 s, "
        "rewriting it (rebuilt with its table)"
    )
    row = (
        "| `db/migrations/0001_type_int_bigint.sql` | 6.10 s | applied | ACCESS EXCLUSIVE on "
        "`pg_toast.pg_toast_16391`: blocks reads and writes, 5.9 s | 6 (224.0 MiB) | "
        f"224.0 MiB layer; 230.0 MiB WAL | {verdict} |"
    )
    body = "\n".join(
        [
            "### pgoverlay: **Ready**",
            "",
            "| Migration | Duration | Result | Worst lock | Rewrites | Bytes | Verdict |",
            "|---|--:|---|---|---|---|---|",
            row,
        ]
    )
    layout = look(browser, body, tmp_path, "old-table")
    assert [t["scroll"] > t["client"] for t in layout.tables] == [True]
