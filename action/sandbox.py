"""How a pull request's own code runs: psql on its migration files, its migrate command.

The PR workflow never starts PR code itself: it hands an argument list, an environment and a
working directory to a :class:`Sandbox`. The Action runs it as itself (:class:`AsUser` with no
user: the runner's user, already unprivileged); the webhook listener runs each job's code in a
throwaway namespace under a uid of its own (``pgoverlay.webhook.sandbox``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pgoverlay.runner import proc
from pgoverlay.runner.proc import OsUser


class Sandbox(Protocol):
    def run(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        timeout: float,
        env: Mapping[str, str],
        cwd: Path,
        check: bool = True,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in ``cwd`` (a folder of the PR's tree) to completion, with ``env`` added
        to a clean environment and ``input_text`` on its standard input; raise CommandError on
        failure when ``check``."""
        ...


@dataclass(frozen=True)
class AsUser:
    """PR code runs as ``user`` (None: as this process's own user)."""

    user: OsUser | None = None

    def run(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        timeout: float,
        env: Mapping[str, str],
        cwd: Path,
        check: bool = True,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return proc.run(
            argv,
            timeout=timeout,
            env=env,
            user=self.user,
            cwd=cwd,
            check=check,
            input_text=input_text,
        )


AS_SELF = AsUser()
