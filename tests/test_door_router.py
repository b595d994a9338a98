"""The front door against real branches: real TLS (a test CA), real clients (psql, psycopg,
pgJDBC), real SCRAM logins, and what an anonymous client sees."""

from __future__ import annotations

import ast
import base64
import contextlib
import hashlib
import hmac
import inspect
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from netns import Machine

from doorkit import (
    SNI_SUFFIX,
    DoorCA,
    failed_scram,
    make_ca,
    message,
    read_message,
    recv_exactly,
    startup,
    tls_socket,
)
from pgoverlay.runner import branch
from pgoverlay.runner.door import router as routermod
from pgoverlay.runner.door import tls
from pgoverlay.runner.door.guard import Slots
from pgoverlay.runner.door.inthread import running
from pgoverlay.runner.door.router import FrontDoor, Route
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion, Branch, Registry

Door = Callable[..., AbstractContextManager[FrontDoor]]


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> DoorCA:
    return make_ca(tmp_path_factory.mktemp("door-ca"))


@pytest.fixture(scope="module")
def two(pool: Pool, base: BaseVersion) -> Iterator[tuple[Branch, Branch]]:
    """Two branches of the session's base: the same role name, different passwords."""
    a = branch.create(pool, "door-a", base_name=base.name)
    try:
        b = branch.create(pool, "door-b", base_name=base.name)
        try:
            assert a.user == b.user and a.password != b.password
            yield a, b
        finally:
            branch.destroy(pool, "door-b")
    finally:
        branch.destroy(pool, "door-a")


class Audit:
    def __init__(self) -> None:
        self.lines: list[dict[str, object]] = []

    def __call__(self, event: str, **fields: object) -> None:
        self.lines.append({"event": event, **fields})


@pytest.fixture
def audit() -> Audit:
    return Audit()


@pytest.fixture
def door(pool: Pool, ca: DoorCA, audit: Audit) -> Door:
    """A door on loopback (``door(**settings)``), routing through the pool's registry, read
    afresh at every connection as the engine would answer."""

    @contextmanager
    def make(clock: Callable[[], float] | None = None, **changes: Any) -> Iterator[FrontDoor]:
        settings = pool.settings.replace(
            **{"door_sni_suffix": SNI_SUFFIX, "door_handshake_timeout": 10.0, **changes}
        )

        async def resolve(name: str, *, may_wake: Callable[[], bool]) -> Route | None:
            # Opened and closed here, on the door's thread (SQLite's objects stay on theirs;
            # one left open would keep the pool from unmounting).
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
            return FrontDoor(
                settings, ssl_context=context, resolve=resolve, audit=audit, clock=clock
            )

        with running(build, host=changes.get("door_address", "127.0.0.1")) as made:
            yield made

    return make


def connect(
    port: int, ca: DoorCA, b: Branch, *, dbname: str | None = None, **extra: Any
) -> psycopg.Connection[Any]:
    params: dict[str, Any] = {
        "host": "localhost",
        "port": port,
        "dbname": b.name if dbname is None else dbname,
        "user": b.user,
        "password": b.password,
        "sslmode": "verify-full",
        "sslrootcert": os.fspath(ca.ca_file),
        "connect_timeout": 10,
        "autocommit": True,
        **extra,
    }
    return psycopg.connect(**params)


def psql(port: int, ca: DoorCA, b: Branch, sql: str, *, password: str | None = None) -> str:
    dsn = (
        f"host=localhost port={port} dbname={b.name} user={b.user} sslmode=verify-full "
        f"sslrootcert={ca.ca_file}"
    )
    env = {
        "PATH": os.environ["PATH"],
        "PGPASSWORD": password or b.password,
        "PGCONNECT_TIMEOUT": "10",
    }
    done = subprocess.run(
        ["psql", dsn, "-XAtc", sql], env=env, capture_output=True, text=True, timeout=60
    )
    return done.stdout.strip() if done.returncode == 0 else "ERROR: " + done.stderr.strip()


# -- routing and logins ------------------------------------------------------------------


