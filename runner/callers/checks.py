"""What ``doctor`` says about the network API (``runner/web/api.py``), one verdict per line:
whether it is on; its audience, which must be the https address a job's `server` input names,
on a host the door's certificate names (else every job's TLS check fails before a token is
sent); its policy file, read as the door reads it; and its OIDC issuer, asked for its keys now.

Run as root by ``doctor`` alone: the door never imports this module.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pgoverlay.errors import PgoverlayError
from pgoverlay.runner.settings import Settings

Verdict = Literal["ok", "warn", "fail"]
Found = tuple[str, Verdict, str]  # a check's name, verdict and detail (doctor.Check's fields)


def network_api(settings: Settings) -> list[Found]:
    """The network API's checks: one line when it is off; else its audience, policy, issuer."""
    if settings.api.audience is None:
        return [
            (
                "network API",
                "ok",
                "off (PGOVERLAY_API_AUDIENCE is unset): only this host's jobs get branches; "
                "set it to the pool's https URL for jobs on other runners (docs/api.md)",
            )
        ]
    return [_audience(settings, settings.api.audience), _policy(settings), _issuer(settings)]


def _audience(settings: Settings, audience: str) -> Found:
    name = "network API audience"
    parts = urlsplit(audience)
    if parts.scheme != "https" or not parts.hostname or parts.path.strip("/") or parts.query:
        return (
            name,
            "fail",
            f"PGOVERLAY_API_AUDIENCE={audience} is not the pool's https URL: set it to "
            f"https://{settings.door_name}"
            f"{'' if settings.door.https_port == 443 else f':{settings.door.https_port}'}, "
            "the address jobs give as the Action's `server` input",
        )
    host = parts.hostname
    names, whose = _certificate_names(settings)
    if names is not None and not _named(host, names):
        return (
            name,
            "fail",
            f"the audience's host {host} is not a name on {whose} ({', '.join(names) or 'none'})"
            ": a job's `server` input must be that host, and its TLS check would refuse the "
            f"door; use a certificate that names {host} (PGOVERLAY_DOOR_CERT_FILE), or set "
            "PGOVERLAY_API_AUDIENCE (and the workflows' `server`) to a name it has",
        )
    port = parts.port or 443
    if port != settings.door.https_port:
        return (
            name,
            "warn",
            f"{audience} names port {port}, but the door's pages and API answer on "
            f"{settings.door.https_port} (PGOVERLAY_DOOR_HTTPS_PORT): right only when something "
            "forwards that port to the door",
        )
    on = (
        f"a name on {whose}" if names is not None else "the name the door's certificate is made for"
    )
    return (name, "ok", f"{audience}: jobs give it as `server`; {host} is {on}")


def _certificate_names(settings: Settings) -> tuple[list[str] | None, str]:
    """The names (DNS and IP) on the certificate the door serves, and what it is; None when
    the door makes its own at start: for ``door_name``, checked then."""
    from pgoverlay.runner.door import pidfile, tls

    if settings.door.cert_file is not None:
        return _names_in(
            settings.door.cert_file
        ), f"the admin's certificate {settings.door.cert_file}"
    made = pidfile.door_dir(settings) / tls.CERT_NAME
    if made.exists():
        return _names_in(made), f"the door's self-signed certificate {made}"
    return [settings.door_name], "the self-signed certificate the door makes at start"


def _names_in(cert_file: Path) -> list[str]:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return []
    return [
        *sans.get_values_for_type(x509.DNSName),
        *map(str, sans.get_values_for_type(x509.IPAddress)),
    ]


def _named(host: str, names: list[str]) -> bool:
    """Whether a TLS client checking ``host`` accepts a certificate with ``names`` (RFC 6125: a
    wildcard stands for one whole left-most label; an address matches an IP name only)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for name in names:
        if address is not None:
            try:
                if ipaddress.ip_address(name) == address:
                    return True
            except ValueError:
                continue
            continue
        wanted, given = host.lower().rstrip("."), name.lower().rstrip(".")
        if given.startswith("*."):
            first, _, rest = wanted.partition(".")
            if first and rest == given[2:]:
                return True
        elif wanted == given:
            return True
    return False


def _policy(settings: Settings) -> Found:
    from pgoverlay.runner.callers import policy

    name = "network API policy"
    path = settings.api.policy_file
    if path is None:  # Settings refuses an audience without one; said here all the same
        return (name, "fail", "PGOVERLAY_API_POLICY_FILE is unset: the API needs a policy")
    try:
        found = policy.load(path)
    except PgoverlayError as err:
        return (name, "fail", str(err))
    owners = ", ".join(o.name for o in found.owners) or "none"
    return (name, "ok", f"{path}: owners {owners}")


def _issuer(settings: Settings) -> Found:
    from pgoverlay.runner.callers import oidc

    name = "network API issuer"
    try:
        verifier = oidc.Verifier(settings.api.issuer, settings.api.audience or "-", http_timeout=5)
        usable, refused = verifier.fetch_keys()
    except PgoverlayError as err:
        return (name, "fail", f"{err}; no job's token can be checked until it answers")
    if usable == 0:
        return (
            name,
            "fail",
            f"{settings.api.issuer} publishes no key that can verify its tokens ({refused} "
            "unusable): check PGOVERLAY_API_ISSUER",
        )
    return (name, "ok", f"{settings.api.issuer} answers: {usable} signing keys")
