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
    if args.restart:
        out.print(serve.restart(settings))
        return 0
    if args.stop:
        stopped = serve.stop_door(settings)
        out.print("stopped the front door" if stopped else "no front door of this pool was running")
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
    how = door_cmd.add_mutually_exclusive_group()
    how.add_argument(
        "--start",
        action="store_true",
        help="start it in the background (its systemd unit when installed) and return; one "
        "running with other settings is restarted with these",
    )
    how.add_argument("--stop", action="store_true", help="stop this pool's front door")
    how.add_argument(
        "--restart",
        action="store_true",
        help="stop it if it runs, and start it with these settings",
    )
    door_cmd.set_defaults(func=cmd_door)
