"""The Docker runtime: a branch is a container of a stock Postgres image.

The branch's data directory is a Docker volume of the ``local`` driver with OverlayFS options
(lower: the base version, read-only; upper and work: the branch's directories in the pool), so
the daemon does the mounting and the container needs no extra capabilities. Every other path the
server uses (its config directory, private socket directory and log directory) is bind-mounted at
the same path as on the host, so the server's options are the same as the local runtime's.

Containers and volumes carry labels naming the pool and the branch; ``gc`` reconciles by them.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgoverlay.errors import (
    BranchStartError,
    DockerError,
    PoolFullError,
    TimeoutExpiredError,
    VersionMismatchError,
)
from pgoverlay.runner import safefs
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool.mounts import check_option_path
from pgoverlay.runner.postgres import postmaster
from pgoverlay.runner.proc import OsUser
from pgoverlay.runner.runtime import RUNNING, STOPPED, Layout, Liveness, MayRemove

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

    from pgoverlay.runner.pool import Pool
    from pgoverlay.runner.pool.registry import BaseVersion
    from pgoverlay.runner.runtime.docker_tools import DockerTools
    from pgoverlay.runner.settings import Settings

log = logging.getLogger(__name__)

LABEL_POOL = "org.pgoverlay.pool"
LABEL_BRANCH = "org.pgoverlay.branch"
LABEL_KIND = "org.pgoverlay.kind"
LABEL_BASE = "org.pgoverlay.base"

_majors: dict[str, int] = {}  # image id -> Postgres major, for this process


def connect(host: str | None, *, timeout: float = 30.0) -> DockerClient:
    """A client of the daemon at ``host`` (``Settings.docker_host``; None: the local socket)."""
    try:
        import docker

        # The address is given, never read from the environment by the SDK (which reads it
        # from os.environ when given none); None is the local socket.
        client = docker.DockerClient(base_url=host, timeout=int(timeout))
        client.ping()
    except Exception as err:  # docker raises many kinds: all mean "not reachable"
        where = f"at {host}" if host else "on the local socket"
        raise DockerError(
            f"cannot reach the Docker daemon {where} ({_first_line(err)}): start it "
            "(`systemctl start docker`), make sure this user may use it (the `docker` group), "
            "set PGOVERLAY_DOCKER_HOST to its address, or set PGOVERLAY_RUNTIME=local"
        ) from None
    return client


_shared = threading.local()


def shared(host: str | None) -> DockerClient:
    """This thread's client of the daemon at ``host``, made once: a branch command asks the
    daemon several things."""
    clients: dict[str | None, DockerClient] = _shared.__dict__.setdefault("clients", {})
    client = clients.get(host)
    if client is None:
        client = clients[host] = connect(host)
    return client


def available(host: str | None) -> bool:
    """Whether the daemon at ``host`` answers; asks (with a short timeout) only until it has
    once."""
    if host in _shared.__dict__.get("clients", {}):
        return True
    if reachable(host) is None:
        return False
    with contextlib.suppress(DockerError):
        shared(host)
        return True
    return False


def _local_socket_refuses(host: str | None) -> bool:
    """Whether the daemon is surely not there: ``host`` names no other daemon and nothing
    listens on the local socket. Asked before importing the Docker SDK, which costs a command
    more than the rest of its start-up, on a host without Docker."""
    if host and not host.startswith("unix://"):
        return False
    path = (host or "").removeprefix("unix://") or "/var/run/docker.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(3)
        try:
            probe.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            return True
        except OSError:
            return False  # e.g. not allowed: let the SDK say so
    return False


def reachable(host: str | None = None) -> str | None:
    """The version of the daemon at ``host`` if it answers within a few seconds, else None."""
    if _local_socket_refuses(host):
        return None
    try:
        client = connect(host, timeout=3)
    except DockerError:
        return None
    try:
        return str(client.version().get("Version", "?"))
    finally:
        client.close()


def daemon_version(settings: Settings) -> str:
    """The version of the daemon ``settings`` name, which answered a moment ago."""
    try:
        return str(shared(settings.docker_host).version().get("Version", "?"))
    except Exception:  # docker raises many kinds; it answered a moment ago
        return "?"


def image_present(client: DockerClient, image: str) -> bool:
    """Whether ``image`` is on this host, without pulling it."""
    import docker.errors

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return False
    return True


def image_major(client: DockerClient, image: str, *, timeout: float) -> int:
    """The Postgres major version of ``image``, pulling it if it is not on this host.

    ``timeout`` bounds asking an image without ``PG_MAJOR`` for ``postgres --version``."""
    import docker.errors

    try:
        found = client.images.get(image)
    except docker.errors.ImageNotFound:
        log.info("pulling image %s", image)
        try:
            found = client.images.pull(image)
        except docker.errors.APIError as err:
            raise DockerError(
                f"image {image} is not on this host and could not be pulled "
                f"({_first_line(err)}): pull or build it, or set PGOVERLAY_DOCKER_IMAGE to an "
                "image that is ({major} stands for the base's Postgres major version)"
            ) from None
    image_id = str(found.id)
    if image_id in _majors:
        return _majors[image_id]
    config = found.attrs.get("Config") or {}
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    major = _parse_major(env.get("PG_MAJOR", ""))
    if major is None:
        major = _ask_major(client, image, image_id, timeout=timeout)
    if major is None:
        raise DockerError(
            f"image {image} does not look like a Postgres image: neither PG_MAJOR in its "
            "environment nor `postgres --version` on its PATH; set PGOVERLAY_DOCKER_IMAGE "
            "to a Postgres image"
        )
    _majors[image_id] = major
    return major


# How Docker says the image has no ``postgres`` to run (runc's words, through the daemon).
_NO_EXECUTABLE = re.compile(r"executable file not found|no such file or directory", re.IGNORECASE)


def _ask_major(
    client: DockerClient, image: str, image_id: str, *, timeout: float
) -> int | None:
    """Not built like the official image: ask its ``postgres``; None if it has none. Any other
    failure is Docker's, and says Docker's own words (a daemon out of space, a user the image
    names that it lacks, a probe that did not answer): the image may well be Postgres's."""
    import docker.errors

    what = f"could not ask image {image} for its Postgres version"
    fix = "fix what Docker says, or set PGOVERLAY_DOCKER_IMAGE to an image Docker can run"
    try:
        container = client.containers.create(
            image_id,
            entrypoint=["postgres"],
            command=["--version"],
            network_mode="none",
            labels={LABEL_KIND: "probe"},
        )
    except docker.errors.DockerException as err:
        raise DockerError(
            f"{what}: Docker could not create its container ({_docker_says(err)}): {fix}"
        ) from None
    try:
        container.start()
        container.wait(timeout=timeout)
        return _parse_major(container.logs().decode(errors="replace"))
    except docker.errors.APIError as err:
        if _NO_EXECUTABLE.search(_docker_says(err)):
            return None  # no postgres on its PATH
        raise DockerError(f"{what}: Docker could not run it ({_docker_says(err)}): {fix}") from None
    except docker.errors.DockerException as err:
        raise DockerError(f"{what}: {_first_line(err)}: {fix}") from None
    except Exception as err:  # the SDK raises the HTTP client's timeout error
        raise DockerError(
            f"{what}: `postgres --version` did not finish within {timeout:g} s "
            f"({_first_line(err)}): see `docker ps -a --filter label={LABEL_KIND}=probe`; {fix}"
        ) from None
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True)


