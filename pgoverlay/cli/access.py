"""`pgoverlay access`: grant, list and revoke credentials in a branch, through the front door."""

from __future__ import annotations

import argparse
import sys

from pgoverlay.cli import common
from pgoverlay.cli.common import Subcommands, out
from pgoverlay.errors import ConfigError
from pgoverlay.runner.names import check_name, parse_seconds


def cmd_access_grant(args: argparse.Namespace) -> int:
    from pgoverlay.runner.service.models import GrantRequest

    if args.app == (args.github_login is not None):
        raise ConfigError("name a person (--github-login LOGIN) or ask for the app's role (--app)")
    ttl = int(parse_seconds(args.ttl, whole=True)) if args.ttl else None
    g = common.engine().grant(
        check_name(args.branch),
        GrantRequest(
            login=args.github_login,
            read_only=args.read_only,
            ttl=ttl,
            repository=args.repository,
            app=args.app,
            rotate=args.rotate,
        ),
    )
    from pgoverlay.runner.door import dsn, tls

    settings = common.settings()
    kind = "read-only" if g.read_only else "read-write"
    who = "the app" if g.app else g.login
    if g.renewed:
        out.line(
            f"the app's {kind} credential in branch {g.branch}, as its preview deployment holds "
            f"it, renewed until {common.when(g.expires_at)} (--rotate gives it a new password, "
            "which the deployed preview then lacks):",
        )
    else:
        out.line(
            f"{kind} credential for {who} in branch {g.branch}, valid until "
            f"{common.when(g.expires_at)}; its password is shown once, here:",
        )
    rootcert = settings.door_rootcert
    # The one place a credential's password is printed: the admin asked for it, on their own
    # terminal, to hand it on. It is in no log.
    sys.stdout.write(
        dsn.url(
            user=g.role,
            password=g.password,
            host=g.dsn_host,
            port=g.dsn_port,
            database=g.database,
            sslrootcert=rootcert,
        )
        + "\n"
    )
    if rootcert == dsn.CERT_DOWNLOAD:
        out.line(
            f"It verifies the front door against the door's own certificate: save it as "
            f"{dsn.CERT_DOWNLOAD} where the client runs (from "
            f"{dsn.certificate_url(settings.page_origin)}, or this host's "
            f"{settings.home / 'door' / tls.CERT_NAME}; `pgoverlay doctor` shows its "
            "fingerprint)."
        )
    return 0


def cmd_access_list(args: argparse.Namespace) -> int:
    rows = common.engine().grants(check_name(args.branch))
    if args.json:
        from pgoverlay.runner.service.shape import as_dict

        common.print_json([{k: v for k, v in as_dict(g).items() if k != "password"} for g in rows])
        return 0
    from pgoverlay.cli.table import render

    cells = [
        (
            g.login,
            g.role,
            "read-only" if g.read_only else "read-write",
            "app" if g.app else "person",
            common.when(g.expires_at),
            g.granted_by,
        )
        for g in rows
    ]
    out.write(render(("login", "role", "access", "for", "expires", "granted by"), cells))
    return 0


def cmd_access_revoke(args: argparse.Namespace) -> int:
    done = common.engine().revoke(check_name(args.branch), args.login, repository=args.repository)
    if done.revoked:
        out.line(f"credential of {done.login} in branch {done.branch} revoked")
    else:
        out.line(f"{done.login} has no credential in branch {done.branch}: nothing to revoke")
    return 0


def register(sub: Subcommands) -> None:
    acc = sub.add_parser(
        "access", help="personal and preview-app credentials in a branch"
    ).add_subparsers(dest="access_command", required=True)
    grant = acc.add_parser(
        "grant",
        help="make a login role in a branch and print its connection URL, with its password, once",
    )
    grant.add_argument("branch")
    grant.add_argument("--github-login", metavar="LOGIN", help="the person's GitHub login")
    grant.add_argument(
        "--app", action="store_true", help="the pull request's preview app's role instead"
    )
    grant.add_argument(
        "--rotate",
        action="store_true",
        help="with --app: a new password (the deployed preview's stops working); without it, "
        "the app's credential is renewed as it is",
    )
    grant.add_argument(
        "--read-only", action="store_true", help="read everything, write nothing (Postgres 14+)"
    )
    grant.add_argument(
        "--ttl", help="valid this long (e.g. 8h, 2d; default PGOVERLAY_ACCESS_TTL, 8 hours)"
    )
    grant.add_argument(
        "--repository", metavar="OWNER/NAME", help="refuse unless the branch is this repository's"
    )
    grant.set_defaults(func=cmd_access_grant, lean=True)
    listing = acc.add_parser("list", help="the credentials granted in a branch (no passwords)")
    listing.add_argument("branch")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_access_list, lean=True)
    revoke = acc.add_parser(
        "revoke", help="drop a login's role from a branch, ending its open sessions"
    )
    revoke.add_argument("branch")
    revoke.add_argument("login", help="the GitHub login (or the app role's name)")
    revoke.add_argument(
        "--repository", metavar="OWNER/NAME", help="refuse unless the branch is this repository's"
    )
    revoke.set_defaults(func=cmd_access_revoke, lean=True)
