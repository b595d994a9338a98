"""Make a freshly copied base's configuration files self-contained, while it is still writable.

A production ``postgresql.conf`` may ``include`` files that exist only on the production host
(``/etc/postgresql/...``); Postgres refuses to start when an included file is missing. Such an
include is not part of the base, so prepare comments it out (with a warning): every branch then
reads exactly the base's files, on this host or in a container alike.
"""

from __future__ import annotations

import os
import re
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


def confine_includes(datadir: Path) -> list[str]:
    """Comment out every include of the base's configuration that points outside ``datadir``
    or to nothing; follow the ones inside. Returns one warning per include removed."""
    warnings: list[str] = []
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
            match = INCLUDE.match(line)
            if not match:
                continue
            kind, target = match.group(1).lower(), Path(_unquote(match.group(2)))
            path = target if target.is_absolute() else conf.parent / target
            if _inside(path, datadir) and path.exists():
                if kind == "include_dir":
                    pending += sorted(path.glob("*.conf"))
                else:
                    pending.append(path)
                continue
            lines[i] = MARK + line
            changed = True
            warnings.append(
                f"{conf.relative_to(datadir)} has `{kind} {target}`, which is not part of the "
                "base (missing, or outside the data directory): branches ignore it"
            )
        if changed:
            stat = conf.stat()
            conf.write_text("".join(lines))
            os.chown(conf, stat.st_uid, stat.st_gid)
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


def _config_files(datadir: Path) -> list[Path]:
    """The base's configuration files and, following includes, those they pull in."""
    found: list[Path] = []
    pending = [datadir / name for name in FILES]
    while pending:
        conf = pending.pop()
        if conf in found or not conf.is_file():
            continue
        found.append(conf)
        for line in conf.read_text(errors="replace").splitlines():
            match = INCLUDE.match(line)
            if not match:
                continue
            target = Path(_unquote(match.group(2)))
            path = target if target.is_absolute() else conf.parent / target
            if _inside(path, datadir) and path.exists():
                pending += sorted(path.glob("*.conf")) if path.is_dir() else [path]
    return found


def remove_secret_settings(datadir: Path) -> list[str]:
    """Comment out settings that branches override and that may carry credentials. Returns one
    note per setting removed (names and files only: never the values)."""
    notes: list[str] = []
    for conf in _config_files(datadir):
        lines = conf.read_text(errors="replace").splitlines(keepends=True)
        changed = False
        for i, line in enumerate(lines):
            match = SETTING.match(line)
            if match and match.group(1).lower() in SECRET_SETTINGS:
                lines[i] = REMOVED_MARK + match.group(1) + "\n"
                changed = True
                notes.append(
                    f"{conf.relative_to(datadir)}: removed {match.group(1).lower()} from the "
                    "base (branches never use it, and it may hold production's credentials)"
                )
        if changed:
            stat = conf.stat()
            conf.write_text("".join(lines))
            os.chown(conf, stat.st_uid, stat.st_gid)
    return notes
