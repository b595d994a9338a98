"""The `pgoverlay` command: parse arguments, call one core function, format the result.

One module per command group, each registering its subcommands: pool.py (pool and doctor),
seed.py, branch.py, service.py (service and gc), demo.py, action.py and webhook.py; common.py
holds what they share.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from pgoverlay.cli import action, branch, demo, pool, seed, service, webhook
from pgoverlay.cli.common import err
from pgoverlay.errors import PgoverlayError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgoverlay",
        description="Copy-on-write Postgres branches on a self-hosted runner.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True)

    for group in (pool, seed, branch, service, demo, action, webhook):
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(
        level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        return int(args.func(args))
    except PgoverlayError as exc:
        err.print(f"[red]error:[/] {exc}", soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
