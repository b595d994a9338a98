"""`pgoverlay base seed|list|rm|warm`: each with only its own flags, any base name possible,
and the old `pgoverlay seed` spellings still working for a release with one deprecation line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import cli, remove_base, source_dsn
from pgoverlay import cli as cli_module
from pgoverlay.cli import renamed
from pgoverlay.errors import BaseMissingError, ConfigError
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import cluster

USAGE = 2  # argparse's exit code for a command line it cannot read


def _help(*words: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pgoverlay", *words, "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    return done.stdout


def _flags(text: str) -> set[str]:
    return {word.strip("[],") for word in text.split() if word.startswith(("--", "[--"))}


def test_each_base_subcommand_offers_only_its_own_flags() -> None:
    own = {
        "seed": {"--from", "--password-file", "--refresh", "--via", "--mask", "--no-mask"}
        | {"--demo", "--scale", "--runtime", "--workload-top"},
        "list": {"--json"},
        "show": {"--top", "--json"},
        "workload": {"--from", "--file", "--password-file", "--top"},
        "rm": {"--version", "--destroy-branches"},
        "warm": {"--count", "--runtime"},
    }
    for command, flags in own.items():
        assert _flags(_help("base", command)) == flags | {"--help"}, command
    group = _help("base")
    for command in own:
        assert command in group


def test_the_old_spellings_become_the_new_ones() -> None:
    cases = {
        ("seed", "prod", "--from", "host=x"): ["base", "seed", "prod", "--from", "host=x"],
        ("seed", "list", "--json"): ["base", "list", "--json"],
        ("seed", "rm", "prod", "--version", "2"): ["base", "rm", "prod", "--version", "2"],
        ("seed", "warm", "prod", "--count", "1"): ["base", "warm", "prod", "--count", "1"],
        ("-v", "seed", "--refresh", "rm", "--demo"): [
            "-v",
            "base",
            "seed",
            "--refresh",
            "rm",
            "--demo",
        ],
        # as before: a base may be called `list` when it is being seeded
        ("seed", "list", "--from", "host=x"): ["base", "seed", "list", "--from", "host=x"],
        ("seed", "--via", "dump", "warm", "--from=host=x"): [
            "base",
            "seed",
            "--via",
            "dump",
            "warm",
            "--from=host=x",
        ],
        ("seed", "--help"): ["base", "seed", "--help"],
        # the new spellings, and a branch or base called `seed`, are left alone
        ("base", "seed", "list", "--demo"): ["base", "seed", "list", "--demo"],
        ("branch", "create", "seed"): ["branch", "create", "seed"],
    }
    for old, new in cases.items():
        assert renamed.rewrite(old) == new, old
    assert cli_module.RENAMED == {renamed.OLD: "base"} and "base" in cli_module.GROUPS


def _deprecation(stderr: str, old: str, new: str) -> None:
    lines = [line for line in stderr.splitlines() if "deprecated" in line]
    assert lines == [
        f"warning: `pgoverlay {old}` is deprecated and goes in the next release: "
        f"use `pgoverlay {new}`"
    ], stderr


def test_a_base_may_be_called_list_rm_or_warm_through_base_seed(
    pool: Pool, source: cluster.Running, env: dict[str, str]
) -> None:
    names = ("list", "rm", "warm")
    try:
        for name in names:
            done = cli(["base", "seed", name, "--from", source_dsn(source)], env=env)
            assert done.returncode == 0, done.stderr
            assert f"base {name} version 1 ready" in done.stdout
            assert "deprecated" not in done.stderr
        listed = cli(["base", "list", "--json"], env=env)
        assert listed.returncode == 0, listed.stderr
        assert set(names) <= {b["name"] for b in json.loads(listed.stdout)}
        warmed = cli(["base", "warm", "warm", "--count", "0"], env=env)
        assert warmed.returncode == 0, warmed.stderr
        assert "base warm on local: no warm branches kept" in warmed.stdout
        for name in names:
            removed = cli(["base", "rm", name], env=env)
            assert removed.returncode == 0, removed.stderr
            assert f"base {name} removed (v1)" in removed.stdout
    finally:
        for name in names:
            for version in pool.registry.bases(name):
                remove_base(pool, version)
    assert not {b.name for b in pool.registry.bases()} & set(names)


def test_the_old_seed_spellings_still_work_with_one_deprecation_line(
    pool: Pool, source: cluster.Running, base: BaseVersion, env: dict[str, str]
) -> None:
    name = "old-spelling"
    try:
        seeded = cli(["seed", name, "--from", source_dsn(source)], env=env)
        assert seeded.returncode == 0, seeded.stderr
        assert f"base {name} version 1 ready" in seeded.stdout
        _deprecation(seeded.stderr, "seed NAME", "base seed NAME")

        listed = cli(["seed", "list", "--json"], env=env)
        assert listed.returncode == 0, listed.stderr
        assert name in {b["name"] for b in json.loads(listed.stdout)}  # stdout is only JSON
        _deprecation(listed.stderr, "seed list", "base list")

        warmed = cli(["seed", "warm", name, "--count", "0"], env=env)
        assert warmed.returncode == 0, warmed.stderr
        assert f"base {name} on local: no warm branches kept" in warmed.stdout
        _deprecation(warmed.stderr, "seed warm", "base warm")

        removed = cli(["seed", "rm", name], env=env)
        assert removed.returncode == 0, removed.stderr
        assert f"base {name} removed (v1)" in removed.stdout
        _deprecation(removed.stderr, "seed rm", "base rm")
    finally:
        for version in pool.registry.bases(name):
            remove_base(pool, version)


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["base", "rm"], USAGE, "the following arguments are required: name"),
        (["base", "rm", "never-seeded"], BaseMissingError.exit_code, "no base named"),
        (["base", "seed", "app", "--destroy-branches"], USAGE, "unrecognized arguments"),
        (["base", "seed", "app"], ConfigError.exit_code, "exactly one of --from DSN or --demo"),
        (["base", "warm", "app"], ConfigError.exit_code, "pgoverlay base warm NAME --count N"),
        (["base", "list", "--count", "1"], USAGE, "unrecognized arguments: --count"),
    ],
)
def test_base_command_mistakes_say_what_to_do(
    pool: Pool, env: dict[str, str], args: list[str], code: int, text: str
) -> None:
    done = cli(args, env=env)
    assert done.returncode == code, (args, done.stderr)
    assert text in done.stderr


@pytest.mark.parametrize(
    ("args", "usage"),
    [
        (["base", "list", "--count", "1"], "usage: pgoverlay base list"),
        (["branch", "list", "--bogus"], "usage: pgoverlay branch list"),
        (["pool", "status", "--yes"], "usage: pgoverlay pool status"),
        (["branch", "--bogus", "list"], "usage: pgoverlay branch"),
    ],
)
def test_an_unknown_option_is_refused_with_its_own_commands_usage(
    env: dict[str, str], args: list[str], usage: str
) -> None:
    done = cli(args, env=env)
    assert done.returncode == USAGE, done.stderr
    assert done.stderr.startswith(usage), done.stderr
    assert "unrecognized arguments" in done.stderr or "invalid choice" in done.stderr
