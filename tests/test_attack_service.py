"""A member of the service's group attacks the root engine service: bodies it cannot hold,
requests that never finish, a flood of connections, simultaneous creates past a limit, and
creates that name no repository or another one. Each is made by a real user (a child process
of its uid) against the real service on its real socket; root's process must stay flat and
serve the other members meanwhile."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from helpers import as_user_call, cli, os_user, service_settings, start_service
from pgoverlay.runner import branch
from pgoverlay.runner.branch import warm
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import WARM_PREFIX, BaseVersion
from pgoverlay.runner.service import client, limits, serve
from pgoverlay.runner.service.models import MAX_RECORD_BYTES
from pgoverlay.runner.service.protocol import peer_of
from pgoverlay.runner.settings import Settings

ATTACKER = "pgo-flood"  # a member of the group that misbehaves
MEMBER = "pgo-member"  # another member (e.g. the webhook listener), going about its work
GROUPS = ("pgoverlay",)
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def users(service: Path) -> None:
    os_user(ATTACKER, groups=list(GROUPS))
    os_user(MEMBER, groups=list(GROUPS))


@pytest.fixture
def clean(pool: Pool) -> Iterator[None]:
    """No branch before the test, and none after it, passed or failed."""

    def wipe() -> None:
        for b in pool.registry.branches():
            branch.destroy(pool, b.name)

    wipe()
    yield
    wipe()


@contextmanager
def service_with(pool: Pool, **changes: object) -> Iterator[Settings]:
    """The test run's engine service, restarted with ``changes`` to its settings meanwhile (a
    pool has one service socket), and restarted as it was afterwards."""
    normal = service_settings(pool)
    changed = normal.replace(**changes)
    was_running = serve.stop(normal, wait=normal.stop_timeout)
    start_service(changed)
    try:
        yield changed
    finally:
        serve.stop(changed, wait=changed.stop_timeout)
        if was_running:
            start_service(normal)


def service_pid(path: Path) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(os.fspath(path))
        return peer_of(sock).pid


def memory(pid: int) -> dict[str, int]:
    """The process's VmRSS and VmHWM (its peak since the last reset), in bytes."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return found


