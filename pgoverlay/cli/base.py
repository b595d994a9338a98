"""`pgoverlay base`: seed a base, list the bases, show one and its workload, give its workload,
remove one, keep branches of one warm."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pgoverlay.cli import common
from pgoverlay.cli.common import Subcommands, out
from pgoverlay.errors import BaseMissingError, ConfigError
from pgoverlay.runner.runtime import table as runtimes

if TYPE_CHECKING:
    from pgoverlay.runner.pool import Pool
    from pgoverlay.runner.service.views import BaseWorkload


def cmd_seed(args: argparse.Namespace) -> int:
    from pgoverlay.runner.units import format_bytes

    if bool(args.source) == bool(args.demo):
        raise ConfigError("base seed needs exactly one of --from DSN or --demo")
    if args.mask and args.no_mask:
        raise ConfigError("base seed takes --mask RULES or --no-mask, not both")
    if args.password_file and args.demo:
        raise ConfigError("--password-file works with --from DSN; the demo needs no password")
    from pgoverlay.runner import seed
    from pgoverlay.runner.seed import credentials

    auth = (
        credentials.resolve(
            password_file=args.password_file, environ=os.environ, home=common.home()
        )
        if args.source
        else credentials.NONE
    )
    p = common.pool()
    # A progress bar only for someone watching: elsewhere (a script, a log) nothing would be
    # drawn, and neither rich nor pg_basebackup's size estimate is paid for.
    bar, update = common.seed_progress() if sys.stderr.isatty() else (None, None)

    def ask_password(label: str) -> str:
        import getpass

        if bar is not None:
            bar.stop()  # the prompt needs the terminal the progress bar draws on
        try:
            return getpass.getpass(f"password for the source {label}: ")
        finally:
            if bar is not None:
                bar.start()

    started = time.monotonic()
    with bar if bar is not None else contextlib.nullcontext():
        if args.demo:
            from pgoverlay.runner import demo  # its sample data: only for the demo

            base = demo.seed_demo(
                p,
                args.name,
                scale=args.scale,
                refresh=args.refresh,
                progress=update,
                mask=args.mask,
                mask_progress=common.mask_progress(bar) if args.mask else None,
            )
        else:
            base = seed.seed(
                p,
                args.name,
                source_dsn=args.source,
                auth=auth,
                ask_password=ask_password if sys.stdin.isatty() else None,
                refresh=args.refresh,
                via=args.via,
                progress=update,
                mask=args.mask,
                mask_progress=common.mask_progress(bar) if args.mask else None,
                allow_unmasked=args.no_mask,
                runtime=args.runtime,
                workload_top=args.workload_top,
            )
    took = time.monotonic() - started
    masking = f"masked by {base.mask_label}" if base.masked else "not masked"
    # One plain line, not rich's: importing rich only to print it would be the last thing the
    # seed waits for, and a line wrapped at 80 columns is harder for a script to read.
    out.line(
        f"base {base.name} version {base.version} ready: Postgres {base.pg_major}, "
        f"{format_bytes(base.size_bytes)}, from {base.source}, {masking}, in {took:.1f} s"
    )
    _end_quickly(p)
    return 0


def _end_quickly(p: Pool) -> None:
    """The seed is done and said so; the process ends next. Close the registry now (its last
    WAL checkpoint, as at any exit), then take every object the seed imported or made out of
    the cyclic collector's sight: the collections Python runs while it shuts down would walk
    them all only to free memory the exit frees anyway, about 0.1 s of a seed process
    (measured with `strace -tt`: no system call between the last write and the exit). Nothing
    is left for a finaliser: connections, locks, servers and the passfile copy were closed by
    their `with` blocks, and logging is flushed by its exit handler, which still runs."""
    import gc

    p.registry.close()
    gc.freeze()


def cmd_list(args: argparse.Namespace) -> int:
    """The bases as the engine shows them; root also sees where each came from and what its
    lockdown removed (``BaseView.detail``)."""
    from pgoverlay.runner.units import format_bytes

    bases = common.engine().bases()
    if getattr(args, "json", False):
        from pgoverlay.runner.service.shape import as_dict

        listed = []
        for b in bases:
            data = as_dict(b)
            data.update(data.pop("detail") or {})
            listed.append(data)
        common.print_json(listed)
        return 0
    from pgoverlay.cli.table import render

    root = any(b.detail is not None for b in bases)
    headers = ["base", "version", "state", "postgres", "size"]
    headers += ["source", "via", "start LSN"] if root else []
    headers += ["seeded", "masked"] + (["neutralised"] if root else []) + ["branches", "warm"]
    rows = []
    for b in bases:
        row = [b.name, str(b.version), b.state, str(b.pg_major or "-"), format_bytes(b.size_bytes)]
        d = b.detail
        if d is not None:
            source = f"{d.source} ({d.source_role})" if d.source_role else d.source
            row += [source, d.via, d.start_lsn or "-"]
        row += [
            common.when(b.prepared_at or b.created_at),
            f"{b.mask_rules} (sha256 {b.mask_sha256[:12]})" if b.masked else "no",
        ]
        if root:
            notes = d.neutralised if d is not None else None
            row.append(str(len(notes)) if notes is not None else "not locked down")
        row += [
            str(b.branches),
            ", ".join(
                f"{w.runtime} {_warm_label(w.ready, w.target, w.memory_bytes_each)}" for w in b.warm
            )
            or "-",
        ]
        rows.append(row)
    out.write(render(headers, rows))
    for b in bases:
        for note in (b.detail.neutralised or []) if b.detail else []:
            out.line(f"{b.name} v{b.version} neutralised: {note}")
    return 0


def _warm_label(ready: int, target: int, memory_each: int | None) -> str:
    """`2/2 (21.4 MiB each)`: ready of wanted, and what one idle warm branch costs."""
    from pgoverlay.runner.units import format_bytes

    each = f" ({format_bytes(memory_each)} each)" if memory_each else ""
    return f"{ready}/{target}{each}"


def cmd_show(args: argparse.Namespace) -> int:
    """A base's versions and the workload kept with its newest: how many statements, and the
    first few with their rates (``--json``: all of it)."""
    from pgoverlay.runner.service.shape import as_dict

    engine = common.engine()
    versions = [b for b in engine.bases() if b.name == args.name]
    if not versions:
        raise BaseMissingError(f"no base named {args.name!r}: see `pgoverlay base list`")
    kept = engine.base_workload(args.name)
    if getattr(args, "json", False):
        common.print_json({"versions": [as_dict(b) for b in versions], "workload": as_dict(kept)})
        return 0
    from pgoverlay.runner.units import format_bytes

    for b in versions:
        masked = f"masked by {b.mask_rules}" if b.masked else "not masked"
        out.line(
            f"base {b.name} v{b.version}: {b.state}, Postgres {b.pg_major or '-'}, "
            f"{format_bytes(b.size_bytes)}, {masked}, {b.branches} branches"
        )
    out.write(_workload_text(kept, shown=args.top))
    return 0


def _workload_text(kept: BaseWorkload, *, shown: int) -> str:
    """The workload in a few lines: its count, where and when it came from, the first
    ``shown`` statements with their rates, mean times and calls."""
    if not kept.captured_at:
        return f"workload: none. {kept.note}\n"
    since = f", counted since {common.when(kept.stats_reset)}" if kept.stats_reset else ""
    lines = [
        f"workload of v{kept.version}: {len(kept.statements)} statements, from {kept.source} "
        f"{common.when(kept.captured_at)}{since}"
    ]
    lines += [f"note: {kept.note}"] if kept.note else []
    for s in kept.statements[:shown]:
        text = " ".join(s.query.split())
        text = text if len(text) <= 80 else text[:79] + "…"
        lines.append(f"  {s.per_second:9.2f}/s  {s.mean_ms:9.2f} ms  {s.calls:>10} calls  {text}")
    if len(kept.statements) > shown:
        lines.append(f"  … and {len(kept.statements) - shown} more (--json shows all)")
    return "\n".join(lines) + "\n"


def cmd_workload(args: argparse.Namespace) -> int:
    """Give or refresh the workload of a base's newest version, without seeding again."""
    from pgoverlay.runner import seed
    from pgoverlay.runner.seed import credentials

    if bool(args.source) == bool(args.file):
        raise ConfigError("base workload needs exactly one of --from DSN or --file PATH")
    auth = (
        credentials.resolve(
            password_file=args.password_file, environ=os.environ, home=common.home()
        )
        if args.source
        else credentials.NONE
    )

    def ask_password(label: str) -> str:
        import getpass

        return getpass.getpass(f"password for the source {label}: ")

    kept = seed.refresh_workload(
        common.pool(),
        args.name,
        source_dsn=args.source,
        file=args.file,
        auth=auth,
        ask_password=ask_password if sys.stdin.isatty() else None,
        top=args.top,
    )
    out.write(_workload_text(kept, shown=5))
    return 0


