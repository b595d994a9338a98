"""Attacks on the front door's logins, against real branches: malformed SCRAM messages that
would tell a real branch from a name that is none, many addresses of one IPv6 network, a flood
of cancel requests, wakes that cost nothing, and logins as a role the engine never minted a
credential for (the branch's own, whatever PR SQL did to its password)."""

from __future__ import annotations

import base64
import os
import socket
import ssl
import statistics
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apikit import running_door

from doorkit import DoorCA, Exchange, failed_scram, make_ca, message, read_message, startup
from helpers import Undo
from pgoverlay.runner import audit as auditmod
from pgoverlay.runner import branch
from pgoverlay.runner.branch import grants
from pgoverlay.runner.door import startup as proto
from pgoverlay.runner.door import tls
from pgoverlay.runner.door.inthread import running
from pgoverlay.runner.door.router import FrontDoor, Route
from pgoverlay.runner.pool import Pool, gc
from pgoverlay.runner.pool.registry import BaseVersion, Branch, Registry

Door = Callable[..., AbstractContextManager[FrontDoor]]
PROOF = base64.b64encode(bytes(32)).decode()


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> DoorCA:
    return make_ca(tmp_path_factory.mktemp("attack-door-ca"))


@pytest.fixture(scope="module")
def real(pool: Pool, base: BaseVersion) -> Iterator[Branch]:
    made = branch.create(pool, "atk-door", base_name=base.name)
    try:
        yield made
    finally:
        branch.destroy(pool, "atk-door")


class Audit:
    def __init__(self) -> None:
        self.lines: list[dict[str, object]] = []

    def __call__(self, event: str, **fields: object) -> None:
        self.lines.append({"event": event, **fields})

    def outcomes(self) -> list[object]:
        return [line["outcome"] for line in self.lines]


@pytest.fixture
def audit() -> Audit:
    return Audit()


@pytest.fixture
def door(pool: Pool, ca: DoorCA, audit: Audit) -> Door:
    """A door in a thread of this process (``door(address=..., **settings)``), routing by the
    pool's registry."""

    @contextmanager
    def make(address: str = "127.0.0.1", **changes: Any) -> Iterator[FrontDoor]:
        settings = pool.settings.replace(**{"door_handshake_timeout": 10.0, **changes})

        async def resolve(name: str, *, may_wake: Callable[[], bool] | None = None) -> Route | None:
            registry = Registry(pool.registry.path)
            try:
                found = registry.branch(name)
            finally:
                registry.close()
            if found is None or found.state != "ready":
                return None
            return Route(host="127.0.0.1", port=found.port, database=found.database)

        def build() -> FrontDoor:
            context = tls.server_context(tls.Pair(cert=ca.cert_file, key=ca.key_file))
            return FrontDoor(settings, ssl_context=context, resolve=resolve, audit=audit)

        with running(build, host=address) as made:
            yield made

    return make


def tls_to(port: int, ca: DoorCA, *, host: str = "127.0.0.1", source: str | None = None) -> Any:
    """A TLS connection to the door after its SSLRequest, from ``source`` when given."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    raw = socket.socket(family, socket.SOCK_STREAM)
    raw.settimeout(20)
    if source is not None:
        raw.bind((source, 0))
    raw.connect((host, port))
    raw.sendall(struct.pack("!II", 8, 80877103))
    assert raw.recv(1) == b"S"
    context = ssl.create_default_context(cafile=os.fspath(ca.ca_file))
    return context.wrap_socket(raw, server_hostname="localhost")


def initial(data: bytes, mechanism: bytes = b"SCRAM-SHA-256") -> bytes:
    return message(b"p", mechanism + b"\0" + struct.pack("!i", len(data)) + data)


def exchange(
    sock: Any, *, database: str, user: str, first: bytes, final: Callable[[str], bytes]
) -> bytes:
    """A SCRAM login with ``first`` as the client-first-message and ``final(nonce)`` as the
    final one: the server's last answer (an ErrorResponse, or its AuthenticationSASLFinal)."""
    sock.sendall(startup(user=user, database=database))
    sasl = read_message(sock)
    if sasl[:1] == b"E":  # refused before any exchange
        return sasl
    sock.sendall(initial(first))
    answer = read_message(sock)
    if answer[:1] == b"E":
        return answer
    combined = answer[9:].split(b",")[0][2:].decode()
    sock.sendall(message(b"p", final(combined)))
    return read_message(sock)


