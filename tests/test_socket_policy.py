"""The pool's policy on the engine's socket: with ``api_policy_file`` set, the real service holds
the creates of its group's members (real users, in child processes of their uids) to the owners,
repositories and limits the policy gives the repository they name; root, and the front door's
vouched requests, are not held to it again; without a policy nothing changes."""

from __future__ import annotations

import json
import os
import signal
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import as_user_call, cli, os_user, service_settings, start_service
from pgoverlay.errors import ConfigError
from pgoverlay.runner import branch
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.service import client, serve
from pgoverlay.runner.service.models import CreateRequest
from pgoverlay.runner.service.protocol import peer_of
from pgoverlay.runner.settings import Settings

MEMBER = "pgo-sockpol"  # a workflow's user: in the service's group, not root
DOOR = "pgoverlay-door"  # the front door's user (the settings' default door_user)
GROUPS = ("pgoverlay",)

POLICY = """\
owners:
  - acme
repositories:
  - acme/shop
  - {name: acme/tiny, branches: 2}
  - {name: acme/pinned, id: 4242}
limits:
  total: 4
"""


@pytest.fixture(scope="module")
def users(service: Path) -> None:
    os_user(MEMBER, groups=list(GROUPS))
    os_user(DOOR, groups=list(GROUPS))


@pytest.fixture
def clean(pool: Pool) -> Iterator[None]:
    """No branch before the test, and none after it, passed or failed."""

    def wipe() -> None:
        for b in pool.registry.branches():
            branch.destroy(pool, b.name)

    wipe()
    yield
    wipe()


