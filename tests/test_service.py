"""The engine service: a root process on a root:pgoverlay 0660 Unix socket, asked by users of
its group for branches. Tried as those users would, in real child processes of other uids."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from helpers import as_user_call, cli, loaded, os_user
from pgoverlay.runner import branch
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.service import serve

RUNNER = "pgo-runner"  # a workflow's user: in the service's group
OTHER = "pgo-other"  # another user of the group (e.g. the webhook listener)
OUTSIDER = "pgo-outsider"  # not in the group


@pytest.fixture(scope="module")
def users(service: Path) -> None:
    os_user(RUNNER, groups=["pgoverlay"])
    os_user(OTHER, groups=["pgoverlay"])
    os_user(OUTSIDER)


def ask(user: str, code: str, *, groups: tuple[str, ...] = ("pgoverlay",)) -> dict[str, object]:
    """Run ``code`` (which sets ``result``) as ``user`` against the service; its JSON answer,
    or the error it raised as {"error": class name, "message": ...}."""
    inner = textwrap.indent(textwrap.dedent(code).strip(), "    ")
    body = "\n".join(
        [
            "import json",
            "from pgoverlay.runner.service.shape import as_dict",
            "from pathlib import Path",
            "from pgoverlay.errors import PgoverlayError",
            "from pgoverlay.runner.service.client import RemoteEngine",
            "from pgoverlay.runner.service.models import CreateRequest, RecordRequest",
            f"engine = RemoteEngine(Path({os.fspath(SOCKET)!r}))",
            f"BASE = {BASE!r}",
            "try:",
            inner,
            "except PgoverlayError as err:",
            '    result = {"error": type(err).__name__, "message": str(err), '
            '"exit": err.exit_code}',
            "print(json.dumps(as_dict(result)))",
        ]
    )
    done = as_user_call(user, groups, body)
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


SOCKET = Path()
BASE = ""  # the session's base: every create names it, whatever other bases the pool holds


@pytest.fixture(scope="module", autouse=True)
def _socket(service: Path, base: BaseVersion) -> None:
    global SOCKET, BASE
    SOCKET = service
    BASE = base.name


@pytest.fixture
def clean(pool: Pool) -> Iterator[None]:
    """No branch when the test starts, and none left when it ends, passed or failed."""
    for b in pool.registry.branches():
        branch.destroy(pool, b.name)
    yield
    for b in pool.registry.branches():
        branch.destroy(pool, b.name)


def test_the_socket_is_root_and_the_groups_alone(service: Path, pool: Pool) -> None:
    st = os.lstat(service)
    assert stat.S_ISSOCK(st.st_mode)
    assert st.st_uid == 0 and st.st_gid == serve.group_id(pool.settings.service_group)
    assert stat.S_IMODE(st.st_mode) == 0o660


def test_a_user_outside_the_group_is_told_how_to_get_in(users: None) -> None:
    answer = ask(OUTSIDER, "result = [b.name for b in engine.bases()]", groups=())
    assert answer["error"] == "ServiceError"
    assert "usermod -aG pgoverlay" in str(answer["message"])


def test_a_workflow_user_creates_logs_in_and_destroys(
    users: None, clean: None, pool: Pool, base: BaseVersion
) -> None:
    created = ask(
        RUNNER,
        """
        b = engine.create(CreateRequest(name="svc-a", base=BASE, repository="acme/widgets", pr=7))
        c = engine.connection("svc-a")
        result = {"view": as_dict(b), "url": c.url}
        """,
    )
    assert "view" in created, created
    view = created["view"]
    assert isinstance(view, dict)
    assert view["repository"] == "acme/widgets" and view["pr"] == 7
    # The caller's uid comes from the socket's peer credentials, and is kept in the registry.
    runner_uid = os_user(RUNNER).pw_uid
    row = pool.registry.branch("svc-a")
    assert row is not None and row.owner_uid == runner_uid == view["owner_uid"]
    with psycopg.connect(str(created["url"]), connect_timeout=10) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (pool.settings.branch_user,)
    log = (pool.settings.home / "service.log").read_text()
    assert f"uid={runner_uid} " in log and "POST /v1/branches" in log
    assert row.password not in log
    gone = ask(RUNNER, 'result = engine.destroy("svc-a")')
    assert gone["destroyed"] is True and pool.registry.branch("svc-a") is None


def test_another_user_may_look_but_not_touch(
    users: None, clean: None, pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    ask(
        RUNNER,
        'result = engine.create(CreateRequest(name="svc-b", base=BASE, repository="acme/b"))',
    )
    seen = ask(OTHER, "result = [b.name for b in engine.branches()]")
    assert seen == ["svc-b"]  # type: ignore[comparison-overlap]
    for call in (
        'result = engine.connection("svc-b")',
        'result = engine.destroy("svc-b")',
        'result = engine.reset("svc-b")',
        'result = engine.save_record("svc-b", RecordRequest(data="{}"))',
    ):
        answer = ask(OTHER, call)
        assert answer["error"] == "NotOwnerError", call
        assert answer["exit"] == 28
    assert pool.registry.branch("svc-b") is not None
    assert pool.registry.record("svc-b") is None
    # root, through its own CLI, may do anything
    done = cli(["branch", "destroy", "svc-b"], env=env)
    assert done.returncode == 0, done.stderr


def test_a_branch_of_another_repository_is_refused_and_freed_when_destroyed(
    users: None, clean: None, pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    ask(
        RUNNER,
        'result = engine.create(CreateRequest(name="pr-31", base=BASE, '
        'repository="acme/widgets", pr=31))',
    )
    refused = ask(RUNNER, 'result = engine.reset("pr-31", repository="other/gadgets")')
    assert refused["error"] == "BranchOwnedError" and "acme/widgets#31" in str(refused["message"])
    # Destroyed by hand: the name, and its record, are free for anyone.
    assert cli(["branch", "destroy", "pr-31"], env=env)
    again = ask(
        RUNNER,
        'result = engine.create(CreateRequest(name="pr-31", base=BASE, '
        'repository="other/gadgets", pr=31))',
    )
    assert again["repository"] == "other/gadgets" and again["record"] is None


def test_requests_name_nothing_but_what_the_api_allows(
    users: None, clean: None, pool: Pool, base: BaseVersion
) -> None:
    raw = """
        from pgoverlay.runner.service.client import exchange
        answers = []
        for method, url, body in REQUESTS:
            status, data = exchange(engine.path, method, url, body and body.encode(), {}, 30)
            answers.append([status, json.loads(data or b"null")])
        result = {"answers": answers}
    """
    requests = [
        ("POST", "/v1/branches", json.dumps({"name": "../../etc"})),
        ("POST", "/v1/branches", json.dumps({"name": "x", "home": "/etc"})),
        ("POST", "/v1/branches", json.dumps({"name": "x", "base": "/var/lib/other-pool"})),
        ("POST", "/v1/branches", json.dumps({"name": "x", "runtime": "/bin/sh"})),
        ("GET", "/v1/branches/..%2F..%2Fetc/connection", None),
        ("PUT", "/v1/branches/x/record", json.dumps({"head_sha": "zz", "status": "ready"})),
    ]
    answer = ask(RUNNER, f"REQUESTS = {requests!r}\n" + textwrap.dedent(raw).strip())
    answers = answer["answers"]
    assert isinstance(answers, list)
    for (status, body), request in zip(answers, requests, strict=True):
        assert status in (404, 422), request
        assert set(body) == {"code", "message"}, request
        assert body["code"] in ("invalid_request", "branch_missing", "not_found"), request
    assert pool.registry.branches() == []


def test_per_repository_and_total_limits(
    users: None, clean: None, pool: Pool, base: BaseVersion
) -> None:
    # The service runs with the pool's settings: limit 10 per repository by default; the test
    # asks for names until refused, without measuring anything.
    limit = pool.settings.max_branches_per_repository
    code = f"""
        made = []
        result = None
        for i in range({limit + 1}):
            try:
                engine.create(
                    CreateRequest(name=f"lim-{{i}}", base=BASE, repository="acme/many", pr=i + 1)
                )
                made.append(i)
            except PgoverlayError as err:
                result = {{"made": len(made), "error": type(err).__name__, "message": str(err)}}
                break
        """
    answer = ask(RUNNER, code)
    assert answer["made"] == limit and answer["error"] == "LimitReachedError"
    assert "PGOVERLAY_MAX_BRANCHES_PER_REPOSITORY" in str(answer["message"])
    other = ask(
        RUNNER,
        'result = engine.create(CreateRequest(name="lim-x", base=BASE, repository="acme/few", pr=1))',  # noqa: E501
    )
    assert other["name"] == "lim-x"


def test_the_non_root_cli_talks_to_the_service(
    users: None, clean: None, pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    made = cli(
        ["branch", "create", "svc-cli", "--repository", "acme/cli", "--json", "--base", base.name],
        env=env,
        user=RUNNER,
        groups=["pgoverlay"],
    )
    assert made.returncode == 0, made.stderr
    listed = cli(["branch", "list", "--json"], env=env, user=OTHER, groups=["pgoverlay"])
    assert [b["name"] for b in json.loads(listed.stdout)] == ["svc-cli"]
    url = cli(["branch", "connect", "svc-cli", "--url"], env=env, user=RUNNER, groups=["pgoverlay"])
    with psycopg.connect(url.stdout.strip(), connect_timeout=10) as conn:
        conn.execute("SELECT 1")
    denied = cli(["branch", "destroy", "svc-cli"], env=env, user=OTHER, groups=["pgoverlay"])
    assert denied.returncode == 28 and "created by another user" in denied.stderr
    bases = cli(["base", "list", "--json"], env=env, user=OTHER, groups=["pgoverlay"])
    (seen,) = [b for b in json.loads(bases.stdout) if b["name"] == base.name]
    # Where a base came from, and what its lockdown removed, are root's to see.
    assert not {"source", "neutralised", "superuser"} & set(seen)
    outside = cli(["branch", "list"], env=env, user=OUTSIDER)
    assert outside.returncode == 30 and "usermod -aG pgoverlay" in outside.stderr
    gone = cli(["branch", "destroy", "svc-cli"], env=env, user=RUNNER, groups=["pgoverlay"])
    assert gone.returncode == 0, gone.stderr


def test_the_published_openapi_document_is_the_services() -> None:
    from pgoverlay.runner.service.app import openapi_document

    published = Path(__file__).resolve().parents[1] / "docs" / "service-openapi.json"
    assert published.read_text() == openapi_document(), (
        "docs/service-openapi.json is stale: `pgoverlay service --openapi > "
        "docs/service-openapi.json`"
    )


def test_concurrent_requests_each_get_their_answer(
    service: Path, clean: None, pool: Pool, base: BaseVersion
) -> None:
    """Routes and their dependencies run on the service's thread pool: each request must work
    on a registry connection of its own thread, however many arrive together."""
    from concurrent.futures import ThreadPoolExecutor

    from pgoverlay.runner.service.client import RemoteEngine
    from pgoverlay.runner.service.models import CreateRequest, RecordRequest

    engine = RemoteEngine(service)  # root's own client: may act on every branch
    engine.create(CreateRequest(name="svc-busy", repository="acme/busy", pr=1, base=base.name))

    def one(i: int) -> str:
        engine.save_record(
            "svc-busy", RecordRequest(repository="acme/busy", data=json.dumps({"i": i}))
        )
        found = engine.branch("svc-busy")
        assert found is not None and found.record is not None
        assert isinstance(json.loads(found.record.data)["i"], int)
        return found.name

    with ThreadPoolExecutor(max_workers=16) as workers:
        assert set(workers.map(one, range(64))) == {"svc-busy"}
    engine.destroy("svc-busy")


def test_connection_strings_survive_any_password() -> None:
    from psycopg.conninfo import conninfo_to_dict

    from pgoverlay.runner.service.views import Connection

    for password in ("it's a \\ secret", "a=b", "\\'", " lead", "plain-Pw_1"):
        c = Connection(host="h", port=5, database="my db", user="u", password=password)
        assert conninfo_to_dict(c.dsn) == {
            "host": "h",
            "port": "5",
            "dbname": "my db",
            "user": "u",
            "password": password,
        }
        assert password not in repr(c)


def test_roots_cli_asks_the_service_only_when_it_runs_with_roots_settings(
    clean: None, pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    """Root's branch commands are requests when the service would act as root's own process
    would (same settings), and root's own work otherwise: the service's log tells which."""
    log = pool.home / "service.log"

    def new_lines(since: int) -> str:
        return log.read_text()[since:]

    # What the test service runs with (the suite's environment turns autostart off).
    same = {
        **env,
        "PGOVERLAY_SERVICE_GC_INTERVAL": "0",
        "PGOVERLAY_SUSPEND_AFTER": "0",
        "PGOVERLAY_SERVICE_EXPIRY_TIMER": "false",
        "PGOVERLAY_SERVICE_AUTOSTART": "true",
    }
    start = len(log.read_text())
    made = cli(["branch", "create", "root-svc", "--json", "--base", base.name], env=same)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["owner_uid"] == 0
    listed = cli(["branch", "list"], env=same)
    assert "root-svc" in listed.stdout, listed.stderr
    asked = new_lines(start)
    assert "uid=0 " in asked and "POST /v1/branches -> 201" in asked
    assert "GET /v1/branches -> 200" in asked
    # Asking is all such a command does: it imports neither the engine nor pydantic, and
    # defines no dataclass (``dataclasses`` and the ``inspect`` it imports cost about 20 ms).
    for args in (["branch", "list"], ["branch", "status", "root-svc"], ["base", "list"]):
        modules = loaded(args, same)
        assert not modules & {"dataclasses", "inspect", "pydantic", "pgoverlay.runner.pool"}
    start = len(log.read_text())
    bases = cli(["base", "list", "--json"], env=same)
    assert "GET /v1/bases -> 200" in new_lines(start), bases.stderr
    shown = json.loads(bases.stdout)[0]
    assert shown["source"] == base.source and shown["neutralised"] == base.neutralised_notes
    # A reader that goes away early (`| head`) ends the listing quietly.
    piped = subprocess.run(
        f"{shlex.quote(sys.executable)} -m pgoverlay branch status root-svc | head -c 1",
        shell=True,
        env={**os.environ, **same},
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )
    assert piped.stdout == "n" and "Traceback" not in piped.stderr, piped.stderr

    start = len(log.read_text())
    gone = cli(["branch", "destroy", "root-svc"], env=env)  # another gc interval
    assert gone.returncode == 0 and "destroyed" in gone.stdout, gone.stderr
    refused = new_lines(start)
    # Declined before anything was done; root then destroyed it itself.
    assert "uid=0 " in refused and "POST /v1/branches/root-svc/destroy -> 409" in refused
    assert pool.registry.branch("root-svc") is None
