"""`pgoverlay door`: the front door's process, started as root, serving as its own user.

As root (``prepare``): the door's account, the TLS certificate (the admin's, or a self-signed
one made once in ``<home>/door/``) loaded into a context, the two listening sockets bound, the
audit file opened, the OAuth client's secret read. Then ``privsep.drop``: from here on the
process is the door's user with the engine service's group, and everything it does with the
network (TLS, the Postgres startup, HTTP) happens after that. It reaches the engine through the
service's socket (``client.RemoteEngine``), where its uid lets it look at branches and grant
the person the page signed in, nothing more.

One process, one event loop (uvloop when present): the Postgres router (``router.FrontDoor``)
on ``door_port`` and the branch pages (``page.create_page``, under uvicorn) on
``door_https_port``, with the engine's network API (``api.create_api``) under ``/api/v1`` on
the same port when ``api_audience`` is set (its policy file read as root, here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pgoverlay.errors import BranchMissingError, ConfigError, PgoverlayError
from pgoverlay.runner import audit, safefs
from pgoverlay.runner.door import pidfile, privsep
from pgoverlay.runner.names import WAKEABLE
from pgoverlay.runner.proc import process_start_epoch, require_root
from pgoverlay.runner.settings import Settings

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from pgoverlay.runner.door import router
    from pgoverlay.runner.service.client import RemoteEngine
    from pgoverlay.runner.service.views import BranchView

log = logging.getLogger(__name__)

MAX_DESCRIPTORS = 65536


@dataclass
class Prepared:
    """What root hands the unprivileged door: nothing it could not have been given by
    descriptor or in memory."""

    uid: int
    gid: int
    service_gid: int
    postgres: socket.socket
    https: socket.socket
    postgres_tls: ssl.SSLContext
    https_tls: ssl.SSLContext
    engine: RemoteEngine
    pages: ASGIApp  # the branch pages, and the network API under /api/v1 when it is on
    audit: audit.AuditLog


def bind(address: str, port: int) -> socket.socket:
    """A listening TCP socket (IPv6 and IPv4 when the address is ``::``)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    try:
        sock.bind((address, port))
    except OSError as err:
        sock.close()
        raise OSError(
            err.errno,
            f"the front door cannot listen on {address}:{port} ({err.strerror}): free the port "
            "or set PGOVERLAY_DOOR_PORT / PGOVERLAY_DOOR_HTTPS_PORT",
        ) from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _more_descriptors() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, MAX_DESCRIPTORS)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def prepare(settings: Settings) -> Prepared:
    """Everything that needs root, done before a byte is read from the network: the modules
    the door runs are imported here too, as the interpreter's files may be root's alone."""
    import uvicorn  # noqa: F401 - imported while root may still read it

    from pgoverlay.runner.door import router, tls  # noqa: F401
    from pgoverlay.runner.service.client import RemoteEngine, socket_path
    from pgoverlay.runner.web import api, page  # noqa: F401

    require_root()
    uid, gid = privsep.account(settings.door.user)
    service_gid = privsep.group_id(settings.service_group)
    safefs.make_dir(pidfile.door_dir(settings), uid=0, gid=0, mode=0o755, exist_ok=True)
    if settings.door.cert_file is not None and settings.door.key_file is not None:
        pair = tls.Pair(cert=settings.door.cert_file, key=settings.door.key_file)
        fingerprint = None
    else:
        pair = tls.self_signed(pidfile.door_dir(settings), host=settings.door_name, uid=0, gid=0)
        fingerprint = tls.fingerprint(pair.cert)
    postgres_tls = tls.server_context(pair)
    https_tls = tls.server_context(pair)
    https_tls.set_alpn_protocols(["http/1.1"])
    safefs.make_dir(settings.home / "audit", uid=0, gid=0, mode=0o755, exist_ok=True)
    _more_descriptors()
    postgres = bind(settings.door.address, settings.door.port)
    https = bind(settings.door.address, settings.door.https_port)
    started = process_start_epoch(os.getpid())
    with contextlib.suppress(FileNotFoundError):
        pidfile.pid_file(settings).unlink()
    safefs.write_new(
        pidfile.pid_file(settings),
        f"{os.getpid()} {started} {settings.fingerprint()}\n",
        uid=0,
        gid=0,
        mode=0o644,
    )
    # nothing is asked of it before the door is its own user; a page view waits 30 s at most
    engine = RemoteEngine(socket_path(settings), timeout=30.0)
    audit_log = audit.AuditLog(settings.home / audit.DOOR_LOG, uid=uid, gid=gid)
    pages: ASGIApp
    if settings.page.oauth_client_id:  # reads the OAuth client's secret file, root's
        pages = page.create_page(
            settings,
            engine,
            secret=secrets.token_bytes(32),
            fingerprint=fingerprint,
            certificate=pair.cert.read_text() if fingerprint else None,
            audit=audit_log.write,
        )
    else:
        log.warning("the branch pages answer 503: %s", page.NOT_SET_UP)
        pages = page.create_unconfigured(
            certificate=pair.cert.read_text() if fingerprint else None
        )
    if settings.api.audience is not None:
        pages = with_api(settings, pages)
    return Prepared(
        uid=uid,
        gid=gid,
        service_gid=service_gid,
        postgres=postgres,
        https=https,
        postgres_tls=postgres_tls,
        https_tls=https_tls,
        engine=engine,
        pages=pages,
        audit=audit_log,
    )


