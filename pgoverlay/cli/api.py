"""`pgoverlay api token`: issue, list and revoke the API tokens the network API accepts from a
caller that is not a GitHub Actions job (the webhook listener on another host). Root's: the
token store is root's alone."""

from __future__ import annotations

import argparse
import os
import sys

from pgoverlay.cli import common
from pgoverlay.cli.common import Subcommands, out
from pgoverlay.runner.names import parse_seconds


def _by() -> str:
    """Who ran the command, for the audit line: the sudo caller's login when there is one."""
    return f"uid:{os.getuid()}" + (
        f" ({os.environ['SUDO_USER']})" if "SUDO_USER" in os.environ else ""
    )


def cmd_token_issue(args: argparse.Namespace) -> int:
    from pgoverlay.runner.pool import require_root
    from pgoverlay.runner.service import tokens

    require_root()
    ttl = parse_seconds(args.expires, whole=True)
    token, stored = tokens.issue(
        common.settings().home,
        name=args.name,
        owners=args.owner,
        repositories=args.repository or (),
        ttl=ttl,
        by=_by(),
    )
    out.line(
        f"API token {stored.name} for {stored.scope}, valid until "
        f"{common.when(stored.expires_at)}; it is shown once, here (the pool keeps only its "
        "SHA-256):"
    )
    # The one place a token is printed: the admin asked for it, on their own terminal, to put
    # in the listener's server_token_file. It is in no log.
    sys.stdout.write(token + "\n")
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    from pgoverlay.runner.pool import require_root
    from pgoverlay.runner.service import tokens

    require_root()
    found = tokens.load(common.settings().home)
    if args.json:
        common.print_json(
            [
                {
                    "name": t.name,
                    "owners": list(t.owners),
                    "repositories": list(t.repositories),
                    "created_at": t.created_at,
                    "expires_at": t.expires_at,
                }
                for t in found
            ]
        )
        return 0
    from pgoverlay.cli.table import render

    cells = [(t.name, t.scope, common.when(t.created_at), common.when(t.expires_at)) for t in found]
    out.write(render(("name", "scope", "created", "expires"), cells))
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from pgoverlay.runner.pool import require_root
    from pgoverlay.runner.service import tokens

    require_root()
    if tokens.revoke(common.settings().home, args.name, by=_by()):
        out.line(f"API token {args.name} revoked: the network API refuses it from now on")
    else:
        out.line(f"there is no API token named {args.name}: nothing to revoke")
    return 0


def register(sub: Subcommands) -> None:
    api = sub.add_parser("api", help="the network API's credentials").add_subparsers(
        dest="api_command", required=True
    )
    token = api.add_parser(
        "token", help="API tokens for a caller that is not a GitHub Actions job (the listener)"
    ).add_subparsers(dest="token_command", required=True)
    issue = token.add_parser("issue", help="make a token and print it, once")
    issue.add_argument("name", help="the token's name (e.g. listener-ci), for list and revoke")
    issue.add_argument(
        "--owner",
        action="append",
        required=True,
        metavar="OWNER",
        help="an account whose repositories it may act for (repeat for more)",
    )
    issue.add_argument(
        "--repository",
        action="append",
        metavar="OWNER/NAME",
        help="only these repositories of the owners (repeat for more; default: all of them)",
    )
    issue.add_argument("--expires", default="90d", help="valid this long (default 90d)")
    issue.set_defaults(func=cmd_token_issue)
    listing = token.add_parser("list", help="the tokens issued (names and scopes, no secrets)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_token_list)
    revoke = token.add_parser("revoke", help="refuse a token from now on")
    revoke.add_argument("name")
    revoke.set_defaults(func=cmd_token_revoke)