def _parse_major(text: str) -> int | None:
    match = re.search(r"(?:^|\s)(\d+)(?:\.\d+)?", text)
    return int(match.group(1)) if match else None


def _docker_says(err: BaseException) -> str:
    """The daemon's own words for an API error (not the SDK's HTTP wrapping), else its first
    line."""
    explanation = getattr(err, "explanation", None)
    return _first_line(explanation) if explanation else _first_line(err)


def _first_line(err: BaseException | str) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:400] if text else type(err).__name__


@dataclass(frozen=True)
class Publish:
    """Host addresses a branch's port is published on."""

    addresses: tuple[str, ...]

    @classmethod
    def parse(cls, listen_address: str) -> Publish:
        hosts = [h.strip() for h in listen_address.split(",") if h.strip()]
        return cls(tuple("0.0.0.0" if h == "*" else h for h in hosts) or ("127.0.0.1",))


@dataclass
class DockerRuntime:
    client: DockerClient
    image: str
    pool_id: str
    owner: OsUser
    publish: Publish
    shm_size: str
    start_timeout: float
    stop_timeout: float

    name = "docker"

    # the pool's side: the daemon, the image, the containers and volumes it labels ---------

    @classmethod
    def for_base(cls, pool: Pool, base: BaseVersion) -> DockerRuntime:
        s = pool.settings
        return cls(
            shared(s.docker_host),
            image=s.image_for(base.pg_major or 0),
            pool_id=pool.id,
            owner=pool.owner,
            publish=Publish.parse(s.listen_address),
            shm_size=s.docker_shm_size,
            start_timeout=s.start_timeout,
            stop_timeout=s.stop_timeout,
        )

    @classmethod
    def readiness(cls, settings: Settings) -> tuple[bool, str]:
        if not available(settings.docker_host):
            return False, (
                "the Docker daemon does not answer: start it, or set PGOVERLAY_RUNTIME=local"
            )
        return True, f"Docker {daemon_version(settings)}"

    @classmethod
    def verify(cls, settings: Settings, major: int, *, what: str) -> str:
        image = settings.image_for(major)
        found = image_major(shared(settings.docker_host), image, timeout=settings.command_timeout)
        if found != major:
            raise VersionMismatchError(
                f"image {image} runs Postgres {found}, but {what} is Postgres {major}: set "
                f"PGOVERLAY_DOCKER_IMAGE to an image of Postgres {major} "
                "({major} in it stands for the base's major version)"
            )
        return f"image {image} runs Postgres {major}"

    @classmethod
    def seed_tools(
        cls, pool: Pool, *, major: int, base_name: str, mounts: Sequence[Path]
    ) -> DockerTools:
        from pgoverlay.runner.runtime.docker_tools import DockerTools  # it imports this module

        s = pool.settings
        image = s.image_for(major)
        tools = DockerTools.for_image(
            connect(s.docker_host),
            image,
            owner=pool.owner,
            scratch=pool.tmp,
            mounts=[pool.root, *mounts],
            timeout=s.command_timeout,
            labels={LABEL_POOL: pool.id, LABEL_BASE: base_name},
        )
        if tools.major != major:
            raise VersionMismatchError(
                f"the source runs Postgres {major} but image {image} is Postgres {tools.major}: "
                f"set PGOVERLAY_DOCKER_IMAGE to an image of Postgres {major} "
                "({major} in it stands for the source's major version)"
            )
        return tools

    @classmethod
    def leftovers(
        cls, pool: Pool, *, known: Iterable[str], may_remove: MayRemove, in_use: bool
    ) -> list[str]:
        """This pool's containers and volumes that nothing claims (see ``reconcile``). Without
        a daemon there are none to reconcile: a ``DockerError`` only when a branch runs here."""
        try:
            client = connect(pool.settings.docker_host, timeout=10)
            try:
                return reconcile(
                    client,
                    pool_id=pool.id,
                    known=known,
                    may_remove=may_remove,
                    stop_timeout=pool.settings.stop_timeout,
                )
            finally:
                client.close()
        except DockerError:
            if in_use:
                raise
            return []

    @classmethod
    def remove_all(cls, settings: Settings, pool_id: str) -> list[str]:
        """Every container and volume labelled with this pool, whatever made it."""
        try:
            client = connect(settings.docker_host, timeout=10)
        except DockerError:
            log.info("no Docker daemon answers: no containers or volumes of this pool to remove")
            return []
        removed = []
        try:
            containers, volumes = labelled(client, pool_id)
            for container in containers:
                container.remove(force=True)
                removed.append(f"removed container {container.name}")
            for volume in volumes:
                remove_volume(client, volume.name)
                removed.append(f"removed volume {volume.name}")
        finally:
            client.close()
        return removed

    # a branch's side ---------------------------------------------------------------------

    # names and labels ----------------------------------------------------------------------

    def object_name(self, layout: Layout) -> str:
        return f"pgoverlay-{self.pool_id}-{layout.root.name}"

    def labels(self, layout: Layout, kind: str) -> dict[str, str]:
        return {LABEL_POOL: self.pool_id, LABEL_BRANCH: layout.root.name, LABEL_KIND: kind}

    def _container(self, layout: Layout) -> Container | None:
        import docker.errors

        try:
            return self.client.containers.get(self.object_name(layout))
        except docker.errors.NotFound:
            return None

    def attach(self, layout: Layout, *, lower: Path) -> None:
        import docker.errors

        # The daemon mounts what these paths name: each must be the real directory pgoverlay
        # made, reached through no link.
        for path in (lower, layout.upper, layout.work):
            safefs.require_real_dir(path)
        name = self.object_name(layout)
        try:
            self.client.volumes.get(name)
            return
        except docker.errors.NotFound:
            pass
        options = (
            f"lowerdir={check_option_path(lower)},upperdir={check_option_path(layout.upper)},"
            f"workdir={check_option_path(layout.work)}"
        )
        self.client.volumes.create(
            name=name,
            driver="local",
            driver_opts={"type": "overlay", "device": "overlay", "o": options},
            labels=self.labels(layout, "branch"),
        )

    def detach(self, layout: Layout) -> None:
        remove_volume(self.client, self.object_name(layout))

    def start(self, layout: Layout, *, options: dict[str, str]) -> None:
        import docker.errors

        self._remove_container(layout)
        # A dead server's pid file names a PID of another PID namespace: it is ours to remove.
        (layout.upper / "postmaster.pid").unlink(missing_ok=True)
        # The server appends to its log by name: leave it no link to follow.
        safefs.clear_unsafe(layout.log_file, uid=self.owner.uid)
        port = options["port"]
        settings = {
            **options,
            # Inside its own network namespace the server listens everywhere; the daemon
            # publishes the port on the host addresses only.
            "listen_addresses": "*",
            # stderr belongs to the daemon; the branch's log goes to its own directory.
            "logging_collector": "on",
            "log_directory": str(layout.log),
            "log_filename": layout.log_file.name,
            "log_rotation_age": "0",
            "log_rotation_size": "0",
        }
        argv: list[str] = []
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]

        def same(path: Path, mode: str) -> dict[str, str]:
            return {"bind": str(path), "mode": mode}

        try:
            container = self.client.containers.run(
                self.image,
                name=self.object_name(layout),
                entrypoint=["postgres"],
                command=argv,
                user=f"{self.owner.uid}:{self.owner.gid}",
                detach=True,
                labels=self.labels(layout, "branch"),
                volumes={
                    self.object_name(layout): same(layout.data, "rw"),
                    str(layout.conf): same(layout.conf, "ro"),
                    str(layout.socket_dir): same(layout.socket_dir, "rw"),
                    str(layout.log): same(layout.log, "rw"),
                    # The pool's own certificate and key, when it has them (ssl=on).
                    **{
                        options[key]: same(Path(options[key]), "ro")
                        for key in ("ssl_cert_file", "ssl_key_file")
                        if options.get(key)
                    },
                },
                ports={f"{port}/tcp": [(host, int(port)) for host in self.publish.addresses]},
                shm_size=self.shm_size,
                stop_signal="SIGINT",  # Postgres's fast shutdown
                environment={"PGDATA": str(layout.data)},
            )
        except docker.errors.APIError as err:
            self._remove_container(layout)
            text = _first_line(err)
            if "no space left" in text.lower():
                raise PoolFullError(
                    "the pool is full, so the branch could not start: destroy branches "
                    "(`pgoverlay branch list` shows their sizes) or grow the pool"
                ) from None
            raise BranchStartError(
                f"Docker could not start the branch's container: {text}"
            ) from None
        self._wait_ready(layout, container)

    def _wait_ready(self, layout: Layout, container: Container) -> None:
        pidfile = layout.upper / "postmaster.pid"
        checks = 0

        def probe() -> bool | None:
            nonlocal checks
            info = postmaster.read_pidfile(pidfile)
            if info is not None and info.status == "ready":
                return True
            checks += 1
            if checks % 5 == 0:
                container.reload()
                if container.status not in ("created", "running"):
                    tail = self._tail(layout, container)
                    raise BranchStartError(f"the branch's Postgres exited while starting: {tail}")
            return None

        try:
            wait_for(
                probe,
                timeout=self.start_timeout,
                what="the branch's container to accept connections",
                max_interval=postmaster.READY_POLL,
            )
        except TimeoutExpiredError as err:
            raise BranchStartError(f"{err}: {self._tail(layout, container)}") from None
        except BranchStartError as err:
            if "No space left on device" in str(err):
                raise PoolFullError(
                    "the pool is full, so the branch could not start: destroy branches "
                    "(`pgoverlay branch list` shows their sizes) or grow the pool"
                ) from None
            raise

    def _tail(self, layout: Layout, container: Container) -> str:
        tail = postmaster.log_tail(layout.log_file)
        if tail == "(no log)":
            with contextlib.suppress(Exception):  # the container may be gone already
                tail = container.logs(tail=3).decode(errors="replace").strip() or tail
        return f"{tail} (full log: {layout.log_file}, or `docker logs {container.name}`)"

    def stop(self, layout: Layout, *, discard: bool = False) -> None:
        self._remove_container(layout, discard=discard)

    def _remove_container(self, layout: Layout, *, discard: bool = False) -> None:
        import docker.errors

        container = self._container(layout)
        if container is None:
            return
        try:
            if container.status == "running" and not discard:
                container.stop(timeout=int(self.stop_timeout))
            container.remove(force=True)  # with discard: killed, as nothing of it is kept
        except docker.errors.NotFound:
            pass

    def server_pid(self, layout: Layout) -> int | None:
        container = self._container(layout)
        if container is None or container.status != "running":
            return None
        pid = int(container.attrs.get("State", {}).get("Pid") or 0)
        return pid or None

    def liveness(self, layout: Layout) -> Liveness:
        try:
            container = self._container(layout)
        except Exception as err:  # docker raises many kinds: none says the container stopped
            return Liveness("unknown", f"the Docker daemon did not answer ({_first_line(err)})")
        return RUNNING if container is not None and container.status == "running" else STOPPED


