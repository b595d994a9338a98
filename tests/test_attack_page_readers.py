"""Who counts as a reader of a pull request's branch on its page: GitHub gives every account
read (`pull`) on a public repository, so there read is nobody's in particular and gets nothing;
a role above it, which only the repository's own people hold, does. The page is the real one
(``pagekit``), signing readers in at the fake GitHub, which answers `permissions` as GitHub
does for a public repository."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers import top_ports
from pagekit import Engine, Site, running_page, sign_in, view
from pgoverlay.runner.callers import oauth

PORT = top_ports(91, 1)[0]
PUBLIC_BRANCH = "open-pr-5"
PUBLIC_REPO = "acme/open"
PRIVATE_BRANCH = "closed-pr-6"
PRIVATE_REPO = "acme/closed"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    engine = Engine(
        {
            PUBLIC_BRANCH: view(PUBLIC_BRANCH, PUBLIC_REPO),
            PRIVATE_BRANCH: view(PRIVATE_BRANCH, PRIVATE_REPO),
        },
        masked=True,
    )
    with running_page(tmp_path_factory.mktemp("readers"), engine, port=PORT) as made:
        made.fake.add_repo(PUBLIC_REPO)  # public: every account reads it
        made.fake.add_repo(PRIVATE_REPO, private=True)
        made.fake.add_collaborator(PUBLIC_REPO, "tina", "triage")
        made.fake.add_collaborator(PUBLIC_REPO, "walt", "write")
        made.fake.add_collaborator(PUBLIC_REPO, "rita", "read")
        made.fake.add_collaborator(PRIVATE_REPO, "rita", "read")
        yield made


def credential(site: Site, login: str, branch: str) -> int:
    """What ``login`` gets asking for a credential on ``branch``'s page: its status."""
    with site.client() as client:
        shown = sign_in(site, client, login, branch)
        if shown.status_code != 200:
            return shown.status_code
        token = shown.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        asked = client.post(
            f"{site.origin}/b/{branch}/credential",
            headers={"Origin": site.origin},
            data={"csrf": token},
        )
        return asked.status_code


def test_a_github_user_who_is_no_collaborator_of_a_public_repository_gets_no_credential(
    site: Site,
) -> None:
    before = len(site.engine.grants)
    with site.client() as client:
        page = sign_in(site, client, "mallory", PUBLIC_BRANCH)
        assert page.status_code == 404, page.text
        assert "Not found" in page.text and "Get my credential" not in page.text
    assert credential(site, "mallory", PUBLIC_BRANCH) == 404
    assert len(site.engine.grants) == before


def test_a_public_repositorys_read_role_is_anyones_and_counts_for_nothing(site: Site) -> None:
    """GitHub's answer for a read collaborator of a public repository is the same as for any
    account: rita is refused there, and gets read-only where read is hers (private)."""
    before = len(site.engine.grants)
    assert credential(site, "rita", PUBLIC_BRANCH) == 404
    assert len(site.engine.grants) == before
    assert credential(site, "rita", PRIVATE_BRANCH) == 200
    assert [(b, r.login, r.read_only) for b, r in site.engine.grants[before:]] == [
        (PRIVATE_BRANCH, "rita", True)
    ]


def test_a_public_repositorys_own_people_get_in_by_their_role(site: Site) -> None:
    before = len(site.engine.grants)
    assert credential(site, "tina", PUBLIC_BRANCH) == 200
    assert credential(site, "walt", PUBLIC_BRANCH) == 200
    assert [(r.login, r.read_only) for _, r in site.engine.grants[before:]] == [
        ("tina", True),
        ("walt", False),
    ]


@pytest.mark.parametrize(
    ("role", "read_permission", "everyone_reads", "expected"),
    [
        ("read", "read", True, None),  # public: read is anyone's
        ("read", "read", False, "read-only"),  # private: read is this person's
        ("triage", "read", True, "read-only"),
        ("triage", "write", False, None),  # the admin asks for more
        ("write", "write", True, "read-write"),
        ("admin", "admin", True, "read-write"),
        ("maintain", "admin", False, None),
    ],
)
def test_the_least_role_that_counts_is_the_admins_and_never_read_where_everyone_reads(
    role: str, read_permission: oauth.ReadPermission, everyone_reads: bool, expected: str | None
) -> None:
    order = list(oauth.ROLES)
    flags = {flag: order.index(name) <= order.index(role) for name, flag in oauth.ROLES.items()}
    assert (
        oauth.access(
            flags,
            write_permission="write",
            read_permission=read_permission,
            everyone_reads=everyone_reads,
        )
        == expected
    )


def test_only_a_plain_private_repository_is_one_everyone_does_not_read() -> None:
    assert oauth.everyone_reads({"private": False, "visibility": "public"})
    assert oauth.everyone_reads({"private": True, "visibility": "internal"})
    assert oauth.everyone_reads({})  # says nothing: taken as public
    assert not oauth.everyone_reads({"private": True, "visibility": "private"})
    assert not oauth.everyone_reads({"private": True})
