"""The front door's protocol parser, without a server: every first packet a client may send,
every malformed one refused with a precise error, and a seeded fuzz that finds no other
outcome."""

from __future__ import annotations

import base64
import random
import struct
import time

import pytest

from pgoverlay.runner.door import startup as proto
from pgoverlay.runner.door.startup import StartupError


def packet(code: int, body: bytes = b"") -> bytes:
    return struct.pack("!II", 8 + len(body), code) + body


def startup_packet(*pairs: tuple[str, str], minor: int = 0) -> bytes:
    body = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in pairs) + b"\0"
    return packet(3 << 16 | minor, body)


def refused(data: bytes) -> StartupError:
    with pytest.raises(StartupError) as caught:
        proto.parse_first(data)
    return caught.value


def test_the_encryption_and_cancel_requests_are_read() -> None:
    assert proto.parse_first(packet(proto.SSL_REQUEST)) == proto.SSLRequest()
    assert proto.parse_first(packet(proto.GSSENC_REQUEST)) == proto.GSSEncRequest()
    cancel = proto.parse_first(packet(proto.CANCEL_REQUEST, struct.pack("!I", 42) + b"abcd"))
    assert cancel == proto.CancelRequest(pid=42, key=b"abcd")
    assert isinstance(cancel, proto.CancelRequest)
    assert proto.parse_first(cancel.packet()) == cancel


def test_a_startup_message_gives_its_parameters_and_is_rewritten_to_the_real_database() -> None:
    got = proto.parse_first(
        startup_packet(
            ("user", "pgoverlay"),
            ("database", "pr-42"),
            ("application_name", "psql"),
            ("options", "-c statement_timeout=5s"),
        )
    )
    assert isinstance(got, proto.Startup)
    assert (got.user, got.database, got.minor) == ("pgoverlay", "pr-42", 0)
    again = proto.parse_first(got.rewritten("app"))
    assert isinstance(again, proto.Startup)
    assert again.parameters == {
        "user": "pgoverlay",
        "database": "app",
        "application_name": "psql",
        "options": "-c statement_timeout=5s",
    }


def test_the_database_defaults_to_the_user_and_a_long_user_is_clipped_as_postgres_does() -> None:
    got = proto.parse_first(startup_packet(("user", "é" * 40)))
    assert isinstance(got, proto.Startup)
    assert got.user == "é" * 31  # 62 bytes: the 32nd character would pass 63
    assert got.database == got.user


def test_protocol_options_are_set_apart_for_negotiation() -> None:
    got = proto.parse_first(startup_packet(("user", "u"), ("_pq_.frob", "1"), minor=2))
    assert isinstance(got, proto.Startup)
    assert got.minor == 2 and got.protocol_options == ("_pq_.frob",)
    assert "_pq_.frob" not in got.parameters
    reply = proto.negotiate_protocol(got.protocol_options)
    assert reply == b"v" + struct.pack("!III", 4 + 8 + 10, 3 << 16, 1) + b"_pq_.frob\0"


@pytest.mark.parametrize(
    ("data", "sqlstate", "words"),
    [
        (struct.pack("!I", 4) + b"\0" * 4, "08P01", "invalid length of startup packet: 4"),
        (struct.pack("!I", 10_001) + b"\0" * 4, "08P01", "between 8 and 10000"),
        (packet(proto.SSL_REQUEST, b"x"), "08P01", "invalid length of encryption request"),
        (packet(proto.CANCEL_REQUEST, b"abc"), "08P01", "invalid length of cancel request"),
        (packet(2 << 16), "0A000", "unsupported frontend protocol 2.0"),
        (packet(3 << 16, b"user\0u\0"), "08P01", "expected terminator as last byte"),
        (packet(3 << 16, b"user\0"), "08P01", "expected terminator as last byte"),
        (startup_packet(("database", "x")), "28000", "no PostgreSQL user name specified"),
        (startup_packet(("user", "")), "28000", "no PostgreSQL user name specified"),
        (startup_packet(("user", "a"), ("user", "b")), "08P01", "'user' given twice"),
        (startup_packet(("user", "a"), ("replication", "database")), "0A000", "replication"),
        (packet(3 << 16, b"user\0\xff\0\0"), "08P01", "parameter value is not valid UTF-8"),
        (packet(3 << 16, b"\0u\0\0"), "08P01", "empty parameter name"),
    ],
)
def test_malformed_first_packets_are_refused_with_a_precise_error(
    data: bytes, sqlstate: str, words: str
) -> None:
    error = refused(data)
    assert error.sqlstate == sqlstate
    assert words in error.message


