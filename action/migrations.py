"""Choose a pull request's migrations and apply them to its branch.

SQL folder mode applies each file with ``psql`` (the tool these files are written for: meta
commands, ``COPY FROM STDIN`` and psql's own statement splitting all work), in one transaction
unless the file holds a statement that cannot run in one. A ledger table in the branch,
``migrations`` in the schema ``names.LEDGER_SCHEMA``, records what ran. Command mode runs the
project's own migration tool with the branch in ``DATABASE_URL`` and the libpq variables.

The pure parts (statement positions, error-to-line mapping, transaction needs) are plain
functions on text.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pgoverlay.action.insight.model import MigrationInsight
from pgoverlay.action.report import MigrationRun
from pgoverlay.action.request import PrRequest
from pgoverlay.action.sandbox import AS_SELF, Sandbox
from pgoverlay.errors import CommandError, MigrationError, TimeoutExpiredError, UnsafeFileError
from pgoverlay.runner import proc, safefs
from pgoverlay.runner.names import LEDGER_SCHEMA
from pgoverlay.runner.service.views import Connection

# psycopg and sqlparse are imported when migrations run: a re-run that finds its branch up to
# date, or a close, does without them.
if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

# The schema itself is made by the engine when it creates the branch (runner/postgres/roles.py), so
# the ledger works whoever owns the database. {ledger} is the table (``_ledger_sql``).
LEDGER_TABLE = f"{LEDGER_SCHEMA}.migrations"  # as messages name it
LEDGER = """
CREATE TABLE IF NOT EXISTS {ledger} (
    name text PRIMARY KEY,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    duration_ms integer NOT NULL
);
"""

# Statements Postgres refuses inside a transaction block (an implicit one included: a query
# of several statements).
_NO_TRANSACTION_BLOCK = re.compile(
    r"""^\s*(
        (CREATE|DROP)\s+(UNIQUE\s+)?INDEX\s+CONCURRENTLY
      | REINDEX\b.*\bCONCURRENTLY
      | REINDEX\s+(\(.*?\)\s*)?(SCHEMA|DATABASE|SYSTEM)\b
      | ALTER\s+TABLE\b.*\bDETACH\s+PARTITION\b.*\bCONCURRENTLY
      | VACUUM\b
      | CLUSTER\s*(\(.*?\)\s*)?(VERBOSE\s*)?;?\s*$
      | (CREATE|DROP)\s+(DATABASE|TABLESPACE)\b
      | (CREATE|ALTER|DROP)\s+SUBSCRIPTION\b
      | ALTER\s+SYSTEM\b
      | ALTER\s+DATABASE\b.*\bSET\s+TABLESPACE\b
      | DISCARD\s+ALL\b
      | (COMMIT|ROLLBACK)\s+PREPARED\b
    )""",
    re.IGNORECASE | re.VERBOSE | re.DOTALL,
)
# Explicit transaction control: a file that holds it is not wrapped in another transaction.
_CONTROL = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|START\s+TRANSACTION|END)\b", re.IGNORECASE)
_PSQL_ERROR = re.compile(
    r"^psql:(?P<file>.+?):(?P<line>\d+): (?P<level>ERROR|FATAL):\s+(?P<msg>.*)$"
)
_STATEMENT_LINE = re.compile(r"^LINE (\d+):")
# The largest migration file read; a bigger one is refused before a byte of it is read.
MAX_FILE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Statement:
    start_line: int  # where psql's query buffer starts (leading -- comments are not sent)
    end_line: int
    text: str
    semicolon: int | None = None  # offset in the file of the ``;`` that ends it, if one does


def statements(sql_text: str) -> list[Statement]:
    """Split a file like psql does, keeping each statement's first and last line (1-based)."""
    from sqlparse import engine
    from sqlparse import tokens as T

    found: list[Statement] = []
    line = 1
    offset = 0
    # The lexer and the splitter only: sqlparse's grouping, which nothing here needs, refuses a
    # statement of more than 10,000 tokens (a data migration's INSERT of a few thousand rows).
    for stmt in engine.FilterStack().run(sql_text):  # type: ignore[no-untyped-call]
        start: int | None = None
        end = line
        semicolon: int | None = None
        for token in stmt.flatten():
            skippable = token.is_whitespace or token.ttype in T.Comment.Single
            if start is None and not skippable:
                start = line
            if not token.is_whitespace and token.ttype not in T.Comment.Single:
                end = line + token.value.count("\n")
                semicolon = offset if token.match(T.Punctuation, ";") else None
            line += token.value.count("\n")
            offset += len(token.value)
        if start is not None:
            found.append(Statement(start, end, str(stmt).strip(), semicolon))
    return found


