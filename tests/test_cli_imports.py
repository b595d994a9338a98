"""Start-up stays cheap: a command imports what it runs, not the whole engine, web framework,
Docker SDK, PyGithub or psycopg (pgoverlay/cli/common.py says why; bench/process.py measures)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import loaded, require_root, source_dsn
from pgoverlay.runner import seed
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import cluster

# What no read-only command, and no help, needs.
HEAVY = {
    "docker",
    "fastapi",
    "github",
    "psycopg",
    "pydantic_settings",
    "requests",
    "sqlparse",
    "starlette",
    "uvicorn",
    "yaml",
}
ENGINE = {"pgoverlay.runner.pool", "pgoverlay.runner.branch", "pgoverlay.runner.service.engine"}


def tops(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["branch", "create", "--help"],
        ["base", "--help"],
        ["base", "seed", "--help"],
        ["base", "warm", "--help"],
        ["seed", "--help"],  # the old spelling, rewritten
        ["pool", "init", "--help"],
        ["demo", "--help"],
        ["action", "run", "--help"],
        ["webhook", "serve", "--help"],
        ["service", "--help"],
    ],
)
def test_help_imports_neither_the_engine_nor_pydantic_nor_rich(args: list[str]) -> None:
    modules = loaded(args)
    assert not tops(modules) & (HEAVY | {"pydantic", "rich"})
    assert not modules & ENGINE


def test_help_still_names_every_command_and_option() -> None:
    """Registering a command imports nothing of it, yet its help is the whole of it."""
    done = subprocess.run(
        [sys.executable, "-m", "pgoverlay", "branch", "create", "--help"],
        cwd="/",  # not the checkout, whose pgoverlay/ folder would hide the installed package
        capture_output=True,
        text=True,
        check=True,
    )
    for option in ("--base", "--ttl", "--runtime", "--json", "{auto,local,docker}"):
        assert option in done.stdout
    top = subprocess.run(
        [sys.executable, "-m", "pgoverlay", "--help"],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for group in ("pool", "doctor", "base", "branch", "service", "gc", "demo", "action"):
        assert group in top


@pytest.mark.parametrize(
    "args", [["branch", "list"], ["branch", "list", "--json"], ["base", "list", "--json"]]
)
def test_the_read_only_views_import_no_server_client_web_or_docker_library(
    args: list[str], env: dict[str, str], base: BaseVersion
) -> None:
    require_root()
    assert not tops(loaded(args, env)) & (HEAVY | {"pydantic"})


def test_a_create_and_a_destroy_import_neither_the_seed_package_nor_a_web_or_docker_library(
    env: dict[str, str], base: BaseVersion
) -> None:
    """A create needs psycopg (to give the login role its password); not pydantic, the seed
    package, the web framework or the Docker SDK of a local branch."""
    require_root()
    created = loaded(["branch", "create", "imports-probe", "--base", base.name], env)
    destroyed = loaded(["branch", "destroy", "imports-probe"], env)
    for modules in (created, destroyed):
        assert not tops(modules) & (HEAVY - {"psycopg"} | {"pydantic", "rich"})
        assert not {m for m in modules if m.startswith("pgoverlay.runner.seed")}
    assert "psycopg" not in tops(destroyed)


def test_a_seed_imports_neither_rich_nor_the_demo_nor_the_other_command_groups(
    env: dict[str, str], pool: Pool, source: cluster.Running
) -> None:
    """`pgoverlay base seed NAME --from DSN` is timed against a bare pg_basebackup: it imports the
    seed (psycopg among it), not the demo's sample data, the other commands' modules, or rich
    to print its one line (or pydantic, YAML and the Docker SDK, which only masking and the
    Docker runtime need)."""
    require_root()
    name = "imports-probe-seed"
    try:
        modules = loaded(["base", "seed", name, "--from", source_dsn(source)], env)
    finally:
        for version in pool.registry.bases(name):
            seed.remove_version(pool, name, version.version)
    assert not tops(modules) & (HEAVY - {"psycopg"} | {"pydantic", "rich"})
    assert not {m for m in modules if m.startswith("pgoverlay.runner.demo")}
    assert {m for m in modules if m.startswith("pgoverlay.cli.")} == {
        "pgoverlay.cli.common",
        "pgoverlay.cli.base",
    }


def test_the_actions_entry_point_imports_no_web_docker_github_psycopg_or_pydantic() -> None:
    """PyGithub comes with the first comment, psycopg with the first migration; pydantic never
    (the Action's models are dataclasses)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys, pgoverlay.action.main; print(json.dumps(sorted(sys.modules)))",
        ],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    assert not tops(set(json.loads(done.stdout))) & (HEAVY - {"sqlparse"} | {"pydantic"})


def test_the_actions_run_imports_no_pydantic(tmp_path: Path) -> None:
    """The Action's models (its inputs, the job's variables, the record) are plain dataclasses:
    importing pydantic and building its models was the largest part of the step's start. A
    run that stops at its inputs has imported all the step reads them with."""
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"action": "opened", "pull_request": {"number": 1}}))
    probe = (
        "import json, sys\n"
        "from pgoverlay.action import main, record, comment\n"
        "from pgoverlay.action.insight import jsonreport\n"
        "code = main.entry(['run'])\n"
        "print(json.dumps(sorted(sys.modules)))\n"
        "raise SystemExit(code)\n"
    )
    env = {
        **os.environ,
        "GITHUB_EVENT_PATH": str(event),
        "GITHUB_EVENT_NAME": "pull_request",
        "GITHUB_REPOSITORY": "acme/shop",
        "INPUT_TTL": "soon",  # refused: the run stops there, having read its inputs
    }
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "input `ttl`: cannot read duration 'soon'" in done.stdout
    modules = set(json.loads(done.stdout.splitlines()[-1]))
    assert not tops(modules) & {"pydantic", "pydantic_core", "annotated_types"}


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_a_command_line_builds_only_its_groups_parser_and_groups_name_their_commands() -> None:
    from pgoverlay import cli

    everything = _commands(cli.build_parser([]))
    assert everything == set(cli.GROUPS)
    for command, group in cli.GROUPS.items():
        assert _commands(cli.build_parser([command, "--help"])) == {
            name for name, owner in cli.GROUPS.items() if owner == group
        }
    assert _commands(cli.build_parser(["-v", "brnch"])) == everything  # a mistake sees all
