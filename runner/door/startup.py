"""The Postgres protocol as far as the front door speaks it, sans I/O: the client's first
packets, the messages of a SCRAM exchange, and the few server messages the door writes itself.

A client's first packet has no type byte: an Int32 length (itself included) and an Int32 code.
The door accepts exactly what Postgres accepts before authentication (``ProcessStartupPacket``
in postmaster.c), with the same cap of 10,000 bytes, and nothing more:

- ``SSLRequest`` (80877103): the door answers ``S`` and TLS starts;
- ``GSSENCRequest`` (80877104): answered ``N`` (no GSSAPI encryption), libpq then asks for TLS;
- ``CancelRequest`` (80877102): a backend's process id and secret key (the key is 4 bytes in
  protocol 3.0, up to 256 from 3.2), forwarded only to the branch the door knows that key for;
- ``StartupMessage`` v3.x: ``name\\0value\\0`` pairs ending in ``\\0``.

Every packet that is not one of these, or is one of them malformed, raises ``StartupError``
with the SQLSTATE and message the client then gets as a FATAL ``ErrorResponse``; nothing else
is raised (``tests/test_door_startup.py`` fuzzes the parser with mutated packets).

Messages after the first have a type byte, then the same Int32 length; ``message_length``
checks it against a cap before anything is read, so a peer never makes the door buffer more
than it allows.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from pgoverlay.runner.values import flag

MAX_STARTUP = 10_000  # Postgres's MAX_STARTUP_PACKET_LENGTH
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
PROTOCOL_3_0 = 3 << 16
NAMEDATALEN = 64  # Postgres truncates a user name to NAMEDATALEN - 1 bytes
MAX_CANCEL_KEY = 256  # protocol 3.2's longest secret key

# SQLSTATEs the door answers with.
PROTOCOL_VIOLATION = "08P01"
FEATURE_NOT_SUPPORTED = "0A000"
INVALID_AUTHORIZATION = "28000"
INVALID_PASSWORD = "28P01"  # noqa: S105 - a SQLSTATE
TOO_MANY_CONNECTIONS = "53300"
CANNOT_CONNECT_NOW = "57P03"


class StartupError(Exception):
    """A packet the door refuses: private control flow, turned into the client's FATAL
    ``ErrorResponse`` (``sqlstate``, ``message``, Postgres's ``detail`` where it gives one) by
    the router; it never reaches a caller."""

    def __init__(self, sqlstate: str, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message
        self.detail = detail

    def response(self) -> bytes:
        """The FATAL ErrorResponse the client gets."""
        return error_response(self.sqlstate, self.message, detail=self.detail)


@dataclass(frozen=True)
class SSLRequest:
    pass


@dataclass(frozen=True)
class GSSEncRequest:
    pass


@dataclass(frozen=True)
class CancelRequest:
    pid: int
    key: bytes

    def packet(self) -> bytes:
        """The request as the branch reads it."""
        body = struct.pack("!II", CANCEL_REQUEST, self.pid) + self.key
        return struct.pack("!I", 4 + len(body)) + body


@dataclass(frozen=True)
class Startup:
    """A StartupMessage: the protocol minor version asked for, and its parameters in order
    (``user`` clipped to 63 bytes as Postgres clips it; ``_pq_.`` protocol options apart)."""

    minor: int
    parameters: dict[str, str]
    protocol_options: tuple[str, ...] = field(default=())

    @property
    def user(self) -> str:
        return self.parameters["user"]

    @property
    def database(self) -> str:
        """The database asked for: the user's name when none is given, as Postgres does."""
        return self.parameters.get("database") or self.user

    def rewritten(self, database: str) -> bytes:
        """The StartupMessage v3.0 the branch gets: the same parameters, ``database`` set to
        the branch's real database, no ``_pq_.`` options (the door negotiated them away)."""
        params = {**self.parameters, "database": database}
        body = bytearray(struct.pack("!I", PROTOCOL_3_0))
        for name, value in params.items():
            body += name.encode() + b"\0" + value.encode() + b"\0"
        body += b"\0"
        return struct.pack("!I", 4 + len(body)) + bytes(body)


FirstPacket = SSLRequest | GSSEncRequest | CancelRequest | Startup


def startup_length(header: bytes) -> int:
    """The whole length of a first packet from its 4 first bytes, refused outside Postgres's
    bounds (8 bytes: a length and a code; ``MAX_STARTUP``)."""
    if len(header) != 4:
        raise StartupError(PROTOCOL_VIOLATION, "incomplete startup packet")
    length: int = struct.unpack("!I", header)[0]
    if length < 8 or length > MAX_STARTUP:
        raise StartupError(
            PROTOCOL_VIOLATION,
            f"invalid length of startup packet: {length} bytes (between 8 and {MAX_STARTUP})",
        )
    return length


def parse_first(packet: bytes) -> FirstPacket:
    """A client's first packet, length included (see the module's docstring)."""
    length = startup_length(packet[:4])
    if len(packet) != length:
        raise StartupError(
            PROTOCOL_VIOLATION,
            f"startup packet says {length} bytes but holds {len(packet)}",
        )
    (code,) = struct.unpack("!I", packet[4:8])
    body = packet[8:]
    if code in (SSL_REQUEST, GSSENC_REQUEST):
        if body:
            raise StartupError(PROTOCOL_VIOLATION, "invalid length of encryption request")
        return SSLRequest() if code == SSL_REQUEST else GSSEncRequest()
    if code == CANCEL_REQUEST:
        if len(body) < 8 or len(body) > 4 + MAX_CANCEL_KEY:
            raise StartupError(PROTOCOL_VIOLATION, "invalid length of cancel request packet")
        (pid,) = struct.unpack("!I", body[:4])
        return CancelRequest(pid=pid, key=bytes(body[4:]))
    major, minor = code >> 16, code & 0xFFFF
    if major != 3:
        raise StartupError(
            FEATURE_NOT_SUPPORTED,
            f"unsupported frontend protocol {major}.{minor}: the front door supports 3.0",
        )
    return _startup(minor, body)


def _startup(minor: int, body: bytes) -> Startup:
    if not body or body[-1] != 0:
        raise StartupError(
            PROTOCOL_VIOLATION, "invalid startup packet layout: expected terminator as last byte"
        )
    fields = body[:-1].split(b"\0")
    # name\0value\0 ... \0: split leaves one empty item after the last value.
    if len(fields) < 3 or fields[-1] != b"" or len(fields) % 2 == 0:
        raise StartupError(
            PROTOCOL_VIOLATION, "invalid startup packet layout: expected terminator as last byte"
        )
    params: dict[str, str] = {}
    options: list[str] = []
    for raw_name, raw_value in zip(fields[0:-1:2], fields[1:-1:2], strict=True):
        name, value = _text(raw_name, "parameter name"), _text(raw_value, "parameter value")
        if not name:
            raise StartupError(PROTOCOL_VIOLATION, "invalid startup packet: empty parameter name")
        if name.startswith("_pq_."):
            options.append(name)
            continue
        if name in params:
            raise StartupError(
                PROTOCOL_VIOLATION, f"invalid startup packet: parameter {name!r} given twice"
            )
        params[name] = value
    replication = params.get("replication")
    # A replication connection asks for WAL, not for a database session: never through the
    # door. Only a flag that says false ("off", "0", ...) is no replication.
    if replication is not None and flag(replication) is not False:
        raise StartupError(
            FEATURE_NOT_SUPPORTED,
            "replication connections are not served by the front door: stream from the "
            "source server instead",
        )
    user = params.get("user", "")
    if not user:
        raise StartupError(
            INVALID_AUTHORIZATION, "no PostgreSQL user name specified in startup packet"
        )
    params["user"] = clip_name(user)
    return Startup(minor=minor, parameters=params, protocol_options=tuple(options))


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise StartupError(
            PROTOCOL_VIOLATION, f"invalid startup packet: {what} is not valid UTF-8"
        ) from None


def clip_name(name: str) -> str:
    """``name`` cut to 63 bytes at a character's boundary, as Postgres cuts an identifier."""
    data = name.encode()
    if len(data) < NAMEDATALEN:
        return name
    return data[: NAMEDATALEN - 1].decode(errors="ignore")


# -- typed messages ---------------------------------------------------------------------------


def message_length(header: bytes, *, cap: int) -> int:
    """The body length of a typed message from its 5-byte header (type, Int32 length)."""
    length: int = struct.unpack("!I", header[1:5])[0]
    if length < 4 or length - 4 > cap:
        raise StartupError(
            PROTOCOL_VIOLATION,
            f"invalid message length {length} for message type {header[:1]!r} "
            f"(at most {cap + 4} here)",
        )
    return length - 4


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!I", 4 + len(body)) + body


def error_response(sqlstate: str, text: str, *, severity: str = "FATAL", detail: str = "") -> bytes:
    """An ErrorResponse as Postgres writes one (severity twice: localized and not), without the
    source-file fields: every error the door sends or passes on during a login is written here,
    so a branch's and the door's read the same byte for byte."""
    body = b"".join(
        kind + value.encode() + b"\0"
        for kind, value in (
            (b"S", severity),
            (b"V", severity),
            (b"C", sqlstate),
            (b"M", text),
            *(((b"D", detail),) if detail else ()),
        )
    )
    return message(b"E", body + b"\0")


def error_fields(body: bytes) -> dict[str, str]:
    """An ErrorResponse's or NoticeResponse's fields by their one-letter code."""
    found: dict[str, str] = {}
    for part in body.split(b"\0"):
        if part:
            found[chr(part[0])] = part[1:].decode(errors="replace")
    return found


def password_failed(user: str) -> bytes:
    """The FATAL a wrong password gets (Postgres's words for a SCRAM login)."""
    return error_response(INVALID_PASSWORD, f'password authentication failed for user "{user}"')


def negotiate_protocol(options: tuple[str, ...]) -> bytes:
    """NegotiateProtocolVersion: 3.0, and every ``_pq_.`` option unrecognized."""
    body = struct.pack("!II", PROTOCOL_3_0, len(options))
    body += b"".join(name.encode() + b"\0" for name in options)
    return message(b"v", body)


AUTH_OK = 0
AUTH_SASL = 10
AUTH_SASL_CONTINUE = 11
AUTH_SASL_FINAL = 12
SCRAM_SHA_256 = "SCRAM-SHA-256"


def auth_sasl(mechanisms: tuple[str, ...] = (SCRAM_SHA_256,)) -> bytes:
    names = b"".join(m.encode() + b"\0" for m in mechanisms) + b"\0"
    return message(b"R", struct.pack("!I", AUTH_SASL) + names)


def auth_sasl_continue(data: bytes) -> bytes:
    return message(b"R", struct.pack("!I", AUTH_SASL_CONTINUE) + data)


def auth_code(body: bytes) -> int:
    """The code of an Authentication message's body ('R')."""
    if len(body) < 4:
        raise StartupError(PROTOCOL_VIOLATION, "authentication message too short")
    return int(struct.unpack("!I", body[:4])[0])


# -- SCRAM-SHA-256, the client's messages, read as Postgres 15 reads them ---------------------
#
# ``CheckSASLAuth`` (auth.c) and ``read_client_first_message`` / ``read_client_final_message``
# (auth-scram.c), check for check and word for word: the door refuses a malformed message before
# a branch sees it, so a real branch and a name that is none answer it the same (the SQLSTATE,
# the message and its detail), and the refusal counts as a failed login on both paths.

_MALFORMED = "malformed SCRAM message"
_PRINTABLE = re.compile(rb"^[\x21-\x2b\x2d-\x7e]*$")  # printable ASCII but ','; empty is too
_BASE64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _malformed(detail: str) -> StartupError:
    return StartupError(PROTOCOL_VIOLATION, _MALFORMED, detail=detail)


def _sanitize_char(c: int) -> str:
    """Postgres's ``sanitize_char``: a printable character quoted, anything else in hex."""
    return f"'{chr(c)}'" if 0x21 <= c <= 0x7E else f"0x{c:02x}"


@dataclass(frozen=True)
class ClientFirst:
    """A SASLInitialResponse's client-first-message: its nonce, its gs2 flag (``n`` or
    ``y``: the client-final's channel binding must repeat it), and the bare message."""

    nonce: str
    bare: str
    flag: str = "n"


class _Reader:
    """A SCRAM message as a C string, read attribute by attribute (``read_attr_value``,
    ``read_any_attr``)."""

    def __init__(self, text: bytes) -> None:
        self.text = text
        self.at = 0

    def peek(self) -> int:
        return self.text[self.at] if self.at < len(self.text) else 0

    def attr(self, name: str) -> bytes:
        found = self.peek()
        if found != ord(name):
            raise _malformed(f'Expected attribute "{name}" but found "{_sanitize_char(found)}".')
        return self._value(name)

    def any_attr(self) -> tuple[str, bytes]:
        found = self.peek()
        if found == 0:
            raise _malformed("Attribute expected, but found end of string.")
        if not (0x41 <= found <= 0x5A or 0x61 <= found <= 0x7A):
            raise _malformed(
                f'Attribute expected, but found invalid character "{_sanitize_char(found)}".'
            )
        return chr(found), self._value(chr(found))

    def _value(self, name: str) -> bytes:
        self.at += 1
        if self.peek() != ord("="):
            raise _malformed(f'Expected character "=" for attribute "{name}".')
        self.at += 1
        end = self.text.find(b",", self.at)
        if end < 0:
            value, self.at = self.text[self.at :], len(self.text)
        else:
            value, self.at = self.text[self.at : end], end + 1
        return value


def _c_string(data: bytes) -> bytes:
    """``scram_exchange``'s checks of a message's length against its string."""
    if not data:
        raise _malformed("The message is empty.")
    if b"\0" in data:
        raise _malformed("Message length does not match input length.")
    return data


def sasl_initial(body: bytes) -> ClientFirst:
    """A SASLInitialResponse ('p' after AuthenticationSASL): the mechanism must be
    SCRAM-SHA-256 (the only one a branch offers behind the door: no -PLUS, no TLS there)."""
    end = body.find(b"\0")
    if end < 0:
        raise StartupError(PROTOCOL_VIOLATION, "invalid string in message")
    if body[:end] != SCRAM_SHA_256.encode():
        raise StartupError(
            PROTOCOL_VIOLATION, "client selected an invalid SASL authentication mechanism"
        )
    if len(body) < end + 5:
        raise StartupError(PROTOCOL_VIOLATION, "insufficient data left in message")
    (length,) = struct.unpack("!i", body[end + 1 : end + 5])
    data = body[end + 5 :]
    if length == -1:
        raise StartupError(
            PROTOCOL_VIOLATION,
            "the front door needs the client-first-message in the SASLInitialResponse "
            "(every libpq and JDBC client sends it there)",
        )
    if length < 0 or length > len(data):
        raise StartupError(PROTOCOL_VIOLATION, "insufficient data left in message")
    if length < len(data):
        raise StartupError(PROTOCOL_VIOLATION, "invalid message format")
    return client_first(data)


def client_first(data: bytes) -> ClientFirst:
    """``read_client_first_message``, on a connection without channel binding."""
    text = _Reader(_c_string(data))
    flag = text.peek()
    if flag in (ord("n"), ord("y")):
        text.at += 1
        if text.peek() != ord(","):
            raise _malformed(
                f'Comma expected, but found character "{_sanitize_char(text.peek())}".'
            )
        text.at += 1
    elif flag == ord("p"):
        raise _malformed(
            "The client selected SCRAM-SHA-256 without channel binding, but the SCRAM message "
            "includes channel binding data."
        )
    else:
        raise _malformed(f'Unexpected channel-binding flag "{_sanitize_char(flag)}".')
    if text.peek() == ord("a"):
        raise StartupError(
            FEATURE_NOT_SUPPORTED, "client uses authorization identity, but it is not supported"
        )
    if text.peek() != ord(","):
        raise _malformed(
            f'Unexpected attribute "{_sanitize_char(text.peek())}" in client-first-message.'
        )
    text.at += 1
    bare = data[text.at :]
    if text.peek() == ord("m"):
        raise StartupError(FEATURE_NOT_SUPPORTED, "client requires an unsupported SCRAM extension")
    text.attr("n")
    nonce = text.attr("r")
    if not _PRINTABLE.match(nonce):
        raise StartupError(PROTOCOL_VIOLATION, "non-printable characters in SCRAM nonce")
    while text.peek() != 0:
        text.any_attr()
    return ClientFirst(nonce=nonce.decode(), bare=bare.decode(errors="replace"), flag=chr(flag))


def client_final(body: bytes, *, nonce: str, flag: str = "n") -> None:
    """``read_client_final_message`` and the nonce's check: ``c=`` repeating the gs2 flag
    (``biws`` for ``n,,``, ``eSws`` for ``y,,``), ``r=`` the combined ``nonce`` (the
    server-first's), extensions, then a 32-byte proof ``p=`` last."""
    text = _Reader(_c_string(body))
    binding = text.attr("c")
    if (binding, flag) not in ((b"biws", "n"), (b"eSws", "y")):
        raise StartupError(
            PROTOCOL_VIOLATION,
            "unexpected SCRAM channel-binding attribute in client-final-message",
        )
    final_nonce = text.attr("r")
    while True:
        attr, value = text.any_attr()
        if attr == "p":
            break
    if _b64_length(value) != 32:
        raise _malformed("Malformed proof in client-final-message.")
    if text.peek() != 0:
        raise _malformed("Garbage found at the end of client-final-message.")
    if final_nonce != nonce.encode():
        raise StartupError(
            PROTOCOL_VIOLATION, "invalid SCRAM response", detail="Nonce does not match."
        )


def _b64_length(value: bytes) -> int:
    """How many bytes Postgres's ``pg_b64_decode`` makes of ``value``; -1 where it refuses
    it (a character outside the alphabet, a misplaced ``=``, a missing padding)."""
    count = pos = end = 0
    for c in value:
        if c == ord("="):
            if not end:
                if pos not in (2, 3):
                    return -1
                end = pos - 1
        elif c not in _BASE64:
            return -1
        pos += 1
        if pos == 4:
            count += 1 + (end in (0, 2)) + (end == 0)
            pos = 0
    return -1 if pos else count


def server_first_nonce(data: bytes) -> str:
    """The combined nonce of a branch's server-first-message (``r=...,s=...,i=...``)."""
    part = data.split(b",", 1)[0]
    if not part.startswith(b"r="):
        raise StartupError(PROTOCOL_VIOLATION, "malformed SCRAM message from the branch")
    return part[2:].decode(errors="replace")
