"""Make a freshly copied base's configuration files self-contained, while it is still writable.

A production ``postgresql.conf`` may ``include`` files that exist only on the production host
(``/etc/postgresql/...``); Postgres refuses to start when an included file is missing. Such an
include is not part of the base, so prepare comments it out (with a warning): every branch then
reads exactly the base's files, on this host or in a container alike.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

from pgoverlay.errors import UnsafePathError
from pgoverlay.runner import safefs

log = logging.getLogger(__name__)

INCLUDE = re.compile(
    r"^\s*(include|include_if_exists|include_dir)\s*(?:=\s*)?"
    r"('(?:[^'\\]|\\.|'')*'|[^\s#]+)\s*(?:#.*)?$",
    re.IGNORECASE,
)
MARK = "# pgoverlay: not part of the base: "
FILES = ("postgresql.conf", "postgresql.auto.conf")


def _unquote(token: str) -> str:
    if token.startswith("'") and token.endswith("'") and len(token) >= 2:
        return re.sub(r"\\(.)|''", lambda m: m.group(1) or "'", token[1:-1])
    return token


def _relative(path: Path, datadir: Path) -> str | None:
    """``path`` relative to ``datadir``, spelled out (``..`` resolved as text); None if outside."""
    norm, base = os.path.normpath(path), os.path.normpath(datadir)
    if not norm.startswith(base + "/"):
        return None
    return norm[len(base) + 1 :]


def _kind(path: Path, datadir: Path) -> str | None:
    """``file`` or ``dir`` if ``path`` is one inside ``datadir``, reached through no link; None
    if it is missing, outside, a link or anything else. The copy is the Postgres user's, who
    may put a link anywhere in it: root follows none."""
    rel = _relative(path, datadir)
    if rel is None:
        return None
    parent, _, name = rel.rpartition("/")
    try:
        with safefs.dir_under(datadir, parent or ".") as fd:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
    except (OSError, UnsafePathError):
        return None
    return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else None


def _include(conf: Path, line: str) -> tuple[str, Path, Path] | None:
    """An include line's kind, its target as written, and the path it names."""
    match = INCLUDE.match(line)
    if not match:
        return None
    target = Path(_unquote(match.group(2)))
    return match.group(1).lower(), target, target if target.is_absolute() else conf.parent / target


def _conf_files(datadir: Path, rel: str) -> list[str]:
    """The ``*.conf`` files of directory ``rel`` (an ``include_dir``), relative to datadir."""
    with safefs.dir_under(datadir, rel) as fd:
        return [f"{rel}/{name}" for name in sorted(os.listdir(fd)) if name.endswith(".conf")]


def _rewrite(datadir: Path, edit: Callable[[Path, str], str | None]) -> None:
    """Walk the base's configuration files, following includes that stay inside ``datadir``,
    and replace each line for which ``edit`` returns a replacement (the file keeps its owner).
    No link is followed: a file reached through one is neither read nor written."""
    pending = list(FILES)
    seen: set[str] = set()
    while pending:
        rel = pending.pop()
        if rel in seen:
            continue
        seen.add(rel)
        try:
            text = safefs.read_under(datadir, rel)
        except UnsafePathError as err:
            log.warning("%s", err)
            continue
        if text is None:
            continue
        conf = datadir / rel
        lines = text.splitlines(keepends=True)
        changed = False
        for i, line in enumerate(lines):
            replacement = edit(conf, line)
            if replacement is not None:
                lines[i] = replacement
                changed = True
                continue
            found = _include(conf, line)
            kind = _kind(found[2], datadir) if found else None
            if found and kind is not None:
                target = _relative(found[2], datadir) or ""
                pending += _conf_files(datadir, target) if kind == "dir" else [target]
        if changed:
            safefs.rewrite_under(datadir, rel, "".join(lines))


def confine_includes(datadir: Path) -> list[str]:
    """Comment out every include of the base's configuration that points outside ``datadir``
    or to nothing; follow the ones inside. Returns one warning per include removed."""
    warnings: list[str] = []

    def edit(conf: Path, line: str) -> str | None:
        found = _include(conf, line)
        if found is None or _kind(found[2], datadir) is not None:
            return None
        kind, target, _ = found
        warnings.append(
            f"{conf.relative_to(datadir)} has `{kind} {target}`, which is not part of the "
            "base (missing, or outside the data directory): branches ignore it"
        )
        return MARK + line

    _rewrite(datadir, edit)
    return warnings


# Settings a branch always overrides (see branch.conf.server_options) whose values may carry
# production's credentials or commands: a connection string with a password, a restore
# command with a token. Kept in the base, a branch's superuser could read them.
SECRET_SETTINGS = (
    "primary_conninfo",
    "restore_command",
    "archive_command",
    "archive_cleanup_command",
    "recovery_end_command",
    "ssl_passphrase_command",
)
SETTING = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(?:=\s*)?\S", re.IGNORECASE)
REMOVED_MARK = "# pgoverlay: removed (it may hold production's credentials): "


def remove_secret_settings(datadir: Path) -> list[str]:
    """Comment out settings that branches override and that may carry credentials. Returns one
    note per setting removed (names and files only: never the values)."""
    notes: list[str] = []

    def edit(conf: Path, line: str) -> str | None:
        match = SETTING.match(line)
        if not match or match.group(1).lower() not in SECRET_SETTINGS:
            return None
        notes.append(
            f"{conf.relative_to(datadir)}: removed {match.group(1).lower()} from the "
            "base (branches never use it, and it may hold production's credentials)"
        )
        return REMOVED_MARK + match.group(1) + "\n"

    _rewrite(datadir, edit)
    return notes