def cannot_run_in_transaction(statement: str) -> bool:
    """True for a statement (without leading comments) Postgres refuses in a transaction
    block."""
    return bool(_NO_TRANSACTION_BLOCK.match(statement))


def needs_no_transaction(sql_text: str) -> bool:
    """True if the file holds a statement that cannot run inside a transaction block."""
    from pgoverlay.action.insight import sqltext

    for stmt in statements(sql_text):
        bare = sqltext.strip_comments(stmt.text)
        if _NO_TRANSACTION_BLOCK.match(bare) or _CONTROL.match(bare):
            return True
    return False


@dataclass(frozen=True)
class PsqlError:
    file: str
    line: int  # the line of the file the error points at
    message: str  # the error and its DETAIL/HINT lines


def parse_psql_error(stderr: str, sql_text: str) -> PsqlError | None:
    """Map psql's ``psql:FILE:N: ERROR:`` (N = the statement's last line) and the server's
    ``LINE k:`` (k = line within the statement) to the line in the file."""
    lines = stderr.splitlines()
    for i, text in enumerate(lines):
        match = _PSQL_ERROR.match(text)
        if not match:
            continue
        end_line = int(match.group("line"))
        details = [match.group("msg")]
        within: int | None = None
        for follow in lines[i + 1 : i + 8]:
            if _PSQL_ERROR.match(follow) or follow.startswith("psql:"):
                break
            found = _STATEMENT_LINE.match(follow)
            if found and within is None:
                within = int(found.group(1))
            if follow.startswith(("DETAIL:", "HINT:", "CONTEXT:")):
                details.append(follow.strip())
        start = next(
            (s.start_line for s in statements(sql_text) if s.start_line <= end_line <= s.end_line),
            end_line,
        )
        line = start + within - 1 if within else start
        return PsqlError(file=match.group("file"), line=line, message="\n".join(details))
    return None


def checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- which files ---------------------------------------------------------------------------


def _git(repo: Path, *args: str, sandbox: Sandbox) -> str:
    return sandbox.run(["git", "-C", repo, *args], timeout=120, env={}, cwd=repo).stdout


def changed_files(
    repo: Path, folder: str, *, base_sha: str, head_sha: str, sandbox: Sandbox = AS_SELF
) -> list[str]:
    """The .sql files under ``folder`` the PR adds or changes, in lexical order.

    git runs in ``sandbox``, as the owner of the checkout: git refuses a repository owned by
    someone else.
    """
    try:
        out = _git(
            repo,
            "diff",
            "--name-only",
            "--diff-filter=AMR",
            "--no-renames",
            f"{base_sha}...{head_sha}",
            "--",
            folder,
            sandbox=sandbox,
        )
    except CommandError as err:
        raise MigrationError(
            f"cannot compare {base_sha[:7]}...{head_sha[:7]} in {repo}: {err}; check out the "
            "repository with its history (actions/checkout with fetch-depth: 0)"
        ) from None
    return sorted(p for p in out.splitlines() if p.endswith(".sql"))


def changed_between(base: Path, head: Path, folder: str) -> list[str]:
    """The .sql files under ``folder`` that ``head`` adds or changes compared with ``base``
    (two checkouts, e.g. extracted tarballs), in lexical order. A file that cannot be read
    safely counts as changed: applying it reports why."""
    found = []
    for name in all_files(head, folder):
        try:
            same = _read(base, name, limit=MAX_FILE_BYTES) == _read(
                head, name, limit=MAX_FILE_BYTES
            )
        except UnsafeFileError:
            same = False
        if not same:
            found.append(name)
    return found