def test_psql_reaches_a_branch_by_its_name_on_its_real_database(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch], audit: Audit
) -> None:
    a, _ = two
    with door() as d:
        got = psql(
            d.port, ca, a, "SELECT current_database(), inet_server_port(), count(*) FROM accounts"
        )
        # psql has gone; the door writes the line once it has seen the end of the session.
        wait_for(lambda: bool(audit.lines), timeout=10, what="the audit line")
    assert got == f"{a.database}|{a.port}|200000"
    (line,) = audit.lines
    assert line["event"] == "door.connect" and line["outcome"] == "closed"
    assert (line["user"], line["branch"], line["source"]) == (a.user, "door-a", "127.0.0.1")
    assert isinstance(line["bytes_in"], int) and isinstance(line["bytes_out"], int)
    assert line["bytes_in"] > 100 and line["bytes_out"] > 300
    assert a.password not in repr(audit.lines)


def test_sni_routes_by_the_wildcard_name_whatever_the_database(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch]
) -> None:
    a, b = two
    with (
        door() as d,
        connect(
            d.port, ca, b, dbname="door-a", host=f"door-b.{SNI_SUFFIX}", hostaddr="127.0.0.1"
        ) as conn,
    ):
        assert conn.execute("SELECT inet_server_port()").fetchone() == (b.port,)
    with (
        door(door_sni_suffix=None) as d,
        connect(d.port, ca, a, host=f"door-b.{SNI_SUFFIX}", hostaddr="127.0.0.1") as conn,
    ):  # no suffix set: the database names the branch
        assert conn.execute("SELECT inet_server_port()").fetchone() == (a.port,)


def test_one_branch_password_does_not_open_the_other(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch]
) -> None:
    a, b = two
    with door() as d:
        assert psql(d.port, ca, a, "SELECT 1") == "1"
        refused = psql(d.port, ca, b, "SELECT 1", password=a.password)
    assert f'password authentication failed for user "{b.user}"' in refused


def test_an_unknown_branch_answers_exactly_as_a_wrong_password(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch], audit: Audit
) -> None:
    a, _ = two
    with door() as d:
        for _ in range(3):  # real logins first: the imitation waits as they took
            with connect(d.port, ca, a):
                pass
        real = [failed_scram(d.port, ca.ca_file, database="door-a", user=a.user) for _ in range(3)]
        fake = [failed_scram(d.port, ca.ca_file, database="no-such", user=a.user) for _ in range(3)]
        bad = failed_scram(d.port, ca.ca_file, database="Not A Name!", user=a.user)
        other_role = failed_scram(d.port, ca.ca_file, database="door-a", user="postgres")
        with pytest.raises(psycopg.OperationalError) as unknown:
            connect(d.port, ca, a, dbname="no-such-branch")
        with pytest.raises(psycopg.OperationalError) as wrong:
            connect(d.port, ca, a, password="wrong")
    assert str(unknown.value) == str(wrong.value)
    assert {x.shape for x in real} == {fake[0].shape} == {x.shape for x in fake} == {bad.shape}
    assert other_role.shape[:-1] == real[0].shape[:-1]
    assert other_role.verdict == real[0].verdict.replace(
        f'"{a.user}"'.encode(), b'"postgres"'
    ).replace(
        struct.pack("!I", 4 + len(real[0].verdict) - 5),
        struct.pack("!I", len(other_role.verdict) - 1),
    )
    # A role's salt is the same at every attempt, on a real branch and an imagined one alike.
    assert len({x.salt for x in real}) == 1 and len({x.salt for x in fake}) == 1
    # The same round trips, each answered after a wait of a real branch's order.
    for r, f in zip(real, fake, strict=True):
        assert len(r.waits) == len(f.waits) == 3
    assert min(f.waits[0] for f in fake) > 0.3 * min(r.waits[0] for r in real)
    outcomes = [line["outcome"] for line in audit.lines]
    assert outcomes.count("auth_failed") == 5 and outcomes.count("unknown_branch") == 5


# -- refusals ----------------------------------------------------------------------------


def test_plaintext_is_refused_unless_allowed_and_from_loopback(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch]
) -> None:
    a, _ = two
    with door() as d, pytest.raises(psycopg.OperationalError, match="sslmode=require"):
        connect(d.port, ca, a, sslmode="disable")
    with door(door_plaintext_loopback=True) as d, connect(d.port, ca, a, sslmode="disable") as c:
        assert c.execute("SELECT inet_server_port()").fetchone() == (a.port,)
        assert c.info.pgconn.ssl_in_use is False
    # An address of this host other than loopback (the host's end of a veth pair), which a
    # connection to it comes from too.
    with (
        Machine() as machine,
        door(door_plaintext_loopback=True, door_address="0.0.0.0") as d,
        pytest.raises(psycopg.OperationalError, match="sslmode=require"),
    ):
        connect(d.port, ca, a, sslmode="disable", host=machine.host)


