"""GitHub's grammar, written once: what a login, a repository's ``owner/name`` and a repository
role are, as GitHub defines them. Pure: every part of pgoverlay that checks one of these asks
this module (the engine's registry and requests, the policy, the listener's payloads and
settings, the page's sign-in, the PR workflow)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

# A login (a user's or an organization's): letters, digits and single hyphens, neither first
# nor last; at most LOGIN_MAX characters (checked apart: the service's schema has no
# look-ahead).
LOGIN_RE = re.compile(r"^[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*$")
LOGIN_MAX = 39
# A repository's name: letters, digits, ``_``, ``.`` and ``-``, at most 100 characters.
NAME_CHARS = r"[A-Za-z0-9_.-]"
NAME_MAX = 100
NAME_RE = re.compile(rf"^{NAME_CHARS}{{1,{NAME_MAX}}}$")
# A repository as ``owner/name`` (the owner checked with the name's characters: GitHub's own
# payloads and tokens name it so, and the older logins it keeps have them).
REPOSITORY_RE = re.compile(rf"^{NAME_CHARS}{{1,{NAME_MAX}}}/{NAME_CHARS}{{1,{NAME_MAX}}}$")
REPOSITORY_MAX = 2 * NAME_MAX + 1

# github.com's addresses, every setting's default (GitHub Enterprise has its own).
API_URL = "https://api.github.com"
WEB_URL = "https://github.com"
# What a workflow's GITHUB_TOKEN acts as (it cannot read /user to say so).
ACTIONS_BOT = "github-actions[bot]"
# The REST API's version every call asks for.
API_VERSION = "2022-11-28"

# A repository's roles, weakest first, and the flag of a repository's ``permissions`` object
# (what GitHub adds for a user's token) each one sets: a role sets its own flag and every
# weaker one's.
Role = Literal["read", "triage", "write", "maintain", "admin"]
ROLES: dict[Role, str] = {
    "read": "pull",
    "triage": "triage",
    "write": "push",
    "maintain": "maintain",
    "admin": "admin",
}
# The least role that gets something, as a setting: any role, and for writing "never" too.
ReadPermission = Role
WritePermission = Literal["write", "maintain", "admin", "never"]
# What the collaborator permission endpoint answers for a role that may write: it reports the
# maintain role (and custom roles built on write) as "write", and triage as "read".
WRITERS = frozenset({"admin", "write"})


def is_login(text: str) -> bool:
    """Whether ``text`` is a GitHub login."""
    return len(text) <= LOGIN_MAX and LOGIN_RE.match(text) is not None


def is_name(text: str) -> bool:
    """Whether ``text`` is a repository's name (the part after ``owner/``)."""
    return NAME_RE.match(text) is not None


def is_repository(text: str) -> bool:
    """Whether ``text`` is a repository written ``owner/name``."""
    return REPOSITORY_RE.match(text) is not None


def role(permissions: Mapping[str, object]) -> Role | None:
    """The strongest role a repository's ``permissions`` object gives (None: not even read)."""
    held = [name for name, flag in ROLES.items() if permissions.get(flag) is True]
    return held[-1] if held else None


def at_least(held: Role, least: Role) -> bool:
    """Whether the role ``held`` is ``least`` or stronger."""
    order = list(ROLES)
    return order.index(held) >= order.index(least)
