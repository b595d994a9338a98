"""Pure checks on user input: names and durations."""

from __future__ import annotations

import re

from pgoverlay.errors import ConfigError, InvalidNameError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_DURATION_RE = re.compile(r"^(\d+)([smhdw])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def check_name(name: str, *, what: str = "branch") -> str:
    if not NAME_RE.match(name):
        raise InvalidNameError(
            f"invalid {what} name {name!r}: use 1-63 lowercase letters, digits and dashes, "
            "starting with a letter or digit (e.g. pr-123)"
        )
    return name


def parse_duration(text: str) -> int:
    """'7d' -> seconds. Units: s, m, h, d, w."""
    match = _DURATION_RE.match(text.strip().lower())
    if not match or int(match.group(1)) == 0:
        raise ConfigError(
            f"cannot read duration {text!r}: use a positive number and a unit s, m, h, d or w "
            "(e.g. 90m, 7d)"
        )
    return int(match.group(1)) * _SECONDS[match.group(2)]
