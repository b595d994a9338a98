"""Where the listener's jobs reach the engine: the engine service's socket on this host, or,
with ``server`` set, the pool's network API on another host (``netclient.NetworkEngine``).

Over the network the listener shows the API token the pool's admin issued it (``pgoverlay api
token issue``): read once from ``server_token_file`` when the process starts, kept in memory,
never logged, never in an argument list or an error. A token is scoped to owners (or
repositories), not to one repository, so each job's requests name the repository they act for
(``service.acting``: its name, id, owner's id and whether the pull request comes from a fork),
taken from the signed delivery; the door admits them only within the token's scope and the
pool's policy, and the branch is owned by the repository's id, as a workflow's would be.
No pool, engine service or service group is needed on the listener's host.
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from pgoverlay.errors import ConfigError, UnsafeFileError
from pgoverlay.runner import safefs
from pgoverlay.runner.service import acting
from pgoverlay.runner.service import client as service
from pgoverlay.runner.service.acting import Acting
from pgoverlay.runner.service.tokens import looks_like
from pgoverlay.runner.settings import Settings
from pgoverlay.webhook.settings import WebhookSettings

if TYPE_CHECKING:
    from pgoverlay.runner.service.engine import Engine
    from pgoverlay.runner.service.netclient import StaticCredential

log = logging.getLogger(__name__)

MAX_TOKEN_FILE_BYTES = 1024


def read_token(settings: WebhookSettings) -> str:
    """The API token in ``server_token_file``: its one line; ConfigError saying what is wrong
    with the file (never what it holds)."""
    path = settings.server_token_file
    if path is None:
        raise ConfigError("server_token_file is not set: name the file holding the API token")
    what = f"server_token_file {path}"
    try:
        raw = safefs.read_regular(path, limit=MAX_TOKEN_FILE_BYTES, what=what)
    except UnsafeFileError as err:
        raise ConfigError(f"{err}: the listener's user must be able to read it") from None
    token = raw.decode("ascii", errors="replace").strip()
    if not looks_like(token) or any(c.isspace() for c in token):
        raise ConfigError(
            f"{what} does not hold an API token (one line, pgo_...): put there the line "
            "`pgoverlay api token issue` printed on the pool"
        )
    return token


class Engines:
    """The engine for each job: the service's socket client (one, shared), or a client of the
    pool's network API naming the job's repository."""

    def __init__(self, settings: WebhookSettings, runner: Settings) -> None:
        self.runner = runner
        self.server = settings.server
        self.ca_file = settings.server_ca
        self._credential: StaticCredential | None = None
        if self.server is not None:
            from pgoverlay.runner.service.netclient import StaticCredential

            self._credential = StaticCredential(read_token(settings))
            log.info("jobs ask the pool's network API at %s", self.server)

    @property
    def remote(self) -> bool:
        return self.server is not None

    def local(self) -> Engine:
        """The engine service on this host (its socket)."""
        return service.client(self.runner)

    def acting_for(self, named: Acting) -> Engine:
        """The pool's network API, for requests that act for ``named``."""
        from pgoverlay.runner.service.netclient import NetworkEngine

        assert self.server is not None and self._credential is not None
        return NetworkEngine(
            self.server,
            credential=self._credential,
            ca_file=self.ca_file,
            timeout=self.runner.command_timeout,
            headers=acting.headers(named),
        )

    def runner_for(self, engine: Engine) -> Settings:
        """The runner's settings for a job on ``engine``: with a pool on another host, its way
        in (the door's name and ports, as its API says), so that a report's and a
        Deployment's links are the pool's, not this host's."""
        from pgoverlay.runner.service.netclient import NetworkEngine

        if not isinstance(engine, NetworkEngine):
            return self.runner
        door = engine.pool()
        return self.runner.replace(
            door_host=str(door["door_name"]),
            door_port=int(door["door_port"]),
            door_https_port=int(door["door_https_port"]),
        )

    def door_answers(self, engine: Engine) -> bool:
        """Whether the front door a report on ``engine`` points at answers: a pool on another
        host is reached through its door; on this host, whether its port accepts."""
        from pgoverlay.runner.door.reach import answering
        from pgoverlay.runner.service.netclient import NetworkEngine

        return isinstance(engine, NetworkEngine) or answering(self.runner)

    def holding(self, engine: Engine, name: str) -> AbstractContextManager[None]:
        """Hold branch ``name`` on a pool on another host while a job works on it, as the
        Action's job does there: a workflow of the same pull request on another runner waits
        (and this job for it). On this host the queue alone orders a pull request's jobs."""
        from pgoverlay.runner.service.netclient import NetworkEngine

        if not isinstance(engine, NetworkEngine):
            return contextlib.nullcontext()
        return engine.hold(name, wait=self.runner.command_timeout)

    def check(self) -> None:
        """Fail early, saying how to fix it, when the engine cannot be reached: the service on
        this host answers; over the network, the server's URL and certificate are readable
        (the door is asked with each job, for that job's repository)."""
        if self.remote:
            self.acting_for(Acting(repository="-/-", repository_id=1, owner_id=1))
            return
        engine = service.client(self.runner)
        try:
            engine.bases()
        finally:
            engine.close()
