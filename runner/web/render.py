"""The branch page's HTML. Pure: strings in, strings out, every value escaped.

What the pull request workflow found comes from the record the Action keeps with the branch,
read with the workflow's own decoder (``pgoverlay.action.record``): the page shows the same
report as the PR comment, as HTML tables, and never parses the record itself. (The page runs in
the unprivileged front door, not in root's engine: it may read the Action's model.)

The pages work without JavaScript: a credential is shown in read-only text fields a reader can
select. The one script, under the response's CSP nonce, adds a copy button to each.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from pgoverlay.action.insight import schemadiff
from pgoverlay.action.insight.locks import per_table
from pgoverlay.action.insight.model import LockUse
from pgoverlay.action.record import PrRecord
from pgoverlay.action.report import MigrationRun
from pgoverlay.runner.callers.oauth import Access
from pgoverlay.runner.door import dsn
from pgoverlay.runner.service.views import BranchView
from pgoverlay.runner.units import format_bytes, idle_rule

LOCK_TABLES = 5  # tables listed per migration; the rest are counted
ERROR_CHARS = 4000  # characters of a migration's error shown

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 60rem;
  padding: 0 1rem; color: #1f2328; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: .5rem 0; }
th, td { border: 1px solid #d0d7de; padding: .3rem .6rem; text-align: left;
  vertical-align: top; }
th { background: #f6f8fa; } td.time { white-space: nowrap; }
code, pre, input.secret { font-family: ui-monospace, monospace; font-size: .9em; }
pre { background: #f6f8fa; padding: .6rem; overflow: auto; white-space: pre-wrap; }
.warn { background: #fff8c5; border: 1px solid #d4a72c; padding: .6rem; }
input.secret { width: 100%; box-sizing: border-box; padding: .4rem; line-height: 1.4; }
.copyable { display: flex; gap: .5rem; align-items: center; margin-bottom: .6rem; }
button { padding: .3rem .8rem; }
form.who { float: right; font-size: .9em; }
"""
# Adds a copy button after each secret field; without it the field is still selectable.
_SCRIPT = """
for (const field of document.querySelectorAll("input.secret")) {
  const button = document.createElement("button");
  button.type = "button";
  button.textContent = "Copy";
  button.addEventListener("click", async () => {
    field.select();
    try { await navigator.clipboard.writeText(field.value); button.textContent = "Copied"; }
    catch (e) { document.execCommand("copy"); button.textContent = "Copied"; }
  });
  field.parentElement.append(button);
}
"""


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


def document(title: str, body: str, *, nonce: str, script: bool = False) -> str:
    """A whole page; its style and script carry ``nonce`` (the CSP allows nothing else)."""
    code = f'<script nonce="{e(nonce)}">{_SCRIPT}</script>' if script else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{e(title)}</title><style nonce="{e(nonce)}">{_STYLE}</style></head>'
        f"<body>{body}{code}</body></html>"
    )


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "never"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pairs(rows: Iterable[tuple[str, str]]) -> str:
    """A two-column table; the values are HTML already."""
    cells = "".join(f'<tr><th scope="row">{e(k)}</th><td>{v}</td></tr>' for k, v in rows)
    return f"<table>{cells}</table>"


def _data_line(masked: bool | None) -> str:
    if masked is True:
        return (
            "<p>Data: <strong>masked</strong> (personal data rewritten when the base was made).</p>"
        )
    if masked is False:
        return (
            '<p class="warn"><strong>This branch holds production data</strong>: its base is '
            "not masked, so it has the personal data of production. Handle it as you would "
            "production.</p>"
        )
    return (
        '<p class="warn">Whether this branch\'s data is masked is not known: treat it as '
        "<strong>production data</strong>.</p>"
    )


def signed_in(login: str, csrf: str) -> str:
    """Who is signed in, and the form that signs them out (the session's CSRF token)."""
    return (
        '<form method="post" action="/signout" class="who">'
        f'<input type="hidden" name="csrf" value="{e(csrf)}">'
        f'Signed in with GitHub as <strong id="login">{e(login)}</strong>. '
        '<button type="submit" id="signout">Sign out</button></form>'
    )


