"""`pgoverlay action`: the PR workflow inside a GitHub Actions job (what action.yml runs)."""

from __future__ import annotations

import argparse

from pgoverlay.cli.common import Subcommands


def cmd_action_run(args: argparse.Namespace) -> int:
    from pgoverlay.action import main as action_main

    return action_main.main_from_env(destroy=args.action_command == "destroy")


def register(sub: Subcommands) -> None:
    action_cmds = sub.add_parser(
        "action", help="run the PR workflow inside a GitHub Actions job (used by action.yml)"
    ).add_subparsers(dest="action_command", required=True)
    for verb, text in (
        ("run", "create or reset, migrate, comment; destroy on close"),
        ("destroy", "destroy the job's branch and update the comment"),
    ):
        action_cmds.add_parser(verb, help=text).set_defaults(func=cmd_action_run)
