"""`pgoverlay pool` and `doctor`: the pool and the host it lives on."""

from __future__ import annotations

import argparse
import sys

from pgoverlay.cli import common
from pgoverlay.cli.common import Subcommands, err, out
from pgoverlay.errors import ConfigError


def cmd_pool_init(args: argparse.Namespace) -> int:
    from pgoverlay.runner import pool as poolmod
    from pgoverlay.runner.pool import gc
    from pgoverlay.runner.units import format_bytes

    p = poolmod.init(common.settings(), size=args.size, allow_plain=args.allow_plain_overlay)
    if p.info.mode == "plain":
        err.print(f"[yellow]warning:[/] {poolmod.PLAIN_COST}")
    info = poolmod.describe(p)
    out.print(
        f"pool ready at {info['home']}: {info['mode']} mode on {info['filesystem']}, "
        f"{format_bytes(int(info['free_bytes']))} free of {format_bytes(int(info['size_bytes']))}"
    )
    for line in gc.collect(p).lines():
        if line != "nothing to do":
            out.print(f"recovered: {line}")
    p.close()
    from pgoverlay.runner.service import serve

    serve.ensure_group(p.settings.service_group)
    if p.settings.service_autostart:
        out.print(serve.start(p.settings))
    return 0


def cmd_pool_status(args: argparse.Namespace) -> int:
    from pgoverlay.runner import pool as poolmod
    from pgoverlay.runner.units import format_bytes

    info = poolmod.describe(common.pool())
    if args.json:
        common.print_json(info)
    else:
        for key, value in info.items():
            out.print(f"{key}: {format_bytes(value) if key.endswith('bytes') else value}")
    return 0


def cmd_pool_down(args: argparse.Namespace) -> int:
    from pgoverlay.runner.pool import maintenance

    settings = common.settings()
    stopped = maintenance.down(settings)
    out.print(
        f"pool at {settings.home} is down: stopped branches: {', '.join(stopped) or 'none'}; "
        "everything is unmounted, the registry is kept",
        soft_wrap=True,
    )
    out.print("bring it back with: pgoverlay pool init")
    return 0


def cmd_pool_rm(args: argparse.Namespace) -> int:
    from pgoverlay.runner.pool import maintenance

    settings = common.settings()
    if not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError(
                f"pool rm removes the pool at {settings.home} with every base and branch in "
                "it: pass --yes to confirm"
            )
        answer = input(
            f"remove the pool at {settings.home} with every base and branch in it? "
            "type yes to confirm: "
        )
        if answer.strip() != "yes":
            out.print("nothing removed")
            return 1

    for line in maintenance.remove(settings):
        out.print(line)
    out.print(f"pool at {settings.home} removed")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from pgoverlay.runner import doctor

    checks = doctor.run(common.settings())
    if args.json:
        common.print_json([c.__dict__ for c in checks])
    else:
        colour = {"ok": "green", "warn": "yellow", "fail": "red"}
        for c in checks:
            out.print(f"[{colour[c.verdict]}]{c.verdict.upper():4}[/] {c.name}: {c.detail}")
    return 4 if doctor.blocking(checks) else 0


def register(sub: Subcommands) -> None:
    pool_cmds = sub.add_parser("pool", help="prepare or inspect the storage pool").add_subparsers(
        dest="pool_command", required=True
    )
    init = pool_cmds.add_parser(
        "init", help="prepare PGOVERLAY_HOME (idempotent; run after a reboot)"
    )
    init.add_argument("--size", help="size of the sparse XFS image when one is made (e.g. 40G)")
    init.add_argument(
        "--allow-plain-overlay",
        action="store_true",
        help="use plain OverlayFS without reflink (every table read copies files)",
    )
    init.set_defaults(func=cmd_pool_init)
    pstatus = pool_cmds.add_parser("status", help="show the pool")
    pstatus.add_argument("--json", action="store_true")
    pstatus.set_defaults(func=cmd_pool_status)
    pool_cmds.add_parser(
        "down",
        help="stop every branch and unmount everything for maintenance (`pool init` brings "
        "it back)",
    ).set_defaults(func=cmd_pool_down)
    prm = pool_cmds.add_parser(
        "rm", help="remove the pool entirely: every branch, base, container and file"
    )
    prm.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    prm.set_defaults(func=cmd_pool_rm)

    doctor_cmd = sub.add_parser("doctor", help="check this host can run branches")
    doctor_cmd.add_argument("--json", action="store_true")
    doctor_cmd.set_defaults(func=cmd_doctor)
