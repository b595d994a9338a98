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
import time  # built in and loaded, where datetime is a module to import: a listing's ms count
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, cast

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from pgoverlay.runner.mask import Step as MaskStep
    from pgoverlay.runner.pool import Pool
    from pgoverlay.runner.service.client import RemoteEngine
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

            # emoji=False: a fingerprint's ":AB:" is not an emoji code (🆎)
            console = Console(stderr=self._stderr, highlight=False, emoji=False)
            # Off a terminal (a file, a pipe, a CI log) no line is broken: rich would wrap at
            # 80 columns, in the middle of a path or a message.
            console.soft_wrap = not console.is_terminal
            self._console = console
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
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(epoch))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def seed_progress() -> tuple[Progress, Callable[[int, int], None]]:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        ProgressColumn,
        Task,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.text import Text

    class StepsOrBytes(ProgressColumn):
        """Bytes (the copy) and their speed, or steps done of the steps known (masking)."""

        def __init__(self) -> None:
            super().__init__()
            self.download, self.speed = DownloadColumn(), TransferSpeedColumn()

        def render(self, task: Task) -> Text:
            if task.fields.get("steps"):
                return Text(f"{int(task.completed)}/{int(task.total or 0)} steps")
            return Text.assemble(self.download.render(task), " ", self.speed.render(task))

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        StepsOrBytes(),
        TimeRemainingColumn(),
        console=err.console,
        transient=True,
    )
    task = bar.add_task("pg_basebackup", total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update


def mask_step_line(step: MaskStep) -> str:
    """One finished masking step, as a line: what, how, how big, how long."""
    from pgoverlay.runner.units import format_bytes

    details = [d for d in (step.how, format_bytes(step.size_bytes) if step.size_bytes else "") if d]
    return f"masking [{step.index}/{step.total}] {step.what}: " + ", ".join(
        [*details, f"{step.seconds or 0.0:.1f} s"]
    )


def mask_progress(bar: Progress | None) -> Callable[[MaskStep], None]:
    """Masking's progress: a task on ``bar`` when a terminal watches, else a line on stderr
    per finished step (a log or a CI job then shows which table a slow seed is on)."""
    if bar is None:

        def line(step: MaskStep) -> None:
            if step.seconds is not None:
                err.line(mask_step_line(step))

        return line
    task = bar.add_task("masking", total=None, visible=False, steps=True)

    from rich.markup import escape

    def update(step: MaskStep) -> None:
        done = step.index if step.seconds is not None else step.index - 1
        # A label quotes SQL ('[a-z]%'): text, not markup the bar would eat.
        bar.update(
            task, description=escape(step.what), completed=done, total=step.total, visible=True
        )

    return update


def home() -> Path | None:
    try:
        return Path.home()
    except RuntimeError:
        return None


def engine(*, service: bool = True) -> Engine:
    """Anyone but root asks the engine service, so an admin and a workflow see the same branches,
    the same errors and the same limits. Root asks it too when its socket is there (``service``:
    the command may): a command then costs a request rather than importing the engine, and a
    create claims a warm branch whose session the service holds. Root works on the engine
    directly when there is no service, or the service declines (``_RootEngine``)."""
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
            return cast("Engine", _RootEngine(remote, found))
    return _local_engine(found)


def _local_engine(found: Settings) -> Engine:
    configure_logging()
    from pgoverlay.runner.pool import Pool
    from pgoverlay.runner.service.engine import LocalEngine

    return LocalEngine(Pool.open(found))


class _RootEngine:
    """Root's engine while the service acts for root: each operation is the service's request,
    until the service declines one (it is not running, runs with other settings, or did not
    answer a question in time: nothing was done). That operation, and every one after it, is
    then root's own work on the engine. No health check comes first: it would cost each
    command a round trip to the service."""

    def __init__(self, remote: RemoteEngine, found: Settings) -> None:
        self._remote = remote
        self._settings = found
        self._local: Engine | None = None

    def __getattr__(self, name: str) -> Any:
        asked = getattr(self._remote, name)
        if not callable(asked):
            return asked

        def call(*args: Any, **kwargs: Any) -> Any:
            global asked_service
            if self._local is None:
                from pgoverlay.runner.service.client import Declined

                try:
                    return asked(*args, **kwargs)
                except Declined:
                    asked_service = False  # the engine runs here now: end as usual
                    self._local = _local_engine(self._settings)
            return getattr(self._local, name)(*args, **kwargs)

        return call
