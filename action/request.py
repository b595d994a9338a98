"""What a pull request's branch is asked for: one request for the composite Action's inputs and
the webhook listener's per-repository settings.

:class:`PrRequest` holds what both front ends ask for; each field is declared once here, with
its default, its description and its check (:func:`option`). The Action's :class:`Inputs`
extends it with what only a workflow decides. Everything else is derived from these fields: the
inputs block of ``action.yml`` (``scripts/action_inputs.py`` writes it, and
``tests/test_workflow.py`` checks it is current), the variables the entry point reads
(``INPUT_<NAME>``), and the listener's ``webhook.settings.RepoSettings``, a pydantic model made
from :class:`PrRequest`'s fields with the same checks.

Plain dataclasses, not pydantic models: every step of the Action reads its inputs, and importing
pydantic and building these models cost that step more than the rest of its start-up. Each
value is read by its annotation with the one reader of typed values (``runner/values.py``), as
the runner's settings are and the listener's per-repository settings are: a flag or a choice
reads, and a problem is worded, alike wherever it is written.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pgoverlay.action import when
from pgoverlay.action.insight.model import Thresholds
from pgoverlay.errors import ConfigError, Location, Problems, RequestError, config_error
from pgoverlay.runner.names import NAME_RE, parse_idle_seconds, parse_seconds
from pgoverlay.runner.runtime import table as runtimes
from pgoverlay.runner.values import read as typed

_LOCK_UNITS = "ms, s, m or h (e.g. 500ms, 5s, 1.5s, 2m)"

Select = Literal["changed", "all"]
# "auto" (the runner's PGOVERLAY_RUNTIME) or a runtime of runner/runtime/table.py, checked
# against the table by the field's check (``_runtime``)
RuntimeName = str


# What a size may be written in: the units (and the reading of the number before them) of
# pydantic's ByteSize, which read this input before.
_BYTE_UNITS: dict[str, float] = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "eb": 10**18,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
    "eib": 2**60,
    "bit": 1 / 8,
    "kbit": 10**3 / 8,
    "mbit": 10**6 / 8,
    "gbit": 10**9 / 8,
    "tbit": 10**12 / 8,
    "pbit": 10**15 / 8,
    "ebit": 10**18 / 8,
    "kibit": 2**10 / 8,
    "mibit": 2**20 / 8,
    "gibit": 2**30 / 8,
    "tibit": 2**40 / 8,
    "pibit": 2**50 / 8,
    "eibit": 2**60 / 8,
}
_BYTE_UNITS.update({k[0]: v for k, v in list(_BYTE_UNITS.items()) if "i" not in k})
_BYTE_STRING = re.compile(r"^\s*(\d*\.?\d+)\s*(\w+)?")


def _bytes(text: str) -> int:
    """``text`` as bytes, or 0 when it cannot be read."""
    try:
        return int(text)
    except ValueError:
        pass
    found = _BYTE_STRING.match(text)
    if found is None:
        return 0
    scalar, unit = found.groups()
    mult = _BYTE_UNITS.get((unit or "b").lower())
    if mult is None:
        return 0
    try:
        return int(float(scalar) * mult)
    except OverflowError:
        return 0


def parse_bytes(text: str) -> int:
    """'512MiB', '1GiB', '10GB', '1048576' -> bytes (KiB/MiB/GiB are powers of 1024, KB/MB/GB of
    1000, a bare number is bytes): how much one rewrite may write."""
    size = _bytes(text.strip())
    if size <= 0:
        raise ConfigError(
            f"cannot read size {text!r}: use a positive number of bytes, or a number and a unit "
            "KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000), "
            "e.g. 512MiB, 1GiB, 10GB"
        )
    return size


# -- the checks of one field, and of the whole ------------------------------------------------


def _base_name(base: str | None) -> None:
    if base and not NAME_RE.match(base):
        raise ConfigError(
            f"{base!r} is not a base name; name one of the bases seeded on this runner "
            "(`pgoverlay base list`), or leave it empty for the only one"
        )


def _runtime(runtime: str) -> None:
    if runtime not in runtimes.choices():
        raise ConfigError("should be one of " + ", ".join(runtimes.choices()))


def _ttl(ttl: str | None) -> None:
    if ttl:
        parse_seconds(ttl, whole=True)


def _idle(text: str | None) -> None:
    if text:
        parse_idle_seconds(text)


def _lock_time(text: str) -> float:
    """'500ms', '5s', '1.5s', '2m' -> seconds: how long a lock may be held."""
    return parse_seconds(text, units=_LOCK_UNITS)


MAX_LONG_TRANSACTION = 3600.0  # the queue simulation holds the migration back this long at most


def long_transaction_seconds(text: str | None) -> float:
    """'30s', '2m' -> seconds; empty or None (the default) -> 0, the simulation off."""
    if not text:
        return 0.0
    seconds = _lock_time(text)
    if seconds > MAX_LONG_TRANSACTION:
        raise ConfigError(
            f"assume-long-transaction {text!r} is longer than {MAX_LONG_TRANSACTION:.0f} s: the "
            "simulated transaction holds each migration back that long; give a shorter time "
            "(e.g. 30s, 2m)"
        )
    return seconds


Check = Callable[[Any], object]  # raises a ConfigError saying what is wrong with a value


def option(default: Any, description: str, *, rerun: bool | str, check: Check | None = None) -> Any:
    """A field of the request, declared once: its default (an input left empty takes it), what
    it does (``action.yml``'s description of the input, the listener's setting's), the check
    its value must pass once it has the field's type, and ``rerun``: True when a change of it
    makes a head already done run again (it changes what runs or what the report says), else
    the reason it does not (see ``decide.fingerprint``)."""
    text = " ".join(description.split())
    meta = {"description": text, "check": check, "rerun": rerun}
    return dataclasses.field(default=default, metadata=meta)


def reruns(field: dataclasses.Field[Any]) -> bool:
    """Whether a change of the field's value makes a head already done run again."""
    return field.metadata.get("rerun") is True


def description(field: dataclasses.Field[Any]) -> str:
    """What the field's input does, as ``action.yml`` says it."""
    return str(field.metadata.get("description", ""))


def field_problem(field: dataclasses.Field[Any], value: object) -> str | None:
    """What is wrong with ``value`` (of the field's type) for ``field``, or None."""
    check: Check | None = field.metadata.get("check")
    if check is None:
        return None
    try:
        check(value)
    except ConfigError as err:
        return str(err)
    return None


def whole_problem(
    migrations: str | None, migrate_command: str | None, *, branch_when: str | None = None
) -> str | None:
    """What is wrong with the request as a whole (its fields each being right), or None."""
    if migrations and migrate_command:
        return "set either `migrations` (a folder of .sql files) or `migrate-command`, not both"
    return when.request_problem(branch_when, migrations, migrate_command)


def is_blank(value: object) -> bool:
    """A value left empty (an input the workflow does not set) means its field's default."""
    return isinstance(value, str) and not value.strip()


_TYPES: dict[type[PrRequest], dict[str, Any]] = {}


def field_types(cls: type[PrRequest]) -> dict[str, Any]:
    """Each field's type, as Python reads its annotation (read once per class: reading them
    costs ten times the rest of a request's checks)."""
    if cls not in _TYPES:
        _TYPES[cls] = typing.get_type_hints(cls)
    return _TYPES[cls]


Problem = tuple[Location, str]  # where (a field's name, or () for the whole) and what is wrong


def read(
    cls: type[PrRequest], values: Mapping[str, object]
) -> tuple[dict[str, Any], list[Problem]]:
    """``values`` as ``cls``'s fields, and what is wrong with them, in pydantic's order: each
    field's type then its check, in the fields' order, then names ``cls`` has no field for;
    the whole request only when its fields are right. A blank value is its field's default."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kinds = field_types(cls)
    settled: dict[str, Any] = {}
    problems: list[Problem] = []
    for name, field in fields.items():
        if name not in values or is_blank(values[name]):
            continue
        try:
            settled[name] = typed(kinds[name], values[name])
        except ValueError as wrong:
            problems.append(((name,), str(wrong)))
            continue
        problem = field_problem(field, settled[name])
        if problem:
            problems.append(((name,), problem))
    problems += [
        ((name,), "Extra inputs are not permitted") for name in values if name not in fields
    ]
    if not problems:
        whole = whole_problem(
            settled.get("migrations"),
            settled.get("migrate_command"),
            branch_when=settled.get("branch_when"),
        )
        if whole:
            problems.append(((), whole))
    return settled, problems


@dataclass(frozen=True, kw_only=True)
class PrRequest:
    """What a workflow, or the listener's settings for a repository, asks for a pull request.
    Made with a value of the wrong type or form, it raises a RequestError naming the field."""

    base: str | None = option(
        None,
        "Seeded base on this runner to branch from (default: the only base).",
        check=_base_name,
        rerun="honoured when the branch is made; a reset keeps the branch's base",
    )
    migrations: str | None = option(
        None,
        "Folder of .sql migration files, relative to working-directory.",
        rerun=True,
    )
    migrate_command: str | None = option(
        None,
        """Command that migrates the database (e.g. `alembic upgrade head`), run with DATABASE_URL
        and PGHOST/PGPORT/PGUSER/PGPASSWORD/PGDATABASE pointing at the branch.""",
        rerun=True,
    )
    migrations_select: Select = option(
        "changed",
        """`changed`: the .sql files the pull request adds or changes; `all`: every file not yet
        recorded in the branch's ledger.""",
        rerun=True,
    )
    working_directory: str = option(
        ".",
        "Directory the migrations path and the migrate command are relative to.",
        rerun=True,
    )
    branch_name: str | None = option(  # None: {repo}-pr-{number} (see event.branch_name)
        None,
        """Branch name; `{number}`, `{ref}`, `{repo}` and `{owner}` are filled in (default
        <repository name>-pr-<number>).""",
        rerun="another name is another branch",
    )
    branch_when: str = option(
        "always",
        """When a pull request gets a branch: `always`; `migrations`, only while it adds or
        changes a .sql file under `migrations` (the files `migrations-select: changed` would
        apply); `label:NAME`, only while it carries the label NAME (adding the label makes the
        branch, taking it off destroys it). A pull request that is not wanted gets no branch, runs
        nothing and gets no comment; one whose branch exists loses it.""",
        check=when.check,
        rerun="whether the pull request gets a branch, asked on every run",
    )
    reset_on_push: bool = option(
        True,
        "On a new push, reset the branch to its base and apply the migrations again.",
        rerun="how a branch reaches a new head, not what runs on it",
    )
    ttl: str | None = option(
        None,
        "Destroy the branch after this long even if the PR stays open (e.g. 7d).",
        check=_ttl,
        rerun="how long the branch lives",
    )
    suspend_after: str | None = option(
        None,
        """Suspend the branch after this long with no connection (e.g. 10m, 2h; 0: never); it
        wakes on its next connection. Empty: the runner's PGOVERLAY_SUSPEND_AFTER (10m unless
        set).""",
        check=_idle,
        rerun="how long the branch may sit idle, honoured when the branch is made",
    )
    comment: bool = option(
        True,
        "Write the sticky PR comment.",
        rerun="where the report goes; a run done again writes it again",
    )
    deployment: bool = option(
        True,
        """Create a GitHub Deployment, environment `pgoverlay/<branch>` with the branch's page as
        its URL, so the pull request shows "View deployment"; inactive once the branch is
        destroyed. Needs `deployments: write`: without it, a warning and the comment alone.""",
        rerun="where the report goes; a run done again writes it again",
    )
    runtime: RuntimeName = option(
        "auto",
        """Where the branch runs, local (a process of the runner) or docker (a container); auto
        follows the runner's setting, itself Docker when its daemon answers.""",
        check=_runtime,
        rerun="honoured when the branch is made; a reset keeps the branch's runtime",
    )
    insight: bool = option(
        True,
        """Trace each migration on the branch: the locks it took and for how long, the tables it
        rewrote, the scans it made under a lock, the rows and WAL it wrote, and squawk's findings
        checked against what was measured. Shown in the comment, the job summary and
        report-path.""",
        rerun=True,
    )
    max_blocking_lock: str = option(
        "5s",
        """Longest a migration may hold a lock that blocks reads or writes before its verdict is
        "over" (e.g. 500ms, 5s, 1.5s, 2m).""",
        check=_lock_time,
        rerun=True,
    )
    max_rewrite: str = option(
        "1GiB",
        """Largest table or index a migration may rewrite before its verdict is "over" (e.g.
        512MiB, 1GiB, 10GB; KiB/MiB/GiB are powers of 1024, KB/MB/GB of 1000; a bare number is
        bytes).""",
        check=parse_bytes,
        rerun=True,
    )
    fail_on_threshold: bool = option(
        False,
        """Fail the step (after commenting) when a migration's verdict is "over"
        max-blocking-lock or max-rewrite.""",
        rerun=True,
    )
    assume_long_transaction: str | None = option(
        None,
        """Simulate the lock queue: before each migration, a session of the branch's role reads
        each probed table in a transaction held this long (e.g. 30s, 2m; at most 1h), and the
        report says how long reads queued behind the migration meanwhile. Each migration waits
        behind it, so the run takes that much longer, and a migration with a shorter
        lock_timeout fails as it would in production. Empty: off.""",
        check=long_transaction_seconds,
        rerun=True,
    )

    def __post_init__(self) -> None:
        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        settled, problems = read(type(self), given)
        if problems:
            raise RequestError(_say(problems))
        for f in dataclasses.fields(self):  # blanks become defaults; "yes" becomes True
            value = settled.get(f.name, f.default)
            if value is not given[f.name]:
                object.__setattr__(self, f.name, value)

    def ttl_seconds(self) -> int | None:
        return int(parse_seconds(self.ttl, whole=True)) if self.ttl else None

    def suspend_after_seconds(self) -> int | None:
        """The branch's idle seconds before it is suspended (0: never); None: the runner's."""
        return round(parse_idle_seconds(self.suspend_after)) if self.suspend_after else None

    def thresholds(self) -> Thresholds:
        """What a migration may do before its verdict is "over" (and, with
        ``fail_on_threshold``, fails the step)."""
        return Thresholds(
            max_blocking_lock=_lock_time(self.max_blocking_lock),
            max_rewrite=parse_bytes(self.max_rewrite),
            fail=self.fail_on_threshold,
        )

    def long_transaction(self) -> float:
        """Seconds the queue simulation's transaction is held (0: no simulation)."""
        return long_transaction_seconds(self.assume_long_transaction)


