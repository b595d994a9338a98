"""Finding this host's Postgres installations."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pgoverlay.runner.postgres import binaries as pgbin


def test_a_postgres_linked_on_path_is_the_installation_it_links_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each installation is asked its version once: a link on PATH to an installation's
    `postgres` (as /usr/local/bin/postgres often is) names that installation's folder."""
    real = pgbin.newest(None).bindir / "postgres"
    (tmp_path / "postgres").symlink_to(real)
    monkeypatch.setattr(shutil, "which", lambda name: str(tmp_path / name))
    found = pgbin._candidate_bindirs(None)
    assert real.resolve().parent in found
    assert tmp_path not in found and len(found) == len(set(found))