NONCE = "rOprNGfwEbeRWgbNEkqO"
# Each a message Postgres refuses: (the client-first, the client-final from the nonce).
MALFORMED: dict[str, tuple[bytes, Callable[[str], bytes]]] = {
    "channel binding attribute after n,,": (
        f"n,,n=,r={NONCE}".encode(),
        lambda r: f"c=cD10bHMtc2VydmVyLWVuZC1wb2ludCws,r={r},p={PROOF}".encode(),
    ),
    "c=eSws after n,,": (
        f"n,,n=,r={NONCE}".encode(),
        lambda r: f"c=eSws,r={r},p={PROOF}".encode(),
    ),
    "a proof of 16 bytes": (
        f"n,,n=,r={NONCE}".encode(),
        lambda r: f"c=biws,r={r},p={base64.b64encode(bytes(16)).decode()}".encode(),
    ),
    "a proof that is not base64": (
        f"n,,n=,r={NONCE}".encode(),
        lambda r: f"c=biws,r={r},p=!!!!".encode(),
    ),
    "a bad extra attribute in the final": (
        f"n,,n=,r={NONCE}".encode(),
        lambda r: f"c=biws,r={r},1=x,p={PROOF}".encode(),
    ),
    "garbage after the proof": (
        f"n,,n=,r={NONCE}".encode(),
        lambda r: f"c=biws,r={r},p={PROOF},x=1".encode(),
    ),
    "a nonce that is not the server's": (
        f"n,,n=,r={NONCE}".encode(),
        lambda r: f"c=biws,r={NONCE}x,p={PROOF}".encode(),
    ),
    "no proof": (f"n,,n=,r={NONCE}".encode(), lambda r: f"c=biws,r={r}".encode()),
    "a bad extra attribute in the first": (
        f"n,,n=,r={NONCE},!x".encode(),
        lambda r: b"",
    ),
    "p= in the first (channel binding)": (
        f"p=tls-server-end-point,,n=,r={NONCE}".encode(),
        lambda r: b"",
    ),
    "an authorization identity": (f"n,a=bob,n=,r={NONCE}".encode(), lambda r: b""),
    "a mandatory extension": (f"n,,m=x,n=,r={NONCE}".encode(), lambda r: b""),
    "an unknown gs2 flag": (f"x,,n=,r={NONCE}".encode(), lambda r: b""),
    "no user attribute": (f"n,,r={NONCE}".encode(), lambda r: b""),
    "a nonce with a control character": (b"n,,n=,r=ab\x01cd", lambda r: b""),
    "a NUL inside": (f"n,,n=,r={NONCE}\0x".encode(), lambda r: b""),
}


def direct(b: Branch, first: bytes, final: Callable[[str], bytes]) -> dict[str, str]:
    """What the branch's own Postgres answers, without the door (its fields by code)."""
    with socket.create_connection(("127.0.0.1", b.port), timeout=20) as sock:
        answer = exchange(sock, database=b.database, user=b.user, first=first, final=final)
    assert answer[:1] == b"E", answer
    return proto.error_fields(answer[5:])


def test_malformed_scram_messages_get_postgres_own_answer_from_a_branch_and_an_unknown_name(
    door: Door, ca: DoorCA, real: Branch, audit: Audit
) -> None:
    with door(door_failed_logins=1000) as d:
        for what, (first, final) in MALFORMED.items():
            answers = []
            for database in (real.name, "atk-no-such"):
                with tls_to(d.port, ca) as sock:
                    answers.append(
                        exchange(sock, database=database, user=real.user, first=first, final=final)
                    )
            at_branch, at_nothing = answers
            assert at_branch == at_nothing, what  # byte for byte
            fields = proto.error_fields(at_branch[5:])
            postgres = direct(real, first, final)
            # Postgres's own SQLSTATE, message and detail (the door drops its source-file fields)
            assert {k: fields.get(k) for k in "CMD"} == {k: postgres.get(k) for k in "CMD"}, what
            assert fields["C"] != "28P01", what
        # a message that is no SASL response at all
        query = message(b"Q", b"SELECT 1\0")
        said = []
        for database in (real.name, "atk-no-such"):
            with tls_to(d.port, ca) as sock:
                sock.sendall(startup(user=real.user, database=database))
                assert read_message(sock)[:1] == b"R"
                sock.sendall(query)
                said.append(read_message(sock))
        with socket.create_connection(("127.0.0.1", real.port), timeout=20) as sock:
            sock.sendall(startup(user=real.user, database=real.database))
            assert read_message(sock)[:1] == b"R"
            sock.sendall(query)
            postgres = proto.error_fields(read_message(sock)[5:])
    assert said[0] == said[1]
    fields = proto.error_fields(said[0][5:])
    assert {k: fields.get(k) for k in "CMD"} == {k: postgres.get(k) for k in "CMD"}
    refused = audit.outcomes().count("refused:scram")
    assert refused == 2 * len(MALFORMED) + 2, audit.outcomes()


