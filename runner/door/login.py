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
from pgoverlay.runner.postgres.roles import SCRAM_ITERATIONS

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
class Record:
    """One connection's audit line, filled in as it goes."""

    source: str
    start: str = field(default_factory=auditmod.now)
    user: str = ""
    branch: str = ""
    outcome: str = "no_startup"


class Login:
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
        record: Record,
        began: float,
    ) -> bool:
        """The branch's authentication, passed on: True at AuthenticationOk."""
        exchanged = False
        nonce = ""
        step, since = "sasl", began
        while True:
            kind, body = await backend.read_message(cap=BACKEND_CAP)
            if kind == b"E":
                fields = proto.error_fields(body)
                sqlstate = fields.get("C", "XX000")
                if not sqlstate.startswith("28"):
                    client.write(proto.error_response(sqlstate, fields.get("M", "")))
                    record.outcome = "branch_error"
                    return False
                self.guard.failed(record.source)
                record.outcome = "auth_failed"
                if exchanged:
                    self.guard.timed(step, _loop_time() - since)
                    client.write(proto.password_failed(user))
                else:  # the branch refused the role outright: as if it had asked
                    await self.imitate(client, user=user, name=name, record=record, refused=True)
                return False
            if kind != b"R":
                raise proto.StartupError(
                    proto.PROTOCOL_VIOLATION,
                    f"unexpected message {kind!r} from branch {name} during the login",
                )
            code = proto.auth_code(body)
            if code == proto.AUTH_OK:
                client.write(proto.message(kind, body))
                return True
            if code == proto.AUTH_SASL:
                self.guard.timed(step, _loop_time() - since)
                client.write(proto.message(kind, body))
                answer = await sasl_message(client)
                proto.sasl_initial(answer)
                exchanged = True
            elif code == proto.AUTH_SASL_CONTINUE:
                self.guard.timed(step, _loop_time() - since)
                nonce = proto.server_first_nonce(body[4:])
                client.write(proto.message(kind, body))
                answer = await sasl_message(client)
                proto.client_final(answer, nonce=nonce)
            elif code == proto.AUTH_SASL_FINAL:
                client.write(proto.message(kind, body))
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

    async def imitate(
        self, client: Channel, *, user: str, name: str, record: Record, refused: bool = False
    ) -> None:
        """A wrong password's exchange, for a name that is not a branch reachable now.
        ``refused``: a branch refused the role before asking for a password (the failure is
        counted already, and the time to the first answer was a real branch's own)."""
        if not refused:
            self.guard.failed(record.source)
            await asyncio.sleep(self.guard.pause("sasl"))
        record.outcome = record.outcome if record.outcome != "login" else "unknown_branch"
        client.write(proto.auth_sasl())
        first = proto.sasl_initial(await sasl_message(client))
        nonce = first.nonce + base64.b64encode(os.urandom(18)).decode()
        salt = hmac.digest(self._salt_key, f"{name}\0{user}".encode(), hashlib.sha256)[:16]
        server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={SCRAM_ITERATIONS}"
        await asyncio.sleep(self.guard.pause("continue"))
        client.write(proto.auth_sasl_continue(server_first.encode()))
        proto.client_final(await sasl_message(client), nonce=nonce)
        await asyncio.sleep(self.guard.pause("final"))
        client.write(proto.password_failed(user))


async def until_ready(client: Channel, backend: Channel) -> tuple[int, bytes] | None:
    """The branch's messages after AuthenticationOk, passed on to its ReadyForQuery: the
    cancel key it gave (None if it ended the session with an error instead)."""
    key: tuple[int, bytes] | None = None
    while True:
        kind, body = await backend.read_message(cap=BACKEND_CAP)
        if kind == b"E":
            fields = proto.error_fields(body)
            client.write(proto.error_response(fields.get("C", "XX000"), fields.get("M", "")))
            return None
        client.write(proto.message(kind, body))
        if kind == b"K" and len(body) >= 8:
            (pid,) = struct.unpack("!I", body[:4])
            key = (pid, bytes(body[4:]))
        elif kind == b"Z":
            return key if key is not None else (0, b"")


async def sasl_message(client: Channel) -> bytes:
    kind, body = await client.read_message(cap=SASL_CAP)
    if kind != b"p":
        raise proto.StartupError(
            proto.PROTOCOL_VIOLATION, f"expected SASL response, got message type {kind!r}"
        )
    return body


def _loop_time() -> float:
    return asyncio.get_running_loop().time()
