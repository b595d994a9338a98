"""What every command group shares: consoles, settings, the pool, the engine, formatting.

Nothing here (nor in a group's ``register``) imports the engine, rich or pydantic at import
time: `pgoverlay --help` and the read-only commands must start in well under a second, so each
command imports what it uses when it runs (tests/test_cli_imports.py keeps it so).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from pgoverlay.runner.pool import Pool
    from pgoverlay.runner.service.engine import Engine
    from pgoverlay.runner.settings import Settings

# What each command group's register() adds its subcommands to.
if TYPE_CHECKING:
    from pgoverlay.runner.service.engine import Engine

    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Subcommands = argparse._SubParsersAction


class LazyConsole:
    """A rich Console made at the first print: a command that prints JSON, or nothing, never
    pays for importing rich."""

    def __init__(self, *, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self._stderr, highlight=False)
        return self._console

    def print(self, *objects: Any, **kwargs: Any) -> None:
        self.console.print(*objects, **kwargs)

    def write(self, text: str) -> None:
        """Text as it is, without rich."""
        (sys.stderr if self._stderr else sys.stdout).write(text)

    def line(self, text: str) -> None:
        """A line of plain text, without rich (no markup, no wrapping): what a command that
        only reports what it did prints, so it does not pay for importing rich."""
        stream = sys.stderr if self._stderr else sys.stdout
        stream.write(text + "\n")


out = LazyConsole(stderr=False)
err = LazyConsole(stderr=True)


# -v on the command line: 0 logs warnings, 1 information, 2 everything.
verbosity = 0
# Whether the command's engine was the service's (``engine``): nothing of the engine runs in
# this process then, and it may end without the interpreter's teardown (``cli.entry``).
asked_service = False


def configure_logging() -> None:
    """Log to stderr at the level -v asks for (once: a second call changes nothing)."""
    import logging

    level = logging.WARNING - 10 * min(verbosity, 2)
    logging.basicConfig(
        level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def settings() -> Settings:
    """The runner's settings, or a ConfigError naming the bad one."""
    from pgoverlay.runner.settings import load

    return load()


def pool() -> Pool:
    """The pool the settings name (it must be prepared: `pgoverlay pool init`)."""
    configure_logging()
    from pgoverlay.runner.pool import Pool

    return Pool.open(settings())


def when(epoch: float | None) -> str:
    """A Unix time as UTC, or `-` for none."""
    if epoch is None:
        return "-"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def seed_progress() -> tuple[Progress, Callable[[int, int], None]]:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err.console,
        transient=True,
    )
    task = bar.add_task("pg_basebackup", total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update


def home() -> Path | None:
    try:
        return Path.home()
    except RuntimeError:
        return None


def engine(*, service: bool = True) -> Engine:
    """Anyone but root asks the engine service, so an admin and a workflow see the same branches,
    the same errors and the same limits. Root asks it too when it runs with root's settings
    (``service``: the command may): a command then costs a request rather than importing the
    engine, and a create claims a warm branch whose session the service holds. Otherwise root
    works on the engine directly."""
    global asked_service
    found = settings()
    if os.geteuid() != 0:
        from pgoverlay.runner.service.client import client

        asked_service = True
        return client(found)
    if service:
        from pgoverlay.runner.service.client import for_root

        remote = for_root(found)
        if remote is not None:
            asked_service = True
            return remote
    configure_logging()
    from pgoverlay.runner.pool import Pool
    from pgoverlay.runner.service.engine import LocalEngine

    return LocalEngine(Pool.open(found))