def test_every_malformed_scram_message_counts_as_a_failed_login(
    door: Door, ca: DoorCA, real: Branch, audit: Audit
) -> None:
    first, final = MALFORMED["a proof of 16 bytes"]
    for database in (real.name, "atk-no-such"):
        with door(door_failed_logins=3) as d:
            for _ in range(3):
                with tls_to(d.port, ca) as sock:
                    exchange(sock, database=database, user=real.user, first=first, final=final)
            with pytest.raises(psycopg.OperationalError, match="too many failed logins"):
                psycopg.connect(
                    host="localhost",
                    port=d.port,
                    dbname=real.name,
                    user=real.user,
                    password=real.password,
                    sslmode="verify-full",
                    sslrootcert=os.fspath(ca.ca_file),
                    connect_timeout=20,
                ).close()


def test_a_wrong_password_takes_as_long_on_an_unknown_name_as_on_a_branch(
    door: Door, ca: DoorCA, real: Branch
) -> None:
    """Printed, not asserted (timing is the bench's): the time of each answer, medians of 20."""
    with door(door_failed_logins=1000) as d:
        for _ in range(30):  # real logins first: the imitation waits as they took
            failed_scram(d.port, ca.ca_file, database=real.name, user=real.user)
        rounds: dict[str, list[tuple[float, float, float]]] = {"branch": [], "unknown": []}
        shapes: dict[str, list[Exchange]] = {"branch": [], "unknown": []}
        for _ in range(20):
            for label, database in (("branch", real.name), ("unknown", "atk-no-such")):
                done = failed_scram(d.port, ca.ca_file, database=database, user=real.user)
                rounds[label].append(done.waits)
                shapes[label].append(done)
    print_waits("in-thread door", rounds)
    assert {x.shape for x in shapes["branch"]} == {x.shape for x in shapes["unknown"]}


def print_waits(where: str, rounds: dict[str, list[tuple[float, float, float]]]) -> None:
    for label, waits in rounds.items():
        medians = [statistics.median(w[i] for w in waits) for i in range(3)]
        total = statistics.median(sum(w) for w in waits)
        print(
            f"{where}, wrong password, {label}: median per answer "
            + ", ".join(f"{m * 1000:.2f}" for m in medians)
            + f" ms; whole login {total * 1000:.2f} ms (of {len(waits)})"
        )


# -- limits per client -------------------------------------------------------------------------

NET = "fd37:5820:37::"  # one /64, on loopback for the test
OTHER = "fd37:5820:38::"


@contextmanager
def loopback_addresses(*addresses: str) -> Iterator[None]:
    added: list[str] = []
    try:
        for address in addresses:
            subprocess.run(
                ["ip", "-6", "addr", "add", f"{address}/64", "dev", "lo", "nodad"],
                check=True,
                capture_output=True,
                timeout=30,
            )
            added.append(address)
        yield
    finally:
        for address in added:
            subprocess.run(
                ["ip", "-6", "addr", "del", f"{address}/64", "dev", "lo"],
                capture_output=True,
                timeout=30,
            )


def wrong_login(port: int, ca: DoorCA, *, host: str, source: str) -> bytes:
    with tls_to(port, ca, host=host, source=source) as sock:
        return exchange(
            sock,
            database="atk-no-such",
            user="guess",
            first=f"n,,n=,r={NONCE}".encode(),
            final=lambda r: f"c=biws,r={r},p={PROOF}".encode(),
        )


def test_addresses_of_one_ipv6_64_share_one_failed_login_budget_and_one_connection_cap(
    door: Door, ca: DoorCA
) -> None:
    ours = [f"{NET}{n}" for n in range(1, 10)]
    theirs = f"{OTHER}1"
    with loopback_addresses(*ours, theirs):
        with door(address=ours[0], door_failed_logins=3) as d:
            said = [wrong_login(d.port, ca, host=ours[0], source=a) for a in ours[1:]]
            codes = [proto.error_fields(s[5:])["C"] for s in said]
            assert codes[:3] == ["28P01"] * 3
            assert codes[3:] == ["28000"] * 5, codes  # the /64 is refused, whichever address
            assert b"too many failed logins" in said[3]
            other = wrong_login(d.port, ca, host=ours[0], source=theirs)  # another /64: its own
            assert proto.error_fields(other[5:])["C"] == "28P01"
        with door(address=ours[0], door_failed_logins=3, door_ipv6_prefix=128) as d:
            said = [wrong_login(d.port, ca, host=ours[0], source=a) for a in ours[1:5]]
            assert [proto.error_fields(s[5:])["C"] for s in said] == ["28P01"] * 4
        with door(address=ours[0], door_max_per_source=2) as d:
            held = [tls_to(d.port, ca, host=ours[0], source=a) for a in ours[1:3]]
            try:
                with tls_to(d.port, ca, host=ours[0], source=ours[3]) as third:
                    third.sendall(startup(user="guess", database="atk-no-such"))
                    refused = read_message(third)
            finally:
                for sock in held:
                    sock.close()
            assert proto.error_fields(refused[5:])["C"] == "53300"
            assert b"door_max_per_source = 2" in refused