def test_a_slow_handshake_is_cut_at_the_deadline(door: Door, ca: DoorCA, audit: Audit) -> None:
    with door(door_handshake_timeout=1.0) as d:
        with socket.create_connection(("127.0.0.1", d.port), timeout=10) as silent:
            started = time.monotonic()
            said = silent.recv(1000)
            assert silent.recv(1000) == b""
            took = time.monotonic() - started
        with tls_socket(d.port, ca.ca_file) as slow:
            slow.sendall(startup(user="x", database="door-a")[:6])  # and no more
            error = read_message(slow)
    assert said[:1] == b"E" and b"door_handshake_timeout" in said
    assert b"door_handshake_timeout" in error
    assert took < 8
    assert [line["outcome"] for line in audit.lines] == ["timeout", "timeout"]


def test_an_oversized_startup_packet_is_refused(door: Door, ca: DoorCA) -> None:
    with door() as d, tls_socket(d.port, ca.ca_file) as sock:
        sock.sendall(struct.pack("!II", 10_001, 3 << 16) + b"x" * 100)
        error = read_message(sock)
    assert error[:1] == b"E" and b"invalid length of startup packet: 10001" in error


def test_gssapi_encryption_is_declined_and_tls_follows(door: Door, ca: DoorCA) -> None:
    with door() as d, socket.create_connection(("127.0.0.1", d.port), timeout=10) as raw:
        raw.sendall(struct.pack("!II", 8, 80877104))
        assert raw.recv(1) == b"N"
        raw.sendall(struct.pack("!II", 8, 80877103))
        assert raw.recv(1) == b"S"
        context = ssl.create_default_context(cafile=os.fspath(ca.ca_file))
        with context.wrap_socket(raw, server_hostname="localhost") as sock:
            assert sock.version() in ("TLSv1.2", "TLSv1.3")


def test_plaintext_sent_after_the_ssl_request_is_refused(door: Door, audit: Audit) -> None:
    """The buffer-stuffing attack (CVE-2021-23214): bytes sent before TLS begins must not be
    read as if they came through it."""
    with door() as d, socket.create_connection(("127.0.0.1", d.port), timeout=10) as raw:
        raw.sendall(struct.pack("!II", 8, 80877103) + startup(user="x", database="door-a"))
        answer = raw.recv(1000)
    assert answer[:1] == b"E" and b"unencrypted data after SSL request" in answer
    assert [line["outcome"] for line in audit.lines] == ["refused:protocol"]


def test_a_client_opening_with_tls_directly_is_closed(door: Door, audit: Audit) -> None:
    with door() as d, socket.create_connection(("127.0.0.1", d.port), timeout=10) as raw:
        raw.sendall(b"\x16\x03\x01\x00\x05hello")
        assert raw.recv(1000) == b""
    assert [line["outcome"] for line in audit.lines] == ["refused:direct_tls"]


def test_a_newer_protocol_minor_is_negotiated_down_to_3_0(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch]
) -> None:
    a, _ = two
    body = struct.pack("!I", 3 << 16 | 2) + b"".join(
        k + b"\0" + v + b"\0"
        for k, v in ((b"user", a.user.encode()), (b"database", a.name.encode()), (b"_pq_.x", b"1"))
    )
    packet = struct.pack("!I", 5 + len(body)) + body + b"\0"
    with door() as d, tls_socket(d.port, ca.ca_file) as sock:
        sock.sendall(packet)
        negotiated = read_message(sock)
        sasl = read_message(sock)
    assert negotiated == b"v" + struct.pack("!III", 4 + 8 + 7, 3 << 16, 1) + b"_pq_.x\0"
    assert sasl[:1] == b"R" and b"SCRAM-SHA-256" in sasl


