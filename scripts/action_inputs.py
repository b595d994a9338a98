"""Write the inputs of `action.yml` from the request's fields: `python scripts/action_inputs.py`.

GitHub reads `action.yml` as a static file, so the inputs it declares, and the `INPUT_<NAME>`
variables its run step passes to the entry point, are written here from the fields of
`pgoverlay.action.request.Inputs` (each field's description and default, declared once there)
between the file's two marker lines; the rest of the file is written by hand. `--check` changes
nothing and fails when the file is not what this script would write (tests/test_workflow.py
runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from pgoverlay.action.request import Inputs, description, env_name, input_name

ROOT = Path(__file__).resolve().parent.parent
ACTION = ROOT / "action.yml"
BEGIN = "# Written by scripts/action_inputs.py from the request's fields: edit those, not this."
END = "# End of what scripts/action_inputs.py writes."
WIDTH = 100


def _scalar(text: str) -> str:
    """``text`` as a YAML value: as it is when YAML reads it back so, else double-quoted."""
    try:
        plain = yaml.safe_load(f"k: {text}") == {"k": text}
    except yaml.YAMLError:
        plain = False
    return text if plain and text else json.dumps(text)


def _default(value: Any) -> str:
    """A field's default as its input's: a flag is "true" or "false", None is empty."""
    if isinstance(value, bool):
        return str(value).lower()
    return "" if value is None else str(value)


def _declaration(field: dataclasses.Field[Any]) -> list[str]:
    name, text = input_name(field.name), description(field)
    line = f"    description: {_scalar(text)}"
    said = (
        [line]
        if len(line) <= WIDTH and _scalar(text) == text
        else [
            "    description: >-",
            *textwrap.wrap(text, WIDTH, initial_indent=" " * 6, subsequent_indent=" " * 6),
        ]
    )
    return [
        f"  {name}:",
        *said,
        "    required: false",
        f"    default: {_scalar(_default(field.default))}",
    ]


def _passing(field: dataclasses.Field[Any]) -> str:
    return f"        {env_name(field.name)}: ${{{{ inputs.{input_name(field.name)} }}}}"


def _between(lines: list[str], indent: str, written: list[str]) -> list[str]:
    """``lines`` with what follows the first BEGIN line at ``indent`` up to its END line
    replaced by ``written``."""
    start = lines.index(indent + BEGIN)
    end = lines.index(indent + END, start)
    return [*lines[: start + 1], *written, *lines[end:]]


def render(text: str) -> str:
    """``text`` (an action.yml) with its inputs and their variables written from the model."""
    fields = dataclasses.fields(Inputs)
    lines = text.split("\n")
    lines = _between(lines, "  ", [line for f in fields for line in _declaration(f)])
    lines = _between(lines, "        ", [_passing(f) for f in fields])
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if action.yml is not current")
    args = parser.parse_args()
    current = ACTION.read_text()
    wanted = render(current)
    if wanted == current:
        return 0
    if args.check:
        print(
            "action.yml's inputs are not those of pgoverlay.action.request.Inputs: run "
            "scripts/action_inputs.py",
            file=sys.stderr,
        )
        return 1
    ACTION.write_text(wanted)
    print("action.yml: inputs written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
