"""Postgres's programs run in throwaway containers of a Postgres image (see ``tools.Tools``).

Each program runs as the given user, on the host's network (it reaches the source as the host
would), with the given host directories bind-mounted at their own paths, so the paths on its
command line mean the same inside and out. A password in the environment reaches the container
as a passfile, never as a variable Docker would keep in the container's configuration.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pgoverlay.errors import BranchStartError, CommandError, DockerError, TimeoutExpiredError
from pgoverlay.runner import proc, safefs
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.postgres import postmaster
from pgoverlay.runner.proc import OsUser
from pgoverlay.runner.runtime.docker import LABEL_KIND, image_major

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

log = logging.getLogger(__name__)

_LISTING = (  # a fixed script: no caller's text goes into it
    'ls "$(pg_config --pkglibdir)"; echo "--- extensions"; ls "$(pg_config --sharedir)/extension"'
)


def _passfile_line(password: str) -> str:
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    return f"*:*:*:*:{escaped}\n"


@dataclass
class DockerTools:
    client: DockerClient
    image: str
    major: int
    owner: OsUser  # the default user programs run as
    scratch: Path  # where passfiles are written (it must be among ``mounts``)
    mounts: tuple[Path, ...] = ()
    version: str = ""
    labels: dict[str, str] = field(default_factory=dict)  # pool and base or branch, for gc
    _listing: tuple[set[str], set[str]] | None = field(default=None, repr=False)

    @classmethod
    def for_image(
        cls,
        client: DockerClient,
        image: str,
        *,
        owner: OsUser,
        scratch: Path,
        mounts: Sequence[Path],
        timeout: float,
        labels: Mapping[str, str] | None = None,
    ) -> DockerTools:
        major = image_major(client, image, timeout=timeout)
        return cls(
            client,
            image,
            major,
            owner,
            scratch,
            tuple(dict.fromkeys([scratch, *mounts])),
            version=f"{major} (image {image})",
            labels=dict(labels or {}),
        )

    @property
    def where(self) -> str:
        return f"image {self.image}"

    # -- containers -----------------------------------------------------------------------
    def _volumes(self, extra: Sequence[Path] = ()) -> dict[str, dict[str, str]]:
        paths = dict.fromkeys([*self.mounts, *extra])
        return {os.fspath(p): {"bind": os.fspath(p), "mode": "rw"} for p in paths}

    @contextlib.contextmanager
    def _environment(self, env: Mapping[str, str] | None, user: OsUser) -> Iterator[dict[str, str]]:
        """The container's environment; PGPASSWORD becomes a passfile only ``user`` reads."""
        clean = dict(env or {})
        password = clean.pop("PGPASSWORD", None)
        if password is None:
            yield clean
            return
        fd, name = tempfile.mkstemp(prefix="pgpass-", dir=self.scratch)
        try:
            with os.fdopen(fd, "w") as handle:
                if os.geteuid() == 0:
                    os.fchown(handle.fileno(), user.uid, user.gid)
                handle.write(_passfile_line(password))  # mkstemp made it 0600
            yield {**clean, "PGPASSFILE": name}
        finally:
            Path(name).unlink(missing_ok=True)

    def _start(
        self,
        tool: str,
        args: Sequence[str | os.PathLike[str]],
        *,
        user: OsUser,
        env: Mapping[str, str],
        cwd: Path | None,
        network: str = "host",
        kind: str = "tool",
        stop_signal: str | None = None,
    ) -> Container:
        import docker.errors

        volumes = self._volumes([cwd] if cwd else [])
        if tool == "initdb":
            # initdb looks its user up by uid, which the image may not know (the official
            # image's documented caveat): lend it this host's user database, read-only.
            for path in ("/etc/passwd", "/etc/group"):
                volumes[path] = {"bind": path, "mode": "ro"}
        try:
            return self.client.containers.run(
                self.image,
                name=f"pgoverlay-{kind}-{uuid.uuid4().hex[:12]}",
                entrypoint=[tool],
                command=[os.fspath(a) for a in args],
                user=f"{user.uid}:{user.gid}",
                environment=dict(env),
                working_dir=os.fspath(cwd) if cwd else None,
                network_mode=network,
                volumes=volumes,
                labels={**self.labels, LABEL_KIND: kind},
                stop_signal=stop_signal,
                detach=True,
            )
        except docker.errors.APIError as err:
            raise DockerError(f"Docker could not run {tool} from {self.image}: {err}") from None

    @staticmethod
    def _finish(container: Container, timeout: float, what: str) -> int:
        try:
            result = container.wait(timeout=timeout)
        except Exception:  # the SDK raises the HTTP client's timeout error
            with contextlib.suppress(Exception):
                container.kill()
            raise TimeoutExpiredError(f"{what} did not finish within {timeout:.0f} s") from None
        return int(result.get("StatusCode", 1))

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
    ) -> subprocess.CompletedProcess[str]:
        who = user or self.owner
        with self._environment(env, who) as environment:
            container = self._start(tool, args, user=who, env=environment, cwd=cwd)
            try:
                code = self._finish(container, timeout, tool)
                out = container.logs(stdout=True, stderr=False).decode(errors="replace")
                err = container.logs(stdout=False, stderr=True).decode(errors="replace")
            finally:
                with contextlib.suppress(Exception):
                    container.remove(force=True)
        done = subprocess.CompletedProcess([tool, *(os.fspath(a) for a in args)], code, out, err)
        if check and code != 0:
            raise CommandError(
                f"{tool} (in {self.image}) failed with exit code {code}: "
                f"{proc.last_lines(err or out, 5)}",
                stderr=err,
                returncode=code,
            )
        return done

    def run_streaming(
        self,
        tool: str,
        args: Sequence[str | os.PathLike[str]],
        *,
        timeout: float,
        on_line: Callable[[str], None],
        user: OsUser | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        who = user or self.owner
        collected: list[str] = []
        with self._environment(env, who) as environment:
            container = self._start(tool, args, user=who, env=environment, cwd=None)
            # The log stream follows the container for as long as it runs: a timer kills it at
            # the deadline, which ends the stream.
            expired = threading.Event()

            def expire() -> None:
                expired.set()
                with contextlib.suppress(Exception):
                    container.kill()

            watchdog = threading.Timer(timeout, expire)
            watchdog.daemon = True
            watchdog.start()
            try:
                pending = ""
                for chunk in container.logs(stdout=False, stderr=True, stream=True, follow=True):
                    pending += chunk.decode(errors="replace")
                    *lines, pending = re.split(r"[\r\n]", pending)
                    for line in lines:
                        if line:
                            collected.append(line)
                            on_line(line)
                if pending:
                    collected.append(pending)
                    on_line(pending)
                code = self._finish(container, 60.0, tool)
            finally:
                watchdog.cancel()
                with contextlib.suppress(Exception):
                    container.remove(force=True)
        if expired.is_set():
            raise TimeoutExpiredError(f"{tool} did not finish within {timeout:.0f} s")
        stderr = "\n".join(collected)
        if code != 0:
            raise CommandError(
                f"{tool} (in {self.image}) failed with exit code {code}: "
                f"{proc.last_lines(stderr, 5)}",
                stderr=stderr,
                returncode=code,
            )
        return stderr

    def _list(self) -> tuple[set[str], set[str]]:
        if self._listing is None:
            out = self.run("sh", ["-c", _LISTING], timeout=120).stdout
            libs, _, exts = out.partition("--- extensions")
            self._listing = (
                set(libs.split()),
                {n.removesuffix(".control") for n in exts.split() if n.endswith(".control")},
            )
        return self._listing

    def libraries(self) -> set[str]:
        return self._list()[0]

    def extensions(self) -> set[str]:
        return self._list()[1]

    # -- a server for the engine's own use (prepare, restore) ----------------------------
    @contextlib.contextmanager
    def server(
        self,
        datadir: Path,
        *,
        options: Mapping[str, str],
        user: OsUser,
        log_path: Path,
        timeout: float,
        stop_timeout: float,
    ) -> Iterator[None]:
        """Postgres on ``datadir`` in a container without a network: only the socket directory
        in ``options`` (which must be mounted) reaches it."""
        argv: list[str] = ["-D", os.fspath(datadir)]
        for key, value in options.items():
            argv += ["-c", f"{key}={value}"]
        (datadir / "postmaster.pid").unlink(missing_ok=True)
        container = self._start(
            "postgres",
            argv,
            user=user,
            env={},
            cwd=None,
            network="none",
            kind="server",
            stop_signal="SIGINT",
        )
        try:
            self._wait_ready(container, datadir, timeout)
            yield
        finally:
            with contextlib.suppress(Exception):
                container.stop(timeout=int(stop_timeout))
            with contextlib.suppress(Exception):
                # In the server user's directory: made afresh, never written through a link.
                text = container.logs().decode(errors="replace")
                safefs.write_new(log_path, text, uid=user.uid, gid=user.gid, mode=0o600)
            with contextlib.suppress(Exception):
                container.remove(force=True)

    def _wait_ready(self, container: Container, datadir: Path, timeout: float) -> None:
        def probe() -> bool | None:
            info = postmaster.read_pidfile(datadir / "postmaster.pid")
            if info is not None and info.status == "ready":
                return True
            container.reload()
            if container.status not in ("created", "running"):
                tail = container.logs(tail=5).decode(errors="replace").strip()
                raise BranchStartError(f"Postgres (in {self.image}) exited while starting: {tail}")
            return None

        wait_for(probe, timeout=timeout, what=f"Postgres in {datadir} to accept connections")