def test_an_unknown_cancel_key_is_dropped_and_counts_as_a_failure(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch], audit: Audit
) -> None:
    a, _ = two
    with door(door_failed_logins=2) as d:
        for _ in range(2):
            with socket.create_connection(("127.0.0.1", d.port), timeout=10) as raw:
                raw.sendall(struct.pack("!IIII", 16, 80877102, 1234, 5678))
                assert raw.recv(1000) == b""
        with pytest.raises(psycopg.OperationalError, match="too many failed logins"):
            connect(d.port, ca, a)
    assert [line["outcome"] for line in audit.lines][:2] == ["cancel_unknown"] * 2


def test_old_tls_versions_are_refused(door: Door, ca: DoorCA) -> None:
    with door() as d:
        for version in (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1):
            raw = socket.create_connection(("127.0.0.1", d.port), timeout=10)
            raw.sendall(struct.pack("!II", 8, 80877103))
            assert raw.recv(1) == b"S"
            old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            old.load_verify_locations(ca.ca_file)
            old.set_ciphers("DEFAULT:@SECLEVEL=0")
            with warnings.catch_warnings():  # the point: versions Python deprecates
                warnings.simplefilter("ignore", DeprecationWarning)
                old.minimum_version = version
                old.maximum_version = version
            with pytest.raises((ssl.SSLError, ConnectionError)):
                old.wrap_socket(raw, server_hostname="localhost")
            raw.close()
        with tls_socket(d.port, ca.ca_file) as fine:
            assert fine.version() in ("TLSv1.2", "TLSv1.3")


def test_connections_per_source_are_capped(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch]
) -> None:
    a, b = two
    with (
        door(door_max_per_source=2) as d,
        connect(d.port, ca, a),
        connect(d.port, ca, b),
        pytest.raises(psycopg.OperationalError, match="door_max_per_source = 2"),
    ):
        connect(d.port, ca, a)


def test_connections_per_branch_are_capped_after_login(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch], audit: Audit
) -> None:
    a, b = two
    with door(door_max_per_branch=1) as d, connect(d.port, ca, a):
        with pytest.raises(psycopg.OperationalError, match="door_max_per_branch = 1"):
            connect(d.port, ca, a)
        with connect(d.port, ca, b) as other:  # another branch has its own count
            other.execute("SELECT 1")
        # An anonymous client learns nothing from the cap: its wrong password fails as ever.
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            connect(d.port, ca, a, password="wrong")
    assert "refused:branch_cap" in [line["outcome"] for line in audit.lines]


def test_a_source_failing_too_many_logins_is_refused_until_the_window_passes(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch]
) -> None:
    a, _ = two
    now = [1000.0]
    with door(clock=lambda: now[0], door_failed_logins=3, door_failed_window=60.0) as d:
        for dbname in ("door-a", "no-such", "door-a"):  # unknown branches count too
            with pytest.raises(psycopg.OperationalError, match="password authentication"):
                connect(d.port, ca, a, dbname=dbname, password="guess")
        with pytest.raises(psycopg.OperationalError, match="too many failed logins"):
            connect(d.port, ca, a)  # the right password, refused all the same
        now[0] += 61
        with connect(d.port, ca, a) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)


# -- sessions ----------------------------------------------------------------------------


def test_a_query_is_cancelled_through_the_door(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch], audit: Audit
) -> None:
    """psycopg's cancel (libpq 17+: a CancelRequest inside TLS), then psql's ^C (libpq 15: in
    plaintext, which the door takes for a cancel even when it refuses plaintext logins). The
    door runs in this process: psycopg's ``cancel()`` would block it, holding the GIL, so the
    test uses ``cancel_safe()``, which waits without it."""
    a, _ = two
    with door() as d:
        with connect(d.port, ca, a) as conn:
            timer = threading.Timer(0.5, conn.cancel_safe, kwargs={"timeout": 10})
            timer.start()
            started = time.monotonic()
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute("SELECT pg_sleep(30)")
            timer.join()
            assert time.monotonic() - started < 10
            assert conn.execute("SELECT 1").fetchone() == (1,)
        dsn = (
            f"host=localhost port={d.port} dbname={a.name} user={a.user} "
            f"sslmode=verify-full sslrootcert={ca.ca_file}"
        )
        env = {"PATH": os.environ["PATH"], "PGPASSWORD": a.password}
        child = subprocess.Popen(
            ["psql", dsn, "-XAtc", "SELECT 'slept' FROM pg_sleep(30)"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: _sleeping(a), timeout=10, what="psql's query to run")
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=10)
        finally:
            child.kill()
            child.wait()
    assert "canceling statement due to user request" in err and "slept" not in out
    assert [line["outcome"] for line in audit.lines].count("cancel") == 2


