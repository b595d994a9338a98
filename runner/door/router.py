"""The front door: one TCP port that speaks the Postgres protocol for every branch of the pool.

Per connection, within ``door_handshake_timeout`` seconds of the accept (to the branch's
ReadyForQuery, or the door's refusal):

1. The client's first packets (``startup``): GSSENCRequest is answered ``N``; SSLRequest ``S``,
   then TLS with the door's certificate (no unencrypted byte may follow the request: the
   CVE-2021-23214 buffer-stuffing attack). A client opening with a TLS record itself
   (PostgreSQL 17's ``sslnegotiation=direct``) is closed at once: it cannot read a Postgres
   error, and libpq's default negotiation works. A StartupMessage in plaintext is refused
   (28000, "connect with sslmode=require or stronger") unless ``door_plaintext_loopback`` and
   the peer is loopback. A CancelRequest (in plaintext, as libpq sends it, or inside TLS) is
   forwarded only to the branch whose backend gave the door that key, else dropped without a
   word and counted as a failed login (its 32-bit secret is a password of sorts).
2. The client's checks (a client is an IPv4 address, or an IPv6 network of
   ``door_ipv6_prefix`` bits, see ``guard``): ``door_failed_logins`` failures within
   ``door_failed_window`` seconds (28000 "too many failed logins from this address; try again
   later"), more than ``door_max_per_source`` connections (the ``PER_SOURCE`` cap: 53300; more
   than twice as many are closed unanswered).
3. The branch: the TLS SNI name ``BRANCH.<door_sni_suffix>`` when the suffix is set and the
   name ends with it, else the StartupMessage's ``database``; asked of the injected
   ``resolve(name, may_wake=...)`` on every connection (nothing is cached, so a destroyed branch
   is unreachable, and a revoked or expired grant refused, as soon as the engine forgets it).
   The answer names the roles that may log in (the credentials the engine minted, until their
   expiry); any other role (the branch's own, one PR SQL made) gets the unknown name's answer.
   A suspended branch is woken only if ``may_wake`` allows it, and the wake counts as a failed
   login until a login through it succeeds; a wake that fails is told to the client (57P03,
   "ask the pool's admin") and counts as nothing.
4. The login, relayed message by message: the door connects to the branch (plain TCP on
   loopback), sends the StartupMessage with ``database`` set to the branch's real database, and
   passes on the branch's SCRAM-SHA-256 exchange. Authentication stays end to end between the
   client and the branch; the door never sees a password, and refuses a branch that asks for a
   method that would show it one. Behind the door a branch offers SCRAM-SHA-256 only, never
   SCRAM-SHA-256-PLUS (the branch's connection is not TLS), so a client with
   ``channel_binding=require`` cannot use the door.
5. The caps of ``AFTER_LOGIN`` (``door_branch_cap`` authenticated connections per branch): a
   connection over one is refused (53300) once the client has logged in: before that, a cap
   would tell an anonymous client that the branch exists.
6. The splice (``channel``): bytes both ways until either side closes.

What an anonymous client learns: nothing about which branches exist. A name that is not a
branch (or not a valid branch name, or a branch that cannot be reached now), and a branch's
refusal of the role before any exchange (pg_hba.conf), get what a wrong password on a real
branch gets: AuthenticationSASL offering SCRAM-SHA-256, a server-first with a fresh 24-character
nonce, a salt and 4096 iterations, then FATAL 28P01 ``password authentication failed for user
"<user>"``. The salt is an HMAC of the branch name and user under a key the door draws at start,
so it stays the same from one attempt to the next, as a real role's does (a fresh salt per
attempt would tell). Every error of a login, the branch's included, is written by the door
without Postgres's source-file fields, so the two read the same byte for byte. The client's
SCRAM messages are checked by the door in both cases before a branch sees them, as Postgres 15
checks them (``startup``: its SQLSTATE, message and detail for each malformed message), and a
refusal counts as a failed login. The imitation's three answers wait as long as a recent real
wrong password's did, counted from the same instants (the first from before the engine's
lookup, so the lookup is not paid twice; ``guard``). Each such failure counts against the
client's failed logins, as a wrong password does.

Caps: each is declared once (a ``Cap``: its kind, its setting, what it counts a connection
by, its refusal), and counted in one place, the connection's slots (``guard.Slots``), taken as
the connection reaches the cap's check and all given back when it ends, however it ends.

Audit: one ``door.connect`` line per connection through the injected ``audit`` writer (an
``AuditLog.write``): user, branch, source, start, end, bytes_in, bytes_out, outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pgoverlay.runner import audit as auditmod
from pgoverlay.runner.door import login
from pgoverlay.runner.door import startup as proto
from pgoverlay.runner.door.channel import Channel, ChannelClosed, splice
from pgoverlay.runner.door.guard import Guard, Taken, client_of, is_loopback, source_of
from pgoverlay.runner.door.login import AuditLine, Refused
from pgoverlay.runner.names import NAME_RE

if TYPE_CHECKING:
    from pgoverlay.runner.settings import Settings

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0  # to a branch's port on this host
_SNI_ATTRIBUTE = "pgoverlay_door_sni"
_TLS_RECORD = 0x16  # a TLS handshake record's first byte: a client that skipped the SSLRequest


@dataclass(frozen=True)
class Route:
    """Where a branch is served: its loopback address and port, and its real database.
    ``logins``: the roles that may log in through the door, each until its expiry (epoch
    seconds): the credentials the engine minted. None: any role the branch lets in (a route
    fixed by a test or a bench)."""

    host: str
    port: int
    database: str
    logins: Mapping[str, float] | None = None

    def admits(self, user: str, *, now: float) -> bool:
        if self.logins is None:
            return True
        until = self.logins.get(user)
        return until is not None and now < until


@dataclass(frozen=True)
class Cap:
    """A cap on the connections through the door at once, per key of one kind (a client, a
    branch): declared once here, its slot taken by ``FrontDoor._take`` and given back with
    the connection's others when it ends."""

    kind: str  # the slots' kind
    limit: Callable[[Settings], int]
    key: Callable[[AuditLine], str]  # what it counts a connection by
    outcome: str  # the audit line's outcome when it refuses one
    refusal: str  # what the client is told: ``{key}`` and ``{limit}`` filled in