def member(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """`pgoverlay ARGS` as the member; its exit code, output and error output."""
    done = cli(args, env=env, user=MEMBER, groups=list(GROUPS))
    return done.returncode, done.stdout, done.stderr


def creates(user: str, path: Path, requests: list[dict[str, object]]) -> list[list[str]]:
    """The creates ``requests``, one after another, by ``user`` on the socket at ``path``:
    ["made", name] or [error class, message] for each."""
    code = textwrap.dedent(
        f"""
        import json
        from pathlib import Path
        from pgoverlay.errors import PgoverlayError
        from pgoverlay.runner.service.client import RemoteEngine
        from pgoverlay.runner.service.models import CreateRequest
        engine = RemoteEngine(Path({os.fspath(path)!r}))
        result = []
        for fields in {requests!r}:
            try:
                result.append(["made", engine.create(CreateRequest(**fields)).name])
            except PgoverlayError as err:
                result.append([type(err).__name__, str(err)])
        print(json.dumps(result))
        """
    )
    done = as_user_call(user, GROUPS, code, preload=["pgoverlay.runner.service.models"])
    assert done.returncode == 0, done.stderr
    answer: list[list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def service_pid(path: Path) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(os.fspath(path))
        return peer_of(sock).pid


# -- without a policy (first: the module's policed service below replaces the session's) -----


def test_without_a_policy_file_a_member_creates_for_any_repository_as_before(
    users: None, clean: None, pool: Pool, base: BaseVersion, service: Path, env: dict[str, str]
) -> None:
    assert service_settings(pool).api.policy_file is None
    code, out, err = member(
        ["branch", "create", "sp-free", "--base", base.name, "--repository", "octo/anything"]
        + ["--json"],
        env,
    )
    assert code == 0, err
    assert json.loads(out)["repository"] == "octo/anything"
    code, _, err = member(["branch", "create", "sp-none", "--base", base.name], env)
    assert code == 2 and "must name the repository" in err and "policy" not in err, err


# -- with the policy ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("policy")
    path = folder / "policy.yml"
    path.write_text(POLICY)
    return path


@pytest.fixture(scope="module")
def policed(users: None, pool: Pool, policy_file: Path) -> Iterator[Settings]:
    """The test run's engine service, restarted with the policy meanwhile (a pool has one
    service socket), and restarted as it was afterwards."""
    normal = service_settings(pool)
    changed = normal.replace(api_policy_file=policy_file)
    was_running = serve.stop(normal, wait=normal.stop_timeout)
    start_service(changed)
    try:
        yield changed
    finally:
        serve.stop(changed, wait=changed.stop_timeout)
        if was_running:
            start_service(normal)


def test_a_repository_or_owner_the_policy_refuses_is_told_so_and_nothing_is_created(
    policed: Settings, clean: None, pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    refused = {
        "sp-other": ("acme/other", "(repositories)", "add it (or acme/*) to repositories"),
        "sp-octo": ("octo/shop", "(owners)", "add it to owners"),
    }
    for name, (repository, rule, fix) in refused.items():
        code, _, err = member(
            ["branch", "create", name, "--base", base.name, "--repository", repository], env
        )
        assert code == 40, err  # PolicyError's exit code
        assert f"does not admit a branch for {repository} on the engine's socket" in err
        assert rule in err and fix in err, err
        assert pool.registry.branch(name) is None
        assert not branch.layout(pool, name).root.exists()
    code, _, err = member(["branch", "create", "sp-none", "--base", base.name], env)
    assert code == 2, err
    assert "must name the repository" in err and "--repository OWNER/NAME" in err, err
    assert "the pool's policy admits branches by their repository's owner and name" in err
    assert pool.registry.branches() == []


def test_an_allowed_repository_works_as_without_a_policy(
    policed: Settings, clean: None, pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    """Names compare as GitHub's do (case aside); an entry pinned to an id admits its name, as
    no id comes with a member's request."""
    code, out, err = member(
        ["branch", "create", "sp-shop", "--base", base.name, "--repository", "ACME/Shop"]
        + ["--pr", "3", "--json"],
        env,
    )
    assert code == 0, err
    made = json.loads(out)
    assert made["repository"] == "ACME/Shop" and made["owner_uid"] == os_user(MEMBER).pw_uid
    assert made["state"] == "ready"
    code, out, err = member(["branch", "connect", "sp-shop", "--url"], env)
    assert code == 0 and out.startswith("postgresql://"), err
    assert member(["branch", "reset", "sp-shop"], env)[0] == 0
    code, _, err = member(
        ["branch", "create", "sp-pinned", "--base", base.name, "--repository", "acme/pinned"],
        env,
    )
    assert code == 0, err
    for name in ("sp-shop", "sp-pinned"):
        code, _, err = member(["branch", "destroy", name], env)
        assert code == 0, err
        assert pool.registry.branch(name) is None


def test_the_policys_limits_hold_where_lower_and_root_is_held_to_none(
    policed: Settings, clean: None, pool: Pool, base: BaseVersion
) -> None:
    """acme/tiny's own `branches: 2` (below PGOVERLAY_MAX_BRANCHES_PER_REPOSITORY's 10), then
    `limits.total: 4` (below PGOVERLAY_MAX_BRANCHES's 50), counted over the pool's branches,
    root's included; root itself goes past both."""
    path = client.socket_path(policed)
    answers = creates(
        MEMBER,
        path,
        [
            {"name": f"sp-tiny-{i}", "base": base.name, "repository": "acme/tiny", "pr": i}
            for i in (1, 2, 3)
        ],
    )
    assert [kind for kind, _ in answers] == ["made", "made", "LimitReachedError"], answers
    refusal = answers[2][1]
    assert "acme/tiny already has 2 branches" in refusal
    assert "limits.per_repository, or the repository's branches" in refusal, refusal
    assert pool.registry.branch("sp-tiny-3") is None
    # Root's branch (the admin's: no repository, refused to a member) counts in the pool's total.
    by_root = client.RemoteEngine(path).create(CreateRequest(name="sp-root", base=base.name))
    assert by_root.owner_uid == 0
    answers = creates(
        MEMBER,
        path,
        [
            {"name": f"sp-shop-{i}", "base": base.name, "repository": "acme/shop", "pr": i}
            for i in (1, 2)
        ],
    )
    assert [kind for kind, _ in answers] == ["made", "LimitReachedError"], answers
    assert "this pool already has 4 branches" in answers[1][1]
    assert "limits.total in the pool's policy" in answers[1][1], answers[1][1]
    assert pool.registry.branch("sp-shop-2") is None
    # Root, past the total and for a repository the policy refuses: the admin is not held.
    past = CreateRequest(name="sp-root-2", base=base.name, repository="octo/shop", pr=1)
    assert client.RemoteEngine(path).create(past).repository == "octo/shop"
    assert len(pool.registry.branches()) == 5


def test_sighup_reads_the_policy_again_and_a_broken_one_leaves_the_last_in_force(
    policed: Settings, clean: None, pool: Pool, base: BaseVersion, policy_file: Path
) -> None:
    path = client.socket_path(policed)
    pid = service_pid(path)
    request = {"name": "sp-later", "base": base.name, "repository": "acme/later", "pr": 1}
    assert creates(MEMBER, path, [request])[0][0] == "PolicyError"
    try:
        policy_file.write_text(POLICY.replace("  - acme/shop\n", "  - acme/shop\n  - acme/later\n"))
        os.kill(pid, signal.SIGHUP)
        made = wait_for(
            lambda: creates(MEMBER, path, [request])[0][0] == "made" or None,
            timeout=30,
            what="the service to read the policy again",
        )
        assert made and pool.registry.branch("sp-later") is not None
        branch.destroy(pool, "sp-later")
        policy_file.write_text("owners: []\n")  # refused on load: the last policy stays
        log = pool.home / "service.log"
        before = log.stat().st_size
        os.kill(pid, signal.SIGHUP)

        def said() -> str:
            with log.open("rb") as f:
                f.seek(before)
                return f.read().decode(errors="replace")

        wait_for(
            lambda: "reload: the policy held stays in force" in said() or None,
            timeout=30,
            what="the service to log the broken policy",
        )
        assert "(owners): List should have at least 1 item" in said(), said()
        assert creates(MEMBER, path, [request])[0][0] == "made"
        assert service_pid(path) == pid  # still the same service: SIGHUP did not end it
    finally:
        policy_file.write_text(POLICY)
        os.kill(pid, signal.SIGHUP)


def test_a_policy_with_a_problem_stops_the_service_before_it_starts(
    policed: Settings, pool: Pool, tmp_path: Path
) -> None:
    """`serve.start` reads the policy as the service would, and says what is wrong to the
    admin who starts it; the service in place is left alone."""
    broken = tmp_path / "policy.yml"
    broken.write_text("owners:\n  - acme\nrepositories:\n  - {name: acme/shop, id: x}\n")
    serve.stop(policed, wait=policed.stop_timeout)
    try:
        with pytest.raises(ConfigError) as caught:
            serve.start(policed.replace(api_policy_file=broken))
        assert f"the pool's policy file {broken} at line 4 (repositories.0.id)" in str(caught.value)
        assert not serve.answering(policed)
    finally:
        start_service(policed)
