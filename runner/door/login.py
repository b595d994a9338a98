"""A login through the front door, message by message: the branch's own SCRAM exchange passed
on (the client's messages checked first, the branch's errors rewritten without their
source-file fields), or, for a name that is not a branch reachable now, the imitation of a
wrong password (see ``router``'s docstring for what an anonymous client can learn)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import secrets
import struct
from dataclasses import dataclass, field

from pgoverlay.runner import audit as auditmod
from pgoverlay.runner.door import startup as proto
from pgoverlay.runner.door.channel import Channel
from pgoverlay.runner.door.guard import Guard
from pgoverlay.runner.names import SCRAM_ITERATIONS

SASL_CAP = 8 * 1024  # a client's SCRAM message is under 200 bytes
BACKEND_CAP = 1024 * 1024  # a branch's message during login (an ErrorResponse, a notice)


class Refused(Exception):
    """A connection the door ends with a FATAL to the client: private control flow, caught in
    the connection's own task."""

    def __init__(self, outcome: str, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.sqlstate = sqlstate
        self.message = message


@dataclass
class AuditLine:
    """One connection's audit line, filled in as it goes."""

    source: str
    client: str = ""  # what the door's limits count it as: its address, or its IPv6 prefix
    start: str = field(default_factory=auditmod.now)
    user: str = ""
    branch: str = ""
    outcome: str = "no_startup"
    # a wake this connection caused, counted as a failed login until the login ends: taken
    # back at a good login, or standing for the failure when it fails
    wake_counted: bool = False


class LoginSteps:
    """The steps of logins for one door: its guard (failed logins, timings) and the key its
    imitation's salts are drawn from (new at every start of the door)."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self._salt_key = secrets.token_bytes(32)

    async def relay(
        self,
        client: Channel,
        backend: Channel,
        *,
        user: str,
        name: str,
        record: AuditLine,
        began: float,
    ) -> bool:
        """The branch's authentication, passed on: True at AuthenticationOk. ``began``: when
        the door started to look the branch up (the imitation's waits count from there too)."""
        exchanged = False
        first = proto.ClientFirst(nonce="", bare="")
        step, since = "sasl", began
        waits: list[float] = []  # the client's wait for each answer, as the imitation copies
        while True:
            kind, body = await backend.read_message(cap=BACKEND_CAP)
            if kind == b"E":
                fields = proto.error_fields(body)
                sqlstate = fields.get("C", "XX000")
                if not sqlstate.startswith("28"):
                    client.write(
                        proto.error_response(
                            sqlstate, fields.get("M", ""), detail=fields.get("D", "")
                        )
                    )
                    record.outcome = "branch_error"
                    return False
                record.outcome = "auth_failed"
                if exchanged:
                    self.failed(record)
                    waits.append(_loop_time() - since)
                    self.guard.timed(step, waits[-1])
                    if len(waits) == 3:
                        self.guard.failed_login_timed((waits[0], waits[1], waits[2]))
                    client.write(proto.password_failed(user))
                else:  # the branch refused the role outright: as if it had asked
                    await self.imitate(client, user=user, name=name, record=record, began=began)
                return False
            if kind != b"R":
                raise proto.StartupError(
                    proto.PROTOCOL_VIOLATION,
                    f"unexpected message {kind!r} from branch {name} during the login",
                )
            code = proto.auth_code(body)
            if code == proto.AUTH_OK:
                client.hold(proto.message(kind, body))  # with what follows it (until_ready)
                return True
            if code == proto.AUTH_SASL:
                waits.append(_loop_time() - since)
                self.guard.timed(step, waits[-1])
                client.write(proto.message(kind, body))
                answer = await self._answer(client, record)
                first = self._client_first(record, answer)
                exchanged = True
            elif code == proto.AUTH_SASL_CONTINUE:
                waits.append(_loop_time() - since)
                self.guard.timed(step, waits[-1])
                nonce = proto.server_first_nonce(body[4:])
                client.write(proto.message(kind, body))
                answer = await self._answer(client, record)
                self._client_final(record, answer, nonce=nonce, flag=first.flag)
            elif code == proto.AUTH_SASL_FINAL:
                client.hold(proto.message(kind, body))  # with what follows it (until_ready)
                continue
            else:
                raise Refused(
                    "refused:auth_method",
                    proto.INVALID_AUTHORIZATION,
                    f"branch {name} asked for an authentication other than SCRAM-SHA-256 "
                    f"(code {code}); the front door passes on only SCRAM, which never shows "
                    "it a password",
                )
            step = "continue" if code == proto.AUTH_SASL else "final"
            backend.write(proto.message(b"p", answer))
            since = _loop_time()

    def failed(self, record: AuditLine) -> None:
        """Count a failed login against the client (a wake it caused stands for it)."""
        if record.wake_counted:
            record.wake_counted = False
        else:
            self.guard.failed(record.client)

    # A client's SCRAM messages, checked as Postgres checks them: a refusal is a failed login,
    # on a real branch and an imitated one alike.

    async def _answer(self, client: Channel, record: AuditLine) -> bytes:
        """The client's next SASL message (a message of another type, or too long, refused)."""
        try:
            return await sasl_message(client)
        except proto.StartupError:
            self._refused(record)
            raise

    def _client_first(self, record: AuditLine, answer: bytes) -> proto.ClientFirst:
        try:
            return proto.sasl_initial(answer)
        except proto.StartupError:
            self._refused(record)
            raise

    def _client_final(self, record: AuditLine, answer: bytes, *, nonce: str, flag: str) -> None:
        try:
            proto.client_final(answer, nonce=nonce, flag=flag)
        except proto.StartupError:
            self._refused(record)
            raise

    def _refused(self, record: AuditLine) -> None:
        self.failed(record)
        record.outcome = "refused:scram"

    async def imitate(
        self,
        client: Channel,
        *,
        user: str,
        name: str,
        record: AuditLine,
        began: float,
    ) -> None:
        """A wrong password's exchange, for a name that is not a branch reachable now, or a
        role the door does not let in. Each answer is sent when a real branch's would be: a
        recent real time for that step, counted from where a real login counts it (the first
        from ``began``, before the lookup, so the lookup's own time is not added twice). The
        failure counts when a real branch's would: at the verdict, or at a malformed message."""
        record.outcome = record.outcome if record.outcome != "login" else "unknown_branch"
        sasl_wait, continue_wait, final_wait = self.guard.pauses()
        await _until(began + sasl_wait)
        client.write(proto.auth_sasl())
        answer = await self._answer(client, record)
        since = _loop_time()
        first = self._client_first(record, answer)
        nonce = first.nonce + base64.b64encode(os.urandom(18)).decode()
        salt = hmac.digest(self._salt_key, f"{name}\0{user}".encode(), hashlib.sha256)[:16]
        server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={SCRAM_ITERATIONS}"
        await _until(since + continue_wait)
        client.write(proto.auth_sasl_continue(server_first.encode()))
        answer = await self._answer(client, record)
        since = _loop_time()
        self._client_final(record, answer, nonce=nonce, flag=first.flag)
        await _until(since + final_wait)
        self.failed(record)
        client.write(proto.password_failed(user))


async def until_ready(client: Channel, backend: Channel) -> tuple[int, bytes] | None:
    """The branch's messages after AuthenticationOk, passed on to its ReadyForQuery: the
    cancel key it gave (None if it ended the session with an error instead). They are held,
    with the exchange's last messages, and leave together at the ReadyForQuery (or the error):
    the client, which waits for that, gets them in one write, not one write a message."""
    key: tuple[int, bytes] | None = None
    while True:
        kind, body = await backend.read_message(cap=BACKEND_CAP)
        if kind == b"E":
            fields = proto.error_fields(body)
            client.write(
                proto.error_response(
                    fields.get("C", "XX000"), fields.get("M", ""), detail=fields.get("D", "")
                )
            )
            return None
        client.hold(proto.message(kind, body))
        if kind == b"K" and len(body) >= 8:
            (pid,) = struct.unpack("!I", body[:4])
            key = (pid, bytes(body[4:]))
        elif kind == b"Z":
            client.flush()
            return key if key is not None else (0, b"")


async def sasl_message(client: Channel) -> bytes:
    kind, body = await client.read_message(cap=SASL_CAP)
    if kind != b"p":  # Postgres's words, the type as a number
        raise proto.StartupError(
            proto.PROTOCOL_VIOLATION, f"expected SASL response, got message type {kind[0]}"
        )
    return body


async def _until(deadline: float) -> None:
    """Wait until ``deadline`` on the loop's clock (at once when it has passed)."""
    await asyncio.sleep(max(0.0, deadline - _loop_time()))


def _loop_time() -> float:
    return asyncio.get_running_loop().time()
