"""What a new admin reads first says what is true: every workflow the docs show using the Action
runs one at a time per pull request (a `concurrency:` group of the pull request's number,
queued: a reader copies the first workflow they see), and the listener's page names every
limit of the engine service the listener meets, with its default."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from pgoverlay.runner.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```ya?ml\n(.*?)```", re.DOTALL)


def workflows() -> dict[str, str]:
    """Each workflow that uses the Action, in the docs' YAML blocks and example files, by
    where it is."""
    found = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for match in BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found[f"{doc.relative_to(ROOT)}:{line}"] = match.group(1)
    for example in sorted((ROOT / "docs" / "examples").glob("*.yml")):
        found[str(example.relative_to(ROOT))] = example.read_text()
    return {where: text for where, text in found.items() if "pgoverlay/action@" in text}


def queued_per_pull_request(text: str) -> bool:
    try:
        workflow = yaml.safe_load(text)
    except yaml.YAMLError:
        return "concurrency" in text  # a fragment: at least it shows the group
    groups = [workflow.get("concurrency")] if isinstance(workflow, dict) else []
    jobs = workflow.get("jobs") if isinstance(workflow, dict) else None
    if isinstance(jobs, dict):
        groups += [job.get("concurrency") for job in jobs.values() if isinstance(job, dict)]
    for group in groups:
        if isinstance(group, dict) and "pull_request.number" in str(group.get("group")):
            return group.get("cancel-in-progress", False) is False
    return False


def test_every_workflow_the_docs_show_queues_its_runs_per_pull_request() -> None:
    shown = workflows()
    assert len(shown) >= 8, sorted(shown)
    unqueued = sorted(where for where, text in shown.items() if not queued_per_pull_request(text))
    assert unqueued == [], unqueued


def test_the_listeners_page_names_every_branch_limit_it_meets_with_its_default() -> None:
    """The listener asks as one uid for all its repositories: the per-user limit (25) is the
    one it meets first, before the pool's (50)."""
    text = " ".join((ROOT / "docs" / "webhook.md").read_text().split())
    defaults = Settings()
    for field in ("max_branches", "max_branches_per_repository", "max_branches_per_user"):
        named = f"`PGOVERLAY_{field.upper()}` ({getattr(defaults, field)})"
        assert named in text, named
    assert "meets the per-user limit first" in text