# Taken as a connection is accepted (what a flood of them counts), refused at the login.
PER_SOURCE = Cap(
    kind="source",
    limit=lambda s: s.door.max_per_source,
    key=lambda r: r.client,
    outcome="refused:source_cap",
    refusal="too many connections from this address (door_max_per_source = {limit}): close "
    "some, or have the admin raise PGOVERLAY_DOOR_MAX_PER_SOURCE",
)
PER_BRANCH = Cap(
    kind="branch",
    limit=lambda s: s.door_branch_cap,
    key=lambda r: r.branch,
    outcome="refused:branch_cap",
    refusal="too many connections to branch {key} through the front door: it takes {limit} "
    "(door_max_per_branch = {limit}), all in use; close some (a preview app's pool shares "
    "them with its reviewers), or have the admin raise PGOVERLAY_MAX_CONNECTIONS",
)
# Taken, in this order, once the client has logged in.
AFTER_LOGIN = (PER_BRANCH,)


class WakeFailed(Exception):
    """The branch is suspended and could not be woken (its port taken, its disk full): private
    control flow, raised by ``resolve`` and caught by the router, which tells the client so
    (57P03) and counts no failed login."""


class Resolve(Protocol):
    """The branch named ``name``, as the engine knows it now (None: no such branch, or none
    that can be reached). A suspended branch is woken only if ``may_wake()`` says so, called
    before a wake starts (it counts the wake against the client); a connection that joins a
    wake under way need not ask."""

    def __call__(self, name: str, *, may_wake: Callable[[], bool]) -> Awaitable[Route | None]: ...