def branch_page(
    view: BranchView,
    record: PrRecord | None,
    *,
    masked: bool | None,
    login: str,
    access: Access,
    csrf: str,
    nonce: str,
    credentials: bool = True,
    pull_url: str | None = None,
) -> str:
    """The branch: what it is, a form for a credential (``credentials``: this host gives a
    reader one here; not on production data unless its admin allows it), the last run's
    report and its schema changes; ``pull_url``: the pull request on GitHub."""
    if view.state == "suspended":
        state = f"suspended since {_when(view.suspended_at)}: wakes on the next connection"
    elif view.liveness == "running":
        state = view.state
    else:
        state = f"{view.state} ({view.liveness})"
    layer = (
        f"{e(format_bytes(view.layer.physical_bytes))} on disk "
        f"({e(format_bytes(view.layer.logical_bytes))} logical)"
        if view.layer is not None
        else "not measured"
    )
    facts = [
        ("Status", e(state)),
        ("Base", f"<code>{e(view.base)}</code> version {e(view.base_version)}"),
        ("Data", "masked" if masked else "production data" if masked is False else "unknown"),
        ("Writable layer", layer),
        ("Pull request", _pull_link(view, pull_url)),
        ("Created", e(_when(view.created_at))),
        ("Expires", e(_when(view.expires_at))),
    ]
    if view.suspend_after is not None:
        facts.append(("When idle", e(idle_rule(view.suspend_after))))
    kind = "read-write" if access == "read-write" else "read-only"
    yours = (
        f"<p>Signed in with GitHub as <strong>{e(login)}</strong>: your access is "
        f"<strong>{kind}</strong>.</p>"
    )
    if credentials:
        connect = (
            f'<form method="post" action="/b/{e(quote(view.name))}/credential">'
            f'<input type="hidden" name="csrf" value="{e(csrf)}">{yours}'
            '<button type="submit" id="get-credential">Get my credential</button></form>'
        )
    else:
        connect = (
            f'{yours}<p id="no-credential">No personal credential is given on this branch: it '
            "holds production data, and this host gives none on such branches. Ask the "
            "runner's admin if you need one, or for a branch of a masked base.</p>"
        )
    schema = schema_html(record.report.schema_diff) if record is not None else ""
    body = (
        f"{signed_in(login, csrf)}"
        f"<h1>Branch <code>{e(view.name)}</code></h1>{_data_line(masked)}{_pairs(facts)}"
        f"<h2>Connect</h2>{connect}<h2>Migrations</h2>{report_html(record)}{schema}"
    )
    return document(f"Branch {view.name}", body, nonce=nonce)


def _pull_link(view: BranchView, pull_url: str | None) -> str:
    name = f"{e(view.repository)}" + (f"#{e(view.pr)}" if view.pr else "")
    if pull_url and pull_url.startswith(("https://", "http://")):
        return f'<a id="pull" href="{e(pull_url)}" rel="noreferrer">{name}</a>'
    return f"<code>{name}</code>"


_CODE_SPAN = re.compile(r"(`+) ?(.+?) ?\1(?!`)")


def _code_spans(text: str) -> str:
    """Markdown text escaped, its code spans (of any number of backticks) as ``<code>``."""
    return _CODE_SPAN.sub(lambda m: f"<code>{m.group(2)}</code>", e(text))


def schema_html(diff: schemadiff.SchemaDiff | None) -> str:
    """What the migrations did to the schema, as the PR comment says it (its headline and one
    line per change, from the same functions), as a list; "" when it was not measured."""
    if diff is None:
        return ""
    items = [f"<li>{_code_spans(schemadiff.line(c, full=True))}</li>" for c in diff.changes]
    if diff.left_out:
        items.append(f"<li>… {diff.left_out:,} more not listed</li>")
    items += [f"<li>{_code_spans(note)}</li>" for note in diff.notes]
    listed = f"<ul>{''.join(items)}</ul>" if items else ""
    if not diff.changes and diff.base_taken_at:
        listed += "<p>The migrations left the schema as the base has it.</p>"
    head = schemadiff.headline(diff).removeprefix("Schema changes: ")
    return f'<h2 id="schema">Schema changes</h2><p>{e(head)}</p>{listed}'


