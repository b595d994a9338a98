"""`pgoverlay branch`: create, reset, destroy and inspect branches."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from pgoverlay.cli import common
from pgoverlay.cli.common import Subcommands, out
from pgoverlay.errors import BranchMissingError
from pgoverlay.runner.names import check_name, parse_idle_seconds, parse_seconds
from pgoverlay.runner.runtime import table as runtimes

if TYPE_CHECKING:
    from pgoverlay.runner.service.views import BranchView


def _branch_dict(b: BranchView) -> dict[str, Any]:
    from pgoverlay.runner.service.shape import as_dict

    data: dict[str, Any] = as_dict(b)
    for detail in ("layer", "record", "seconds"):
        del data[detail]
    if b.layer is not None:
        data["layer_logical_bytes"] = b.layer.logical_bytes
        data["layer_physical_bytes"] = b.layer.physical_bytes
    return data


def cmd_branch_create(args: argparse.Namespace) -> int:
    from pgoverlay.runner.service.models import CreateRequest

    engine = common.engine()
    ttl = int(parse_seconds(args.ttl, whole=True)) if args.ttl else None
    idle = round(parse_idle_seconds(args.suspend_after)) if args.suspend_after else None
    started = time.monotonic()
    b = engine.create(
        CreateRequest(
            name=check_name(args.name),
            base=check_name(args.base, what="base") if args.base else None,
            ttl_seconds=ttl,
            runtime=None if args.runtime in (None, "auto") else args.runtime,
            repository=args.repository,
            pr=args.pr,
            suspend_after_seconds=idle,
        )
    )
    elapsed = time.monotonic() - started
    if args.json:
        common.print_json({**_branch_dict(b), "seconds": round(elapsed, 3)})
    else:
        out.line(
            f"branch {b.name} ready in {elapsed:.2f} s on port {b.port} "
            f"(base {b.base} v{b.base_version})"
        )
        out.line(f"connect: pgoverlay branch connect {b.name}")
    return 0


def cmd_branch_destroy(args: argparse.Namespace) -> int:
    if common.engine().destroy(check_name(args.name)).destroyed:
        out.line(f"branch {args.name} destroyed")
    else:
        out.line(f"no branch {args.name}: nothing to destroy")
    return 0


def cmd_branch_reset(args: argparse.Namespace) -> int:
    started = time.monotonic()
    b = common.engine().reset(check_name(args.name))
    out.line(
        f"branch {b.name} reset to base {b.base} v{b.base_version} in "
        f"{time.monotonic() - started:.2f} s (same port {b.port} and password)"
    )
    return 0


def cmd_branch_suspend(args: argparse.Namespace) -> int:
    started = time.monotonic()
    b = common.engine().suspend(check_name(args.name))
    out.line(
        f"branch {b.name} suspended in {time.monotonic() - started:.2f} s: its layer, port, "
        "password and credentials are kept; the next connection through the front door, or "
        f"`pgoverlay branch resume {b.name}`, starts it again"
    )
    return 0


def cmd_branch_resume(args: argparse.Namespace) -> int:
    started = time.monotonic()
    b = common.engine().wake(check_name(args.name))
    out.line(f"branch {b.name} is {b.state} ({time.monotonic() - started:.2f} s)")
    return 0


def cmd_branch_list(args: argparse.Namespace) -> int:
    from pgoverlay.runner.units import format_bytes

    rows = common.engine().branches(layer=True)
    if args.json:
        common.print_json([_branch_dict(b) for b in rows])
        return 0
    from pgoverlay.cli.table import render
    from pgoverlay.runner.service.views import Layer

    headers = (
        "branch",
        "state",
        "runs",
        "base",
        "port",
        "layer (logical)",
        "layer (physical)",
        "for",
        "created",
        "expires",
    )
    cells = []
    for b in rows:
        layer = b.layer or Layer(logical_bytes=0, physical_bytes=0)
        cells.append(
            (
                b.name,
                _state(b),
                {"running": "yes", "stopped": "no"}.get(b.liveness, b.liveness),
                f"{b.base} v{b.base_version}",
                str(b.port),
                format_bytes(layer.logical_bytes),
                format_bytes(layer.physical_bytes),
                f"{b.repository}#{b.pr}" if b.pr else (b.repository or f"uid {b.owner_uid}"),
                common.when(b.created_at),
                common.when(b.expires_at),
            )
        )
    out.write(render(headers, cells))
    for b in rows:
        if b.liveness == "unknown":
            out.line(f"{b.name}: could not tell whether it runs: {b.liveness_reason}")
    return 0


def cmd_branch_status(args: argparse.Namespace) -> int:
    from pgoverlay.runner.units import format_bytes

    if args.config:
        from pgoverlay.cli.table import render
        from pgoverlay.runner.branch import lookup

        p = common.pool()
        changed = lookup.overrides(p, args.name)
        if args.json:
            common.print_json([o.__dict__ for o in changed])
            return 0
        rows = [(o.name, o.branch_value, o.base_value or "(default)") for o in changed]
        out.write(render(("setting", "branch", "base"), rows))
        return 0
    found = common.engine().branch(check_name(args.name), layer=True)
    if found is None:
        raise BranchMissingError(
            f"no branch named {args.name}: see `pgoverlay branch list`, or create it with "
            f"`pgoverlay branch create {args.name}`"
        )
    data = _branch_dict(found)
    if args.json:
        common.print_json(data)
        return 0
    for key, value in data.items():
        if key.endswith("_bytes"):
            value = format_bytes(int(value))
        elif key.endswith("_at"):
            value = common.when(value)
        elif key == "suspend_after":
            value = _idle(found.suspend_after)
        elif key == "state":
            value = _state(found, how_it_wakes=True)
        out.line(f"{key}: {value}")
    return 0


def _state(b: BranchView, *, how_it_wakes: bool = False) -> str:
    """A branch's state as a person reads it: a suspended one says since when (and, with
    ``how_it_wakes``, that its next connection wakes it)."""
    if b.state != "suspended":
        return b.state
    since = f"suspended since {common.when(b.suspended_at)}"
    return f"{since}: wakes on the next connection" if how_it_wakes else since


def _idle(seconds: float | None) -> str:
    from pgoverlay.runner.units import idle_rule

    return "-" if seconds is None else idle_rule(seconds)


def cmd_branch_connect(args: argparse.Namespace) -> int:
    c = common.engine().connection(check_name(args.name))
    # The one place a password is printed: the user asked for it, on their own terminal.
    sys.stdout.write((c.url if args.url else c.dsn) + "\n")
    return 0


def cmd_branch_size(args: argparse.Namespace) -> int:
    from pgoverlay.runner.units import format_bytes

    size = common.engine().size(check_name(args.name))
    if args.json:
        common.print_json(
            {"logical_bytes": size.logical_bytes, "physical_bytes": size.physical_bytes}
        )
    else:
        out.line(
            f"{args.name}: {format_bytes(size.logical_bytes)} logical, "
            f"{format_bytes(size.physical_bytes)} physical (not shared with the base)"
        )
    return 0


def register(sub: Subcommands) -> None:
    br = sub.add_parser(
        "branch", help="create, reset, destroy and inspect branches"
    ).add_subparsers(dest="branch_command", required=True)
    create = br.add_parser("create", help="create a branch and wait until it accepts connections")
    create.add_argument("name")
    create.add_argument("--base", help="base name (default: the only base)")
    create.add_argument("--ttl", help="destroy after this long (e.g. 7d, 12h); reaped by gc")
    create.add_argument(
        "--runtime",
        choices=runtimes.choices(),
        help="where the branch runs (default: PGOVERLAY_RUNTIME, itself `auto`: Docker when "
        "its daemon answers, otherwise a local process)",
    )
    create.add_argument(
        "--repository",
        metavar="OWNER/NAME",
        help="the repository the branch is for (required of users other than root: the "
        "service's limits count it)",
    )
    create.add_argument("--pr", type=int, help="the pull request the branch is for")
    create.add_argument(
        "--suspend-after",
        help="suspend it after this long with no connection (e.g. 10m, 2h; 0: never; default "
        "PGOVERLAY_SUSPEND_AFTER); its next connection wakes it",
    )
    create.add_argument("--json", action="store_true")
    create.set_defaults(func=cmd_branch_create, lean=True)
    for verb, func, text in (
        ("destroy", cmd_branch_destroy, "destroy a branch (idempotent)"),
        ("reset", cmd_branch_reset, "discard every change of a branch"),
        ("suspend", cmd_branch_suspend, "stop an idle branch, keeping its layer"),
        ("resume", cmd_branch_resume, "start a suspended branch again"),
    ):
        p = br.add_parser(verb, help=text)
        p.add_argument("name")
        p.set_defaults(func=func, lean=True)
    blist = br.add_parser("list", help="list branches with their writable-layer sizes")
    blist.add_argument("--json", action="store_true")
    blist.set_defaults(func=cmd_branch_list, lean=True)
    st = br.add_parser("status", help="show one branch")
    st.add_argument("name")
    st.add_argument("--json", action="store_true")
    st.add_argument(
        "--config",
        action="store_true",
        help="the settings pgoverlay imposes that differ from the base's own",
    )
    st.set_defaults(func=cmd_branch_status, lean=True)
    conn = br.add_parser("connect", help="print the branch's connection string (with password)")
    conn.add_argument("name")
    conn.add_argument("--url", action="store_true", help="print a postgresql:// URL instead")
    conn.set_defaults(func=cmd_branch_connect, lean=True)
    size = br.add_parser("size", help="writable-layer size: logical and physical exclusive bytes")
    size.add_argument("name")
    size.add_argument("--json", action="store_true")
    size.set_defaults(func=cmd_branch_size, lean=True)
