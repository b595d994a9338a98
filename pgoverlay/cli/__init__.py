"""The `pgoverlay` command: parse arguments, call one core function, format the result.

One module per command group, each registering its subcommands: pool.py (pool and doctor),
base.py, branch.py, access.py, api.py, service.py (service and gc), demo.py, action.py and
webhook.py; common.py holds what they share; renamed.py keeps the old spellings of renamed
commands working for a release.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from pgoverlay import __version__
from pgoverlay.cli import common
from pgoverlay.cli.common import err
from pgoverlay.errors import PgoverlayError

# The command names each group registers, and the group's module in pgoverlay.cli: a command
# line that names one imports and builds only that group (importing and building all of them
# is a cost every command would pay: the other groups' modules import what their commands
# share with the engine).
GROUPS = {
    "pool": "pool",
    "doctor": "pool",
    "base": "base",
    "branch": "branch",
    "access": "access",
    "api": "api",
    "service": "service",
    "gc": "service",
    "door": "door",
    "demo": "demo",
    "action": "action",
    "webhook": "webhook",
}
# Renamed commands, whose old spelling still works for a release: renamed.py rewrites a command
# line that uses one (imported only then).
RENAMED = {"seed": "base"}


# argparse's width off a terminal: no line of help is that long, so none is broken.
NO_WRAP = 1 << 16


def _help_width() -> int:
    """Where argparse wraps help: on a terminal, at its width as ``shutil.get_terminal_size``
    finds it (COLUMNS, else the terminal's own); off one (a file, a pipe, a CI log) nowhere, as
    a path or a message broken at 80 columns cannot be searched or copied whole. Found without
    importing shutil: argparse's help formatter imports it, with bz2 and lzma, for this alone,
    about 5 ms of every command."""
    stdout = sys.__stdout__
    try:
        if stdout is None or not os.isatty(stdout.fileno()):
            return NO_WRAP
        columns = os.get_terminal_size(stdout.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return NO_WRAP
    override = os.environ.get("COLUMNS", "")
    if override.isdigit() and int(override) > 0:
        columns = int(override)
    return columns if columns > 0 else 80


class _Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str, **kwargs: Any) -> None:
        kwargs.setdefault("width", _help_width() - 2)  # what argparse's own default is
        super().__init__(prog, **kwargs)


class _Parser(argparse.ArgumentParser):
    """argparse's parser with ``_Formatter``; its subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """A subcommand's parser refuses what it does not know itself, with its own usage
        (argparse leaves that to the top parser, whose usage names only the groups)."""
        parsed, extra = super().parse_known_args(args, namespace)
        if extra and " " in self.prog:  # a subcommand's parser: "pgoverlay branch list"
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: every group's commands, or only those of the group ``argv``
    names (its first word that is not an option); help and mistakes still see them all."""
    parser = _Parser(
        prog="pgoverlay",
        description="Copy-on-write Postgres branches on a self-hosted runner.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("--version", action="version", version=f"pgoverlay {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    named = GROUPS.get(_command(argv or ()) or "")
    for group in (named,) if named else dict.fromkeys(GROUPS.values()):
        importlib.import_module(f"pgoverlay.cli.{group}").register(sub)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if _command(argv) in RENAMED:
        from pgoverlay.cli import renamed

        argv = renamed.rewrite(argv)
    args = build_parser(argv).parse_args(argv)
    common.verbosity = args.verbose
    # A command that may only ask the engine service (``lean``) sets logging up when it turns
    # to the engine itself: importing logging is a cost it otherwise never pays.
    lean = getattr(args, "lean", False)
    if not (lean(args) if callable(lean) else lean):
        common.configure_logging()
    try:
        return int(args.func(args))
    except PgoverlayError as exc:
        err.print(f"[red]error:[/] {exc}", soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): the rest is not wanted
        # Python's advice: point stdout at /dev/null, so its flush at exit does not fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def entry() -> None:
    """The `pgoverlay` program: ``main``, then exit. A command that only asked the engine
    service skips the interpreter's teardown (freeing every module it imported, about a tenth
    of such a command's time): its output is flushed, and nothing else of it needs ending."""
    code = main()
    if not common.asked_service:
        raise SystemExit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # as in main
        code = code or 1
    os._exit(code)
