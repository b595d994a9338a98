"""The `pgoverlay` command: parse arguments, call one core function, format the result."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from pgoverlay.errors import BranchMissingError, ConfigError, MigrationError, PgoverlayError
from pgoverlay.runner import branch, demo, doctor, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.branch.sizes import format_bytes
from pgoverlay.runner.demo import job as demo_run
from pgoverlay.runner.names import check_name, parse_duration
from pgoverlay.runner.pool import Pool, gc, maintenance
from pgoverlay.runner.runtime.choose import RUNTIMES
from pgoverlay.runner.seed import bases, credentials
from pgoverlay.runner.service.engine import Engine, LocalEngine
from pgoverlay.runner.service.models import BranchView, CreateRequest, Layer
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.settings import load as load_settings

if TYPE_CHECKING:
    from pgoverlay.webhook.settings import WebhookSettings

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

Handler = Callable[[argparse.Namespace], int]


def _settings() -> Settings:
    try:
        return load_settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "settings"
        raise ConfigError(f"bad setting PGOVERLAY_{field.upper()}: {first['msg']}") from None


def _pool() -> Pool:
    return Pool.open(_settings())


def _size(n: int) -> str:
    return format_bytes(n)


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _seed_progress() -> tuple[Progress, Callable[[int, int], None]]:
    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    )
    task = bar.add_task("pg_basebackup", total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update


# -- pool, doctor, gc ---------------------------------------------------------------------


def cmd_pool_init(args: argparse.Namespace) -> int:

    p = poolmod.init(_settings(), size=args.size, allow_plain=args.allow_plain_overlay)
    if p.info.mode == "plain":
        err.print(f"[yellow]warning:[/] {poolmod.PLAIN_COST}")
    info = poolmod.describe(p)
    out.print(
        f"pool ready at {info['home']}: {info['mode']} mode on {info['filesystem']}, "
        f"{_size(int(info['free_bytes']))} free of {_size(int(info['size_bytes']))}"
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


def cmd_service(args: argparse.Namespace) -> int:
    """The engine service, in the foreground (systemd's ExecStart, or `pool init`'s child)."""
    if args.openapi:
        from pgoverlay.runner.service.app import openapi_document

        sys.stdout.write(openapi_document())
        return 0
    from pgoverlay.runner.service import serve

    logging.getLogger().setLevel(logging.INFO)
    serve.serve(_settings())
    return 0


def cmd_pool_status(args: argparse.Namespace) -> int:

    info = poolmod.describe(_pool())
    if args.json:
        _print_json(info)
    else:
        for key, value in info.items():
            out.print(f"{key}: {_size(value) if key.endswith('bytes') else value}")
    return 0


def cmd_pool_down(args: argparse.Namespace) -> int:

    settings = _settings()
    stopped = maintenance.down(settings)
    out.print(
        f"pool at {settings.home} is down: stopped branches: {', '.join(stopped) or 'none'}; "
        "everything is unmounted, the registry is kept",
        soft_wrap=True,
    )
    out.print("bring it back with: pgoverlay pool init")
    return 0


def cmd_pool_rm(args: argparse.Namespace) -> int:

    settings = _settings()
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

    checks = doctor.run(_settings())
    if args.json:
        _print_json([c.__dict__ for c in checks])
    else:
        colour = {"ok": "green", "warn": "yellow", "fail": "red"}
        for c in checks:
            out.print(f"[{colour[c.verdict]}]{c.verdict.upper():4}[/] {c.name}: {c.detail}")
    return 4 if doctor.blocking(checks) else 0


def cmd_gc(args: argparse.Namespace) -> int:
    report = _engine().gc()
    for line in report.lines:
        out.print(line)
    return 1 if report.problems else 0


# -- seed ---------------------------------------------------------------------------------


def cmd_seed(args: argparse.Namespace) -> int:

    if args.name == "list" and not args.source and not args.demo:
        return cmd_seed_list(args)
    if args.name == "rm" and not args.source and not args.demo:
        return cmd_seed_rm(args)
    if args.base is not None:
        raise ConfigError(
            f"seed takes one base name, got {args.name!r} and {args.base!r} "
            "(`pgoverlay seed rm NAME` removes a base)"
        )
    if args.version is not None or args.destroy_branches:
        raise ConfigError("--version and --destroy-branches go with `pgoverlay seed rm NAME`")
    if bool(args.source) == bool(args.demo):
        raise ConfigError("seed needs exactly one of --from DSN or --demo")
    if args.mask and args.no_mask:
        raise ConfigError("seed takes --mask RULES or --no-mask, not both")
    if args.demo and args.mask:
        raise ConfigError("--mask works with --from DSN; the demo's data is made up already")
    if args.password_file and args.demo:
        raise ConfigError("--password-file works with --from DSN; the demo needs no password")
    auth = (
        credentials.resolve(password_file=args.password_file, environ=os.environ, home=_home())
        if args.source
        else credentials.NONE
    )
    p = _pool()
    bar, update = _seed_progress()

    def ask_password(label: str) -> str:
        bar.stop()  # the prompt needs the terminal the progress bar draws on
        try:
            return getpass.getpass(f"password for the source {label}: ")
        finally:
            bar.start()

    started = time.monotonic()
    with bar:
        if args.demo:
            base = demo.seed_demo(
                p, args.name, scale=args.scale, refresh=args.refresh, progress=update
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
                allow_unmasked=args.no_mask,
                runtime=args.runtime,
            )
    masking = f"masked by {base.mask_label}" if base.masked else "not masked"
    out.print(
        f"base {base.name} version {base.version} ready: Postgres {base.pg_major}, "
        f"{_size(base.size_bytes)}, from {base.source}, {masking}, in "
        f"{time.monotonic() - started:.1f} s"
    )
    return 0


def _home() -> Path | None:
    try:
        return Path.home()
    except RuntimeError:
        return None


def _seed_list_from_service(args: argparse.Namespace) -> int:
    """A workflow's user sees the bases as the engine service shows them."""
    from pgoverlay.runner.service.client import client

    bases = client(_settings()).bases()
    if getattr(args, "json", False):
        _print_json([b.model_dump() for b in bases])
        return 0
    table = Table("base", "version", "state", "postgres", "size", "seeded", "masked", "branches")
    for b in bases:
        table.add_row(
            b.name,
            str(b.version),
            b.state,
            str(b.pg_major or "-"),
            _size(b.size_bytes),
            _when(b.prepared_at or b.created_at),
            f"{b.mask_rules} (sha256 {b.mask_sha256[:12]})" if b.masked else "no",
            str(b.branches),
        )
    out.print(table)
    return 0