def _say(problems: list[Problem]) -> str:
    """The first problem as ``field: problem`` (and how many more there are)."""
    (loc, message), more = problems[0], len(problems) - 1
    text = f"{'.'.join(map(str, loc))}: {message}" if loc else message
    return f"{text} (and {more} more)" if more else text


@dataclass(frozen=True, kw_only=True)
class Inputs(PrRequest):
    """The composite Action's inputs: the request, and what only a workflow decides."""

    fail_on_migration_error: bool = option(
        True,
        "Fail the step when a migration fails (the branch stays up either way).",
        rerun="the step's exit code, worked out on every run",
    )
    allow_forks: bool = option(
        False,
        """Branch pull requests from forks. Off: a fork's pull request gets no branch and runs
        nothing, and the job summary says so.""",
        rerun="whether a fork is branched, asked on every run",
    )
    allow_fork_commands: bool = option(
        False,
        """Also run migrate-command for pull requests from forks that allow-forks lets in (their
        code runs on your runner, as the runner's user).""",
        rerun=True,
    )


def input_name(field: str) -> str:
    """The Action input a field is read from: ``migrate_command`` -> ``migrate-command``."""
    return field.replace("_", "-")


def env_name(field: str) -> str:
    """The variable ``action.yml`` passes the field's input in: ``INPUT_MIGRATE_COMMAND``."""
    return f"INPUT_{field.upper()}"


def read_inputs(environ: Mapping[str, str]) -> Inputs:
    """The Action's inputs from the step's environment (an unset variable is an empty input)."""
    raw = {f.name: environ.get(env_name(f.name), "") for f in dataclasses.fields(Inputs)}
    settled, problems = read(Inputs, raw)
    if problems:
        raise config_error(
            Problems(problems),
            what="input",
            where=lambda loc: f"`{input_name(str(loc[0]))}`" if loc else "",
        )
    return Inputs(**settled)
