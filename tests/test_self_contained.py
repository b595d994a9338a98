"""A user's clone holds only the repository: tests and benchmarks read nothing beside it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Ways a file under tests/ or bench/ could reach above the checkout.
OUTSIDE = re.compile(r"parents\[[2-9]\]|ROOT\.parent\b|\.\./shared|github-fixtures")


def test_tests_and_benchmarks_read_nothing_outside_the_checkout() -> None:
    me = Path(__file__).resolve()
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("tests", "bench")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != me
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == []


def test_the_github_fixtures_the_tests_use_are_in_the_repository() -> None:
    fixtures = ROOT / "tests" / "fixtures" / "github"
    for name in ("opened", "synchronize", "reopened", "closed", "labeled"):
        assert (fixtures / "webhooks" / f"pull_request.{name}.json").is_file(), name
    assert (fixtures / "signature_vectors.json").is_file()
    assert (fixtures / "github_openapi_subset.json").is_file()