class Audit(Protocol):
    def __call__(self, event: str, **fields: object) -> None: ...


class FrontDoor:
    def __init__(
        self,
        settings: Settings,
        *,
        ssl_context: ssl.SSLContext,
        resolve: Resolve,
        audit: Audit,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.settings = settings
        self._ssl = ssl_context
        self._ssl.sni_callback = _remember_sni
        self._resolve = resolve
        self._audit = audit
        # How long logins take is timed on the loop's clock; ``clock`` (tests) is the failed
        # logins' window's.
        self._clock: Callable[[], float] = _loop_time
        self.guard = Guard(
            failed_logins=settings.door.failed_logins,
            failed_window=settings.door.failed_window,
            clock=clock or self._clock,
        )
        self._login_steps = login.LoginSteps(self.guard)
        self._keys: dict[tuple[int, bytes], Route] = {}
        self._channels: set[Channel] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(
        self, *, sock: socket.socket | None = None, host: str | None = None, port: int = 0
    ) -> None:
        """Serve on ``sock`` (bound by root before it dropped privileges), or bind
        ``host``:``port`` (tests)."""
        loop = asyncio.get_running_loop()
        if sock is not None:
            self._server = await loop.create_server(self._channel, sock=sock, backlog=512)
        else:
            self._server = await loop.create_server(self._channel, host, port, backlog=512)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop accepting, and close every connection (a session in progress included)."""
        if self._server is not None:
            self._server.close()
        for channel in list(self._channels):
            channel.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # -- one connection ----------------------------------------------------------------

    def _channel(self) -> Channel:
        client = _ClientChannel(self)
        return client

    def _accepted(self, client: Channel) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(client))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, client: Channel) -> None:
        source = source_of(client.info("peername"))
        record = AuditLine(
            source=source, client=client_of(source, ipv6_prefix=self.settings.door.ipv6_prefix)
        )
        backend: Channel | None = None
        held = self.guard.slots.taker()
        self._channels.add(client)
        key: tuple[int, bytes] | None = None
        try:
            if self._take(held, PER_SOURCE, record) > 2 * PER_SOURCE.limit(self.settings):
                record.outcome = "refused:flood"
                return
            try:
                async with asyncio.timeout(self.settings.door.handshake_timeout):
                    backend, key = await self._handshake(client, record, held)
            except TimeoutError:
                record.outcome = "timeout"
                _say(client, proto.error_response(proto.CANNOT_CONNECT_NOW, self._late()))
                return
            except Refused as refused:
                record.outcome = refused.outcome
                _say(client, proto.error_response(refused.sqlstate, refused.message))
                return
            except proto.StartupError as bad:
                if record.outcome != "refused:scram":  # a SCRAM message's, counted as failed
                    record.outcome = "refused:protocol"
                _say(client, bad.response())
                return
            except (ChannelClosed, OSError) as gone:
                if record.outcome == "tls_handshake" or isinstance(gone, ssl.SSLError):
                    record.outcome = "refused:tls"
                elif record.outcome == "login":
                    record.outcome = "client_left"
                return
            except Exception:  # the door's own bug: this connection ends, the door serves on
                log.exception("the front door failed a connection from %s", record.source)
                record.outcome = "door_error"
                _say(client, proto.error_response("XX000", "the front door failed; try again"))
                return
            if backend is None:
                return
            record.outcome = "closed"
            self._channels.add(backend)
            splice(client, backend)
            await asyncio.wait([client.done, backend.done], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            record.outcome = "door_closed" if backend is not None else record.outcome
            raise
        finally:
            for side in (client, backend):
                if side is not None:
                    side.close()
                    self._channels.discard(side)
            held.release()
            if key is not None:
                self._keys.pop(key, None)
            self._write_audit(record, client, backend)

    def _take(self, held: Taken, cap: Cap, record: AuditLine) -> int:
        """Hold a slot of ``cap`` for ``record``'s connection until it ends: how many are
        held now, this one included."""
        return held.take(cap.kind, cap.key(record))

    def _refuse_over(self, held: Taken, cap: Cap, record: AuditLine) -> None:
        """Refuse the connection when more than ``cap``'s limit hold its slot (this one
        included)."""
        limit = cap.limit(self.settings)
        if held.count(cap.kind) > limit:
            raise Refused(
                cap.outcome,
                proto.TOO_MANY_CONNECTIONS,
                cap.refusal.format(key=cap.key(record), limit=limit),
            )

    def _late(self) -> str:
        seconds = self.settings.door.handshake_timeout
        return (
            f"the connection took longer than {seconds:g} s to log in "
            "(the front door's door_handshake_timeout): connect again"
        )

    def _write_audit(self, record: AuditLine, client: Channel, backend: Channel | None) -> None:
        try:
            self._audit(
                "door.connect",
                user=record.user,
                branch=record.branch,
                source=record.source,
                start=record.start,
                end=auditmod.now(),
                bytes_in=client.received,
                bytes_out=client.sent,
                outcome=record.outcome,
            )
        except (OSError, ValueError) as exc:
            log.warning("cannot write the front door's audit line: %s", exc)

    async def _first(self, client: Channel) -> proto.FirstPacket:
        header = await client.read(4)
        length = proto.startup_length(header)
        return proto.parse_first(header + await client.read(length - 4))

    async def _handshake(
        self, client: Channel, record: AuditLine, held: Taken
    ) -> tuple[Channel | None, tuple[int, bytes] | None]:
        """Everything up to the branch's ReadyForQuery: the branch's channel (None when the
        door answered alone), the backend's cancel key."""
        if await client.peek() == _TLS_RECORD:
            record.outcome = "refused:direct_tls"
            return None, None
        first = await self._first(client)
        if isinstance(first, proto.GSSEncRequest):
            client.write(b"N")
            first = await self._first(client)
        encrypted = False
        if isinstance(first, proto.SSLRequest):
            if client.buffered:
                raise proto.StartupError(
                    proto.PROTOCOL_VIOLATION, "received unencrypted data after SSL request"
                )
            client.write(b"S")
            record.outcome = "tls_handshake"
            await client.start_tls(self._ssl, timeout=self.settings.door.handshake_timeout)
            record.outcome = "no_startup"
            encrypted = True
            first = await self._first(client)
        if isinstance(first, proto.SSLRequest | proto.GSSEncRequest):
            raise proto.StartupError(
                proto.PROTOCOL_VIOLATION, "unexpected encryption request: encryption is settled"
            )
        if isinstance(first, proto.CancelRequest):
            record.outcome = "cancel"
            await self._cancel(first, record)
            return None, None
        record.user = first.user
        record.outcome = "login"
        return await self._login(client, first, record, held, encrypted=encrypted)

    async def _login(
        self,
        client: Channel,
        start: proto.Startup,
        record: AuditLine,
        held: Taken,
        *,
        encrypted: bool,
    ) -> tuple[Channel | None, tuple[int, bytes] | None]:
        s = self.settings
        if not encrypted and not (s.door.plaintext_loopback and is_loopback(record.source)):
            raise Refused(
                "refused:plaintext",
                proto.INVALID_AUTHORIZATION,
                "the front door takes only TLS connections: connect with sslmode=require "
                "or stronger",
            )
        if start.minor > 0 or start.protocol_options:
            client.write(proto.negotiate_protocol(start.protocol_options))
        if self.guard.banned(record.client):
            raise Refused(
                "refused:failed_logins",
                proto.INVALID_AUTHORIZATION,
                "too many failed logins from this address; try again later",
            )
        self._refuse_over(held, PER_SOURCE, record)
        name = self._branch_name(client, start)
        record.branch = name
        began = self._clock()
        route = await self._route(name, record)
        if route is None or not route.admits(start.user, now=time.time()):
            # No branch, or a role the engine minted no current credential for (the branch's
            # own, one PR SQL made, an expired grant): the same wrong password either way.
            record.outcome = "unknown_branch" if route is None else "refused:role"
            await self._login_steps.imitate(
                client, user=start.user, name=name, record=record, began=began
            )
            return None, None
        try:
            backend = await self._connect(route)
        except OSError as exc:
            log.warning(
                "the front door cannot reach branch %s (port %s): %s", name, route.port, exc
            )
            record.outcome = "branch_unreachable"
            await self._login_steps.imitate(
                client, user=start.user, name=name, record=record, began=began
            )
            return None, None
        try:
            backend.write(start.rewritten(route.database))
            if not await self._login_steps.relay(
                client, backend, user=start.user, name=name, record=record, began=began
            ):
                backend.close()
                return None, None
            if record.wake_counted:  # the wake it caused was worth a good login
                record.wake_counted = False
                self.guard.forgive(record.client)
            for cap in AFTER_LOGIN:
                self._take(held, cap, record)
                self._refuse_over(held, cap, record)
            key = await login.until_ready(client, backend)
            if key is None:
                backend.close()
                record.outcome = "branch_error"
                return None, None
            if key[1]:
                self._keys[key] = route
            return backend, key
        except BaseException:
            backend.close()
            raise

    async def _route(self, name: str, record: AuditLine) -> Route | None:
        """The engine's answer for ``name``. A wake counts against the client as a failed
        login until a login through it succeeds (a client that hangs up after the first reply
        keeps it counted), so a client wakes at most its failed logins' worth of branches; a
        wake that fails is told to the client and counted as nothing."""

        def may_wake() -> bool:
            if self.guard.banned(record.client):
                return False
            self.guard.failed(record.client)
            record.wake_counted = True
            return True

        if not NAME_RE.match(name):
            return None
        try:
            return await self._resolve(name, may_wake=may_wake)
        except WakeFailed:
            if record.wake_counted:
                record.wake_counted = False
                self.guard.forgive(record.client)
            raise Refused(
                "wake_failed",
                proto.CANNOT_CONNECT_NOW,
                f"branch {name} is suspended and could not be woken: ask the pool's admin, who "
                "finds why in the front door's log and repairs it with `pgoverlay gc`",
            ) from None

    def _branch_name(self, client: Channel, start: proto.Startup) -> str:
        suffix = (self.settings.door.sni_suffix or "").strip(".").lower()
        sni = getattr(client.info("ssl_object"), _SNI_ATTRIBUTE, None)
        if suffix and isinstance(sni, str):
            name = sni.rstrip(".").lower()
            if name.endswith("." + suffix):
                return name[: -len(suffix) - 1]
        return start.database

    async def _connect(self, route: Route) -> Channel:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(CONNECT_TIMEOUT):
            _, backend = await loop.create_connection(Channel, route.host, route.port)
        return backend

    async def _cancel(self, request: proto.CancelRequest, record: AuditLine) -> None:
        route = self._keys.get((request.pid, request.key))
        if route is None:
            if not self.guard.banned(record.client):  # a banned one's cancels cost nothing
                self.guard.failed(record.client)
            record.outcome = "cancel_unknown"
            return
        try:
            backend = await self._connect(route)
        except (OSError, TimeoutError):
            return
        backend.write(request.packet())
        backend.close()


class _ClientChannel(Channel):
    """A client's side: the door starts its task when it connects."""

    def __init__(self, door: FrontDoor) -> None:
        super().__init__()
        self._door = door

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._door._accepted(self)


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


def _say(client: Channel, data: bytes) -> None:
    with contextlib.suppress(ChannelClosed, ConnectionError, RuntimeError):
        client.write(data)


def _remember_sni(obj: object, name: str | None, context: ssl.SSLContext) -> None:
    """The TLS server name the client asked for, kept on its SSL object for the routing."""
    if name is not None:
        setattr(obj, _SNI_ATTRIBUTE, name)