def cmd_warm(args: argparse.Namespace) -> int:
    """Set how many warm branches of a base to keep started, and start them now."""
    from pgoverlay.runner.branch import lookup, warm
    from pgoverlay.runner.runtime.choose import choose

    if args.count is None:
        raise ConfigError(
            "base warm needs a count: pgoverlay base warm NAME --count N "
            "(0 stops keeping warm branches of it)"
        )
    if args.count < 0 or args.count > 64:
        raise ConfigError(f"--count {args.count} is out of range: give 0 to 64")
    p = common.pool()
    base = lookup.resolve_base(p, args.name)
    runtime = choose(p.settings, "branch", requested=args.runtime, major=base.pg_major or 0).name
    done = warm.set_target(p, base.name, runtime, args.count)
    for problem in done.problems:
        common.err.print(f"[yellow]warning:[/] {problem}", soft_wrap=True)
    found = {(s.base_name, s.runtime): s for s in warm.states(p)}.get((base.name, runtime))
    if found is None:
        out.line(f"base {base.name} on {runtime}: no warm branches kept")
    else:
        label = _warm_label(found.ready, found.target, found.memory_each)
        out.line(f"base {base.name} on {runtime}: {label} warm branches")
    if done.busy:
        out.line(
            "another pgoverlay was still starting warm branches; the engine service (or "
            "`pgoverlay gc`) meets the new count when it is done"
        )
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from pgoverlay.runner.seed import bases

    removed = bases.remove(
        common.pool(), args.name, version=args.version, destroy_branches=args.destroy_branches
    )
    versions = ", ".join(f"v{v}" for v in removed.versions)
    out.print(f"base {removed.name} removed ({versions})")
    if removed.branches:
        out.print(f"destroyed branches: {', '.join(removed.branches)}")
    return 0


