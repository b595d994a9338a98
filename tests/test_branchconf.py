"""A branch's pg_hba.conf, as text: who it admits (no server needed)."""

from __future__ import annotations

import pytest

from pgoverlay.errors import SeedError
from pgoverlay.runner.branch import conf as branchconf


def test_hba_admits_the_branch_role_over_tcp_and_the_superuser_on_the_socket_only() -> None:
    lines = branchconf.hba(user="pgoverlay", superuser="all", database="app").splitlines()
    # A quoted "all" is a role named all, not the keyword: names are always quoted.
    assert lines == [
        'local all "all" trust',
        'host all "pgoverlay" 0.0.0.0/0 scram-sha-256',
        'host all "pgoverlay" ::/0 scram-sha-256',
        'host "app" +pgoverlay_access 0.0.0.0/0 scram-sha-256',
        'host "app" +pgoverlay_access ::/0 scram-sha-256',
        "local all all reject",
        "host all all 0.0.0.0/0 reject",
        "host all all ::/0 reject",
    ]


@pytest.mark.parametrize("name", ['bad"name', "two\nlines", ""])
def test_hba_refuses_a_role_name_it_cannot_quote(name: str) -> None:
    with pytest.raises(SeedError, match="rename it in the source"):
        branchconf.hba(user="pgoverlay", superuser=name, database="app")
