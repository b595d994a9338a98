"""Postgres's programs, from this host's binaries or from a Docker image.

Seeding, preparing a base and applying migrations only call programs through a ``Tools``:
``pgbin.PgInstall`` runs this host's binaries, ``runtime.docker_tools.DockerTools`` runs the same
programs in throwaway containers of an image, so a Docker runner needs no Postgres on the host.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from pgoverlay.runner.proc import OsUser


class Tools(Protocol):
    @property
    def major(self) -> int: ...

    @property
    def version(self) -> str: ...

    @property
    def where(self) -> str:
        """Where the programs come from, for messages: ``this runner's Postgres 16``,
        ``image postgres:16``."""

    def run(
        self,
        tool: str,
        args: Sequence[str | os.PathLike[str]],
        *,
        timeout: float,
        user: OsUser | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]: ...

    def run_streaming(
        self,
        tool: str,
        args: Sequence[str | os.PathLike[str]],
        *,
        timeout: float,
        on_line: Callable[[str], None],
        user: OsUser | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str: ...

    def libraries(self) -> set[str]: ...

    def extensions(self) -> set[str]: ...

    def server(
        self,
        datadir: Path,
        *,
        options: Mapping[str, str],
        user: OsUser,
        log_path: Path,
        timeout: float,
        stop_timeout: float,
    ) -> AbstractContextManager[None]:
        """Run Postgres on ``datadir`` as ``user`` with ``options`` (which name the socket
        directory it is reached by), once it accepts connections; stop it on exit. Its log
        ends up at ``log_path``."""
