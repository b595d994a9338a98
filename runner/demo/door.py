"""The demo's last step: the branch through the front door, as a preview app reaches it.

The front door is started (it drops to its own user once its ports are bound), the branch gets
the application credential a pull request's `database-url` carries, and one query goes through
the door over TLS, verified against the door's certificate (its own self-signed one unless the
admin set theirs). The credential is dropped again: the demo shows the way in, it does not leave
a password behind. What a person does next (the branch page, or a credential by hand) is
printed by the command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from pgoverlay.runner.pool import Pool


@dataclass(frozen=True)
class ThroughTheDoor:
    started: str  # how the door was found or started
    role: str
    database: str
    tables: int
    sslmode: str
    fingerprint: str | None  # the self-signed certificate's, for a person to check


def connect(pool: Pool, branch: str) -> ThroughTheDoor:
    from pgoverlay.runner.door import serve, tls
    from pgoverlay.runner.service.engine import LocalEngine
    from pgoverlay.runner.service.models import GrantRequest

    settings = pool.settings
    started = serve.start(settings)
    engine = LocalEngine(pool)
    grant = engine.grant(branch, GrantRequest(app=True))
    params: dict[str, Any] = {
        "host": settings.door_name,
        "hostaddr": "127.0.0.1"
        if settings.door_address in ("0.0.0.0", "::", "*")
        else settings.door_address,
        "port": settings.door_port,
        "dbname": branch,
        "user": grant.role,
        "password": grant.password,
        "connect_timeout": 10,
    }
    fingerprint = None
    if settings.door_cert_file is None:  # the door's own: verified against that very file
        cert = serve.door_dir(settings) / tls.CERT_NAME
        params |= {"sslmode": "verify-full", "sslrootcert": str(cert)}
        fingerprint = tls.fingerprint(cert)
    else:  # the admin's, for a CA the system trusts: libpq 15 cannot name the system's store
        params |= {"sslmode": "require"}
    try:
        with psycopg.connect(**params) as conn:
            row = conn.execute(
                "SELECT current_user, (SELECT pg_catalog.count(*) FROM information_schema.tables"
                " WHERE table_schema = 'public')"
            ).fetchone()
    finally:
        engine.revoke(branch, grant.role)
    if row is None:  # pragma: no cover - a SELECT without FROM has its row
        raise RuntimeError("the query through the front door returned no row")
    return ThroughTheDoor(
        started=started,
        role=str(row[0]),
        database=branch,
        tables=int(row[1]),
        sslmode=params["sslmode"],
        fingerprint=fingerprint,
    )
