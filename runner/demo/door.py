"""The demo's last step: the branch through the front door, as a preview app reaches it.

The front door is started (it drops to its own user once its ports are bound), the branch gets
the application credential a pull request's `database-url` carries, and one query goes through
the door over TLS, verified against the door's certificate (its own self-signed one unless the
admin set theirs). On a masked base a reviewer's read-only credential, as the branch page or
`access grant` gives one, goes through the door too and reads the made-up customers. Each
credential is dropped again: the demo shows the way in, it does not leave a password behind.
What a person does next (the branch page, or a credential by hand) is printed by the command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from pgoverlay.runner.pool import Pool

if TYPE_CHECKING:
    from pgoverlay.runner.service.engine import LocalEngine


REVIEWER = "demo-reviewer"  # the GitHub login the demo grants a reviewer's credential to


@dataclass(frozen=True)
class Reviewer:
    """What a reviewer's read-only credential saw through the door: the customers, and how
    many of their emails are made up (the masked base's)."""

    role: str
    customers: int
    made_up_emails: int


@dataclass(frozen=True)
class ThroughTheDoor:
    started: str  # how the door was found or started
    role: str
    database: str
    tables: int
    sslmode: str
    fingerprint: str | None  # the self-signed certificate's, for a person to check
    reviewer: Reviewer | None  # None: the base is not masked, and the admin gives no
    # personal credential on production data


def connect(pool: Pool, branch: str, *, masked: bool) -> ThroughTheDoor:
    """The door started, and ``branch`` reached through it, verified, with a preview app's
    credential and (``masked``, or the admin allows it) a reviewer's read-only one; both are
    revoked again."""
    from pgoverlay.runner.door import control, pidfile, tls
    from pgoverlay.runner.service.engine import LocalEngine
    from pgoverlay.runner.service.models import GrantRequest

    settings = pool.settings
    started = control.start(settings)
    engine = LocalEngine(pool)
    params: dict[str, Any] = {
        "host": settings.door_name,
        "hostaddr": "127.0.0.1"
        if settings.door.address in ("0.0.0.0", "::", "*")
        else settings.door.address,
        "port": settings.door.port,
        "dbname": branch,
        "connect_timeout": 10,
        "sslmode": "verify-full",
    }
    fingerprint = None
    if settings.door.cert_file is None:  # the door's own: verified against that very file
        cert = pidfile.door_dir(settings) / tls.CERT_NAME
        params["sslrootcert"] = str(cert)
        fingerprint = tls.fingerprint(cert)
    else:  # the admin's, signed by an authority this host trusts
        from pgoverlay.runner.service.netclient import trust_file

        params["sslrootcert"] = trust_file(None)
    grant = engine.grant(branch, GrantRequest(app=True))
    try:
        with psycopg.connect(**params, user=grant.role, password=grant.password) as conn:
            row = conn.execute(
                "SELECT current_user, (SELECT pg_catalog.count(*) FROM information_schema.tables"
                " WHERE table_schema = 'public')"
            ).fetchone()
    finally:
        engine.revoke(branch, grant.role)
    if row is None:  # pragma: no cover - a SELECT without FROM has its row
        raise RuntimeError("the query through the front door returned no row")
    reviewer = None
    if masked or settings.access_unmasked:
        reviewer = _review(engine, branch, params)
    return ThroughTheDoor(
        started=started,
        role=str(row[0]),
        database=branch,
        tables=int(row[1]),
        sslmode=params["sslmode"],
        fingerprint=fingerprint,
        reviewer=reviewer,
    )


def _review(engine: LocalEngine, branch: str, params: dict[str, Any]) -> Reviewer:
    """A reviewer's read-only credential, as `access grant` or the page gives it, used through
    the door and revoked."""
    from pgoverlay.runner.service.models import GrantRequest

    grant = engine.grant(branch, GrantRequest(login=REVIEWER, read_only=True))
    try:
        with psycopg.connect(**params, user=grant.role, password=grant.password) as conn:
            row = conn.execute(
                "SELECT current_user, pg_catalog.count(*), pg_catalog.count(*) FILTER"
                " (WHERE email LIKE '%@example.com') FROM customers"
            ).fetchone()
    finally:
        engine.revoke(branch, grant.role)
    if row is None:  # pragma: no cover - an aggregate has its row
        raise RuntimeError("the reviewer's query through the front door returned no row")
    return Reviewer(role=str(row[0]), customers=int(row[1]), made_up_emails=int(row[2]))
