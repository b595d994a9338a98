"""How to log in to a branch: its connection details, written one way each (psycopg's keywords,
libpq's variables, a URL, a DSN), built by ``branch.connection()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote


@dataclass(frozen=True, kw_only=True)
class Connection:
    """How to log in to a branch: for its owner (or root) only."""

    host: str
    port: int
    database: str
    user: str
    password: str = field(repr=False)

    @property
    def url(self) -> str:
        return (
            f"postgresql://{quote(self.user, safe='')}:{quote(self.password, safe='')}@"
            f"{self.host}:{self.port}/{quote(self.database, safe='')}"
        )

    def connect_kwargs(self) -> dict[str, Any]:
        """psycopg.connect's keywords."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "dbname": self.database,
        }

    def libpq_env(self) -> dict[str, str]:
        """The libpq variables a child process (psql, a migrate command) connects with."""
        return {
            "PGHOST": self.host,
            "PGPORT": str(self.port),
            "PGUSER": self.user,
            "PGPASSWORD": self.password,
            "PGDATABASE": self.database,
            "PGAPPNAME": "pgoverlay-migrate",
            "PGCONNECT_TIMEOUT": "15",
        }

    @property
    def dsn(self) -> str:
        """A libpq key=value string (values quoted as libpq needs them)."""
        from psycopg.conninfo import make_conninfo  # only the `connect` command needs it

        return make_conninfo(
            host=self.host,
            port=self.port,
            dbname=self.database,
            user=self.user,
            password=self.password,
        )
