"""The front door's TLS: the admin's certificate and key, or a self-signed pair made for the
door's host name; the server context every connection's TLS uses; the certificate's SHA-256
fingerprint, which the page and ``doctor`` show so that a client of a self-signed door can pin
it.

The context refuses TLS 1.0 and 1.1 (Postgres's own default floor since 12 is TLS 1.2), keeps
OpenSSL's default cipher choice for 1.2 and 1.3, and offers the ALPN name ``postgresql``, which
PostgreSQL 17's clients send.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from pgoverlay.errors import ConfigError
from pgoverlay.runner import safefs

CERT_NAME = "door.crt"
KEY_NAME = "door.key"
SELF_SIGNED_DAYS = 825  # the longest life Apple's and Chrome's rules let a server certificate have


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def server_context(pair: Pair) -> ssl.SSLContext:
    """A server-side context of ``pair`` (PEM files; the certificate file may hold its chain)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols(["postgresql"])
    try:
        context.load_cert_chain(pair.cert, pair.key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load the front door's certificate {pair.cert} and key {pair.key}: {exc}; "
            "set PGOVERLAY_DOOR_CERT_FILE and PGOVERLAY_DOOR_KEY_FILE to a PEM certificate "
            "(chain) and its unencrypted private key, or unset both for a self-signed pair"
        ) from exc
    return context


def fingerprint(cert_file: Path) -> str:
    """The SHA-256 of the (first) certificate's DER form, as ``AA:BB:...``."""
    try:
        pem = cert_file.read_text()
        der = ssl.PEM_cert_to_DER_cert(pem[: pem.index("-----END CERTIFICATE-----") + 25])
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read a PEM certificate from {cert_file}: {exc}") from exc
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def self_signed(directory: Path, *, host: str, uid: int, gid: int) -> Pair:
    """The self-signed pair in ``directory`` (made for ``host`` if it is not there yet, or if
    the one there names another host or has expired): the key 0600, both owned by
    ``uid``:``gid``. ``directory`` must exist and be root's or ``uid``'s alone."""
    pair = Pair(cert=directory / CERT_NAME, key=directory / KEY_NAME)
    if _usable(pair, host=host):
        return pair
    cert_pem, key_pem = make_self_signed(host)
    safefs.write_new(pair.key, key_pem, uid=uid, gid=gid, mode=0o600)
    safefs.write_new(pair.cert, cert_pem, uid=uid, gid=gid, mode=0o644)
    return pair


def make_self_signed(host: str) -> tuple[str, str]:
    """A certificate (PEM) naming ``host`` (a DNS name, or an IP address and its text as a DNS
    name), and its P-256 key (PEM, unencrypted)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(host)]
    with contextlib.suppress(ValueError):  # a name, not an address
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode()


def _usable(pair: Pair, *, host: str) -> bool:
    """Whether the pair on disk names ``host`` and is valid for another day."""
    from cryptography import x509

    text = safefs.read_small(pair.cert)
    if text is None or safefs.read_small(pair.key) is None:
        return False
    try:
        cert = x509.load_pem_x509_certificate(text.encode())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    tomorrow = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
    return host in sans.get_values_for_type(x509.DNSName) and cert.not_valid_after_utc > tomorrow