def test_a_banned_sources_cancel_requests_do_not_grow_the_doors_memory(
    door: Door, ca: DoorCA
) -> None:
    cancels = 20_000

    def remembered(d: FrontDoor) -> int:  # the failure table's size: every time it holds
        return sum(len(times) for times in d.guard._failures.values())

    def cancel(_: int) -> None:
        with socket.create_connection(("127.0.0.1", d.port), timeout=20) as raw:
            raw.sendall(struct.pack("!IIII", 16, 80877102, 1234, 5678))
            raw.recv(100)

    with door(door_failed_logins=5, door_max_per_source=1000) as d:
        before = remembered(d)
        started = time.monotonic()
        with ThreadPoolExecutor(8) as workers:
            list(workers.map(cancel, range(cancels)))
        after = remembered(d)
        print(
            f"{cancels} cancels in {time.monotonic() - started:.1f} s: failure times held "
            f"{before} -> {after}"
        )
    assert after <= 5, after


# -- through the door that ships (`pgoverlay door`, asking the engine) -------------------------


def door_login(door_port: int, ca_file: Path, *, dbname: str, user: str, password: str) -> str:
    """``connected``, or the client's error."""
    try:
        psycopg.connect(
            host="localhost",
            port=door_port,
            dbname=dbname,
            user=user,
            password=password,
            sslmode="verify-full",
            sslrootcert=os.fspath(ca_file),
            connect_timeout=60,
        ).close()
    except psycopg.OperationalError as err:
        return str(err)
    return "connected"


