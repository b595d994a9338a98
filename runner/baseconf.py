"""Make a freshly copied base's configuration files self-contained, while it is still writable.

A production ``postgresql.conf`` may ``include`` files that exist only on the production host
(``/etc/postgresql/...``); Postgres refuses to start when an included file is missing. Such an
include is not part of the base, so prepare comments it out (with a warning): every branch then
reads exactly the base's files, on this host or in a container alike.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

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


def _inside(path: Path, datadir: Path) -> bool:
    return path.resolve().is_relative_to(datadir.resolve())


def _include(conf: Path, line: str) -> tuple[str, Path, Path] | None:
    """An include line's kind, its target as written, and the path it names."""
    match = INCLUDE.match(line)
    if not match:
        return None
    target = Path(_unquote(match.group(2)))
    return match.group(1).lower(), target, target if target.is_absolute() else conf.parent / target


def _rewrite(datadir: Path, edit: Callable[[Path, str], str | None]) -> None:
    """Walk the base's configuration files, following includes that stay inside ``datadir``,
    and replace each line for which ``edit`` returns a replacement (keeping the file's owner)."""
    pending = [datadir / name for name in FILES]
    seen: set[Path] = set()
    while pending:
        conf = pending.pop()
        if conf in seen or not conf.is_file():
            continue
        seen.add(conf)
        lines = conf.read_text(errors="replace").splitlines(keepends=True)
        changed = False
        for i, line in enumerate(lines):
            replacement = edit(conf, line)
            if replacement is not None:
                lines[i] = replacement
                changed = True
                continue
            found = _include(conf, line)
            if found and _inside(found[2], datadir) and found[2].exists():
                path = found[2]
                pending += sorted(path.glob("*.conf")) if path.is_dir() else [path]
        if changed:
            stat = conf.stat()
            conf.write_text("".join(lines))
            os.chown(conf, stat.st_uid, stat.st_gid)


def confine_includes(datadir: Path) -> list[str]:
    """Comment out every include of the base's configuration that points outside ``datadir``
    or to nothing; follow the ones inside. Returns one warning per include removed."""
    warnings: list[str] = []

    def edit(conf: Path, line: str) -> str | None:
        found = _include(conf, line)
        if found is None or (_inside(found[2], datadir) and found[2].exists()):
            return None
        kind, target, _ = found
        warnings.append(
            f"{conf.relative_to(datadir)} has `{kind} {target}`, which is not part of the "
            "base (missing, or outside the data directory): branches ignore it"
        )
        return MARK + line

    _rewrite(datadir, edit)
    return warnings


# Settings a branch always overrides (see branchconf.server_options) whose values may carry
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