def all_files(repo: Path, folder: str) -> list[str]:
    """Every entry named ``*.sql`` under ``folder``, in lexical order, without following links
    to folders. Entries that are not regular files (a link out of the checkout, a FIFO, a
    directory named like a migration) are listed too: applying them reports why they are
    refused, rather than skipping them silently."""
    if safefs.inside_checkout(repo, folder) is None:
        raise MigrationError(
            f"migrations folder {folder!r} leads out of the checkout {repo}: fix the "
            "`migrations` input (a path inside the repository)"
        )
    root = repo / folder
    if not root.is_dir():
        raise MigrationError(
            f"migrations folder {folder!r} does not exist in {repo}: fix the `migrations` input "
            "(a path relative to the working directory)"
        )
    found = []
    for here, dirs, files in os.walk(root, followlinks=False):
        for entry in (*dirs, *files):
            if entry.endswith(".sql"):
                found.append(os.path.relpath(os.path.join(here, entry), repo))
    return sorted(found)


def _read(repo: Path, name: str, *, limit: int) -> bytes:
    return safefs.read_inside(repo, name, limit=limit, what=f"migration file {name}")


def read_migration(repo: Path, name: str, *, limit: int = MAX_FILE_BYTES) -> str:
    """The text of migration ``name`` under ``repo``: a regular file inside the checkout of at
    most ``limit`` bytes (see ``safefs.read_inside``), read once without blocking."""
    data = _read(repo, name, limit=limit)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise UnsafeFileError(f"migration file {name} is not UTF-8 text") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # as a text-mode read sees it


# -- applying ------------------------------------------------------------------------------


# How to reach the branch; the password travels only in child environments.


_LEDGER_FIX = (
    f"the branch's user must be able to log in and own the schema {LEDGER_SCHEMA} (a migration "
    "that drops or alters it breaks this); reset the branch and run the job again"
)


def _ledger_sql(text: str) -> sql.Composed:
    """``text`` with ``{ledger}`` made the ledger table's quoted name."""
    from psycopg import sql

    return sql.SQL(text).format(ledger=sql.Identifier(LEDGER_SCHEMA, "migrations"))


def _ledger_error(what: str) -> AbstractContextManager[None]:
    from pgoverlay.runner.postgres import sqlerror

    return sqlerror.wrapped(MigrationError, what=what, fix=_LEDGER_FIX)


def _connect_ledger(target: Connection) -> psycopg.Connection[Any]:
    """The workflow's own connection to the branch, for the ledger: one for the whole run, so
    a trace can tell its statements from the migrations' (by its backend pid)."""
    with _ledger_error(
        f"cannot read the migration ledger ({LEDGER_TABLE}) of database "
        f"{target.database} on port {target.port}"
    ):
        import psycopg

        conn = psycopg.connect(**target.connect_kwargs(), autocommit=True, connect_timeout=15)
        try:
            conn.execute(_ledger_sql(LEDGER))
        except BaseException:
            conn.close()
            raise
        return conn


def _recorded(conn: psycopg.Connection[Any], target: Connection) -> dict[str, str]:
    with _ledger_error(
        f"cannot read the migration ledger ({LEDGER_TABLE}) of database "
        f"{target.database} on port {target.port}"
    ):
        rows = conn.execute(_ledger_sql("SELECT name, checksum FROM {ledger}")).fetchall()
        return dict(rows)


def _record(
    conn: psycopg.Connection[Any], target: Connection, name: str, text: str, seconds: float
) -> None:
    with _ledger_error(
        f"{name} ran, but cannot be recorded in the migration ledger "
        f"({LEDGER_TABLE}) of database {target.database} on port {target.port}"
    ):
        conn.execute(
            _ledger_sql(
                "INSERT INTO {ledger} (name, checksum, duration_ms) VALUES (%s, %s, %s) "
                "ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, "
                "applied_at = now(), duration_ms = EXCLUDED.duration_ms"
            ),
            (name, checksum(text), int(seconds * 1000)),
        )


