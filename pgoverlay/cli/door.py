"""`pgoverlay door`: the front door (the Postgres router and the branch pages), in the
foreground or started in the background."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pgoverlay.cli import common
from pgoverlay.cli.common import Subcommands, out

if TYPE_CHECKING:
    from pgoverlay.runner.settings import Settings


def cmd_door(args: argparse.Namespace) -> int:
    import logging

    settings = common.settings()
    if args.start or args.restart or args.stop:
        return _control(args, settings)
    # the door's own process: it never loads ``control``, which is root's (tests/importgraph.py)
    from pgoverlay.runner.door import serve

    logging.getLogger().setLevel(logging.INFO)
    serve.serve(settings)
    return 0


def _control(args: argparse.Namespace, settings: Settings) -> int:
    from pgoverlay.runner.door import control

    if args.start:
        out.print(control.start(settings))
        return 0
    if args.restart:
        out.print(control.restart(settings))
        return 0
    if args.stop:
        stopped = control.stop_door(settings)
        out.print("stopped the front door" if stopped else "no front door of this pool was running")
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