def cmd_seed_list(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        return _seed_list_from_service(args)
    p = _pool()
    bases = p.registry.bases()
    refs: dict[tuple[str, int], int] = {}
    for br in p.registry.branches():
        key = (br.base_name, br.base_version)
        refs[key] = refs.get(key, 0) + 1
    if getattr(args, "json", False):
        _print_json(
            [
                {
                    **b.__dict__,
                    "neutralised": b.neutralised_notes if b.locked_down else None,
                    "branches": refs.get((b.name, b.version), 0),
                }
                for b in bases
            ]
        )
        return 0
    table = Table(
        "base",
        "version",
        "state",
        "postgres",
        "size",
        "source",
        "via",
        "start LSN",
        "seeded",
        "masked",
        "neutralised",
        "branches",
    )
    for b in bases:
        table.add_row(
            b.name,
            str(b.version),
            b.state,
            str(b.pg_major or "-"),
            _size(b.size_bytes),
            f"{b.source} ({b.source_role})" if b.source_role else b.source,
            b.via,
            b.start_lsn or "-",
            _when(b.prepared_at or b.created_at),
            b.mask_label if b.masked else "no",
            str(len(b.neutralised_notes)) if b.locked_down else "not locked down",
            str(refs.get((b.name, b.version), 0)),
        )
    out.print(table)
    for b in bases:
        for note in b.neutralised_notes:
            out.print(f"{b.name} v{b.version} neutralised: {note}", soft_wrap=True)
    return 0


def cmd_seed_rm(args: argparse.Namespace) -> int:

    if args.base is None:
        raise ConfigError("seed rm needs the base's name: pgoverlay seed rm NAME")
    removed = bases.remove(
        _pool(), args.base, version=args.version, destroy_branches=args.destroy_branches
    )
    versions = ", ".join(f"v{v}" for v in removed.versions)
    out.print(f"base {removed.name} removed ({versions})")
    if removed.branches:
        out.print(f"destroyed branches: {', '.join(removed.branches)}")
    return 0


# -- branches -----------------------------------------------------------------------------


def _engine() -> Engine:
    """Root works on the engine directly; anyone else asks the engine service, so an admin
    and a workflow see the same branches, the same errors and the same limits."""
    settings = _settings()
    if os.geteuid() == 0:
        return LocalEngine(Pool.open(settings))
    from pgoverlay.runner.service.client import client

    return client(settings)


def _branch_dict(b: BranchView) -> dict[str, Any]:
    data = b.model_dump(exclude={"layer", "record", "seconds"})
    if b.layer is not None:
        data["layer_logical_bytes"] = b.layer.logical_bytes
        data["layer_physical_bytes"] = b.layer.physical_bytes
    return data


def cmd_branch_create(args: argparse.Namespace) -> int:
    engine = _engine()
    ttl = parse_duration(args.ttl) if args.ttl else None
    started = time.monotonic()
    b = engine.create(
        CreateRequest(
            name=check_name(args.name),
            base=check_name(args.base, what="base") if args.base else None,
            ttl_seconds=ttl,
            runtime=None if args.runtime in (None, "auto") else args.runtime,
        )
    )
    elapsed = time.monotonic() - started
    if args.json:
        _print_json({**_branch_dict(b), "seconds": round(elapsed, 3)})
    else:
        out.print(
            f"branch {b.name} ready in {elapsed:.2f} s on port {b.port} "
            f"(base {b.base} v{b.base_version})"
        )
        out.print(f"connect: pgoverlay branch connect {b.name}")
    return 0


def cmd_branch_destroy(args: argparse.Namespace) -> int:
    if _engine().destroy(check_name(args.name)).destroyed:
        out.print(f"branch {args.name} destroyed")
    else:
        out.print(f"no branch {args.name}: nothing to destroy")
    return 0


def cmd_branch_reset(args: argparse.Namespace) -> int:
    started = time.monotonic()
    b = _engine().reset(check_name(args.name))
    out.print(
        f"branch {b.name} reset to base {b.base} v{b.base_version} in "
        f"{time.monotonic() - started:.2f} s (same port {b.port} and password)"
    )
    return 0


def cmd_branch_list(args: argparse.Namespace) -> int:
    rows = _engine().branches(layer=True)
    if args.json:
        _print_json([_branch_dict(b) for b in rows])
        return 0
    table = Table(
        "branch",
        "state",
        "running",
        "base",
        "port",
        "layer (logical)",
        "layer (physical)",
        "for",
        "created",
        "expires",
    )
    for b in rows:
        layer = b.layer or Layer(logical_bytes=0, physical_bytes=0)
        table.add_row(
            b.name,
            b.state,
            "yes" if b.running else "no",
            f"{b.base} v{b.base_version}",
            str(b.port),
            _size(layer.logical_bytes),
            _size(layer.physical_bytes),
            f"{b.repository}#{b.pr}" if b.pr else (b.repository or f"uid {b.owner_uid}"),
            _when(b.created_at),
            _when(b.expires_at),
        )
    out.print(table)
    return 0


def cmd_branch_status(args: argparse.Namespace) -> int:
    if args.config:
        p = _pool()
        changed = branch.overrides(p, args.name)
        if args.json:
            _print_json([o.__dict__ for o in changed])
            return 0
        table = Table("setting", "branch", "base")
        for o in changed:
            table.add_row(o.name, o.branch_value, o.base_value or "(default)")
        out.print(table)
        return 0
    found = _engine().branch(check_name(args.name), layer=True)
    if found is None:
        raise BranchMissingError(
            f"no branch named {args.name}: see `pgoverlay branch list`, or create it with "
            f"`pgoverlay branch create {args.name}`"
        )
    data = _branch_dict(found)
    if args.json:
        _print_json(data)
        return 0
    for key, value in data.items():
        if key.endswith("_bytes"):
            value = _size(int(value))
        elif key.endswith("_at"):
            value = _when(value)
        out.print(f"{key}: {value}")
    return 0


def cmd_branch_connect(args: argparse.Namespace) -> int:
    c = _engine().connection(check_name(args.name))
    # The one place a password is printed: the user asked for it, on their own terminal.
    sys.stdout.write((c.url if args.url else c.dsn) + "\n")
    return 0


def cmd_branch_size(args: argparse.Namespace) -> int:
    size = _engine().size(check_name(args.name))
    if args.json:
        _print_json({"logical_bytes": size.logical_bytes, "physical_bytes": size.physical_bytes})
    else:
        out.print(
            f"{args.name}: {_size(size.logical_bytes)} logical, "
            f"{_size(size.physical_bytes)} physical (not shared with the base)"
        )
    return 0


# -- demo ---------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    p = _pool()
    bar, update = _seed_progress()
    with bar:
        result = demo_run.run(p, branch_name=args.branch, scale=args.scale, progress=update)
    out.print(
        f"[bold]base[/] {result.base.name} v{result.base.version}: "
        f"{_size(result.base.size_bytes)} of sample data"
    )
    out.print(f"[bold]branch[/] {result.branch.name} on port {result.branch.port}")
    for m in result.migrations:
        where = f" at {m.file}:{m.line}" if m.line else ""
        detail = f": {m.error}{where}" if m.error else ""
        out.print(f"  migration {m.name}: {m.status}{detail} ({m.seconds:.2f} s)")
    out.print(
        f"[bold]writable layer[/] {_size(result.layer.logical_bytes)} logical, "
        f"{_size(result.layer.physical_bytes)} physical"
    )
    for step, seconds in result.timings.items():
        out.print(f"  {step}: {seconds:.2f} s")
    out.print(f'[bold]connect[/] psql "$(pgoverlay branch connect {result.branch.name})"')
    out.print(f"[bold]destroy[/] pgoverlay branch destroy {result.branch.name}")
    failed = any(m.status == "failed" for m in result.migrations)
    return MigrationError.exit_code if failed else 0


# -- the GitHub Action --------------------------------------------------------------------


def cmd_action_run(args: argparse.Namespace) -> int:
    from pgoverlay.action import main as action_main

    return action_main.main_from_env(destroy=args.action_command == "destroy")


# -- the webhook listener -------------------------------------------------------------------


def cmd_webhook_setup(args: argparse.Namespace) -> int:
    from pgoverlay.webhook import account

    account.setup(
        user=args.user,
        state_dir=Path(args.state_dir),
        group=_settings().service_group,
        say=lambda line: print(f"pgoverlay: {line}"),
    )
    print(f"pgoverlay: {args.user} is ready to run the webhook listener")
    return 0


def _webhook_settings() -> WebhookSettings:
    """The listener's settings and its log format (both processes log alike)."""
    from pgoverlay.webhook import sandbox
    from pgoverlay.webhook.settings import WebhookSettings
    from pgoverlay.webhook.worker import JobLogContext

    sandbox.check()  # never as root; each job's code gets a uid of its own
    os.umask(0o077)  # the queue, its journals and the jobs' trees: the listener's alone
    try:
        settings = WebhookSettings()  # type: ignore[call-arg]
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        raise ConfigError(
            f"webhook setting {where}: {first['msg']} (PGOVERLAY_WEBHOOK_* or the file named by "
            "PGOVERLAY_WEBHOOK_CONFIG)"
        ) from None
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(JobLogContext())
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s delivery=%(delivery_id)s pr=%(pr)s %(message)s"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    return settings


def cmd_webhook_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from pgoverlay.runner.service.client import client as service_client
    from pgoverlay.webhook.app import create_app
    from pgoverlay.webhook.process import KILL_WAIT, WorkerProcess

    settings = _webhook_settings()
    runner = _settings()
    engine = service_client(runner)
    try:
        engine.bases()  # fails early, with how to fix it, if the engine service is not there
    finally:
        engine.close()
    settings.make_state_dir()
    worker = WorkerProcess(grace=settings.shutdown_grace + KILL_WAIT, nice=settings.worker_nice)
    app = create_app(settings, settings.queue_file(), worker=worker, runner=runner)
    uvicorn.run(
        app,
        host=args.host or settings.host,
        port=args.port or settings.port,
        log_config=None,
        timeout_graceful_shutdown=int(settings.shutdown_grace) + 5,
    )
    return 0


def cmd_webhook_work(args: argparse.Namespace) -> int:
    from pgoverlay.webhook.service import work

    return work(_webhook_settings(), _settings())


# -- parser -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgoverlay",
        description="Copy-on-write Postgres branches on a self-hosted runner.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True)

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

    seed_cmd = sub.add_parser(
        "seed",
        help="seed a base from a running Postgres (`seed list` lists bases, `seed rm NAME` "
        "removes one)",
    )
    seed_cmd.add_argument("name", help="base name, or `list`, or `rm`")
    seed_cmd.add_argument("base", nargs="?", metavar="NAME", help="with `rm`: the base to remove")
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
        choices=RUNTIMES,
        help="where pg_basebackup and the prepare step run: `docker` runs them in a container "
        "of PGOVERLAY_DOCKER_IMAGE (no Postgres needed on the host); `auto` (the default) uses "
        "this host's binaries of the source's version when it has them",
    )
    seed_cmd.add_argument("--json", action="store_true", help="with `seed list`: JSON output")
    seed_cmd.add_argument(
        "--version", type=int, metavar="N", help="with `seed rm`: remove only version N"
    )
    seed_cmd.add_argument(
        "--destroy-branches",
        action="store_true",
        help="with `seed rm`: destroy the branches that use the base, then remove it",
    )
    seed_cmd.set_defaults(func=cmd_seed)

    br = sub.add_parser(
        "branch", help="create, reset, destroy and inspect branches"
    ).add_subparsers(dest="branch_command", required=True)
    create = br.add_parser("create", help="create a branch and wait until it accepts connections")
    create.add_argument("name")
    create.add_argument("--base", help="base name (default: the only base)")
    create.add_argument("--ttl", help="destroy after this long (e.g. 7d, 12h); reaped by gc")
    create.add_argument(
        "--runtime",
        choices=RUNTIMES,
        help="where the branch runs (default: PGOVERLAY_RUNTIME, itself `auto`: Docker when "
        "its daemon answers, otherwise a local process)",
    )
    create.add_argument("--json", action="store_true")
    create.set_defaults(func=cmd_branch_create)
    for verb, func, text in (
        ("destroy", cmd_branch_destroy, "destroy a branch (idempotent)"),
        ("reset", cmd_branch_reset, "discard every change of a branch"),
    ):
        p = br.add_parser(verb, help=text)
        p.add_argument("name")
        p.set_defaults(func=func)
    blist = br.add_parser("list", help="list branches with their writable-layer sizes")
    blist.add_argument("--json", action="store_true")
    blist.set_defaults(func=cmd_branch_list)
    st = br.add_parser("status", help="show one branch")
    st.add_argument("name")
    st.add_argument("--json", action="store_true")
    st.add_argument(
        "--config",
        action="store_true",
        help="the settings pgoverlay imposes that differ from the base's own",
    )
    st.set_defaults(func=cmd_branch_status)
    conn = br.add_parser("connect", help="print the branch's connection string (with password)")
    conn.add_argument("name")
    conn.add_argument("--url", action="store_true", help="print a postgresql:// URL instead")
    conn.set_defaults(func=cmd_branch_connect)
    size = br.add_parser("size", help="writable-layer size: logical and physical exclusive bytes")
    size.add_argument("name")
    size.add_argument("--json", action="store_true")
    size.set_defaults(func=cmd_branch_size)

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

    demo_cmd = sub.add_parser(
        "demo", help="seed the demo base if needed, branch it, apply examples"
    )
    demo_cmd.add_argument("--scale", type=int, default=10)
    demo_cmd.add_argument("--branch", default="demo")
    demo_cmd.set_defaults(func=cmd_demo)

    action_cmds = sub.add_parser(
        "action", help="run the PR workflow inside a GitHub Actions job (used by action.yml)"
    ).add_subparsers(dest="action_command", required=True)
    for verb, text in (
        ("run", "create or reset, migrate, comment; destroy on close"),
        ("destroy", "destroy the job's branch and update the comment"),
    ):
        action_cmds.add_parser(verb, help=text).set_defaults(func=cmd_action_run)
    hooks = sub.add_parser("webhook", help="the optional webhook listener").add_subparsers(
        dest="webhook_command", required=True
    )
    serve = hooks.add_parser("serve", help="serve POST /webhook, /healthz and /metrics")
    serve.add_argument("--host", help="address to listen on (default from settings)")
    serve.add_argument("--port", type=int, help="port to listen on (default from settings)")
    serve.set_defaults(func=cmd_webhook_serve)
    hooks.add_parser(
        "work", help="run the listener's jobs and reconcile (`serve` starts and stops it)"
    ).set_defaults(func=cmd_webhook_work)
    hook_setup = hooks.add_parser(
        "setup",
        help="as root: make the listener's user, its state folder and its subordinate id range",
    )
    hook_setup.add_argument("--user", default="pgoverlay-webhook", help="the listener's user")
    hook_setup.add_argument(
        "--state-dir",
        default="/var/lib/pgoverlay-webhook",
        help="the listener's state folder (its `state_dir` setting)",
    )
    hook_setup.set_defaults(func=cmd_webhook_setup)
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