def test_only_credentials_the_engine_minted_log_in_through_the_door(
    pool: Pool,
    base: BaseVersion,
    service: Path,
    tmp_path_factory: pytest.TempPathFactory,
    undo: Undo,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The branch's own role, with its own password or one PR SQL gave it, is refused as an
    unknown user is and counts as a failed login; a grant logs in."""
    monkeypatch.setattr(pool.settings, "access_unmasked", True)
    name = "atk-own-role"
    undo.branch(name)
    made = branch.create(pool, name, base_name=base.name)
    granted = grants.grant(pool, name, login="octo-cat", ttl=3600)
    own = branch.connection(pool, made).url
    with psycopg.connect(own, autocommit=True) as pr_sql:  # what a migration may do
        pr_sql.execute("ALTER ROLE CURRENT_USER PASSWORD 'chosen-by-the-pr'")
    folder = tmp_path_factory.mktemp("door-own-role")
    env = {"PGOVERLAY_DOOR_FAILED_LOGINS": "3"}
    with running_door(pool, base, folder, policy="owners: [acme]\n", env=env) as door:
        ca_file = door.certs.ca_file
        role = granted.grant.role
        assert (
            door_login(door.door_port, ca_file, dbname=name, user=role, password=granted.password)
            == "connected"
        )
        unknown = door_login(
            door.door_port, ca_file, dbname="atk-none", user=made.user, password="chosen-by-the-pr"
        )
        own = door_login(
            door.door_port, ca_file, dbname=name, user=made.user, password="chosen-by-the-pr"
        )
        assert own == unknown and 'password authentication failed for user "' in own
        stored = door_login(
            door.door_port, ca_file, dbname=name, user=made.user, password=made.password
        )
        assert stored == unknown
        # three failed logins: the grant's right password is refused now
        refused = door_login(
            door.door_port, ca_file, dbname=name, user=role, password=granted.password
        )
        assert "too many failed logins" in refused
    lines = [x for x in auditmod.read(pool.home / auditmod.DOOR_LOG) if x.get("branch") == name]
    assert [x["outcome"] for x in lines].count("refused:role") == 2


def test_a_wrong_password_through_the_shipping_door_takes_as_long_on_an_unknown_name(
    pool: Pool,
    base: BaseVersion,
    service: Path,
    tmp_path_factory: pytest.TempPathFactory,
    undo: Undo,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`pgoverlay door`, asking the engine about each name: a granted role's wrong password on
    a real branch against the same on a name that is none. Printed, not asserted."""
    monkeypatch.setattr(pool.settings, "access_unmasked", True)
    name = "atk-timing"
    undo.branch(name)
    branch.create(pool, name, base_name=base.name)
    role = grants.grant(pool, name, login="octo-cat", ttl=3600).grant.role
    folder = tmp_path_factory.mktemp("door-timing")
    env = {"PGOVERLAY_DOOR_FAILED_LOGINS": "1000"}
    with running_door(pool, base, folder, policy="owners: [acme]\n", env=env) as door:
        ca_file = door.certs.ca_file
        for _ in range(30):  # real wrong passwords first: the imitation copies their waits
            failed_scram(door.door_port, ca_file, database=name, user=role)
        rounds: dict[str, list[tuple[float, float, float]]] = {"branch": [], "unknown": []}
        verdicts = set()
        for _ in range(20):
            for label, database in (("branch", name), ("unknown", "atk-none")):
                done = failed_scram(door.door_port, ca_file, database=database, user=role)
                rounds[label].append(done.waits)
                verdicts.add(done.verdict)
    print_waits("pgoverlay door", rounds)
    assert len(verdicts) == 1  # the same 28P01, byte for byte


def first_reply(door_port: int, ca_file: Path, name: str, user: str) -> bytes:
    """Name branch ``name`` and hang up after the door's first answer."""
    raw = socket.create_connection(("127.0.0.1", door_port), timeout=120)
    raw.sendall(struct.pack("!II", 8, 80877103))
    assert raw.recv(1) == b"S"
    context = ssl.create_default_context(cafile=os.fspath(ca_file))
    with context.wrap_socket(raw, server_hostname="localhost") as sock:
        sock.sendall(startup(user=user, database=name))
        return read_message(sock)


def test_a_client_hanging_up_after_the_first_reply_wakes_no_more_than_its_failed_logins(
    pool: Pool,
    base: BaseVersion,
    service: Path,
    tmp_path_factory: pytest.TempPathFactory,
    undo: Undo,
) -> None:
    names = [f"atk-wake-{n}" for n in range(3)]
    undo.branch(*names)
    for name in names:
        user = branch.create(pool, name, base_name=base.name).user  # guessable: pgoverlay
        branch.suspend(pool, name)
    folder = tmp_path_factory.mktemp("door-wakes")
    env = {"PGOVERLAY_DOOR_FAILED_LOGINS": "2", "PGOVERLAY_DOOR_HANDSHAKE_TIMEOUT": "60"}
    with running_door(pool, base, folder, policy="owners: [acme]\n", env=env) as door:
        replies = [first_reply(door.door_port, door.certs.ca_file, n, user) for n in names]
    assert [r[:1] for r in replies] == [b"R", b"R", b"E"]
    assert b"too many failed logins" in replies[2]
    states = [branch.get(pool, name).state for name in names]
    assert states == ["ready", "ready", "suspended"], states


def test_a_wake_that_fails_tells_the_client_counts_nothing_and_gc_finishes_it(
    pool: Pool,
    base: BaseVersion,
    service: Path,
    tmp_path_factory: pytest.TempPathFactory,
    undo: Undo,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool.settings, "access_unmasked", True)
    name = "atk-wake-fails"
    undo.branch(name)
    made = branch.create(pool, name, base_name=base.name)
    granted = grants.grant(pool, name, login="octo-cat", ttl=3600)
    branch.suspend(pool, name)
    folder = tmp_path_factory.mktemp("door-wake-fails")
    env = {"PGOVERLAY_DOOR_FAILED_LOGINS": "1", "PGOVERLAY_DOOR_HANDSHAKE_TIMEOUT": "120"}
    login = {"dbname": name, "user": granted.grant.role, "password": granted.password}
    with running_door(pool, base, folder, policy="owners: [acme]\n", env=env) as door:
        taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past its TIME_WAITs
        try:
            taken.bind((pool.settings.listen_address, made.port))  # the branch's port, taken
            taken.listen(1)
            said = [door_login(door.door_port, door.certs.ca_file, **login) for _ in range(2)]
        finally:
            taken.close()
        # told what happened, twice: not a failed login (one would have banned the source)
        for text in said:
            assert "could not be woken" in text and "pgoverlay gc" in text, text
        assert branch.get(pool, name).state in ("waking", "suspended")
        assert f"could not wake branch {name}" in door.log.read_text()
        gc.collect(pool)
        assert branch.get(pool, name).state == "ready"
        assert door_login(door.door_port, door.certs.ca_file, **login) == "connected"
