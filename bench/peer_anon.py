"""The masking peer for bench/mask.py: pg_anon's dump with masking, then its restore.

pg_anon (PyPI `pg-anon`, a command `pg_anon`) masks while it dumps: each table's rows are read
through a SELECT that applies the dictionary's expressions, written compressed per table, and
restored by `pg_anon restore` (pg_restore for the structure, COPY for the data) into an empty
database. The masked database is then as ready as a masked base: a server can serve it.

The dictionary below masks the columns docs/examples/masking-rules.yml masks, the same way where
pg_anon can express it (a digest of the value for the email, kept consistent across the two
tables so the foreign key holds; NULL; the year; the rounded amount; pg_anon's own
`anon_funcs.random_phone` for the phone), keeps no row of `sessions` and drops the audit rows
with an address, as the rules' free SQL does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import psycopg
from psycopg import sql

from pgoverlay.runner import proc
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster

VERSION = "1.12.0"


def _digest(column: str, chars: int) -> str:
    """The first ``chars`` hex digits of the value's SHA-256 (built in: no extension)."""
    return f"left(encode(sha256(convert_to({column}, 'UTF8')), 'hex'), {chars})"


def _email(column: str) -> str:
    return f"SQL:'u' || {_digest(column, 16)} || '@example.com'"


DICTIONARY = {
    "dictionary": [
        {
            "schema": "public",
            "table": "customers",
            "fields": {
                "email": _email("email"),
                "full_name": f"SQL:'Name ' || {_digest('full_name', 10)}",
                "phone": "anon_funcs.random_phone('+1 555 ')",
                "notes": "SQL:left(repeat('lorem ipsum dolor sit amet ', 1 + length(notes) / 27), "
                "length(notes))",
                "tax_id": f"SQL:{_digest('tax_id', 64)}",
                "born": "SQL:date_trunc('year', born)::date",
            },
        },
        {
            "schema": "public",
            "table": "orders",
            "fields": {
                "customer_email": _email("customer_email"),
                "shipping_address": "SQL:NULL",
                "amount": "SQL:round(amount, -1)",
            },
        },
        {"schema": "public", "table": "sessions", "fields": {}, "sql_condition": "false"},
        {
            "schema": "public",
            "table": "audit_log",
            "fields": {},
            "sql_condition": "detail NOT LIKE '%@%'",
        },
    ],
}


def find(given: str | None) -> Path | None:
    """The `pg_anon` command: ``given``, or the one on PATH."""
    found = given or shutil.which("pg_anon")
    return Path(found) if found else None


def version(command: Path) -> str:
    done = subprocess.run(
        [command, "init", "--version"], capture_output=True, text=True, timeout=120, check=False
    )
    said = (done.stdout or done.stderr).strip().splitlines()  # "Version 1.12.0"
    return said[-1].removeprefix("Version ").strip() if said else "?"


class PgAnon:
    """pg_anon against the benchmark's source, restoring into a target server of its own."""

    def __init__(
        self,
        command: Path,
        *,
        work: Path,
        install: pgbin.PgInstall,
        owner: proc.OsUser,
        source: cluster.Running,
        target: cluster.Running,
    ) -> None:
        self.command, self.work, self.install = command, work, install
        self.owner, self.source, self.target = owner, source, target
        self.dict_file = work / "pg-anon-dict.py"
        self.dict_file.write_text(repr(DICTIONARY) + "\n")
        self.output = work / "pg-anon-dump"

    def _db(self, srv: cluster.Running, dbname: str) -> list[str | os.PathLike[str]]:
        return [
            "--db-host",
            os.fspath(srv.socket_dir),
            "--db-port",
            str(srv.port),
            "--db-name",
            dbname,
            "--db-user",
            "postgres",
        ]

    def _run(self, *args: str | os.PathLike[str]) -> None:
        done = subprocess.run(
            [self.command, *args],
            capture_output=True,
            text=True,
            timeout=3600,
            cwd=self.work,  # its run folder (pg_anon_runs/) lands here
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"pg_anon {args[0]} failed: {(done.stderr or done.stdout)[-2000:]}")

    def init(self) -> None:
        """Its SQL functions (schema ``anon_funcs``) in the source: once, untimed."""
        self._run("init", *self._db(self.source, "postgres"))

    def run(self, round_: int) -> tuple[float, float]:
        """Dump with masking, restore into a new empty database: seconds of each."""
        target_db = f"anon_{round_}"
        with psycopg.connect(**self.target.conninfo(user="postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(target_db)))
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(target_db))
            )
        shutil.rmtree(self.output, ignore_errors=True)
        started = time.monotonic()
        self._run(
            "dump",
            *self._db(self.source, "postgres"),
            "--prepared-sens-dict-file",
            self.dict_file,
            "--output-dir",
            self.output,
            "--pg-dump",
            self.install.tool("pg_dump"),
        )
        dumped = time.monotonic()
        self._run(
            "restore",
            *self._db(self.target, target_db),
            "--input-dir",
            self.output,
            "--pg-restore",
            self.install.tool("pg_restore"),
        )
        restored = time.monotonic()
        with psycopg.connect(**self.target.conninfo(user="postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(target_db)))
        shutil.rmtree(self.output, ignore_errors=True)
        return dumped - started, restored - dumped