def _sleeping(b: Branch) -> bool:
    """Whether a session of ``b`` runs the test's pg_sleep now (asked directly)."""
    with psycopg.connect(
        host="127.0.0.1", port=b.port, user=b.user, password=b.password, dbname=b.database
    ) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%FROM pg_sleep(30)' "
            "AND pid <> pg_backend_pid()"
        ).fetchone()
        return bool(row and row[0])


def test_a_destroyed_branch_is_unreachable_within_seconds(
    pool: Pool, base: BaseVersion, door: Door, ca: DoorCA
) -> None:
    gone = branch.create(pool, "door-gone", base_name=base.name)
    try:
        with door() as d:
            with connect(d.port, ca, gone) as conn:
                conn.execute("SELECT 1")
            branch.destroy(pool, "door-gone")
            destroyed = time.monotonic()

            def refused() -> bool:
                try:
                    connect(d.port, ca, gone).close()
                except psycopg.OperationalError as exc:
                    return "password authentication failed" in str(exc)
                return False

            wait_for(refused, timeout=5, what="the destroyed branch to be refused")
            assert time.monotonic() - destroyed < 5
    finally:
        branch.destroy(pool, "door-gone")


def test_close_ends_sessions_in_progress(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch]
) -> None:
    a, _ = two
    with door() as d:
        conn = connect(d.port, ca, a)
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")
    conn.close()


JAVA = """
import java.sql.*;
import java.util.Properties;
public class DoorCheck {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.setProperty("user", args[1]);
        p.setProperty("password", System.getenv("PGPASSWORD"));
        p.setProperty("sslmode", "verify-full");
        p.setProperty("sslrootcert", args[2]);
        try (Connection c = DriverManager.getConnection(args[0], p);
             ResultSet r = c.createStatement().executeQuery(
                 "SELECT current_database() || '|' || inet_server_port()")) {
            r.next();
            System.out.println(r.getString(1));
        }
    }
}
"""
JDBC_JAR = Path("/usr/share/java/postgresql.jar")


def test_pgjdbc_logs_in_through_the_door(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch], tmp_path: Path
) -> None:
    if shutil.which("javac") is None or not JDBC_JAR.exists():
        pytest.fail(
            "needs javac and Debian's pgJDBC: install default-jdk-headless and "
            "libpostgresql-jdbc-java (scripts/test.sh does)"
        )
    a, _ = two
    (tmp_path / "DoorCheck.java").write_text(JAVA)
    subprocess.run(["javac", "DoorCheck.java"], cwd=tmp_path, check=True, timeout=120)
    with door() as d:
        done = subprocess.run(
            [
                "java",
                "-cp",
                f"{tmp_path}:{JDBC_JAR}",
                "DoorCheck",
                f"jdbc:postgresql://localhost:{d.port}/{a.name}",
                a.user,
                os.fspath(ca.ca_file),
            ],
            env={"PATH": os.environ["PATH"], "PGPASSWORD": a.password},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{a.database}|{a.port}"


def test_a_self_signed_pair_names_the_host_and_keeps_its_key_private(tmp_path: Path) -> None:
    pair = tls.self_signed(tmp_path, host="db.example.test", uid=0, gid=0)
    assert os.stat(pair.key).st_mode & 0o777 == 0o600
    first = tls.fingerprint(pair.cert)
    assert len(first) == 95 and first.count(":") == 31
    assert tls.self_signed(tmp_path, host="db.example.test", uid=0, gid=0) == pair
    assert tls.fingerprint(pair.cert) == first  # kept, not made again
    tls.self_signed(tmp_path, host="192.0.2.7", uid=0, gid=0)
    assert tls.fingerprint(pair.cert) != first  # another host: a new pair
    context = tls.server_context(pair)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_a_branch_takes_the_doors_whole_cap_and_the_next_client_is_told_by_the_door(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch], audit: Audit
) -> None:
    """With the defaults the door takes 50 connections to a branch (docs/access.md), and the
    branch has room for all of them and still for the engine's and the job's own: the 51st
    client is refused by the door, saying so, not by Postgres's 'remaining connection slots
    are reserved'."""
    a, _ = two
    cap = 50
    with door(door_max_per_source=cap + 5) as d, contextlib.ExitStack() as held:
        for _ in range(cap):
            conn = held.enter_context(connect(d.port, ca, a))
            assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(psycopg.OperationalError) as refused:
            connect(d.port, ca, a)
        assert "too many connections to branch door-a through the front door" in str(refused.value)
        assert "reserved" not in str(refused.value)
        # The engine's and the job's own share is still there, beside the door's.
        for _ in range(10):
            direct = held.enter_context(
                psycopg.connect(
                    host="127.0.0.1",
                    port=a.port,
                    dbname=a.database,
                    user=a.user,
                    password=a.password,
                    connect_timeout=10,
                )
            )
            assert direct.execute("SELECT 1").fetchone() == (1,)
    assert "refused:branch_cap" in [line["outcome"] for line in audit.lines]


