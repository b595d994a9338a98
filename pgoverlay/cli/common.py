"""What every command group shares: consoles, settings, the pool, the engine, formatting."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from pgoverlay.runner.pool import Pool
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.settings import load as load_settings

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

# What each command group's register() adds its subcommands to.
if TYPE_CHECKING:
    from pgoverlay.runner.service.engine import Engine

    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Subcommands = argparse._SubParsersAction


def settings() -> Settings:
    """The runner's settings, or a ConfigError naming the bad one."""
    return load_settings()


def pool() -> Pool:
    """The pool the settings name (it must be prepared: `pgoverlay pool init`)."""
    return Pool.open(settings())


def when(epoch: float | None) -> str:
    """A Unix time as UTC, or `-` for none."""
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def seed_progress() -> tuple[Progress, Callable[[int, int], None]]:
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


def home() -> Path | None:
    try:
        return Path.home()
    except RuntimeError:
        return None


def engine() -> Engine:
    """Root works on the engine directly; anyone else asks the engine service, so an admin
    and a workflow see the same branches, the same errors and the same limits."""
    found = settings()
    if os.geteuid() == 0:
        from pgoverlay.runner.service.engine import LocalEngine  # not for commands without one

        return LocalEngine(Pool.open(found))
    from pgoverlay.runner.service.client import client

    return client(found)
