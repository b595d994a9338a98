"""`pgoverlay demo`: the product's main job on sample data."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pgoverlay.cli import common
from pgoverlay.cli.common import Subcommands, out
from pgoverlay.errors import MigrationError

if TYPE_CHECKING:
    from pgoverlay.runner.pool import Pool


def cmd_demo(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from pgoverlay.action.insight import locks
    from pgoverlay.runner import demo
    from pgoverlay.runner.demo import job as demo_run
    from pgoverlay.runner.units import format_bytes

    p = common.pool()
    bar, update = common.seed_progress()
    rules = None if args.no_mask else demo.masking_rules()
    with bar:
        result = demo_run.run(
            p,
            branch_name=args.branch,
            scale=args.scale,
            progress=update,
            mask=rules,
            mask_progress=common.mask_progress(bar) if rules else None,
        )
    masked = result.base.masked
    out.print(
        f"[bold]base[/] {result.base.name} v{result.base.version}: "
        f"{format_bytes(result.base.size_bytes)} of sample data, "
        + (f"masked by {result.base.mask_rules}" if masked else "not masked")
    )
    out.print(f"[bold]branch[/] {result.branch.name} on port {result.branch.port}")
    for m in result.migrations:
        where = f" at {m.file}:{m.line}" if m.line else ""
        detail = f": {m.error}{where}" if m.error else ""
        out.print(f"  migration {m.name}: {m.status}{detail} ({m.seconds:.2f} s)")
        if m.insight is not None:
            out.print(f"    {escape(m.insight.verdict.text)}", highlight=False)
            tables = locks.per_table(m.insight.locks)
            blocking = [table for table in tables if table.blocks != "ddl"]
            for table in blocking:
                out.print(
                    f"    {escape(table.what(str))}: blocks {table.blocks}, "
                    f"held {locks.seconds_text(table.held_seconds)}",
                    highlight=False,
                )
            if len(tables) > len(blocking):
                others = len(tables) - len(blocking)
                out.print(
                    f"    and {others} table(s) locked in a mode that blocks other DDL only",
                    highlight=False,
                )
    out.print(
        f"[bold]writable layer[/] {format_bytes(result.layer.logical_bytes)} logical, "
        f"{format_bytes(result.layer.physical_bytes)} physical"
    )
    for step, seconds in result.timings.items():
        out.print(f"  {step}: {seconds:.2f} s")
    out.print(f'[bold]connect[/] psql "$(pgoverlay branch connect {result.branch.name})"')
    _way_in(p, result.branch.name, masked=masked)
    out.print(f"[bold]destroy[/] pgoverlay branch destroy {result.branch.name}")
    failed = any(m.status == "failed" for m in result.migrations)
    return MigrationError.exit_code if failed else 0


def _way_in(p: Pool, name: str, *, masked: bool) -> None:
    """The branch through the front door, and how a person gets in."""
    from pgoverlay.runner.demo import door

    settings = p.settings
    reached = door.connect(p, name, masked=masked)
    out.print(
        f"[bold]front door[/] {reached.started}; a preview app's credential connected as "
        f"{reached.role} to {reached.database} over TLS ({reached.sslmode}) and saw "
        f"{reached.tables} tables",
        highlight=False,
    )
    if reached.fingerprint:
        out.print(f"  its own certificate, SHA-256 {reached.fingerprint}", highlight=False)
    seen = reached.reviewer
    if seen is not None:
        out.print(
            f"[bold]reviewer[/] a read-only credential for GitHub user {seen.role} connected "
            f"the same way and read {seen.customers:,} customers, "
            f"{seen.made_up_emails:,} of their emails made up (@example.com)",
            highlight=False,
        )
    out.print(
        f"[bold]way in[/] {settings.page_url(name)} (GitHub sign-in, once "
        "PGOVERLAY_OAUTH_CLIENT_ID is set), or by hand, as root: "
        f"pgoverlay access grant {name} --github-login YOUR-LOGIN --read-only",
        highlight=False,
    )
    if seen is None:
        out.print(
            "  its base is not masked: personal credentials need "
            "PGOVERLAY_ACCESS_UNMASKED=true (the admin's choice for production's data)"
        )


def register(sub: Subcommands) -> None:
    demo_cmd = sub.add_parser(
        "demo", help="seed the demo base if needed, branch it, apply examples"
    )
    demo_cmd.add_argument("--scale", type=int, default=10)
    demo_cmd.add_argument("--branch", default="demo")
    demo_cmd.add_argument(
        "--no-mask",
        action="store_true",
        help="seed the demo base without its masking rules (then no reviewer gets a credential "
        "unless PGOVERLAY_ACCESS_UNMASKED=true)",
    )
    demo_cmd.set_defaults(func=cmd_demo)
