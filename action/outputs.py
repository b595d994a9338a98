"""What the step writes back to GitHub Actions: masks, outputs, the job summary, annotations.

Workflow commands are printed to stdout; outputs and the summary go to the files GitHub names
in GITHUB_OUTPUT and GITHUB_STEP_SUMMARY.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO


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


def write_outputs(path: Path | None, values: Mapping[str, str]) -> None:
    """Append ``name<<DELIM`` blocks, the form that allows any value."""
    if path is None:
        return
    with path.open("a") as handle:
        for key, value in values.items():
            delimiter = f"pgoverlay_{secrets.token_hex(8)}"
            handle.write(f"{key}<<{delimiter}\n{value}\n{delimiter}\n")


def write_summary(path: Path | None, markdown: str) -> None:
    if path is None:
        return
    with path.open("a") as handle:
        handle.write(markdown.rstrip() + "\n")
