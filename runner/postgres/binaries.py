"""Find Postgres server binaries and their major versions."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pgoverlay.errors import PostgresBinariesError, VersionMismatchError
from pgoverlay.runner import proc
from pgoverlay.runner.postgres import postmaster

MIN_MAJOR = 14
_VERSION = re.compile(r"\(PostgreSQL\)\s+(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class PgInstall:
    """Postgres binaries of this host. ``runtime.docker_tools.DockerTools`` offers the same
    methods with the binaries of an image, so seeding needs none on the host."""

    major: int
    version: str
    bindir: Path

    @property
    def where(self) -> str:
        return f"this runner's Postgres {self.major}"

    def run(
        self,
        tool: str,
        args: Sequence[str | os.PathLike[str]],
        *,
        timeout: float,
        user: proc.OsUser | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        return proc.run(
            [self.tool(tool), *args], timeout=timeout, user=user, env=env, cwd=cwd, check=check
        )

    def run_streaming(
        self,
        tool: str,
        args: Sequence[str | os.PathLike[str]],
        *,
        timeout: float,
        on_line: Callable[[str], None],
        user: proc.OsUser | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        return proc.run_streaming(
            [self.tool(tool), *args], timeout=timeout, on_line=on_line, user=user, env=env
        )

    def libraries(self) -> set[str]:
        """File names in the library directory (``auto_explain.so``, ...)."""
        libdir = self.run("pg_config", ["--pkglibdir"], timeout=30).stdout.strip()
        return {p.name for p in Path(libdir).iterdir()}

    def extensions(self) -> set[str]:
        """Extensions these binaries can load: the names of their ``.control`` files."""
        sharedir = Path(self.run("pg_config", ["--sharedir"], timeout=30).stdout.strip())
        return {p.name.removesuffix(".control") for p in (sharedir / "extension").glob("*.control")}

    @contextlib.contextmanager
    def server(
        self,
        datadir: Path,
        *,
        options: Mapping[str, str],
        user: proc.OsUser,
        log_path: Path,
        timeout: float,
        stop_timeout: float,
    ) -> Iterator[None]:
        """Postgres on ``datadir`` as a child of this process, run as ``user``; stopped on
        exit."""
        child = postmaster.start(
            self, datadir=datadir, options=options, user=user, log_path=log_path
        )
        try:
            postmaster.wait_ready(datadir, child=child, log_path=log_path, timeout=timeout)
            yield
        finally:
            postmaster.stop(datadir / "postmaster.pid", timeout=stop_timeout)
            if child.poll() is None:
                child.kill()
            child.wait()

    def tool(self, name: str) -> Path:
        path = self.bindir / name
        if not path.exists():
            raise PostgresBinariesError(
                f"{name} is missing from {self.bindir}: install the Postgres {self.major} "
                f"server and client packages (apt-get install postgresql-{self.major})"
            )
        return path


def parse_version(text: str) -> tuple[int, str]:
    match = _VERSION.search(text)
    if not match:
        raise PostgresBinariesError(f"cannot read a Postgres version from {text.strip()!r}")
    return int(match.group(1)), match.group(0).split()[-1]


def _candidate_bindirs(override: Path | None) -> list[Path]:
    if override is not None:
        return [override]
    dirs = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    dirs += sorted(Path("/usr").glob("pgsql-*/bin"))
    on_path = shutil.which("postgres")
    if on_path:
        # the folder of the program itself: a link on PATH (e.g. /usr/local/bin/postgres) to
        # an installation's binary names that installation, not a second one to ask
        dirs.append(Path(on_path).resolve().parent)
    return list(dict.fromkeys(d.resolve() for d in dirs))


@functools.cache
def installs(override: Path | None = None) -> dict[int, PgInstall]:
    """Every usable Postgres server installation, by major version (newest bindir wins)."""
    found: dict[int, PgInstall] = {}
    for bindir in _candidate_bindirs(override):
        postgres = bindir / "postgres"
        if not postgres.is_file():
            continue
        out = proc.run([postgres, "--version"], timeout=30, check=False).stdout
        try:
            major, version = parse_version(out)
        except PostgresBinariesError:
            continue
        found.setdefault(major, PgInstall(major=major, version=version, bindir=bindir))
    return found


def for_major(major: int, override: Path | None = None) -> PgInstall:
    available = installs(override)
    if major in available:
        return available[major]
    have = ", ".join(str(m) for m in sorted(available)) or "none"
    raise VersionMismatchError(
        f"the base needs Postgres {major} but this runner has Postgres binaries for: {have}; "
        f"install postgresql-{major} (or point PGOVERLAY_PG_BINDIR at its bin directory)"
    )


def newest(override: Path | None = None) -> PgInstall:
    available = {m: i for m, i in installs(override).items() if m >= MIN_MAJOR}
    if not available:
        raise PostgresBinariesError(
            f"no Postgres {MIN_MAJOR} or newer server binaries found: install the server "
            "package (apt-get install postgresql) or set PGOVERLAY_PG_BINDIR"
        )
    return available[max(available)]
