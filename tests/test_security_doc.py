"""docs/security.md names a test for each thing an attacker cannot do: those tests must exist,
and its links must lead somewhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "security.md"
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")
LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#([\w-]+))?\)")


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {
        _slug(line.lstrip("#"))
        for line in path.read_text().splitlines()
        if re.match(r"#{1,6} ", line)
    }


def test_every_test_the_security_page_names_exists() -> None:
    refs = TEST_REF.findall(DOC.read_text())
    assert len(refs) >= 30, "the page should name the tests that prove it"
    missing = [
        f"{module}::{name}"
        for module, name in refs
        if not (ROOT / module).is_file() or name not in _test_functions(ROOT / module)
    ]
    assert missing == []


def test_every_link_of_the_security_page_leads_to_a_file_and_heading() -> None:
    broken = []
    for target, anchor in LINK.findall(DOC.read_text()):
        path = (DOC.parent / target).resolve()
        if not path.is_file():
            broken.append(target)
        elif anchor and anchor not in _anchors(path):
            broken.append(f"{target}#{anchor}")
    assert broken == []


def test_slugs_follow_githubs_rule() -> None:
    assert _slug(" `PGOVERLAY_BRANCH_SUPERUSER=true`") == "pgoverlay_branch_superusertrue"
    assert _slug(" 3. Put the runner's user in the `pgoverlay` group") == (
        "3-put-the-runners-user-in-the-pgoverlay-group"
    )