def remove_volume(client: DockerClient, name: str) -> None:
    import docker.errors

    with contextlib.suppress(docker.errors.NotFound):
        client.volumes.get(name).remove(force=True)


def labelled(client: DockerClient, pool_id: str) -> tuple[list[Any], list[Any]]:
    """This pool's containers (running or not) and volumes."""
    flt = {"label": f"{LABEL_POOL}={pool_id}"}
    return client.containers.list(all=True, filters=flt), client.volumes.list(filters=flt)


def reconcile(
    client: DockerClient,
    *,
    pool_id: str,
    known: Iterable[str],
    may_remove: MayRemove,
    stop_timeout: float,
) -> list[str]:
    """Remove this pool's containers and volumes that nothing claims any more.

    A branch's container or volume goes when no known branch has its name. A program's
    container (seeding, preparing, migrating) goes once it has exited, or when the base or
    branch it worked for is no longer locked by a live pgoverlay (``may_remove(kind, name)``
    with kind ``seed`` or ``branch``).
    """
    keep = set(known)
    removed = []
    containers, volumes = labelled(client, pool_id)
    for container in containers:
        labels = container.labels
        branch = labels.get(LABEL_BRANCH, "")
        if labels.get(LABEL_KIND) == "branch":
            gone = branch not in keep and may_remove("branch", branch)
        elif container.status not in ("created", "running"):
            gone = True
        elif labels.get(LABEL_BASE):
            gone = may_remove("seed", labels[LABEL_BASE])
        else:
            gone = bool(branch) and may_remove("branch", branch)
        if gone:
            if container.status == "running":
                container.stop(timeout=int(stop_timeout))
            container.remove(force=True)
            removed.append(f"container {container.name}")
    for volume in volumes:
        branch = (volume.attrs.get("Labels") or {}).get(LABEL_BRANCH, "")
        if branch not in keep and may_remove("branch", branch):
            remove_volume(client, volume.name)
            removed.append(f"volume {volume.name}")
    return removed
