"""What the front door's tests share: a test CA and the door's certificate signed by it, and
a bare Postgres client that records a login's exchange byte for byte."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import socket
import ssl
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SNI_SUFFIX = "branches.test"


@dataclass(frozen=True)
class DoorCA:
    ca_file: Path
    cert_file: Path
    key_file: Path
    spki_sha256: str  # the server key's, base64: Chromium's --ignore-certificate-errors-spki-list


def make_ca(
    directory: Path,
    *,
    names: tuple[str, ...] = ("localhost", f"*.{SNI_SUFFIX}"),
    addresses: tuple[str, ...] = ("127.0.0.1",),
) -> DoorCA:
    """A CA, and a server certificate it signed for ``names`` and ``addresses`` (by default
    localhost, ``*.branches.test`` and 127.0.0.1), as PEM files in ``directory``."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pgoverlay test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(name) for name in names]
                + [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    spki = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    made = DoorCA(
        ca_file=directory / "ca.pem",
        cert_file=directory / "door.crt",
        key_file=directory / "door.key",
        spki_sha256=base64.b64encode(hashlib.sha256(spki).digest()).decode(),
    )
    made.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    made.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    made.key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(made.key_file, 0o600)
    return made


def message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", 4 + len(body)) + body


def startup(**params: str) -> bytes:
    body = struct.pack("!I", 3 << 16)
    body += b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in params.items()) + b"\0"
    return struct.pack("!I", 4 + len(body)) + body


def read_message(sock: socket.socket) -> bytes:
    """One whole message, header included."""
    header = recv_exactly(sock, 5)
    (length,) = struct.unpack("!I", header[1:])
    return header + recv_exactly(sock, length - 4)


def recv_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {count} bytes")
        data += chunk
    return data


def tls_socket(port: int, ca_file: Path, *, server_name: str = "localhost") -> ssl.SSLSocket:
    """A connection to the door on loopback after SSLRequest and a verified TLS handshake."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    raw.sendall(struct.pack("!II", 8, 80877103))
    assert raw.recv(1) == b"S"
    context = ssl.create_default_context(cafile=os.fspath(ca_file))
    return context.wrap_socket(raw, server_hostname=server_name)


@dataclass(frozen=True)
class Exchange:
    """What the door sent during a failed SCRAM login, and how long each answer took."""

    sasl: bytes
    server_first: bytes
    verdict: bytes
    waits: tuple[float, float, float]

    @property
    def salt(self) -> str:
        return dict(p.split("=", 1) for p in self.server_first[9:].decode().split(","))["s"]

    @property
    def shape(self) -> tuple[object, ...]:
        """Everything but the random nonce's and the salt's values."""
        attrs = dict(p.split("=", 1) for p in self.server_first[9:].decode().split(","))
        return (
            self.sasl,
            self.server_first[:9],
            tuple(sorted(attrs)),
            len(attrs["r"]),
            len(base64.b64decode(attrs["s"])),
            attrs["i"],
            self.verdict,
        )


def failed_scram(port: int, ca_file: Path, *, database: str, user: str) -> Exchange:
    """A SCRAM login with a wrong proof, recorded."""
    sock = tls_socket(port, ca_file)
    with sock:
        client_nonce = base64.b64encode(os.urandom(18)).decode()
        started = time.perf_counter()
        sock.sendall(startup(user=user, database=database))
        sasl = read_message(sock)
        first_wait = time.perf_counter() - started
        bare = f"n=,r={client_nonce}".encode()
        initial = b"SCRAM-SHA-256\0" + struct.pack("!i", 3 + len(bare)) + b"n,," + bare
        started = time.perf_counter()
        sock.sendall(message(b"p", initial))
        server_first = read_message(sock)
        second_wait = time.perf_counter() - started
        combined = server_first[9:].split(b",")[0][2:].decode()
        proof = base64.b64encode(b"\0" * 32).decode()
        started = time.perf_counter()
        sock.sendall(message(b"p", f"c=biws,r={combined},p={proof}".encode()))
        verdict = read_message(sock)
        third_wait = time.perf_counter() - started
        return Exchange(sasl, server_first, verdict, (first_wait, second_wait, third_wait))
