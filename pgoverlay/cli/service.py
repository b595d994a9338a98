"""`pgoverlay service` and `gc`: the engine service, and finishing or undoing interrupted work."""

from __future__ import annotations

import argparse
import sys

from pgoverlay.cli import common
from pgoverlay.cli.common import Subcommands, out


def cmd_service(args: argparse.Namespace) -> int:
    """The engine service, in the foreground (systemd's ExecStart, or `pool init`'s child)."""
    if args.openapi:
        from pgoverlay.runner.service.app import openapi_document

        sys.stdout.write(openapi_document())
        return 0
    import logging

    from pgoverlay.runner.service import serve

    logging.getLogger().setLevel(logging.INFO)
    serve.serve(common.settings())
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    # Root's own: gc mends what an interrupted service (or its process) left.
    report = common.engine(service=False).gc()
    for line in report.lines:
        out.print(line)
    return 1 if report.problems else 0


def register(sub: Subcommands) -> None:
    service_cmd = sub.add_parser(
        "service",
        help="run the engine service (root): workflows ask it for branches on its Unix socket",
    )
    service_cmd.add_argument(
        "--openapi", action="store_true", help="print the service's OpenAPI document and exit"
    )
    service_cmd.set_defaults(func=cmd_service)

    gc_cmd = sub.add_parser("gc", help="finish or undo interrupted work, reap expired branches")
    gc_cmd.set_defaults(func=cmd_gc)