class Watcher(Protocol):
    """Measures what each migration did to the branch (``pgoverlay.action.insight.observe``).

    ``start`` is called once, when this workflow's own sessions on the branch are open and
    before any migration runs; ``starting`` just before each migration runs (``text``: its
    SQL, None for a migrate command); ``measure`` once after each migration that ran, failed
    ones included, in order; ``ignore_pids`` are this workflow's own sessions."""

    def start(self) -> None: ...

    def marked(self, text: str, *, single_transaction: bool) -> str | None:
        """What psql is to read instead of the file ``text``, to measure it (None: the file
        as it is); the next ``measure`` is of it."""
        ...

    def starting(self, *, text: str | None) -> None: ...

    def measure(
        self,
        *,
        text: str | None,
        seconds: float,
        single_transaction: bool,
        ignore_pids: Collection[int],
    ) -> MigrationInsight | None: ...


def scrub(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How one run applies migrations to a branch, passed from the workflow down to each file or
    command: the branch, the request (what the workflow's inputs or the listener's settings
    ask), how long one migration may take, the sandbox the pull request's code runs in, and
    what measures it. The environment a migration runs in is made here only."""

    target: Connection
    timeout: float  # seconds one file, or the command, may take
    request: PrRequest = field(default_factory=PrRequest)
    sandbox: Sandbox = AS_SELF
    watcher: Watcher | None = None

    def child_env(self, *, command: bool = False) -> dict[str, str]:
        """The environment of psql, or of the migrate command (``command``): the branch's libpq
        variables, the password among them (it travels nowhere else). A command also gets the
        branch as ``DATABASE_URL``, and no application name of ours: its tool may set its own."""
        env = self.target.libpq_env()
        if command:
            del env["PGAPPNAME"]
            env["DATABASE_URL"] = self.target.url
        return env


def apply_files(
    options: RunOptions,
    repo: Path,
    files: list[str],
    *,
    psql: Path,
    skip_recorded: bool,
    max_bytes: int = MAX_FILE_BYTES,
) -> list[MigrationRun]:
    r"""Apply ``files`` (paths relative to ``repo``) in order with the ``psql`` program to the
    options' branch; stop at the first failure. With the options' ``watcher``, each file that
    ran is measured (its ``MigrationRun.insight``).

    psql runs in the options' ``sandbox`` (as the owner of the checkout, or a job's own uid),
    never as root: a file's ``\!`` shell escape must not gain privileges the pull request's own job
    steps do not have. This process reads every file once, before psql runs on any of them
    (psql's shell escapes could change the tree), for its checksum and to see whether it can
    run in a transaction, only if it is a regular file inside the checkout of at most
    ``max_bytes``: a link to a device or out of the checkout, a FIFO or a directory fails that
    file without being read.
    """
    texts: list[str | UnsafeFileError] = []
    for name in files:
        try:
            texts.append(read_migration(repo, name, limit=max_bytes))
        except UnsafeFileError as err:
            texts.append(err)
    with _connect_ledger(options.target) as conn:
        return _apply(
            options,
            conn,
            repo=repo,
            files=files,
            texts=texts,
            psql=psql,
            skip_recorded=skip_recorded,
        )


def _apply(
    options: RunOptions,
    conn: psycopg.Connection[Any],
    *,
    repo: Path,
    files: list[str],
    texts: list[str | UnsafeFileError],
    psql: Path,
    skip_recorded: bool,
) -> list[MigrationRun]:
    target, watcher, timeout = options.target, options.watcher, options.timeout
    recorded = _recorded(conn, target)
    mine = {conn.info.backend_pid}
    if watcher is not None:
        watcher.start()
    results: list[MigrationRun] = []

    def stop_after(run: MigrationRun, index: int) -> list[MigrationRun]:
        return [*results, run, *(MigrationRun(n, "not run", 0.0) for n in files[index + 1 :])]

    for index, (name, text) in enumerate(zip(files, texts, strict=True)):
        if isinstance(text, UnsafeFileError):
            return stop_after(MigrationRun(name, "failed", 0.0, str(text), file=name), index)
        if name in recorded:
            if recorded[name] == checksum(text):
                if skip_recorded:
                    results.append(MigrationRun(name, "skipped", 0.0))
                    continue
            elif skip_recorded:
                changed = MigrationRun(
                    name,
                    "failed",
                    0.0,
                    "this file changed after it was applied to the branch; reset the branch "
                    "(or push with reset-on-push enabled) to apply the new version",
                    file=name,
                )
                return stop_after(changed, index)
        single = not needs_no_transaction(text)
        argv: list[str | os.PathLike[str]] = ["-X", "-q", "-v", "ON_ERROR_STOP=1"]
        if single:
            argv.append("--single-transaction")
        marked = watcher.marked(text, single_transaction=single) if watcher else None
        # A marked file is read from standard input: its lines are the file's, so psql's
        # error lines stay right (they name <stdin> instead of the file).
        argv += ["-f", name if marked is None else "-"]
        if watcher is not None:
            watcher.starting(text=text)
        started = time.monotonic()
        try:
            done = options.sandbox.run(
                [psql, *argv],
                timeout=timeout,
                env=options.child_env(),
                cwd=repo,
                check=False,
                input_text=marked,
            )
        except TimeoutExpiredError:
            seconds = time.monotonic() - started
            late = MigrationRun(
                name,
                "failed",
                seconds,
                f"did not finish within {timeout:.0f} s",
                file=name,
                insight=_measure(watcher, text, seconds, single, mine),
            )
            return stop_after(late, index)
        seconds = time.monotonic() - started
        insight = _measure(watcher, text, seconds, single, mine)
        if done.returncode == 0:
            _record(conn, target, name, text, seconds)
            results.append(MigrationRun(name, "applied", seconds, insight=insight))
            continue
        stderr = scrub(done.stderr, target.password)
        if marked is not None:
            from pgoverlay.action.insight import marks

            stderr = marks.scrub(stderr)
        error = parse_psql_error(stderr, text)
        failed = MigrationRun(
            name,
            "failed",
            seconds,
            error.message if error else proc.last_lines(stderr, 5),
            file=name,
            line=error.line if error else None,
            insight=insight,
        )
        return stop_after(failed, index)
    return results


def _measure(
    watcher: Watcher | None,
    text: str | None,
    seconds: float,
    single: bool,
    mine: Collection[int],
) -> MigrationInsight | None:
    if watcher is None:
        return None
    return watcher.measure(text=text, seconds=seconds, single_transaction=single, ignore_pids=mine)


def run_command(
    options: RunOptions,
    command: str,
    *,
    cwd: Path,
    echo: Callable[[str], None] | None = None,
) -> MigrationRun:
    """Run the project's own migration command against the options' branch in their
    ``sandbox`` (as the owner of the checkout, or a job's own uid), never with the engine's
    privileges. With their ``watcher``, the run is measured from the server's side
    (``MigrationRun.insight``)."""
    target, watcher, timeout = options.target, options.watcher, options.timeout
    if watcher is not None:
        watcher.start()
        watcher.starting(text=None)
    started = time.monotonic()
    try:
        done = options.sandbox.run(
            ["/bin/sh", "-c", command],
            timeout=timeout,
            env=options.child_env(command=True),
            cwd=cwd,
            check=False,
        )
    except TimeoutExpiredError:
        seconds = time.monotonic() - started
        return MigrationRun(
            command,
            "failed",
            seconds,
            f"the migrate command did not finish within {timeout:.0f} s",
            insight=_measure(watcher, None, seconds, False, ()),
        )
    seconds = time.monotonic() - started
    insight = _measure(watcher, None, seconds, False, ())
    output = scrub(done.stdout + done.stderr, target.password)
    if echo is not None:
        for line in output.splitlines():
            echo(line)
    if done.returncode == 0:
        return MigrationRun(command, "applied", seconds, insight=insight)
    tail = "\n".join(output.strip().splitlines()[-15:]) or f"exit code {done.returncode}"
    return MigrationRun(command, "failed", seconds, tail, insight=insight)