# -- caps, declared once and counted in slots ---------------------------------------------


def test_a_connections_slots_are_given_back_all_at_once_and_once() -> None:
    slots = Slots()
    first, second = slots.taker(), slots.taker()
    assert first.take("source", "192.0.2.1") == 1
    assert second.take("source", "192.0.2.1") == 2
    assert first.take("branch", "a") == 1 and first.count("branch") == 1
    assert second.count("branch") == 0  # holds none of that kind
    with pytest.raises(ValueError, match="one source slot at most"):
        first.take("source", "192.0.2.1")
    first.release()
    first.release()  # a second release gives back nothing more
    assert slots.held("source", "192.0.2.1") == 1 and slots.held("branch", "a") == 0
    second.release()
    assert slots.total() == 0


def test_the_router_counts_connections_by_its_declared_caps_alone() -> None:
    """The structural rule: no count by hand in the router (no ``+=``/``-=`` anywhere in it),
    and every cap it declares is taken (the source cap at the accept, the others after the
    login)."""
    tree = ast.parse(inspect.getsource(routermod))
    by_hand = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.AugAssign)]
    assert by_hand == [], f"router.py counts by hand at lines {by_hand}: declare a Cap"
    declared = [v for v in vars(routermod).values() if isinstance(v, routermod.Cap)]
    assert len({cap.kind for cap in declared}) == len(declared)  # one cap per kind
    assert set(declared) == {routermod.PER_SOURCE, *routermod.AFTER_LOGIN}