def test_replication_off_is_an_ordinary_connection() -> None:
    got = proto.parse_first(startup_packet(("user", "u"), ("replication", "off")))
    assert isinstance(got, proto.Startup)


def test_an_error_response_has_no_source_file_fields() -> None:
    data = proto.password_failed("bob")
    assert data[:1] == b"E"
    fields = proto.error_fields(data[5:])
    assert fields == {
        "S": "FATAL",
        "V": "FATAL",
        "C": "28P01",
        "M": 'password authentication failed for user "bob"',
    }
    assert struct.unpack("!I", data[1:5])[0] == len(data) - 1


def test_scram_client_messages_are_checked() -> None:
    initial = b"SCRAM-SHA-256\0" + struct.pack("!i", 32) + b"n,,n=,r=abcdefghijklmnopqrstuvwx"
    first = proto.sasl_initial(initial)
    assert first.nonce == "abcdefghijklmnopqrstuvwx"
    with pytest.raises(StartupError, match="invalid SASL authentication mechanism"):
        proto.sasl_initial(b"SCRAM-SHA-256-PLUS\0" + initial[14:])
    with pytest.raises(StartupError, match="malformed SCRAM message") as cbind:
        proto.client_first(b"p=tls-server-end-point,,n=,r=abc")
    assert "includes channel binding data" in cbind.value.detail
    with pytest.raises(StartupError, match="insufficient data left in message"):
        proto.sasl_initial(b"SCRAM-SHA-256\0" + struct.pack("!i", 99) + b"n,,n=,r=x")
    proof = base64.b64encode(bytes(32))
    proto.client_final(b"c=biws,r=abcXYZ,p=" + proof, nonce="abcXYZ")
    proto.client_final(b"c=eSws,r=abcXYZ,x=1,p=" + proof, nonce="abcXYZ", flag="y")
    with pytest.raises(StartupError, match="invalid SCRAM response") as other:
        proto.client_final(b"c=biws,r=other,p=" + proof, nonce="abcXYZ")
    assert other.value.detail == "Nonce does not match."
    for final, detail in (
        (b"c=biws,r=abcXYZ,x=1", "Attribute expected, but found end of string."),
        (b"c=biws,r=abcXYZ,p=cHJvb2Y=", "Malformed proof in client-final-message."),
        (
            b"c=biws,r=abcXYZ,1=2,p=" + proof,
            "Attribute expected, but found invalid character \"'1'\".",
        ),
        (
            b"c=biws,r=abcXYZ,p=" + proof + b",x=1",
            "Garbage found at the end of client-final-message.",
        ),
    ):
        with pytest.raises(StartupError, match="malformed SCRAM message") as bad:
            proto.client_final(final, nonce="abcXYZ")
        assert bad.value.detail == detail, final
    with pytest.raises(StartupError, match="unexpected SCRAM channel-binding attribute"):
        proto.client_final(b"c=eSws,r=abcXYZ,p=" + proof, nonce="abcXYZ")  # the flag was n


@pytest.mark.parametrize(
    ("text", "length"),
    [
        (b"", 0),
        (b"AAAA", 3),
        (b"AAA=", 2),
        (b"AA==", 1),
        (b"AA=A", 1),
        (b"A===", -1),
        (b"AAA", -1),
        (b"AA AA", -1),
        (b"AAAA\x80", -1),
        (base64.b64encode(bytes(32)), 32),
    ],
)
def test_base64_is_decoded_as_postgres_decodes_it(text: bytes, length: int) -> None:
    assert proto._b64_length(text) == length


