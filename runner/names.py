"""Pure checks on user input: names and durations, and the role names a pg_hba.conf holds; and
the names pgoverlay itself gives in a branch's database."""

from __future__ import annotations

import re

from pgoverlay.errors import ConfigError, InvalidNameError, SeedError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h|d|w)$")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def check_name(name: str, *, what: str = "branch") -> str:
    if not NAME_RE.match(name):
        raise InvalidNameError(
            f"invalid {what} name {name!r}: use 1-63 lowercase letters, digits and dashes, "
            "starting with a letter or digit (e.g. pr-123)"
        )
    return name


def parse_seconds(text: str, *, whole: bool = False, units: str = "") -> float:
    """'500ms', '1.5s', '90m', '7d' -> seconds: the one reader of a duration a user writes (a
    TTL, a lock's longest hold, the probe's transaction). ``whole``: a whole number of seconds,
    at least one (a TTL). ``units`` is what the error offers (by default, what the reading
    accepts)."""
    match = _DURATION_RE.match(text.strip().lower())
    seconds = float(match.group(1)) * _SECONDS[match.group(2)] if match else 0.0
    if seconds <= 0 or (whole and (seconds < 1 or not seconds.is_integer())):
        offered = units or (
            "s, m, h, d or w (e.g. 90m, 7d)"
            if whole
            else "ms, s, m, h, d or w (e.g. 500ms, 1.5s, 7d)"
        )
        raise ConfigError(
            f"cannot read duration {text!r}: use a positive number and a unit {offered}"
        )
    return seconds


_BARE_SECONDS_RE = re.compile(r"^\d+(?:\.\d+)?$")


def parse_idle_seconds(text: str) -> float:
    """'10m', '2h', '600', '0' -> seconds: how long a branch may sit with no connection before
    it is suspended (a bare number is seconds; 0: never; otherwise at least a second, as the
    engine looks for idle branches every few seconds). Durations are ``parse_seconds``'."""
    bare = text.strip()
    try:
        seconds = float(bare) if _BARE_SECONDS_RE.match(bare) else parse_seconds(bare)
    except ConfigError:
        seconds = -1.0
    if seconds < 0 or 0 < seconds < 1:
        raise ConfigError(
            f"cannot read idle time {text!r}: use 0 (never), a number of seconds of at least 1, "
            "or a number and a unit s, m, h, d or w (e.g. 10m, 2h)"
        )
    return seconds


_BAD_HBA_CHARACTERS = ('"', "\n", "\r", "\0")


def check_hba_name(role: str) -> None:
    """A role name must be writable as a quoted pg_hba.conf token."""
    if not role or any(c in role for c in _BAD_HBA_CHARACTERS):
        raise SeedError(
            f"role {role!r} cannot be named in a branch's pg_hba.conf (it has a double quote "
            "or a line break): rename it in the source and seed again"
        )


# The migration ledger's schema, in every branch's database: made by the engine for the branch's
# user (postgres/roles.py), written by the PR workflow (action/migrations.py), and left out of
# what a trace and the insight report (trace/schema.py, action/insight/work.py).
LEDGER_SCHEMA = "pgoverlay_ledger"

# A suspended branch, and one a killed suspend or wake left: a wake finishes either (the
# registry's states; the front door wakes a branch in one of them on a connection).
WAKEABLE = frozenset({"suspended", "suspending", "waking"})
# The SCRAM-SHA-256 iteration count of a branch role's verifier: what Postgres itself uses (and
# the least pgJDBC's SCRAM client accepts from a server); the front door imitates it.
SCRAM_ITERATIONS = 4096

# The marker role of the credentials pgoverlay grants in a branch (runner/branch/grants.py):
# every role made for a person or a preview app is its member, and a branch's pg_hba.conf
# admits its members over TCP with SCRAM.
ACCESS_ROLE = "pgoverlay_access"

# What pgoverlay itself runs on a seed's source starts with this comment (pg_stat_statements
# keeps a statement's text as it came, comments included), so a capture of the source's
# workload leaves pgoverlay's own reads out of production's.
SOURCE_MARK = "/* pgoverlay */ "
