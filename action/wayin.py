"""The way into a pull request's branch, as the PR shows it: the branch's page (behind GitHub
sign-in, where a reader gets a credential of their own) and the front door's address. Pure
data, and never a secret: a PR comment on a public repository is readable by anyone, so what
it shows names the reader's own login as a placeholder, and the password is had on the page.

A person is told ``sslmode=verify-full`` whatever the door's certificate: with the door's own
self-signed one, the branch page offers it and its fingerprint, for ``sslrootcert``. A program
(the Action's ``database-url``) is told what ``Settings.door_app_sslmode`` says.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

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
    sslmode: str  # verify-full for a person; for a program, Settings.door_app_sslmode

    def url(self, user: str, password: str | None = None) -> str:
        """A libpq URL through the front door as ``user`` (with ``password`` for a program's
        own credential; a person's URL has none)."""
        who = quote(user, safe="<> ")
        if password is not None:
            who += ":" + quote(password, safe="")
        return (
            f"postgresql://{who}@{self.host}:{self.port}/{quote(self.database, safe='')}"
            f"?sslmode={self.sslmode}"
        )


def way_in(settings: Settings, branch: str) -> WayIn:
    """How a person reaches ``branch``: its page and the front door's address."""
    return WayIn(
        page=settings.page_url(branch),
        host=settings.door_name,
        port=settings.door_port,
        database=branch,
        sslmode=PERSON_SSLMODE,
    )