def test_message_lengths_are_capped_before_anything_is_read() -> None:
    assert proto.message_length(b"p" + struct.pack("!I", 104), cap=100) == 100
    with pytest.raises(StartupError, match="invalid message length"):
        proto.message_length(b"p" + struct.pack("!I", 105), cap=100)
    with pytest.raises(StartupError, match="invalid message length"):
        proto.message_length(b"p" + struct.pack("!I", 3), cap=100)


# -- fuzz -----------------------------------------------------------------------------------

SEEDS = [
    packet(proto.SSL_REQUEST),
    packet(proto.GSSENC_REQUEST),
    packet(proto.CANCEL_REQUEST, struct.pack("!I", 7) + b"\x01\x02\x03\x04"),
    startup_packet(("user", "pgoverlay"), ("database", "pr-1"), ("application_name", "psql")),
    startup_packet(("user", "x"), ("options", "-c a=b"), ("_pq_.x", "y"), minor=2),
]


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        choice = rng.randrange(7)
        if choice == 0 and buf:  # flip bits
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif choice == 1:  # insert bytes
            i = rng.randint(0, len(buf))
            buf[i:i] = rng.randbytes(rng.randint(1, 16))
        elif choice == 2 and buf:  # delete a run
            i = rng.randrange(len(buf))
            del buf[i : i + rng.randint(1, 8)]
        elif choice == 3 and len(buf) >= 4:  # a random length
            buf[0:4] = struct.pack("!I", rng.choice([0, 7, 8, 9, len(buf), 10_000, 2**32 - 1]))
        elif choice == 4 and len(buf) >= 8:  # a random code
            code = rng.choice([proto.SSL_REQUEST, proto.CANCEL_REQUEST, 3 << 16, 0, 2**32 - 1])
            buf[4:8] = struct.pack("!I", code)
        elif choice == 5:  # a NUL or a 0xFF somewhere
            buf.insert(rng.randint(0, len(buf)), rng.choice([0, 0xFF]))
        else:  # truncate
            buf = buf[: rng.randint(0, len(buf))]
    return bytes(buf)


def test_fuzzed_first_packets_are_parsed_or_refused_and_nothing_else() -> None:
    rng = random.Random(20261205)
    outcomes = {"parsed": 0, "refused": 0}
    started = time.monotonic()
    for i in range(20_000):
        fresh = i % 5 == 0  # every fifth: random bytes, not a mutated packet
        data = rng.randbytes(rng.randint(0, 64)) if fresh else mutate(rng, rng.choice(SEEDS))
        try:
            got = proto.parse_first(data)
        except StartupError as error:
            assert error.sqlstate in {"08P01", "0A000", "28000"}
            assert error.message
            outcomes["refused"] += 1
            continue
        outcomes["parsed"] += 1
        assert len(data) <= proto.MAX_STARTUP
        if isinstance(got, proto.Startup):  # what the door would send on parses back the same
            again = proto.parse_first(got.rewritten(got.database))
            assert isinstance(again, proto.Startup) and again.user == got.user
    assert outcomes["parsed"] > 100 and outcomes["refused"] > 1000, outcomes
    assert time.monotonic() - started < 60, "the parser must not crawl on hostile input"


def test_fuzzed_scram_messages_are_read_or_refused_and_nothing_else() -> None:
    rng = random.Random(5)
    good_first = b"SCRAM-SHA-256\0" + struct.pack("!i", 32) + b"n,,n=,r=abcdefghijklmnopqrstuvwx"
    good_final = b"c=biws,r=abcXYZ,p=cHJvb2Y="
    for _ in range(10_000):
        for data, check in (
            (mutate(rng, good_first), proto.sasl_initial),
            (mutate(rng, good_final), lambda b: proto.client_final(b, nonce="abcXYZ")),
        ):
            try:
                check(data)
            except StartupError as error:
                assert error.sqlstate in {"08P01", "0A000"}
