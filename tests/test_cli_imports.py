"""Start-up stays cheap: a command imports what it runs, not the whole engine, web framework,
Docker SDK, PyGithub or psycopg (pgoverlay/cli/common.py says why; bench/process.py measures).
An import inside a function is there for that alone (docs/architecture.md, "Where to look")."""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
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


def test_the_seeds_start_leaves_what_only_the_steps_after_the_copy_use_to_load_meanwhile() -> None:
    """The seed's start, timed against a bare pg_basebackup, loads what the checks and the copy
    need; the preparation and the trace's triggers (``seed.AFTER_COPY``) load in a thread while
    pg_basebackup copies."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys, pgoverlay.cli.base, pgoverlay.runner.seed; "
            "print(json.dumps(sorted(sys.modules)))",
        ],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    modules = set(json.loads(done.stdout))
    assert "pgoverlay.runner.seed" in modules
    assert "pgoverlay.runner.seed.prepare" not in modules
    assert "pgoverlay.runner.trace.instrument" not in modules


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


ROOT = Path(__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    """Every module of the package by its installed name (pyproject.toml's package-dir)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {}
    for package, folder in {"pgoverlay": "pgoverlay", **setuptools["package-dir"]}.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _late_imports(name: str, path: Path) -> dict[int, list[str]]:
    """The imports inside the module's functions: by line, what each may load (for
    ``from a import b``, ``a.b`` in case b is a module, and ``a``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[int, list[str]] = {}
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                found[node.lineno] = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                found[node.lineno] = [*(f"{base}.{a.name}" for a in node.names), base]
    return found


# Imports the module, then says which of the candidates are modules already loaded, and which
# are not modules at all (a name a module defines).
_LOADED_PROBE = """
import importlib, importlib.util, json, sys
importlib.import_module(sys.argv[1])
loaded = set(sys.modules)
def is_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
names = sys.argv[2:]
print(json.dumps({n: n in loaded or not is_module(n) for n in names}))
"""


def _already_there(name: str, candidates: set[str]) -> dict[str, bool]:
    done = subprocess.run(
        [sys.executable, "-c", _LOADED_PROBE, name, *sorted(candidates)],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    there: dict[str, bool] = json.loads(done.stdout)
    return there


def test_an_import_inside_a_function_loads_what_its_module_has_not_loaded() -> None:
    """An import goes inside a function to put off loading a module (a library, or one of ours
    that brings one) until a command needs it; one of a module its own module has already
    loaded (with its imports at the top) puts off nothing and belongs at the top."""
    modules = _modules()
    late = {name: _late_imports(name, path) for name, path in modules.items()}
    late = {name: found for name, found in late.items() if found}
    with ThreadPoolExecutor(max_workers=4) as pool:
        asked = {name: {c for cs in found.values() for c in cs} for name, found in late.items()}
        there = dict(zip(asked, pool.map(_already_there, asked, asked.values()), strict=True))
    pointless = [
        f"{modules[name].relative_to(ROOT)}:{line}: {candidates[-1]}"
        for name, found in late.items()
        for line, candidates in sorted(found.items())
        # one candidate not loaded (``a.b`` a module, or ``a`` itself) is what the import defers
        if all(there[name][c] for c in candidates)
    ]
    assert pointless == [], "move these imports to the top of their module"
