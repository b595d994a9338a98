"""The PR comment examples in docs/action.md, rendered by the code that writes the comment.

Each example is a fixed Report, rendered with ``pgoverlay.action.comment.render_comment`` and
quoted into the doc between ``<!-- comment example: NAME -->`` and
``<!-- end comment example -->``. tests/test_comment.py fails when a block differs from what
the code renders now; this script rewrites them:

    python scripts/comment_examples.py --update     # rewrite the blocks in docs/action.md
    python scripts/comment_examples.py              # exit 1 and name the blocks out of date
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

from pgoverlay.action.comment import render_comment
from pgoverlay.action.insight.model import (
    Finding,
    LockUse,
    MigrationInsight,
    StatementInsight,
    TableBlocking,
    Verdict,
    Volume,
)
from pgoverlay.action.report import BranchInfo, MigrationRun, Report
from pgoverlay.action.wayin import WayIn

DOC = Path(__file__).resolve().parents[1] / "docs" / "action.md"
_BLOCK = re.compile(
    r"(<!-- comment example: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- end comment example -->)",
    re.DOTALL,
)

_BRANCH = BranchInfo(
    name="shop-pr-42",
    host="127.0.0.1",
    port=55433,
    database="shop",
    user="pgoverlay",
    base_name="prod",
    base_version=3,
    base_seeded_at=1735732800.0,  # 2025-01-01 12:00 UTC
    layer_logical_bytes=1572864,
    layer_physical_bytes=409600,
    create_seconds=0.11,
    runtime="local",
    base_masked=True,
    base_mask_rules="prod-rules.yml",
    base_mask_sha256="e86b70ece64e" + "0" * 52,
)
_COMMON = {
    "repository": "acme/shop",
    "pr": 42,
    "branch_name": "shop-pr-42",
    "head_sha": "3f9c2a1" + "0" * 33,
    "way_in": WayIn(
        page="https://db.acme.dev/b/shop-pr-42",
        host="db.acme.dev",
        port=6543,
        database="shop-pr-42",
        sslmode="verify-full",
    ),
    "run_url": "https://github.com/acme/shop/actions/runs/12345678901",
}


def _notes() -> MigrationInsight:
    """An added column with a default: no rewrite, a short lock, a smaller layer (the
    statement's dead tuples were pruned)."""
    return MigrationInsight(
        seconds=0.08,
        locks=[
            LockUse(
                "public.orders",
                "table",
                "ACCESS EXCLUSIVE",
                "reads and writes",
                0.004,
                bytes=0,
                source="exact",
            )
        ],
        rewrites=[],
        scans=[],
        volume=Volume(wal_bytes=24576, layer_bytes=-417792),
        statements=[
            StatementInsight(
                0,
                1,
                "ALTER TABLE orders ADD COLUMN notes text NOT NULL DEFAULT ''",
                0.004,
                locks=[
                    LockUse(
                        "public.orders",
                        "table",
                        "ACCESS EXCLUSIVE",
                        "reads and writes",
                        0.004,
                        source="exact",
                    )
                ],
            )
        ],
        findings=[
            Finding(
                "require-lock-timeout",
                "Missing `set lock_timeout` before potentially slow ACCESS EXCLUSIVE lock "
                "operations",
                1,
                "not observed",
                "held 4 ms",
                statement=0,
            )
        ],
        verdict=Verdict("safe", "safe online"),
        interval=0.05,
        blocking=[TableBlocking("public.orders", reads=1, writes=1)],
    )


def _index() -> MigrationInsight:
    """A plain CREATE INDEX on a big table: writes blocked for longer than max-blocking-lock."""
    size = 412 * 1024**2
    lock = LockUse(
        "public.orders", "table", "SHARE", "writes", 41.2, bytes=size, statement=0, source="exact"
    )
    return MigrationInsight(
        seconds=41.3,
        locks=[lock],
        rewrites=[],
        scans=[],
        volume=Volume(wal_bytes=41943040, layer_bytes=20971520),
        statements=[
            StatementInsight(
                0, 1, "CREATE INDEX orders_status ON orders (status)", 41.2, locks=[lock]
            )
        ],
        findings=[
            Finding(
                "require-concurrent-index-creation",
                "During normal index creation, table updates are blocked, but reads are still "
                "allowed.",
                1,
                "confirmed",
                "blocked writes to public.orders for 41.2 s",
                statement=0,
            )
        ],
        verdict=Verdict(
            "over",
            "blocks writes to `public.orders` (412.0 MiB) for 41.2 s: consider CREATE INDEX "
            "CONCURRENTLY",
        ),
        interval=0.05,
        blocking=[
            TableBlocking(
                "public.orders", writes_blocked=40.9, writes_worst=40.9, reads=164, writes=109
            )
        ],
    )


EXAMPLES: dict[str, Report] = {
    "ready": Report(
        **_COMMON,
        status="ready",
        branch=_BRANCH,
        migrations=[
            MigrationRun("db/migrations/0041_order_notes.sql", "applied", 0.08, insight=_notes()),
            MigrationRun(
                "db/migrations/0042_orders_status_index.sql", "applied", 41.31, insight=_index()
            ),
        ],
    ),
    "migration-failed": Report(
        **_COMMON,
        status="migration failed",
        branch=_BRANCH,
        migrations=[
            MigrationRun("db/migrations/0041_order_notes.sql", "applied", 0.08),
            MigrationRun(
                "db/migrations/0042_add_email.sql",
                "failed",
                0.02,
                error='column "email" of relation "customers" already exists',
                file="db/migrations/0042_add_email.sql",
                line=3,
            ),
            MigrationRun("db/migrations/0043_backfill_email.sql", "not run", 0.0),
        ],
    ),
    "destroyed": Report(
        **_COMMON,
        status="destroyed",
        branch=dataclasses.replace(
            _BRANCH,
            layer_logical_bytes=6291456,
            layer_physical_bytes=1153434,
            create_seconds=None,
        ),
        merged=True,
    ),
}


def quoted(name: str) -> str:
    """The example as the doc shows it: the rendered comment, as a Markdown quote."""
    body = render_comment(EXAMPLES[name])
    return "".join(f"> {line}".rstrip() + "\n" for line in body.rstrip("\n").split("\n"))


def stale(text: str) -> list[str]:
    """The names of the doc's example blocks that differ from what the code renders."""
    return [m["name"] for m in _BLOCK.finditer(text) if m["body"] != quoted(m["name"])]


def update(text: str) -> str:
    """The doc with every example block rendered anew."""
    return _BLOCK.sub(lambda m: m[1] + quoted(m["name"]) + m[4], text)


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    if argv == ["--update"]:
        DOC.write_text(update(text))
        return 0
    if argv:
        print("usage: comment_examples.py [--update]", file=sys.stderr)
        return 2
    out_of_date = stale(text)
    if out_of_date:
        print(f"out of date in {DOC.name}: {', '.join(out_of_date)} (run with --update)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