def with_api(settings: Settings, pages: ASGIApp) -> ASGIApp:
    """The pages with the network API mounted at ``api.PREFIX``: its policy file read and
    checked now (as root: the admin's file may be root's alone), its issuer asked for keys
    when the first token comes."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from pgoverlay.runner.callers import oidc, policy
    from pgoverlay.runner.service import vouch
    from pgoverlay.runner.service.acting import Acting
    from pgoverlay.runner.service.client import RemoteEngine, socket_path
    from pgoverlay.runner.web import api

    if settings.api.audience is None or settings.api.policy_file is None:  # Settings checks
        raise ConfigError("the network API needs PGOVERLAY_API_AUDIENCE and its policy file")
    verifier = oidc.Verifier(settings.api.issuer, settings.api.audience, leeway=settings.api.leeway)
    rules = policy.load(settings.api.policy_file)
    path = socket_path(settings)

    def engine_for(token: str, named: Acting | None) -> RemoteEngine:
        sent = vouch.headers(token=token, named=named)
        return RemoteEngine(path, timeout=settings.command_timeout, headers=sent)

    served = api.create_api(
        verifier=verifier,
        policy=rules,
        engine_for=engine_for,
        door=RemoteEngine(path, timeout=30.0),
        door_host=settings.door_name,
        door_port=settings.door.port,
        door_https_port=settings.door.https_port,
        app_sslmode=settings.door_app_sslmode,
        failed_logins=settings.door.failed_logins,
        failed_window=settings.door.failed_window,
        ipv6_prefix=settings.door.ipv6_prefix,
    )
    log.info(
        "network API on https://%s:%d%s for audience %s (issuer %s)",
        settings.door_name,
        settings.door.https_port,
        api.PREFIX,
        settings.api.audience,
        verifier.issuer,
    )
    return Starlette(routes=[Mount(api.PREFIX, app=served), Mount("/", app=pages)])


def serve(settings: Settings) -> None:
    """Prepare as root, drop to the door's user, serve until SIGTERM/SIGINT."""
    prepared = prepare(settings)
    privsep.drop(prepared.uid, prepared.gid, groups=[prepared.service_gid])
    log.info(
        "front door for %s: postgres on %s:%d, pages on https://%s:%d (as %s)",
        settings.home,
        settings.door.address,
        settings.door.port,
        settings.door_name,
        settings.door.https_port,
        settings.door.user,
    )
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(_serve(settings, prepared))
    else:
        uvloop.run(_serve(settings, prepared))


def resolver(engine: RemoteEngine) -> router.Resolve:
    """The router's lookup: the branch as the engine lists it (anyone may look), if it is
    ready, and the roles that may log in through the door: the credentials the engine granted
    (people's, the preview app's, and a job's on another runner), each until its expiry; never
    the branch's own role, whose password PR SQL can change. Asked each connection (the
    engine answers from its registry in about a millisecond, the logins with the branch), so a
    destroyed branch is unreachable, and a revoked or expired grant refused, at once; asked
    from the loop's own thread (``RemoteEngine.look``), handed to no thread of its own.

    A suspended branch is woken first if the router's ``may_wake`` allows it (asked by the
    connection that starts a wake: one that joins a wake under way adds no cost), and the
    client's connection waits meanwhile: the connections that arrive while it wakes share one
    wake (and the engine's lock on the branch makes a wake from elsewhere, a command or the
    Action, the same one). A wake that fails is logged with why, and raised as
    ``router.WakeFailed``."""

    from pgoverlay.runner.door import router

    waking: dict[str, asyncio.Future[BranchView]] = {}

    async def woken(name: str) -> BranchView:
        started = time.monotonic()
        view = await asyncio.to_thread(engine.wake, name)
        log.info("woke branch %s in %.3f s", name, time.monotonic() - started)
        return view

    async def wake(name: str) -> BranchView:
        pending = waking.get(name)
        if pending is None:
            pending = asyncio.ensure_future(woken(name))
            waking[name] = pending
            pending.add_done_callback(lambda _: waking.pop(name, None))
        return await asyncio.shield(pending)

    async def resolve(name: str, *, may_wake: Callable[[], bool]) -> router.Route | None:
        try:
            view = await engine.look(name)
        except BranchMissingError:
            return None
        except PgoverlayError as err:
            log.warning("the front door could not look up branch %s: %s", name, err)
            return None
        minted = (view.logins or []) if view is not None else []  # the wake's view has none
        if view is not None and view.state in WAKEABLE:
            if name not in waking and not may_wake():  # joining a wake under way costs nothing
                return None
            try:
                view = await wake(name)
            except BranchMissingError:
                return None
            except PgoverlayError as err:
                log.error("the front door could not wake branch %s: %s", name, err)
                raise router.WakeFailed(str(err)) from None
        if view is None or view.state != "ready":
            return None
        logins = {g.role: g.expires_at for g in minted}
        return router.Route(host=view.host, port=view.port, database=view.database, logins=logins)

    return resolve


async def _serve(settings: Settings, prepared: Prepared) -> None:
    import uvicorn

    from pgoverlay.runner.door import router
    from pgoverlay.runner.web import page

    door = router.FrontDoor(
        settings,
        ssl_context=prepared.postgres_tls,
        resolve=resolver(prepared.engine),
        audit=prepared.audit.write,
    )
    await door.start(sock=prepared.postgres)
    page.quiet_access_log()
    config = uvicorn.Config(
        prepared.pages,
        log_config=None,
        access_log=False,  # a URL is never logged (a code or state is in the callback's)
        lifespan="off",
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=16 * 1024,
    )
    config.load()
    config.ssl = prepared.https_tls  # the context root made; uvicorn would read the key file
    server = uvicorn.Server(config)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    pages = asyncio.create_task(server.serve(sockets=[prepared.https]))
    stop = asyncio.create_task(stopping.wait())
    await asyncio.wait({pages, stop}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await door.close()
    with contextlib.suppress(asyncio.CancelledError):
        await pages