def test_a_cap_declared_in_one_line_is_enforced_and_its_slots_given_back(
    door: Door,
    ca: DoorCA,
    two: tuple[Branch, Branch],
    audit: Audit,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cap per login (a role on a branch) as the one declaration it takes: the second
    session of a login is refused, another branch's login is not, and the slot comes back
    when the first session ends; every connection, refused or not, gives its slots back."""
    a, b = two
    per_login = routermod.Cap(
        kind="login",
        limit=lambda s: 1,
        key=lambda r: f"{r.branch} {r.user}",
        outcome="refused:login_cap",
        refusal="too many sessions of {key} (the cap is {limit})",
    )
    monkeypatch.setattr(routermod, "AFTER_LOGIN", (*routermod.AFTER_LOGIN, per_login))
    with door(door_max_per_source=2) as d:
        with connect(d.port, ca, a) as first:
            with pytest.raises(psycopg.OperationalError, match=f"too many sessions of {a.name}"):
                connect(d.port, ca, a)
            with connect(d.port, ca, b) as other:
                assert other.execute("SELECT 1").fetchone() == (1,)
            first.execute("SELECT 1")
        with connect(d.port, ca, a) as again:  # the slot came back with the first session
            assert again.execute("SELECT 1").fetchone() == (1,)
        # Refused by the source cap, and a flood closed unanswered: their slots come back too.
        held = [tls_socket(d.port, ca.ca_file) for _ in range(4)]
        try:
            held[2].sendall(startup(user=a.user, database=a.name))
            assert b"door_max_per_source = 2" in read_message(held[2])
            held.append(tls_socket(d.port, ca.ca_file))  # the door closed the refused one
            with socket.create_connection(("127.0.0.1", d.port), timeout=10) as flood:
                flood.sendall(struct.pack("!II", 8, 80877103))
                assert flood.recv(1) == b""  # the fifth: closed unanswered
        finally:
            for sock in held:
                sock.close()
        wait_for(lambda: d.guard.slots.total() == 0, timeout=10, what="every slot given back")
    outcomes = [line["outcome"] for line in audit.lines]
    for outcome in ("refused:login_cap", "refused:source_cap", "refused:flood"):
        assert outcome in outcomes


# -- what a login costs the client ---------------------------------------------------------


def test_the_end_of_a_login_reaches_the_client_in_one_tls_record(
    door: Door, ca: DoorCA, two: tuple[Branch, Branch]
) -> None:
    """After the client's last SCRAM message, the branch's answers (SASL final,
    AuthenticationOk, its ParameterStatus, BackendKeyData, ReadyForQuery) leave the door in one
    write: one TLS record, not one a message (each a system call and a wake-up of a client that
    waits for the ReadyForQuery anyway)."""
    a, _ = two
    with door() as d:
        login = RecordCountingLogin(d.port, ca.ca_file)
        try:
            login.scram(user=a.user, database=a.name, password=a.password)
            kinds = login.until_ready()
        finally:
            login.close()
    assert kinds[:2] == [b"R", b"R"] and b"S" in kinds and kinds[-2:] == [b"K", b"Z"], kinds
    assert login.records_after_final == 1, login.records_after_final


class RecordCountingLogin:
    """A SCRAM-SHA-256 login over TLS, read record by record (``ssl.MemoryBIO``), so the test
    sees how the door cut what it sent into TLS records."""

    def __init__(self, port: int, ca_file: Path) -> None:
        self.raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.raw.sendall(struct.pack("!II", 8, 80877103))
        assert self.raw.recv(1) == b"S"
        context = ssl.create_default_context(cafile=os.fspath(ca_file))
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self._in, self._out, server_hostname="localhost")
        self._plain = bytearray()
        self.records_after_final = 0
        self._counting = False
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._send_pending()
                self._read_record()
        self._send_pending()

    def _send_pending(self) -> None:
        if data := self._out.read():
            self.raw.sendall(data)

    def _read_record(self) -> None:
        header = recv_exactly(self.raw, 5)
        (length,) = struct.unpack("!H", header[3:])
        self._in.write(header + recv_exactly(self.raw, length))
        if self._counting:
            self.records_after_final += 1

    def send(self, data: bytes) -> None:
        self.tls.write(data)
        self._send_pending()

    def message(self) -> tuple[bytes, bytes]:
        while True:
            if len(self._plain) >= 5:
                (length,) = struct.unpack("!I", self._plain[1:5])
                if len(self._plain) >= 1 + length:
                    kind, body = bytes(self._plain[:1]), bytes(self._plain[5 : 1 + length])
                    del self._plain[: 1 + length]
                    return kind, body
            try:
                self._plain += self.tls.read(1 << 16)
            except ssl.SSLWantReadError:
                self._read_record()

    def scram(self, *, user: str, database: str, password: str) -> None:
        self.send(startup(user=user, database=database))
        kind, body = self.message()
        assert kind == b"R" and struct.unpack("!I", body[:4])[0] == 10, (kind, body)
        nonce = base64.b64encode(os.urandom(18)).decode()
        bare = f"n=,r={nonce}"
        first = f"n,,{bare}".encode()
        mechanism = b"SCRAM-SHA-256\0" + struct.pack("!I", len(first)) + first
        self.send(message(b"p", mechanism))
        kind, body = self.message()
        assert kind == b"R" and struct.unpack("!I", body[:4])[0] == 11, (kind, body)
        server_first = body[4:].decode()
        fields = dict(item.split("=", 1) for item in server_first.split(","))
        salted = hashlib.pbkdf2_hmac(
            "sha256", password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
        )
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        without_proof = f"c=biws,r={fields['r']}"
        said = f"{bare},{server_first},{without_proof}".encode()
        signature = hmac.digest(hashlib.sha256(client_key).digest(), said, "sha256")
        proof = bytes(x ^ y for x, y in zip(client_key, signature, strict=True))
        self._counting = True
        self.send(message(b"p", f"{without_proof},p={base64.b64encode(proof).decode()}".encode()))

    def until_ready(self) -> list[bytes]:
        kinds: list[bytes] = []
        while not kinds or kinds[-1] != b"Z":
            kind, _ = self.message()
            kinds.append(kind)
        return kinds

    def close(self) -> None:
        self.raw.close()
