"""Apply a folder of .sql migrations to a branch, each in its own transaction, and remember
which ran (``pgoverlay.migrations`` in the branch) so a second run applies only what is new."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psycopg

from pgoverlay.errors import MigrationError

Status = Literal["applied", "skipped", "failed", "not run"]

_TRACKING = """
CREATE SCHEMA IF NOT EXISTS pgoverlay;
CREATE TABLE IF NOT EXISTS pgoverlay.migrations (
    name text PRIMARY KEY,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    duration_ms integer NOT NULL
);
"""


@dataclass(frozen=True)
class Result:
    name: str
    status: Status
    seconds: float
    error: str = ""


def _natural_key(path: Path) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def discover(folder: Path) -> list[Path]:
    """The folder's .sql files in natural order (2_x.sql before 10_x.sql)."""
    if not folder.is_dir():
        raise MigrationError(
            f"migrations folder {folder} does not exist: check the path (relative to the "
            "working directory)"
        )
    return sorted(
        (p for p in folder.iterdir() if p.suffix == ".sql" and p.is_file()), key=_natural_key
    )


def checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def apply(conninfo: Mapping[str, Any], files: list[Path]) -> list[Result]:
    """Apply ``files`` in order; stop at the first failure (the rest are 'not run')."""
    results: list[Result] = []
    with psycopg.connect(**conninfo, autocommit=True, connect_timeout=15) as conn:
        conn.execute(_TRACKING)
        done = dict(conn.execute("SELECT name, checksum FROM pgoverlay.migrations").fetchall())
        failed = False
        for path in files:
            if failed:
                results.append(Result(path.name, "not run", 0.0))
                continue
            text = path.read_text()
            if path.name in done:
                if done[path.name] != checksum(text):
                    results.append(
                        Result(
                            path.name,
                            "failed",
                            0.0,
                            "changed after it was applied; reset the branch",
                        )
                    )
                    failed = True
                else:
                    results.append(Result(path.name, "skipped", 0.0))
                continue
            started = time.monotonic()
            try:
                with conn.transaction():
                    conn.execute(text.encode())
                    elapsed = time.monotonic() - started
                    conn.execute(
                        "INSERT INTO pgoverlay.migrations (name, checksum, duration_ms) "
                        "VALUES (%s, %s, %s)",
                        (path.name, checksum(text), int(elapsed * 1000)),
                    )
            except psycopg.Error as err:
                message = (err.diag.message_primary or str(err)).strip()
                results.append(Result(path.name, "failed", time.monotonic() - started, message))
                failed = True
                continue
            results.append(Result(path.name, "applied", elapsed))
    return results