def reset_peak(pid: int) -> None:
    """Start the process's VmHWM again from its current RSS (proc(5): clear_refs, 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def as_member(user: str, code: str) -> dict[str, object]:
    """Run ``code`` (which sets ``result``) as ``user``, a member of the group; its JSON."""
    body = "\n".join(
        [
            "import json",
            textwrap.dedent(code).strip(),
            "print(json.dumps(result))",
        ]
    )
    done = as_user_call(user, GROUPS, body, preload=["pgoverlay.runner.service.models"])
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


# Raw HTTP as an attacker sends it: (status, JSON body or None) of each request, or the error.
_RAW = """
import socket
def ask(path, data, *, chunks=(), timeout=60):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    try:
        sock.sendall(data)
        for chunk in chunks:
            sock.sendall(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    got = b""
    try:
        while part := sock.recv(65536):
            got += part
    except ConnectionResetError:
        pass
    sock.close()
    head, _, body = got.partition(b"\\r\\n\\r\\n")
    status = int(head.split(b" ")[1]) if head else 0
    return [status, json.loads(body) if body else None, head.decode("latin-1").lower()]
"""


def head(method: str, target: str, *extra: str) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: localhost", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunked(size: int, *, count: int) -> list[bytes]:
    piece = b"x" * size
    return [f"{size:x}\r\n".encode() + piece + b"\r\n" for _ in range(count)]


def test_a_declared_body_over_its_cap_is_refused_before_it_is_read(
    users: None, service: Path
) -> None:
    """Nothing of the body is sent: a service that waited for it would answer 408 after its
    request timeout, not 413."""
    requests = [
        head("POST", "/v1/branches", "Content-Length: 200000000"),
        head("PUT", "/v1/branches/x/record", f"Content-Length: {limits.MAX_RECORD_BODY_BYTES + 1}"),
        head("POST", "/v1/branches", f"Content-Length: {limits.MAX_BODY_BYTES + 1}"),
    ]
    code = _RAW + f"result = [ask({os.fspath(service)!r}, r) for r in {requests!r}]"
    answers = as_member(ATTACKER, code)
    assert isinstance(answers, list)
    for (status, body, heads), cap in zip(
        answers,
        [limits.MAX_BODY_BYTES, limits.MAX_RECORD_BODY_BYTES, limits.MAX_BODY_BYTES],
        strict=True,
    ):
        assert status == 413, body
        assert body["code"] == "request_too_large"
        assert f"over {cap} bytes" in body["message"]
        assert "connection: close" in heads


def test_a_body_without_a_length_is_cut_at_its_cap(users: None, service: Path) -> None:
    """Chunked bodies are counted as they are read: 64 MiB offered, refused at the cap."""
    streams = [
        ("POST", "/v1/branches", chunked(64 * 1024, count=1024)),
        ("PUT", "/v1/branches/x/record", chunked(64 * 1024, count=1024)),
    ]
    code = _RAW + textwrap.dedent(
        f"""
        result = []
        for method, target, chunks in {[(m, t, len(c)) for m, t, c in streams]!r}:
            start = (f"{{method}} {{target}} HTTP/1.1\\r\\nHost: x\\r\\n"
                     "Transfer-Encoding: chunked\\r\\n\\r\\n").encode()
            piece = b"%x\\r\\n" % 65536 + b"x" * 65536 + b"\\r\\n"
            result.append(ask({os.fspath(service)!r}, start, chunks=[piece] * chunks))
        """
    )
    answers = as_member(ATTACKER, code)
    assert isinstance(answers, list)
    for (status, body, _), cap in zip(
        answers, [limits.MAX_BODY_BYTES, limits.MAX_RECORD_BODY_BYTES], strict=True
    ):
        assert status == 413, body
        assert f"over {cap} bytes" in body["message"]


def test_the_largest_record_fits_its_routes_cap(
    users: None, clean: None, pool: Pool, base: BaseVersion, service: Path
) -> None:
    """A record of MAX_RECORD_BYTES whose every byte the client escapes to six (U+007F) is
    still taken: the record route's cap is sized from it."""
    code = f"""
        from pathlib import Path
        from pgoverlay.runner.service.client import RemoteEngine
        from pgoverlay.runner.service.models import CreateRequest, RecordRequest
        engine = RemoteEngine(Path({os.fspath(service)!r}))
        made = CreateRequest(name="big-record", base={base.name!r}, repository="acme/records", pr=1)
        engine.create(made)
        data = '"' + "\\x7f" * ({MAX_RECORD_BYTES} - 2) + '"'
        engine.save_record("big-record", RecordRequest(repository="acme/records", data=data))
        result = len(engine.branch("big-record").record.data)
    """
    assert as_member(MEMBER, code) == MAX_RECORD_BYTES  # type: ignore[comparison-overlap]


def test_a_refusal_quotes_only_an_excerpt_of_what_was_sent(users: None, service: Path) -> None:
    bodies = [
        {"name": "a" * 3000},
        {"name": "x", "repository": "r" * 3000},
        {"name": "x", "k" * 3000: 1},
    ]
    requests = [
        head(
            "POST",
            "/v1/branches",
            "Content-Type: application/json",
            f"Content-Length: {len(json.dumps(b))}",
        )
        + json.dumps(b).encode()
        for b in bodies
    ]
    code = _RAW + f"result = [ask({os.fspath(service)!r}, r) for r in {requests!r}]"
    answers = as_member(ATTACKER, code)
    assert isinstance(answers, list)
    for status, body, _ in answers:
        assert status == 422 and body["code"] == "invalid_request", body
        assert len(body["message"]) < 300, body
        assert not [c for c in "ark" if c * 100 in body["message"]], body
    assert "(3000 characters)" in answers[0][1]["message"]


def test_a_head_over_its_cap_is_refused_sent_at_once_or_slowly(users: None, service: Path) -> None:
    big = "X-Padding: " + "p" * limits.MAX_HEAD_BYTES
    at_once = head("GET", "/v1/health", big)
    code = _RAW + textwrap.dedent(
        f"""
        whole = {at_once!r}
        result = [ask({os.fspath(service)!r}, whole),
                  ask({os.fspath(service)!r}, whole[:100], chunks=[whole[i:i + 512]
                      for i in range(100, len(whole), 512)])]
        """
    )
    answers = as_member(ATTACKER, code)
    assert isinstance(answers, list)
    statuses = [status for status, _, _ in answers]
    # At once, h11 reads the whole head and the service answers 431; in parts, h11 stops
    # buffering at the cap (400). Either way as the service's JSON error.
    assert statuses[0] == 431 and answers[0][1]["code"] == "request_too_large", answers[0]
    assert statuses[1] in (400, 431), answers[1]
    assert all(set(body) == {"code", "message"} for _, body, _ in answers)


# -- limits ---------------------------------------------------------------------------------

# Twenty creates of one member, released together; each one's answer.
_RACE = """
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from pgoverlay.errors import PgoverlayError
from pgoverlay.runner.service.client import RemoteEngine
from pgoverlay.runner.service.models import CreateRequest
engine = RemoteEngine(Path(SOCKET))
start = threading.Barrier(len(REQUESTS))
def create(fields):
    start.wait()
    try:
        return ["made", engine.create(CreateRequest(**fields)).name]
    except PgoverlayError as err:
        return [type(err).__name__, str(err)]
with ThreadPoolExecutor(len(REQUESTS)) as workers:
    result = list(workers.map(create, REQUESTS))
"""

LIMITS: dict[str, tuple[str, Callable[[int], str]]] = {
    # limit -> (its setting, the repository of create i)
    "total": ("max_branches", lambda i: f"acme/r{i}"),
    "per repository": ("max_branches_per_repository", lambda i: "acme/same"),
    "per user": ("max_branches_per_user", lambda i: f"acme/r{i}"),
}


@pytest.mark.parametrize("limit", list(LIMITS))
def test_simultaneous_creates_stop_exactly_at_the_limit(
    users: None, clean: None, pool: Pool, base: BaseVersion, limit: str
) -> None:
    """Twenty creates at once against a limit of 3: three branches, seventeen refusals with
    the limit's own message, and nothing of the refused ones left behind."""
    setting, repository = LIMITS[limit]
    with service_with(pool, **{setting: 3}) as settings:
        requests = [
            {"name": f"race-{i}", "base": base.name, "repository": repository(i), "pr": i + 1}
            for i in range(20)
        ]
        path = client.socket_path(settings)
        code = f"SOCKET = {os.fspath(path)!r}\nREQUESTS = {requests!r}\n{_RACE}"
        answers = as_member(ATTACKER, code)
        assert isinstance(answers, list)
        made = sorted(name for kind, name in answers if kind == "made")
        refused = [message for kind, message in answers if kind != "made"]
        assert len(made) == 3, answers
        assert {kind for kind, _ in answers} == {"made", "LimitReachedError"}, answers
        variable = f"PGOVERLAY_{setting.upper()}"
        assert len(refused) == 17 and all(variable in m for m in refused), refused
        assert sorted(b.name for b in pool.registry.branches(warm=True)) == made
        assert all(b.state == "ready" for b in pool.registry.branches())
        for i in range(20):
            if f"race-{i}" not in made:
                assert not branch.layout(pool, f"race-{i}").root.exists()
        if limit == "per user":
            # The limit is the attacker's uid's: another member still gets its branch.
            other = as_member(
                MEMBER,
                f"""
                from pathlib import Path
                from pgoverlay.runner.service.client import RemoteEngine
                from pgoverlay.runner.service.models import CreateRequest
                engine = RemoteEngine(Path({os.fspath(path)!r}))
                request = CreateRequest(
                    name="race-other", base={base.name!r}, repository="acme/other", pr=1
                )
                result = engine.create(request).owner_uid
                """,
            )
            assert other == os_user(MEMBER).pw_uid


def test_simultaneous_creates_claiming_warm_branches_stop_exactly_at_the_limit(
    users: None, clean: None, pool: Pool, base: BaseVersion
) -> None:
    """The same race with warm branches to claim: a claim is counted in the transaction that
    binds the warm branch, as a cold create is in the one that registers it."""
    with service_with(pool, max_branches=3) as settings:
        pool.registry.set_warm_target(base.name, "local", 2)
        try:
            wait_for(
                lambda: len(warm.warm_branches(pool)) >= 2 or None,
                timeout=180,
                what="the service to start 2 warm branches",
            )
            requests = [
                {"name": f"race-{i}", "base": base.name, "repository": f"acme/r{i}", "pr": i + 1}
                for i in range(20)
            ]
            path = client.socket_path(settings)
            code = f"SOCKET = {os.fspath(path)!r}\nREQUESTS = {requests!r}\n{_RACE}"
            answers = as_member(ATTACKER, code)
        finally:
            pool.registry.set_warm_target(base.name, "local", 0)
            wait_for(
                lambda: not warm.warm_branches(pool),
                timeout=180,
                what="the service to retire its warm branches",
            )
    assert isinstance(answers, list)
    made = sorted(name for kind, name in answers if kind == "made")
    assert len(made) == 3, answers
    assert {kind for kind, _ in answers} == {"made", "LimitReachedError"}, answers
    ours = pool.registry.branches()
    assert sorted(b.name for b in ours) == made and all(b.state == "ready" for b in ours)
    assert any(b.slot.startswith(WARM_PREFIX) for b in ours), "no warm branch was claimed"


def test_a_create_without_a_repository_is_refused_to_members_and_taken_from_root(
    users: None, clean: None, pool: Pool, base: BaseVersion, service: Path, env: dict[str, str]
) -> None:
    refused = cli(
        ["branch", "create", "no-repo", "--base", base.name],
        env=env,
        user=MEMBER,
        groups=list(GROUPS),
    )
    assert refused.returncode == 2, refused.stderr
    assert "must name the repository" in refused.stderr
    assert "--repository OWNER/NAME" in refused.stderr
    assert pool.registry.branch("no-repo") is None
    named = cli(
        ["branch", "create", "with-repo", "--base", base.name, "--repository", "acme/shop"]
        + ["--pr", "4", "--json"],
        env=env,
        user=MEMBER,
        groups=list(GROUPS),
    )
    assert named.returncode == 0, named.stderr
    shown = json.loads(named.stdout)
    assert shown["repository"] == "acme/shop" and shown["pr"] == 4
    assert shown["owner_uid"] == os_user(MEMBER).pw_uid
    from pgoverlay.runner.service.client import RemoteEngine
    from pgoverlay.runner.service.models import CreateRequest

    by_root = RemoteEngine(service).create(CreateRequest(name="root-no-repo", base=base.name))
    assert by_root.owner_uid == 0 and by_root.repository == ""


# -- floods ---------------------------------------------------------------------------------

# Opens SLOW connections that send part of a request and stop, then DECLARED requests of a
# 200 MB body (the second half of them sending it) and STREAMED chunked ones (the last
# RECORDS to the record route), all open together; prints "ready", then each one's status
# (0: closed without an answer, -1: no answer within the deadline).
_FLOOD = """
import asyncio, json, resource, socket
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
PIECE = b"x" * 65536
CHUNK = b"%x\\r\\n" % len(PIECE) + PIECE + b"\\r\\n"

def opened(first):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(60)
    sock.connect(PATH)
    sock.sendall(first)
    sock.setblocking(False)
    return sock

async def answer(sock, more):
    loop = asyncio.get_running_loop()
    try:
        for piece in more:
            await loop.sock_sendall(sock, piece)
    except (BrokenPipeError, ConnectionResetError):
        pass
    got = b""
    try:
        while part := await asyncio.wait_for(loop.sock_recv(sock, 65536), DEADLINE):
            got += part
    except ConnectionResetError:
        pass
    except TimeoutError:
        return -1
    finally:
        sock.close()
    return int(got.split(b" ")[1]) if got else 0

def heading(method, target, extra):
    return f"{method} {target} HTTP/1.1\\r\\nHost: x\\r\\n{extra}\\r\\n\\r\\n".encode()

async def main():
    waiting = {"slow": [], "declared": [], "streamed": []}
    for i in range(SLOW):
        # most stop in their request line; one in ten sends its head and stops in its body
        first = b"POST /v1/branches HTT"
        if i % 10 == 9:
            first = heading("POST", "/v1/branches", "Content-Length: 100") + b'{"name": '
        waiting["slow"].append(answer(opened(first), ()))
    for i in range(DECLARED):
        first = heading("POST", "/v1/branches", "Content-Length: 200000000")
        more = (PIECE for _ in range(3052)) if i >= DECLARED // 2 else ()
        waiting["declared"].append(answer(opened(first), more))
    for i in range(STREAMED):
        target = "/v1/branches/x/record" if i >= STREAMED - RECORDS else "/v1/branches"
        method = "PUT" if target.endswith("record") else "POST"
        first = heading(method, target, "Transfer-Encoding: chunked")
        waiting["streamed"].append(answer(opened(first), (CHUNK for _ in range(3052))))
    print("ready", flush=True)
    kinds = list(waiting)
    every = await asyncio.gather(*(asyncio.gather(*waiting[kind]) for kind in kinds))
    print(json.dumps(dict(zip(kinds, every))))

asyncio.run(main())
"""


def flood(
    user: str, path: Path, *, slow: int, declared: int, streamed: int, records: int
) -> subprocess.Popen[str]:
    """The flood above as ``user`` (a member of the group), started; its first line read."""
    settings = {
        "PATH": os.fspath(path),
        "SLOW": slow,
        "DECLARED": declared,
        "STREAMED": streamed,
        "RECORDS": records,
        "DEADLINE": 300,
    }
    prelude = (
        "import grp, os, pwd\n"
        f"u = pwd.getpwnam({user!r})\n"
        f"os.setgroups([grp.getgrnam(g).gr_gid for g in {list(GROUPS)!r}])\n"
        "os.setgid(u.pw_gid); os.setuid(u.pw_uid)\n"
        + "".join(f"{name} = {value!r}\n" for name, value in settings.items())
    )
    attack = subprocess.Popen(
        [sys.executable, "-c", prelude + _FLOOD],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    assert attack.stdout is not None
    first = attack.stdout.readline()
    if first.strip() != "ready":
        attack.kill()
        _, err = attack.communicate(timeout=60)
        pytest.fail(f"the flood did not start: {first}{err}")
    return attack


def flood_result(attack: subprocess.Popen[str]) -> dict[str, list[int]]:
    out, err = attack.communicate(timeout=400)
    assert attack.returncode == 0, err
    found: dict[str, list[int]] = json.loads(out.strip().splitlines()[-1])
    return found


def test_oversized_and_slow_requests_leave_the_services_memory_flat_and_others_served(
    users: None, clean: None, pool: Pool, base: BaseVersion, env: dict[str, str]
) -> None:
    """1,000 slow requests (stopped in their request line, or a tenth of them in their body)
    and 100 oversized ones (200 MB declared, half of them sent; and chunked streams of 200 MB)
    from one member at once, every one of them let in (its
    connection cap raised for this): each is refused on its own cap, root's service grows by
    no more than a few tens of MiB, and another member's create is served meanwhile."""
    with service_with(
        pool, service_connections_per_user=2000, service_request_timeout=60
    ) as settings:
        path = client.socket_path(settings)
        pid = service_pid(path)
        as_member_cli: dict[str, Any] = {"env": env, "user": MEMBER, "groups": list(GROUPS)}
        # What a create costs the service the first time (its imports) is not the flood's.
        warm = cli(
            ["branch", "create", "warm-up", "--base", base.name, "--repository", "acme/shop"],
            **as_member_cli,
        )
        assert warm.returncode == 0, warm.stderr
        assert cli(["branch", "destroy", "warm-up"], **as_member_cli).returncode == 0
        reset_peak(pid)
        before = memory(pid)["VmRSS"]

        attack = flood(ATTACKER, path, slow=1000, declared=50, streamed=50, records=10)
        try:
            made = cli(
                ["branch", "create", "meanwhile", "--base", base.name]
                + ["--repository", "acme/shop", "--json"],
                **as_member_cli,
            )
            # Served while the slow requests were still open (they wait 60 s for their 408).
            still_flooding = attack.poll() is None
        finally:
            found = flood_result(attack)
        after = memory(pid)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["name"] == "meanwhile" and still_flooding
    assert found["slow"] == [408] * 1000
    assert found["declared"] == [413] * 50
    assert found["streamed"] == [413] * 50
    grown = {key: (value - before) / MiB for key, value in after.items()}
    print(f"service RSS before {before / MiB:.1f} MiB; grown by {grown}")
    assert grown["VmHWM"] < 40 and grown["VmRSS"] < 40, grown


def test_a_members_connections_over_its_cap_are_refused_and_others_still_served(
    users: None, pool: Pool, service: Path
) -> None:
    """Default caps: of 200 connections of one member left half-sent, the first
    PGOVERLAY_SERVICE_CONNECTIONS_PER_USER are held until their request timeout (408) and the
    rest refused at once (429, saying which setting); another member and root are served
    meanwhile, and the refusals are logged once, not once each."""
    settings = service_settings(pool)
    cap = settings.service_connections_per_user
    log = pool.home / "service.log"
    start = len(log.read_bytes())
    attack = flood(ATTACKER, service, slow=200, declared=0, streamed=0, records=0)
    try:
        seen = as_member(
            MEMBER,
            f"""
            from pathlib import Path
            from pgoverlay.runner.service.client import RemoteEngine
            result = [b.name for b in RemoteEngine(Path({os.fspath(service)!r})).bases()]
            """,
        )
        from pgoverlay.runner.service.client import RemoteEngine

        by_root = [b.name for b in RemoteEngine(service).bases()]
        still_flooding = attack.poll() is None
    finally:
        found = flood_result(attack)
    assert seen == by_root == [b.name for b in pool.registry.bases()]  # type: ignore[comparison-overlap]
    assert still_flooding
    assert sorted(found["slow"]) == [408] * cap + [429] * (200 - cap)
    said = log.read_bytes()[start:].decode()
    uid = os_user(ATTACKER).pw_uid
    assert said.count(f"uid={uid} ") >= 1
    assert said.count("refusing more") == 1, said
    assert f"uid={uid}: {200 - cap} connections over its limit were refused" in said


def test_a_refused_connection_tells_the_client_which_setting_to_raise(
    users: None, pool: Pool, service: Path
) -> None:
    """The client reads the 429 the service sent before it closed the connection."""
    cap = service_settings(pool).service_connections_per_user
    attack = flood(ATTACKER, service, slow=cap, declared=0, streamed=0, records=0)
    try:
        answer = as_member(
            ATTACKER,
            f"""
            from pathlib import Path
            from pgoverlay.errors import PgoverlayError
            from pgoverlay.runner.service.client import RemoteEngine
            try:
                RemoteEngine(Path({os.fspath(service)!r})).bases()
                result = None
            except PgoverlayError as err:
                result = [type(err).__name__, str(err), err.exit_code]
            """,
        )
    finally:
        flood_result(attack)
    assert isinstance(answer, list)
    kind, message, exit_code = answer
    assert kind == "ServiceBusyError" and exit_code == 30
    assert f"already has {cap} requests open" in message
    assert "PGOVERLAY_SERVICE_CONNECTIONS_PER_USER" in message
