"""What the step writes back to GitHub Actions: masks, outputs, the job summary, annotations.

Workflow commands are printed to stdout; outputs and the summary go to the files GitHub names
in GITHUB_OUTPUT and GITHUB_STEP_SUMMARY. Those names come from the job's environment, which
the job's own steps can change: the files are appended to as this process's user (never root's
privileges), through no symbolic link, and only when they are regular files.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from pgoverlay.action.markdown import inert
from pgoverlay.errors import JobFileError

_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def mask(value: str, out: TextIO) -> None:
    """Ask the runner to hide ``value`` in every later log line."""
    if value:
        out.write(f"::add-mask::{_escape_data(value)}\n")
        out.flush()


def annotation(
    level: str,
    message: str,
    out: TextIO,
    *,
    file: str | None = None,
    line: int | None = None,
    title: str | None = None,
) -> None:
    """A workflow command that annotates the run (and ``file`` at ``line``). Its message and
    title may hold a pull request's text (an error, a migration's name): nothing in them
    mentions anyone or references an issue (``markdown.inert``)."""
    message, title = inert(message), inert(title) if title else title
    props = []
    if file:
        props.append(f"file={_escape_property(file)}")
    if line:
        props.append(f"line={line}")
    if title:
        props.append(f"title={_escape_property(title)}")
    joined = (" " + ",".join(props)) if props else ""
    out.write(f"::{level}{joined}::{_escape_data(message)}\n")
    out.flush()


def append(path: Path, text: str, *, variable: str) -> None:
    """Append ``text`` to the regular file ``path`` that ``variable`` names, following no link."""
    try:
        fd = os.open(path, _APPEND, 0o644)
    except OSError as err:
        why = {
            errno.ELOOP: "it is a symbolic link",
            errno.ENXIO: "it is a FIFO",
            errno.EACCES: "this user may not write it",
            errno.EPERM: "this user may not write it",
        }.get(err.errno or 0, err.strerror or str(err))
        raise JobFileError(
            f"cannot write {variable}={path}: {why}. GitHub Actions sets {variable} to a file "
            "of the job's own: do not change it in the workflow"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise JobFileError(
                f"cannot write {variable}={path}: it is not a regular file. GitHub Actions sets "
                f"{variable} to a file of the job's own: do not change it in the workflow"
            )
        data = text.encode()
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def check_writable(path: Path | None, *, variable: str) -> None:
    """Refuse now, before any work, a file that ``append`` would refuse later."""
    if path is not None:
        append(path, "", variable=variable)


def check_folder(path: Path | None, *, variable: str) -> None:
    """Refuse now, before any work, a folder ``write_new`` could not write in."""
    if path is not None and not (path.is_dir() and os.access(path, os.W_OK | os.X_OK)):
        raise JobFileError(
            f"cannot write in {variable}={path}: it is not a folder this user may write in. "
            f"GitHub Actions sets {variable} to a folder of the job's own: do not change it in "
            "the workflow"
        )


def write_outputs(path: Path | None, values: Mapping[str, str]) -> None:
    """Append ``name<<DELIM`` blocks, the form that allows any value."""
    if path is None:
        return
    blocks = []
    for key, value in values.items():
        delimiter = f"pgoverlay_{secrets.token_hex(8)}"
        blocks.append(f"{key}<<{delimiter}\n{value}\n{delimiter}\n")
    append(path, "".join(blocks), variable="GITHUB_OUTPUT")


def write_summary(path: Path | None, markdown: str) -> None:
    if path is None:
        return
    append(path, markdown.rstrip() + "\n", variable="GITHUB_STEP_SUMMARY")


def write_new(directory: Path, text: str, *, prefix: str, suffix: str, variable: str) -> Path:
    """Write ``text`` to a new file of this user's in ``directory`` (which ``variable`` names),
    and return its path. The file is made where none was (``mkstemp``: no link followed, no
    file replaced) and readable by this user only."""
    try:
        fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    except OSError as err:
        raise JobFileError(
            f"cannot write a file in {variable}={directory}: {err.strerror or err}. GitHub "
            f"Actions sets {variable} to a folder of the job's own: do not change it in the "
            "workflow"
        ) from None
    try:
        data = text.encode()
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
    return Path(name)
