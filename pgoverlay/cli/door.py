"""`pgoverlay door`: the front door (the Postgres router and the branch pages), in the
foreground or started in the background."""

from __future__ import annotations

import argparse

from pgoverlay.cli import common
from pgoverlay.cli.common import Subcommands, out


def cmd_door(args: argparse.Namespace) -> int:
    import logging

    from pgoverlay.runner.door import serve

    settings = common.settings()
    if args.start:
        out.print(serve.start(settings))
        return 0
    logging.getLogger().setLevel(logging.INFO)
    serve.serve(settings)
    return 0


def register(sub: Subcommands) -> None:
    door_cmd = sub.add_parser(
        "door",
        help="run the front door (root, then its own user): every branch on one TLS port, "
        "and the branch pages",
    )
    door_cmd.add_argument(
        "--start",
        action="store_true",
        help="start it in the background (its systemd unit when installed) and return",
    )
    door_cmd.set_defaults(func=cmd_door)