def report_html(record: PrRecord | None) -> str:
    """The last run's report as tables (a short line when there is none)."""
    if record is None:
        return "<p>No report: the pull request workflow has not run on this branch.</p>"
    r = record.report
    facts = [
        ("Result", e(r.status)),
        ("Head", f"<code>{e(r.head_sha[:12])}</code>"),
    ]
    if r.message:
        facts.append(("Why", e(r.message)))
    if r.run_url.startswith("https://"):
        facts.append(("Run", f'<a href="{e(r.run_url)}" rel="noreferrer">{e(r.run_url)}</a>'))
    parts = [_pairs(facts)]
    if not r.migrations:
        parts.append("<p>No migration ran.</p>")
        return "".join(parts)
    rows = "".join(_migration_row(m) for m in r.migrations)
    parts.append(
        "<table><thead><tr><th>Migration</th><th>Result</th><th>Time</th><th>Verdict</th>"
        f"<th>Locks</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    for m in r.migrations:
        if m.error:
            where = f" ({e(m.file)}, line {e(m.line)})" if m.file and m.line else ""
            error = m.error if len(m.error) <= ERROR_CHARS else m.error[:ERROR_CHARS] + "…"
            parts.append(f"<h3><code>{e(m.name)}</code>{where}</h3><pre>{e(error)}</pre>")
    return "".join(parts)


def _migration_row(m: MigrationRun) -> str:
    verdict = locks = "—"
    if m.insight is not None:
        said = m.insight.verdict
        verdict = f"<strong>{e(said.level)}</strong>: {_code_spans(said.text)}"
        locks = _locks(m.insight.locks)
    return (
        f"<tr><td><code>{e(m.name)}</code></td><td>{e(m.status)}</td>"
        f'<td class="time">{m.seconds:.2f}\u00a0s</td><td>{verdict}</td><td>{locks}</td></tr>'
    )


def _locks(uses: Sequence[LockUse]) -> str:
    tables = per_table(uses)
    if not tables:
        return "none"
    # The line names the table through ``code``: mark it, escape the whole, then make it code.
    lines = [e(t.line(lambda name: f"\x00{name}\x01")) for t in tables[:LOCK_TABLES]]
    if len(tables) > LOCK_TABLES:
        lines.append(f"and {len(tables) - LOCK_TABLES:,} more tables")
    return "<br>".join(x.replace("\x00", "<code>").replace("\x01", "</code>") for x in lines)


@dataclass(frozen=True)
class Credential:
    """What the page shows of a grant: where to connect, as whom, until when."""

    branch: str
    login: str
    role: str
    read_only: bool
    expires_at: float
    password: str
    host: str
    port: int
    database: str


# The name a reader saves the door's own (self-signed) certificate under, next to where they
# run their client: the connection strings name it as sslrootcert.
CERT_DOWNLOAD = dsn.CERT_DOWNLOAD


def connection_strings(c: Credential, *, verify: bool) -> dict[str, str]:
    """psql's command, the postgresql:// URL and JDBC's URL for ``c``, in the one form of
    ``dsn``; ``verify``: the front door's certificate is signed by an authority the client
    trusts, else it is the door's own, which the reader saves as ``CERT_DOWNLOAD``."""
    rootcert = dsn.rootcert(self_signed=not verify)
    url = dsn.url(
        user=c.role,
        password=c.password,
        host=c.host,
        port=c.port,
        database=c.database,
        sslrootcert=rootcert,
    )
    jdbc = dsn.jdbc(
        user=c.role,
        password=c.password,
        host=c.host,
        port=c.port,
        database=c.database,
        sslrootcert=rootcert,
    )
    return {"psql": f"psql '{url}'", "URL": url, "JDBC": jdbc}


def credential_page(c: Credential, *, fingerprint: str | None, nonce: str) -> str:
    """The credential, once: each connection string in a field with a copy button."""
    strings = connection_strings(c, verify=fingerprint is None)
    fields = "".join(
        f'<h3>{e(label)}</h3><div class="copyable"><input class="secret" readonly '
        f'aria-label="{e(label)}" id="{e(label.lower())}" value="{e(value)}"></div>'
        for label, value in strings.items()
    )
    access = "read-only" if c.read_only else "read-write"
    tls = (
        "<p>The front door's certificate is signed by a certificate authority: "
        "<code>sslmode=verify-full</code> checks it against your system's trusted ones "
        "(<code>sslrootcert=system</code>: libpq 16 or later; with an older one, name your "
        "system's CA file instead, <code>/etc/ssl/certs/ca-certificates.crt</code> on Debian "
        "and Ubuntu).</p>"
        if fingerprint is None
        else '<p class="warn">The front door\'s certificate is its own (self-signed). '
        f'<a href="/{CERT_DOWNLOAD}" download="{CERT_DOWNLOAD}">Save it</a> as '
        f"<code>{CERT_DOWNLOAD}</code> where you run your client, and check that its SHA-256 "
        f'fingerprint is <code id="fingerprint">{e(fingerprint)}</code> (your admin publishes '
        "it; <code>openssl x509 -noout -fingerprint -sha256 -in "
        f"{CERT_DOWNLOAD}</code>): the strings below verify the door against it.</p>"
    )
    body = (
        f"<h1>Your credential for <code>{e(c.branch)}</code></h1>"
        f"<p>Role <code>{e(c.role)}</code> ({access}) for GitHub user <strong>{e(c.login)}"
        f'</strong>, valid until <strong id="expires">{e(_when(c.expires_at))}</strong>. '
        "This page shows the password once: it is kept nowhere else, so copy it now (ask "
        "again for a new one).</p>"
        f'{tls}{fields}<p><a href="/b/{e(quote(c.branch))}">Back to the branch</a></p>'
    )
    return document(f"Credential for {c.branch}", body, nonce=nonce, script=True)


def message_page(
    title: str,
    text: str,
    *,
    nonce: str,
    link: tuple[str, str] | None = None,
    who: tuple[str, str] | None = None,
) -> str:
    """A page of one message (and a link onward); ``who``: the signed-in reader's login and
    CSRF token, for the line that says who they are and signs them out."""
    onward = f'<p><a href="{e(link[0])}">{e(link[1])}</a></p>' if link else ""
    top = signed_in(*who) if who else ""
    return document(title, f"{top}<h1>{e(title)}</h1><p>{e(text)}</p>{onward}", nonce=nonce)
