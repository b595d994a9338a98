"""The way into a pull request's branch, as the PR shows it: the branch's page (behind GitHub
sign-in, where a reader gets a credential of their own) and the front door's address. Pure
data, and never a secret: a PR comment on a public repository is readable by anyone, so what
it shows names the reader's own login as a placeholder, and the password is had on the page.

Every URL is in the one form of ``runner.door.dsn``: ``sslmode=verify-full`` and the
``sslrootcert`` to verify the door with. A person's names the door's own certificate's file
(``pgoverlay-door.crt``, which the branch page offers with its fingerprint, and the comment
links) or the system's store; a program's (the Action's ``database-url``) the path of a copy
on its runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from pgoverlay.runner.door import dsn
from pgoverlay.runner.settings import Settings

YOUR_LOGIN = "<your GitHub login>"
PERSON_SSLMODE = "verify-full"


@dataclass(frozen=True)
class WayIn:
    """Where a pull request's branch is reached: its page and the front door."""

    page: str  # https://<door>/b/<branch>
    host: str  # the front door's name
    port: int  # its Postgres port
    database: str  # the branch's name: the front door routes by it
    sslmode: str  # verify-full (a record of an older release may say require)
    sslrootcert: str = ""  # what verifies the door (dsn.rootcert; "": an older record's)

    @property
    def certificate(self) -> str | None:
        """Where a person gets the door's own certificate (None: their system trusts it)."""
        if self.sslrootcert != dsn.CERT_DOWNLOAD:
            return None
        return dsn.certificate_url(self.page.rsplit("/b/", 1)[0])

    def url(self, user: str, password: str | None = None) -> str:
        """A libpq URL through the front door as ``user`` (with ``password`` for a program's
        own credential; a person's URL has none)."""
        if not self.sslrootcert:  # a record of an older release
            who = quote(user, safe="<> ") + ("" if password is None else ":" + quote(password))
            return (
                f"postgresql://{who}@{self.host}:{self.port}/{quote(self.database, safe='')}"
                f"?sslmode={self.sslmode}"
            )
        return dsn.url(
            user=user,
            password=password,
            host=self.host,
            port=self.port,
            database=self.database,
            sslrootcert=self.sslrootcert,
            user_safe="<> ",
        )


def way_in(settings: Settings, branch: str) -> WayIn:
    """How a person reaches ``branch``: its page and the front door's address."""
    return WayIn(
        page=settings.page_url(branch),
        host=settings.door_name,
        port=settings.door.port,
        database=branch,
        sslmode=PERSON_SSLMODE,
        sslrootcert=settings.door_rootcert,
    )