def register(sub: Subcommands) -> None:
    base_cmds = sub.add_parser(
        "base", help="seed, list, remove the bases branches start from, or keep some warm"
    ).add_subparsers(dest="base_command", required=True)

    seed_cmd = base_cmds.add_parser(
        "seed", help="seed a base from a running Postgres (or the demo's sample database)"
    )
    seed_cmd.add_argument("name", help="the base's name")
    seed_cmd.add_argument(
        "--from",
        dest="source",
        metavar="DSN",
        help="source connection string, without a password (it would show in `ps`)",
    )
    seed_cmd.add_argument(
        "--password-file",
        type=Path,
        metavar="PATH",
        help="a file holding the source's password (else PGPASSWORD, PGPASSFILE or ~/.pgpass; "
        "on a terminal, a prompt)",
    )
    seed_cmd.add_argument(
        "--refresh", action="store_true", help="seed a new version of an existing base"
    )
    seed_cmd.add_argument(
        "--via",
        choices=["basebackup", "dump"],
        default="basebackup",
        help="dump: for servers that refuse replication connections",
    )
    seed_cmd.add_argument(
        "--mask",
        type=Path,
        metavar="RULES",
        help="mask personal data while preparing the base, with this YAML rules file",
    )
    seed_cmd.add_argument(
        "--no-mask",
        action="store_true",
        help="refresh a masked base without masking the new version",
    )
    seed_cmd.add_argument(
        "--demo", action="store_true", help="seed from a throwaway local sample database"
    )
    seed_cmd.add_argument(
        "--scale", type=int, default=10, help="demo data scale (10 = a few hundred MB)"
    )
    seed_cmd.add_argument(
        "--runtime",
        choices=runtimes.choices(),
        help="where pg_basebackup and the prepare step run: `docker` runs them in a container "
        "of PGOVERLAY_DOCKER_IMAGE (no Postgres needed on the host); `auto` (the default) uses "
        "this host's binaries of the source's version when it has them",
    )
    seed_cmd.add_argument(
        "--workload-top",
        type=int,
        metavar="N",
        help="keep the source's N top statements from pg_stat_statements with the base, by "
        "total time (default 200; 0: none)",
    )
    seed_cmd.set_defaults(func=cmd_seed)

    _register_workload(base_cmds)

    list_cmd = base_cmds.add_parser("list", help="list the bases, their versions and warm branches")
    list_cmd.add_argument("--json", action="store_true", help="JSON output")
    list_cmd.set_defaults(func=cmd_list, lean=True)

    rm_cmd = base_cmds.add_parser(
        "rm", help="remove a base: every version of it, or one (refused while branches use it)"
    )
    rm_cmd.add_argument("name", help="the base to remove")
    rm_cmd.add_argument("--version", type=int, metavar="N", help="remove only version N")
    rm_cmd.add_argument(
        "--destroy-branches",
        action="store_true",
        help="destroy the branches that use the base, then remove it",
    )
    rm_cmd.set_defaults(func=cmd_rm)

    warm_cmd = base_cmds.add_parser(
        "warm", help="keep N branches of a base started, so `branch create` takes one at once"
    )
    warm_cmd.add_argument("name", help="the base to keep warm branches of")
    warm_cmd.add_argument(
        "--count",
        type=int,
        metavar="N",
        help="keep N branches of the base started and unclaimed, so `branch create` takes one "
        "in milliseconds (0: none, and the ones started are removed)",
    )
    warm_cmd.add_argument(
        "--runtime",
        choices=runtimes.choices(),
        help="the runtime the warm branches run on (default: the branches' runtime)",
    )
    warm_cmd.set_defaults(func=cmd_warm)


