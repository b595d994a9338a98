"""GitHub is reached through one client and its grammar written once (docs/architecture.md,
"GitHub, and a second forge"): these read the product's sources, so a second HTTP path to
GitHub, or a login's pattern or a list of roles written again elsewhere, fails here."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgoverlay.github import grammar

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("action", "webhook", "runner", "pgoverlay")
CLIENT = "pgoverlay/github/rest.py"
GRAMMAR = "pgoverlay/github/grammar.py"
NOT_GITHUB = {
    "runner/callers/oidc.py",  # an OIDC issuer's keys, not GitHub's API
    "runner/service/netclient.py",  # the pool's own network API
}
# HTTP libraries, and the product modules that may import each one.
HTTP = {
    "urllib3": {CLIENT},
    "urllib.request": {CLIENT} | NOT_GITHUB,  # the client: the proxy variables, read so
    "http.client": NOT_GITHUB,
    "requests": set(),
    "httpx": set(),
    "aiohttp": set(),
    "github": set(),  # PyGithub: a test's independent client of the fake, not the product's
}
ROLE_NAMES = set(grammar.ROLES)
GITHUBS_OWN = {"triage", "maintain"}  # role names nothing else in the product uses
PATTERNS = (grammar.NAME_CHARS, grammar.LOGIN_RE.pattern[1:-1])


def sources() -> Iterator[tuple[str, ast.Module]]:
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            yield rel, ast.parse(path.read_text(), rel)


def imported(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def http_imports(rel: str, tree: ast.Module) -> list[str]:
    """The HTTP libraries ``rel`` imports that it may not."""
    found = set()
    for name in imported(tree):
        for library, allowed in HTTP.items():
            if (name == library or name.startswith(f"{library}.")) and rel not in allowed:
                found.add(library)
    return sorted(found)


def grammar_written(rel: str, tree: ast.Module) -> list[str]:
    """GitHub's grammar written again in ``rel``: a pattern of a login or a repository's name,
    or two or more role names in one list, set, dict or Literal."""
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        text = node.value if isinstance(node, ast.Constant) else None
        if isinstance(text, str) and any(pattern in text for pattern in PATTERNS):
            found.append(f"line {line}: {text!r}")
        items: list[ast.expr] = []
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            items = list(node.elts)
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        names = {str(i.value) for i in items if isinstance(i, ast.Constant)} & ROLE_NAMES
        if len(names) >= 2 and names & GITHUBS_OWN:  # ("read", "write") may be a lock's kinds
            found.append(f"line {line}: roles {sorted(names)}")
    return found


def test_only_the_github_client_imports_an_http_library_for_github() -> None:
    wrong = {rel: libs for rel, tree in sources() if (libs := http_imports(rel, tree))}
    assert wrong == {}, "call GitHub through pgoverlay.github.rest (its retry and rate limits)"


def test_githubs_grammar_is_written_in_its_module_alone() -> None:
    wrong = {
        rel: found
        for rel, tree in sources()
        if rel != GRAMMAR and (found := grammar_written(rel, tree))
    }
    assert wrong == {}, "ask pgoverlay.github.grammar"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import requests\n", ["requests"]),
        ("from urllib3 import PoolManager\n", ["urllib3"]),
        ("from github import Github\n", ["github"]),
        ("import urllib.request\n", ["urllib.request"]),
        ("from urllib.parse import quote\n", []),
        ("from pgoverlay.github import rest\n", []),
    ],
)
def test_a_second_http_path_to_github_would_be_found(source: str, expected: list[str]) -> None:
    assert http_imports("action/elsewhere.py", ast.parse(source)) == expected


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ('R = r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$"\n', True),
        ('LOGIN = r"^[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*$"\n', True),
        ('LEVELS = ("read", "triage", "write")\n', True),
        ('Level = Literal["write", "maintain", "admin", "never"]\n', True),
        ('ROLES = {"read": "pull", "triage": "triage"}\n', True),
        ('KINDS = ("read", "write")\n', False),
        ('at_least(held, "triage")\n', False),
        ('KID = r"^[A-Za-z0-9._-]{1,64}$"\n', False),
    ],
)
def test_the_grammar_written_again_would_be_found(source: str, caught: bool) -> None:
    assert bool(grammar_written("runner/elsewhere.py", ast.parse(source))) is caught


def test_the_roles_are_the_role_type_in_order() -> None:
    assert tuple(grammar.ROLES) == ("read", "triage", "write", "maintain", "admin")
    assert set(grammar.ROLES) >= grammar.WRITERS
    assert grammar.is_login("octo-cat") and not grammar.is_login("-octo")
    assert not grammar.is_login("a" * (grammar.LOGIN_MAX + 1))
    assert grammar.is_repository("acme/shop.v2") and not grammar.is_repository("acme/shop/x")
    assert len("a" * 100 + "/" + "b" * 100) == grammar.REPOSITORY_MAX
