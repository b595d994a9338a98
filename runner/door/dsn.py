"""The one form of a connection string through the front door, wherever it is printed: the
CLI's `access grant`, the PR comment, the branch page and the Action's `database-url`. Pure.

Every form verifies the door (``sslmode=verify-full``: its certificate, and that it names the
host) and says where the certificate to verify it with is (``sslrootcert``):

- the door's own, self-signed certificate (no admin certificate): ``pgoverlay-door.crt``, a
  file the reader saves where they run their client, which the branch page offers for
  download (``https://HOST:PORT/pgoverlay-door.crt``) with its SHA-256 fingerprint; a program
  on the pool's host or a job's runner is given the path of a copy it already has;
- an admin's certificate signed by an authority clients trust: ``system``, the system's store
  (libpq 16 and later; psycopg's wheels carry one), and for JDBC the Java runtime's own
  (``sslfactory=org.postgresql.ssl.DefaultJavaSSLFactory``).

libpq without ``sslrootcert`` reads ``~/.postgresql/root.crt`` and, when it is missing, tells
people to "change sslmode to disable": no form here leaves it out.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

CERT_DOWNLOAD = "pgoverlay-door.crt"
SYSTEM = "system"
JAVA_TRUST = "org.postgresql.ssl.DefaultJavaSSLFactory"


def rootcert(*, self_signed: bool) -> str:
    """What a person's strings name as ``sslrootcert``."""
    return CERT_DOWNLOAD if self_signed else SYSTEM


def certificate_url(origin: str) -> str:
    """Where the branch pages offer the door's own certificate (``origin``: the pages')."""
    return f"{origin}/{CERT_DOWNLOAD}"


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def url(
    *,
    user: str,
    host: str,
    port: int,
    database: str,
    sslrootcert: str,
    password: str | None = None,
    user_safe: str = "",
) -> str:
    """``postgresql://user[:password]@host:port/database?sslmode=verify-full&sslrootcert=…``;
    ``user_safe``: characters of ``user`` left as they are (a placeholder's)."""
    who = quote(user, safe=user_safe)
    if password is not None:
        who += ":" + quote(password, safe="")
    tls = urlencode(
        {"sslmode": "verify-full", "sslrootcert": sslrootcert}, safe="/", quote_via=quote
    )
    return f"postgresql://{who}@{_host(host)}:{port}/{quote(database, safe='')}?{tls}"


def jdbc(*, user: str, password: str, host: str, port: int, database: str, sslrootcert: str) -> str:
    """pgJDBC's URL for the same: the Java runtime's trust store where libpq's is the
    system's, else the same certificate file."""
    trust = {"sslfactory": JAVA_TRUST} if sslrootcert == SYSTEM else {"sslrootcert": sslrootcert}
    query = urlencode({"user": user, "password": password}, quote_via=quote)
    tls = urlencode({"sslmode": "verify-full", **trust}, safe="/", quote_via=quote)
    return f"jdbc:postgresql://{_host(host)}:{port}/{quote(database, safe='')}?{query}&{tls}"