def _register_workload(base_cmds: Subcommands) -> None:
    """`base show` and `base workload`: a base's workload, read and given."""
    show_cmd = base_cmds.add_parser(
        "show", help="show a base's versions and the workload kept with its newest"
    )
    show_cmd.add_argument("name", help="the base to show")
    show_cmd.add_argument(
        "--top", type=int, default=5, metavar="N", help="statements of the workload shown"
    )
    show_cmd.add_argument("--json", action="store_true", help="JSON output, the whole workload")
    show_cmd.set_defaults(func=cmd_show, lean=True)

    workload_cmd = base_cmds.add_parser(
        "workload",
        help="give or refresh the workload (production's top statements) of a base's newest "
        "version, without seeding again",
    )
    workload_cmd.add_argument("name", help="the base")
    workload_cmd.add_argument(
        "--from",
        dest="source",
        metavar="DSN",
        help="read pg_stat_statements of this server, without a password in the DSN",
    )
    workload_cmd.add_argument(
        "--file",
        type=Path,
        metavar="PATH",
        help="an export of pg_stat_statements, CSV with a header or JSON: queryid, query, "
        "calls, total_exec_time; rows and per_second when given",
    )
    workload_cmd.add_argument(
        "--password-file",
        type=Path,
        metavar="PATH",
        help="a file holding the source's password (else PGPASSWORD, PGPASSFILE or ~/.pgpass)",
    )
    workload_cmd.add_argument(
        "--top",
        type=int,
        metavar="N",
        help="statements kept, by total time (default 200)",
    )
    workload_cmd.set_defaults(func=cmd_workload)
