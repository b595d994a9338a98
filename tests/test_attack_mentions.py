"""Attack: a pull request's SQL (its error text, its file names, a failure's message) pings
people or references issues through what pgoverlay writes to GitHub.

GitHub turns ``@login`` and ``@org/team`` into a notification, and ``#12``, ``owner/repo#12``
and ``GH-12`` into a cross-reference, wherever they appear outside code in a comment, a job
summary or an annotation; descriptions are shown beside them. The comment and the summary are
rendered here by cmark-gfm (GitHub's own renderer) and every text node outside ``<code>`` and
``<pre>`` is searched with GitHub's patterns; the plain-text fields go through the real GitHub
client to the fake GitHub (real HTTP) and the real annotation writer.
"""

from __future__ import annotations

import dataclasses
import io
import random
import re
from html.parser import HTMLParser

import cmarkgfm
from cmarkgfm.cmark import Options
from test_comment import WAY_IN, report

from fakegithub import FakeGitHub
from pgoverlay.action import markdown as md
from pgoverlay.action import outputs
from pgoverlay.action.comment import render_comment, render_summary
from pgoverlay.action.conclusion import deployment
from pgoverlay.action.deployment import PendingDeployment
from pgoverlay.action.github import GitHub
from pgoverlay.action.report import MigrationRun

# GitHub's own patterns: a mention is an @ after a non-word character, then a login (and a team
# after a slash); a reference is a # then digits, optionally after owner/repo, or GH- digits.
MENTION = re.compile(r"(?:^|[^\w`])@[A-Za-z0-9][A-Za-z0-9-]*(?:/[A-Za-z0-9][\w-]*)?")
REFERENCE = re.compile(r"(?:^|[^\w&])(?:[\w.-]+/[\w.-]+)?#\d+|\bGH-\d+", re.IGNORECASE)
HOSTILE = (
    "@octocat please look, cc @acme/security-team and @everyone; "
    "fixes #1, see acme/other#77 and GH-12"
)
REPO = "acme/shop"
HEAD = "a" * 40


class _Prose(HTMLParser):
    """The text GitHub would link in: every text node outside code spans and blocks."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self.depth += tag in ("code", "pre")

    def handle_endtag(self, tag: str) -> None:
        self.depth -= tag in ("code", "pre")

    def handle_data(self, data: str) -> None:
        if self.depth == 0:
            self.text.append(data)


def linked(markdown: str) -> list[str]:
    """What GitHub would turn into a mention or a reference in ``markdown``, rendered as GitHub
    renders it (raw HTML kept: the comment's ``<details>`` blocks are HTML)."""
    html = cmarkgfm.github_flavored_markdown_to_html(markdown, options=Options.CMARK_OPT_UNSAFE)
    parser = _Prose()
    parser.feed(html)
    found: list[str] = []
    for text in parser.text:
        found += [m.group(0) for m in MENTION.finditer(text)]
        found += [m.group(0) for m in REFERENCE.finditer(text)]
    return found


def hostile_report(text: str) -> object:
    runs = [
        MigrationRun(f"db/{text}.sql", "failed", 0.1, error=f"ERROR:  {text}", file="db/x.sql"),
        MigrationRun(text, "applied", 0.2),
    ]
    return report(status="migration failed", migrations=runs, message=text, way_in=WAY_IN)


def test_sql_error_text_and_names_mention_nobody_in_the_comment_or_the_summary() -> None:
    r = hostile_report(HOSTILE)
    for body in (render_comment(r), render_summary(r)):  # type: ignore[arg-type]
        assert linked(body) == []
        # the text is still there, as it reads, and whole inside code
        assert "ERROR:  @octocat please look" in body
        assert "@" + md.JOINER + "octocat" in body


def test_a_failure_message_with_quotes_and_backticks_mentions_nobody() -> None:
    # backticks that pair up become code; the rest is prose, and no mention survives either way
    for text in (f"`{HOSTILE}` and {HOSTILE}", f"{HOSTILE} `x", f"<b>{HOSTILE}</b> `@x`"):
        r = report(status="failed", branch=None, migrations=[], message=text)
        assert linked(render_comment(r)) == [], text
        destroyed = dataclasses.replace(r, status="destroyed")
        assert linked(render_comment(destroyed)) == [], text


def test_random_text_around_mentions_never_links_anyone() -> None:
    rng = random.Random(37)
    pieces = ["@octocat", "@acme/team", "#12", "o/r#3", "GH-4", "`", "\\", "*", "_", "<", ">",
              "&", "|", " ", "\n", "a", "é", "@", "#", "(", ")", "[", "]"]  # fmt: skip
    for _ in range(200):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 40)))
        r = hostile_report(text)
        for body in (render_comment(r), render_summary(r)):  # type: ignore[arg-type]
            assert linked(body) == [], (text, body)


def test_annotations_mention_nobody() -> None:
    out = io.StringIO()
    outputs.annotation("error", HOSTILE, out, file="db/x.sql", line=3, title=f"Migration {HOSTILE}")
    written = out.getvalue()
    assert written.startswith("::error ")
    assert MENTION.search(written) is None and REFERENCE.search(written) is None


def test_deployment_and_commit_status_descriptions_mention_nobody() -> None:
    with FakeGitHub() as fake:
        fake.add_token("ghs_job", "github-actions[bot]", kind="installation")
        fake.add_pull(REPO, 5, HEAD, "b" * 40)
        github = GitHub("ghs_job", api_url=fake.url, backoff=0.01)
        failed = report(status="failed", branch=None, migrations=[], message=HOSTILE)
        end = deployment(failed)
        assert end is not None
        PendingDeployment(github, REPO, "shop-pr-5").write(end, sha=HEAD)
        github.set_status(REPO, HEAD, "failure", f"failed: {HOSTILE}")
        sent = [r["json"]["description"] for r in fake.requests if r["method"] == "POST"]
        assert len(sent) == 3  # the deployment, its status, the commit status
        for description in sent:
            assert "octocat" in description and len(description) <= 140
            assert MENTION.search(description) is None
            assert REFERENCE.search(description) is None
        assert fake.violations == []
