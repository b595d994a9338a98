"""`pgoverlay webhook`: the optional listener's setup, its HTTP process and its worker."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgoverlay.webhook.settings import WebhookSettings


from pgoverlay.cli import common
from pgoverlay.cli.common import Subcommands


def cmd_webhook_setup(args: argparse.Namespace) -> int:
    from pgoverlay.runner import listener as account

    account.setup(
        user=args.user,
        state_dir=Path(args.state_dir),
        group=common.settings().service_group,
        say=lambda line: print(f"pgoverlay: {line}"),
    )
    print(f"pgoverlay: {args.user} is ready to run the webhook listener")
    return 0


def _webhook_settings() -> WebhookSettings:
    """The listener's settings and its log format (both processes log alike)."""
    import logging

    from pgoverlay.webhook import sandbox
    from pgoverlay.webhook.settings import load
    from pgoverlay.webhook.worker import LOG_FORMAT, JobLogContext

    sandbox.check()  # never as root; each job's code gets a uid of its own
    os.umask(0o077)  # the queue, its journals and the jobs' trees: the listener's alone
    settings = load()
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(JobLogContext())
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    return settings


def cmd_webhook_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from pgoverlay.webhook.app import create_app
    from pgoverlay.webhook.engines import Engines
    from pgoverlay.webhook.process import KILL_WAIT, WorkerProcess

    settings = _webhook_settings()
    runner = common.settings()
    # Fails early, with how to fix it, if the engine service is not there (or, for a pool on
    # another host, the token file or the server's URL or certificate are not right).
    Engines(settings, runner).check()
    settings.make_state_dir()
    worker = WorkerProcess(grace=settings.shutdown_grace + KILL_WAIT, nice=settings.worker_nice)
    # /healthz and /metrics ask the engine service on this host; a pool on another host is
    # asked by each job, for its repository, and its branches are its own to count.
    local = runner if settings.server is None else None
    app = create_app(settings, settings.queue_file(), worker=worker, runner=local)
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

    return work(_webhook_settings(), common.settings())


def register(sub: Subcommands) -> None:
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
