#!/usr/bin/env python3
"""Front-door benchmark: the door that ships beside PgBouncer and a direct connection.

    sudo .venv/bin/python bench/frontdoor.py [--rounds 3] [--seconds 10] [--work DIR]
        [--profile DIR]

Builds a small throwaway source, seeds one base into a pool of its own, creates one branch and
fills it with `pgbench -i -s 10`. Then it starts the pool as `pool init` does: the engine
service, and `pgoverlay door` as a process of its own (its self-signed certificate for
localhost, which the clients verify: `sslmode=verify-full`), which asks the engine about the
branch on every connection. The login is a reviewer's, made by `pgoverlay access grant BRANCH
--github-login LOGIN` as an admin runs it, and every way logs in with it (SCRAM):

- **direct**: the branch's own port, plain TCP;
- **door**: the door's Postgres port, TLS;
- **PgBouncer** (Debian's package, the proven proxy) in front of the same branch, in session
  mode (the mode a reviewer's session needs: SET, temporary tables, prepared statements and
  LISTEN last as long as the client's connection): the door's certificate and key to its
  clients (`client_tls_sslmode=require`, the clients verifying it the same way), plaintext to
  the branch on loopback as the door's, SCRAM checked against the reviewer role's verifier
  (read from the branch's catalog as the engine, written to its auth_file: the password is in
  no file and no argument list), one process as the pool's OS user.

In every round the ways take turns, the first rotating from round to round, and each runs:
single `SELECT 1` on one psycopg connection (p50 and p99 after a warm-up), `pgbench -S -c 1
-j 1`, `pgbench -S -c 4 -j 2` (tps), and connection set-ups (connect, TLS, SCRAM login,
`SELECT 1`, close; p50). The pgbench runs and the set-ups are cut in ``SLICES`` slices
(SECONDS in all for each pgbench), the ways taking turns slice by slice: on a shared machine
whose load swings within seconds, each way then meets the same load. Cells are medians over
the rounds. The targets (issue 37): the door's pgbench tps at least 0.95x PgBouncer's at -c 1
and -c 4, its added p50 latency over direct at most PgBouncer's + 0.01 ms, its set-up at most
5 ms over direct.

`--profile DIR` then runs one more `pgbench -S -c 1` through the door under `py-spy record
--native` (the door's process, its CPU samples, collapsed stacks kept in DIR) and reports where
its CPU goes.
The Markdown section replaces the one between the front door's markers in docs/benchmarks.md.
A measurement script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from common import build_source, dismantle, machine_rows, small_app, start
from engine_report import load_note, write_report
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgoverlay.runner import branch, proc, safefs, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.branch import access
from pgoverlay.runner.door import tls
from pgoverlay.runner.door.reach import answering
from pgoverlay.runner.pool.registry import Branch
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.service import serve
from pgoverlay.runner.settings import Settings

START, END = "<!-- frontdoor:start -->", "<!-- frontdoor:end -->"
BASE = "door-bench"
BRANCH = "door-bench"
REVIEWER = "bench-reviewer"
PORTS = (56450, 56499)
DOOR_PORT, DOOR_HTTPS_PORT = 56440, 56441
WAYS = {
    "direct": "direct to the branch's port (plain TCP)",
    "door": "`pgoverlay door` (TLS, asks the engine about each branch)",
    "bouncer": "PgBouncer, TLS, SCRAM, pool_mode=session",
}
QUERIES, WARM_UP, SETUPS = 5000, 500, 60
SLICES = 5  # each pgbench run and the set-ups, cut in turns of the ways (see the module)
HEADER = (
    "| way | query p50 | query p99 | pgbench -S -c 1 tps | -c 4 tps | set-up p50 | added p50 "
    "| added set-up | proxy's CPU under -c 4 |\n|---|---|---|---|---|---|---|---|---|"
)
SHARED = "the machine is shared, and other work ran alongside"
# The targets of issue 37, against PgBouncer measured in the same run.
TPS_VS_BOUNCER, LATENCY_OVER_BOUNCER_MS, SETUP_OVER_DIRECT_MS = 0.95, 0.01, 5.0


def now() -> float:
    return time.perf_counter()


def proc_cpu(pid: int) -> float:
    """A process's CPU seconds so far (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Door:
    """`pgoverlay door` as a child process with the pool's settings (as `pool init` starts it
    without systemd), until ``stop``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.log = open(settings.home / "door.log", "ab")  # noqa: SIM115 - closed by stop
        self.child = subprocess.Popen(
            [sys.executable, "-P", "-m", "pgoverlay", "door"],
            env={**os.environ, **serve.settings_environ(settings)},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
        deadline = time.monotonic() + 60
        while not answering(settings):
            if self.child.poll() is not None or time.monotonic() > deadline:
                self.stop()
                said = (settings.home / "door.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"the front door did not start; its log ends: {said}")
            time.sleep(0.2)
        self.ca = settings.home / "door" / tls.CERT_NAME
        self.port = DOOR_PORT

    def cpu(self) -> float:
        return proc_cpu(self.child.pid)

    def stop(self) -> None:
        if self.child.poll() is None:
            self.child.terminate()
            self.child.wait(timeout=30)
        self.log.close()


# -- the reviewer's login -------------------------------------------------------------------


class Reviewer:
    """A reviewer's credential, made by `pgoverlay access grant` as an admin runs it: the
    connection string it prints once (the password only ever in this process's memory and
    the clients' environment)."""

    def __init__(self, settings: Settings) -> None:
        done = subprocess.run(
            [sys.executable, "-P", "-m", "pgoverlay", "access", "grant", BRANCH,
             "--github-login", REVIEWER],
            env={**os.environ, **serve.settings_environ(settings)},
            capture_output=True, text=True, timeout=120, cwd="/",
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"access grant failed: {done.stderr.strip()}")
        # The connection string is the line that is one (a note may follow it).
        said = done.stdout.strip().splitlines()
        url = next((line.strip() for line in said if line.strip().startswith("postgres")), "")
        if not url:
            raise RuntimeError("access grant printed no connection string")
        found = conninfo_to_dict(url)
        self.user, self.password = str(found["user"]), str(found["password"])
        self.url_params = {k: v for k, v in found.items() if k != "password"}


def bouncer_version() -> str:
    """PgBouncer's version (its first line's last word), or a SystemExit saying how to get it."""
    if shutil.which("pgbouncer") is None:
        raise SystemExit(
            "pgbouncer is not on PATH: the benchmark measures PgBouncer beside the door; "
            "install it (apt-get install pgbouncer; the Debian package's service need not run) "
            "and run this again"
        )
    done = subprocess.run(["pgbouncer", "--version"], capture_output=True, text=True, timeout=30)
    return done.stdout.split("\n", 1)[0].split()[-1] if done.returncode == 0 else "unknown"


def free_port() -> int:
    """A loopback TCP port nobody listens on now (PgBouncer cannot be told to take port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scram_verifier(pool: poolmod.Pool, b: Branch, role: str) -> str:
    """The SCRAM verifier of ``role`` in the branch, as the engine reads it from the branch's
    catalog: what PgBouncer checks a client's proof against, and (its keys being the
    server's) what lets it log in to the branch with the client's own proof."""
    base = pool.registry.base(b.base_name, b.base_version)
    if base is None:
        raise RuntimeError(f"base {b.base_name} v{b.base_version} of {b.name} is not registered")
    with access.engine_connection(pool, b, base) as conn:
        row = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role,))
        found = row.fetchone()
    if found is None or not str(found[0] or "").startswith("SCRAM-SHA-256$"):
        raise RuntimeError(f"the role {role} of {b.name} has no SCRAM verifier to give PgBouncer")
    return str(found[0])


class BouncerChild:
    """PgBouncer in front of ``b``, as the pool's OS user, on a free loopback port.

    Its folder is root's (0755) and each file in it made afresh through safefs: the auth_file
    (the verifier) and the key 0600 and the user's, so PgBouncer can read them and nobody but
    root can swap them. Logs go to a file root opened."""

    def __init__(self, work: Path, pool: poolmod.Pool, b: Branch, *, ca: Path, role: str) -> None:
        owner, root = pool.owner, work / "bouncer"
        safefs.make_dir(root, uid=0, gid=0, mode=0o755, exist_ok=True)
        pair = ca, ca.with_name(tls.KEY_NAME)
        cert, key, users = root / "client.crt", root / "client.key", root / "userlist.txt"
        safefs.write_new(cert, pair[0].read_text(), uid=owner.uid, gid=owner.gid, mode=0o644)
        key_pem = safefs.read_regular(pair[1], limit=65536, what="the door's key").decode()
        safefs.write_new(key, key_pem, uid=owner.uid, gid=owner.gid, mode=0o600)
        line = f'"{role}" "{scram_verifier(pool, b, role)}"\n'
        safefs.write_new(users, line, uid=owner.uid, gid=owner.gid, mode=0o600)
        self.port = free_port()
        ini = root / "pgbouncer.ini"
        safefs.write_new(
            ini,
            f"""[databases]
{BRANCH} = host=127.0.0.1 port={b.port} dbname={b.database}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {users}
pool_mode = session
max_client_conn = 200
default_pool_size = 20
client_tls_sslmode = require
client_tls_cert_file = {cert}
client_tls_key_file = {key}
server_tls_sslmode = disable
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
""",
            uid=0,
            gid=0,
            mode=0o644,
        )
        self.log = root / "pgbouncer.log"
        log_fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            self.child = subprocess.Popen(
                ["pgbouncer", os.fspath(ini)],
                env=proc.child_env(user=owner),
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                user=owner.uid,
                group=owner.gid,
                extra_groups=[],
            )
        finally:
            os.close(log_fd)
        deadline = time.monotonic() + 15
        while True:
            if self.child.poll() is not None:
                raise RuntimeError(f"pgbouncer exited at its start: {self.log.read_text()[-800:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"pgbouncer did not listen in 15 s: {self.log.read_text()[-800:]}"
                )
            time.sleep(0.05)

    def cpu(self) -> float:
        return proc_cpu(self.child.pid)

    def stop(self) -> None:
        self.child.terminate()
        self.child.wait(timeout=30)


# -- the measurements -----------------------------------------------------------------------


def params(way: str, b: Branch, *, door: Door, bouncer_port: int) -> dict[str, Any]:
    if way == "direct":
        return {"host": "127.0.0.1", "port": b.port, "dbname": b.database, "sslmode": "disable"}
    port = door.port if way == "door" else bouncer_port
    return {
        "host": "localhost",
        "port": port,
        "dbname": BRANCH,
        "sslmode": "verify-full",
        "sslrootcert": os.fspath(door.ca),
    }


def connect(conninfo: dict[str, Any], password: str, user: str) -> psycopg.Connection[Any]:
    return psycopg.connect(**conninfo, user=user, password=password, autocommit=True)


def latency(conninfo: dict[str, Any], password: str, user: str) -> tuple[float, float]:
    with connect(conninfo, password, user) as conn:
        cur = conn.cursor()
        times = []
        for i in range(WARM_UP + QUERIES):
            t0 = now()
            cur.execute("SELECT 1")
            cur.fetchone()
            if i >= WARM_UP:
                times.append(now() - t0)
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.99)]


def setup_times(conninfo: dict[str, Any], password: str, user: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        t0 = now()
        with connect(conninfo, password, user) as c:
            c.execute("SELECT 1").fetchone()
        times.append(now() - t0)
    return times


def pgbench(
    conninfo: dict[str, Any],
    password: str,
    user: str,
    seconds: int,
    *,
    clients: int,
) -> float:
    """``pgbench -S`` (simple protocol) with ``clients`` clients on ``min(clients, 2)``
    threads: the machine's two cores."""
    env = {
        "PATH": os.environ["PATH"],
        "PGPASSWORD": password,
        "PGSSLMODE": conninfo["sslmode"],
        **({"PGSSLROOTCERT": conninfo["sslrootcert"]} if "sslrootcert" in conninfo else {}),
    }
    threads = min(clients, 2)
    argv = [
        "pgbench", "-S", "-c", str(clients), "-j", str(threads), "-T", str(seconds), "-n",
        "-h", conninfo["host"], "-p", str(conninfo["port"]), "-U", user, conninfo["dbname"],
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 120)
    found = re.search(r"tps = ([0-9.]+)", done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"pgbench failed: {done.stderr.strip() or done.stdout.strip()}")
    return float(found.group(1))


class Ways:
    """The three ways to the branch, up for the whole run, and the reviewer's login."""

    def __init__(self, work: Path, pool: poolmod.Pool, b: Branch, login: Reviewer) -> None:
        self.login, self.b = login, b
        self.door = Door(pool.settings)
        try:
            self.bouncer = BouncerChild(work, pool, b, ca=self.door.ca, role=login.user)
        except BaseException:
            self.door.stop()
            raise

    def params(self, way: str) -> dict[str, Any]:
        return params(way, self.b, door=self.door, bouncer_port=self.bouncer.port)

    def cpu(self, way: str) -> float:
        return {"door": self.door.cpu, "bouncer": self.bouncer.cpu}.get(way, lambda: 0.0)()

    def measure(self, order: list[str], seconds: int) -> dict[str, dict[str, float]]:
        """One round: each measure taken by the ways in ``order``, the pgbench runs and the
        set-ups slice by slice (``SLICES``)."""
        user, password = self.login.user, self.login.password
        found: dict[str, dict[str, float]] = {way: {} for way in order}
        for way in order:
            found[way]["p50"], found[way]["p99"] = latency(self.params(way), password, user)
        piece = max(1, seconds // SLICES)
        for clients, key in ((1, "tps1"), (4, "tps4")):
            tps: dict[str, list[float]] = {way: [] for way in order}
            cpu = dict.fromkeys(order, 0.0)
            for _ in range(SLICES):
                for way in order:
                    before = self.cpu(way)
                    tps[way].append(
                        pgbench(self.params(way), password, user, piece, clients=clients)
                    )
                    cpu[way] += self.cpu(way) - before
            for way in order:
                found[way][key] = statistics.mean(tps[way])  # slices of one length
                if clients == 4:
                    found[way]["cpu"] = cpu[way] / (piece * SLICES)
        times: dict[str, list[float]] = {way: [] for way in order}
        for _ in range(SLICES):
            for way in order:
                times[way] += setup_times(self.params(way), password, user, SETUPS // SLICES)
        for way in order:
            found[way]["setup"] = statistics.median(times[way])
        return found

    def profile(self, folder: Path, seconds: int) -> Path:
        """One more `pgbench -S -c 1` through the door, its process sampled by py-spy (its CPU
        samples, native frames included: uvloop's and OpenSSL's C; it pauses the door 200 times a
        second to read them, so the figures of that run are not kept); the
        collapsed stacks are kept in ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        out = folder / "door.txt"
        spy = subprocess.Popen(
            [Path(sys.executable).with_name("py-spy"), "record", "--pid", str(self.door.child.pid),
             "--duration", str(seconds), "--rate", "200", "--native",
             "--format", "raw", "-o", out],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        pgbench(self.params("door"), self.login.password, self.login.user, seconds, clients=1)
        _, err = spy.communicate(timeout=seconds + 60)
        if spy.returncode != 0:
            raise RuntimeError(f"py-spy failed: {err.strip()}")
        return out

    def profile_setups(self, folder: Path, seconds: int) -> tuple[Path, int]:
        """Connection set-ups through the door for ``seconds``, its process sampled by py-spy
        (wall clock, idle included, Python frames only, without pausing it): the stacks, and
        how many set-ups ran."""
        out = folder / "door-setup.txt"
        spy = subprocess.Popen(
            [Path(sys.executable).with_name("py-spy"), "record", "--pid", str(self.door.child.pid),
             "--duration", str(seconds), "--rate", str(SETUP_RATE), "--nonblocking", "--idle",
             "--format", "raw", "-o", out],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        info, count = self.params("door"), 0
        while spy.poll() is None:
            with connect(info, self.login.password, self.login.user) as c:
                c.execute("SELECT 1").fetchone()
            count += 1
        if spy.returncode != 0:
            raise RuntimeError(f"py-spy failed: {spy.communicate()[1].strip()}")
        return out, count

    def stop(self) -> None:
        self.bouncer.stop()
        self.door.stop()


# What a sample's innermost frame says it was doing, first match wins: py-spy's native
# frames name the library (libssl.so.3) or the C file (loop.c) or the Python file.
KINDS = (
    ("waiting for the network (epoll)", ("epoll_pwait", "PyThread_acquire_lock")),
    ("system calls: write", ("write (libc",)),
    ("system calls: read", ("read (libc", "recv")),
    ("TLS: OpenSSL and Python's ssl module", ("libssl", "libcrypto", "_ssl.", "(ssl.py)")),
    ("uvloop's C (its loop, transports and SSL protocol)", ("(loop.c)", ".c)", "libuv")),
    ("the door's Python (runner/door)", ("(channel.py)", "(router.py)", "(login.py)")),
)


SETUP_RATE = 500  # py-spy's samples a second during the set-ups
# Where a set-up's time goes in the door, by the frames on a sample's stack, first match wins.
SETUP_PARTS = (
    # From the loop's thread (RemoteEngine.look): the door's work on the request and its
    # answer; its wait for the answer is the loop's wait for events, left out.
    ("asking the engine (its request and answer, not the wait)", ("RemoteEngine",)),
    ("the login (runner/door/login.py)", ("(login.py",)),
    ("the startup and TLS handshake (startup.py, ssl)", ("(startup.py", "(ssl.py", "(sslproto")),
    ("the guard's limits (guard.py)", ("(guard.py",)),
    ("routing and splicing (router.py, channel.py)", ("(router.py", "(channel.py")),
)


def setup_parts(stacks: Path, count: int) -> list[tuple[float, str]]:
    """Milliseconds per set-up the door spent in each of ``SETUP_PARTS`` (a thread's or the
    loop's samples; the loop waiting and the idle threads are left out), largest first."""
    parts = collections.Counter[str]()
    for line in stacks.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        if "RemoteEngine" not in stack and (
            frames[-1].startswith(("Runner.run", "_worker", "Condition.wait", "Event.wait"))
            or "_worker (" in frames[-1]
        ):
            continue  # the loop waiting for events, a thread waiting for work
        part = next((name for name, marks in SETUP_PARTS if any(m in stack for m in marks)), None)
        parts[part or "other (the loop's own work, logging, the audit)"] += int(n)
    per = 1000 / SETUP_RATE / max(count, 1)
    return [(samples * per, name) for name, samples in parts.most_common()]


def where_cpu(stacks: Path) -> tuple[int, list[tuple[float, str]]]:
    """The samples of the door's event loop thread (the one that runs ``cmd_door``; the
    executor's threads only wait for engine lookups here) by what each was doing (``KINDS``),
    and the share of each kind, largest first."""
    total, kinds = 0, collections.Counter[str]()
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or "cmd_door" not in stack:
            continue
        total += int(count)
        leaf = stack.split(";")[-1]
        kind = next((name for name, marks in KINDS if any(m in leaf for m in marks)), "other")
        kinds[kind] += int(count)
    return total, [(n / total, kind) for kind, n in kinds.most_common()] if total else []


# -- the report ------------------------------------------------------------------------------


ROUND_HEADER = (
    "| round | load | -c 1: door / PgBouncer | -c 4: door / PgBouncer | door's set-up over "
    "direct | PgBouncer's |\n|---|---|---|---|---|---|"
)


def render(results: dict[str, list[dict[str, float]]], **ctx: Any) -> str:
    def med(way: str, key: str) -> float:
        return statistics.median(r[key] for r in results[way])

    rows = []
    for way, label in WAYS.items():
        p50, p99, tps1, tps4, setup = (med(way, k) for k in ("p50", "p99", "tps1", "tps4", "setup"))
        if way == "direct":
            extra = ["–"] * 3
        else:
            extra = [
                f"{(p50 - med('direct', 'p50')) * 1000:+.3f} ms",
                f"{(setup - med('direct', 'setup')) * 1000:+.1f} ms",
                f"{med(way, 'cpu') * 100:.0f}%",
            ]
        rows.append(
            f"| {label} | {p50 * 1000:.3f} ms | {p99 * 1000:.3f} ms | {tps1:,.0f} | {tps4:,.0f} | "
            f"{setup * 1000:.1f} ms | {' | '.join(extra)} |"
        )

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    c1 = med("door", "tps1") / med("bouncer", "tps1")
    c4 = med("door", "tps4") / med("bouncer", "tps4")
    added_door = (med("door", "p50") - med("direct", "p50")) * 1000
    added_bouncer = (med("bouncer", "p50") - med("direct", "p50")) * 1000
    setup_over = (med("door", "setup") - med("direct", "setup")) * 1000
    targets = [
        f"| pgbench -S -c 1: door ≥ {TPS_VS_BOUNCER}x PgBouncer | {c1:.2f}x "
        f"({med('door', 'tps1'):,.0f} against {med('bouncer', 'tps1'):,.0f} tps) | "
        f"{verdict(c1 >= TPS_VS_BOUNCER)} |",
        f"| pgbench -S -c 4: door ≥ {TPS_VS_BOUNCER}x PgBouncer | {c4:.2f}x "
        f"({med('door', 'tps4'):,.0f} against {med('bouncer', 'tps4'):,.0f} tps) | "
        f"{verdict(c4 >= TPS_VS_BOUNCER)} |",
        f"| added p50 latency ≤ PgBouncer's + {LATENCY_OVER_BOUNCER_MS} ms | door "
        f"{added_door:+.3f} ms, PgBouncer {added_bouncer:+.3f} ms | "
        f"{verdict(added_door <= added_bouncer + LATENCY_OVER_BOUNCER_MS)} |",
        f"| set-up ≤ direct + {SETUP_OVER_DIRECT_MS:.0f} ms | door {setup_over:+.1f} ms | "
        f"{verdict(setup_over <= SETUP_OVER_DIRECT_MS)} |",
    ]
    load_cell = (
        f"{ctx['load']} (1, 5, 15 min) when the run started, {ctx['end_load']} when it ended; "
        f"{SHARED}"
    )
    by_round = []
    for i, load in enumerate(ctx["round_loads"]):
        door, bouncer, direct = (results[way][i] for way in ("door", "bouncer", "direct"))
        by_round.append(
            f"| {i + 1} | {load:.1f} | {door['tps1'] / bouncer['tps1']:.2f}x | "
            f"{door['tps4'] / bouncer['tps4']:.2f}x | "
            f"{(door['setup'] - direct['setup']) * 1000:+.1f} ms | "
            f"{(bouncer['setup'] - direct['setup']) * 1000:+.1f} ms |"
        )
    profile = ""
    if ctx.get("hot"):
        samples, kinds = ctx["hot"]
        lines = "\n".join(f"| {kind} | {share:.0%} |" for share, kind in kinds)
        setups, parts = ctx["setup_parts"]
        setup_lines = "\n".join(f"| {name} | {ms:.2f} ms |" for ms, name in parts)
        profile = f"""
What the door's process was doing during one more `pgbench -S -c 1` of {ctx["seconds"]} s
(`py-spy record --native`, {samples} samples of its event loop's thread, each counted by its
innermost frame; its tps is not kept, py-spy pauses the door to read its stacks):

| doing | share of samples |
|---|---|
{lines}

Where a connection set-up's time goes in the door ({setups} set-ups in {ctx["seconds"]} s,
`py-spy record --idle`, wall clock, Python frames; the time the loop waits for the network is
left out):

| part | per set-up |
|---|---|
{setup_lines}
"""
    return f"""{START}
## Front door: the door that ships, PgBouncer and a direct connection

Generated by `{ctx["cmd"]}`. One branch of a small base, filled with `pgbench -i -s 10`; the
pool started as `pool init` starts it: the engine service and `pgoverlay door` in a process of
its own, asking the engine about the branch on every connection, its self-signed certificate
verified by the clients (`sslmode=verify-full`). Every way logs in with one reviewer's
credential made by `pgoverlay access grant {BRANCH} --github-login {REVIEWER}` (SCRAM).
PgBouncer {ctx["bouncer"]} (Debian's package) in front of the same branch in
`pool_mode=session` (what a reviewer's session needs: its SET, temporary tables, prepared
statements and LISTEN last as long as its connection), with the door's certificate and key
to its clients (`client_tls_sslmode=require`, verified the same way), plaintext to the branch
on loopback as the door's, SCRAM checked against the reviewer role's verifier in its
`auth_file`, one process as the pool's OS user. In each of {ctx["rounds"]} rounds the ways take
turns (the first rotating): {QUERIES} single `SELECT 1` on one psycopg connection (after
{WARM_UP} unmeasured), `pgbench -S -c 1 -j 1` and `pgbench -S -c 4 -j 2` for {ctx["seconds"]} s
each, and {SETUPS} connection set-ups (connect, TLS, SCRAM login, `SELECT 1`, close), the
pgbench runs and the set-ups cut in {SLICES} slices, the ways taking turns slice by slice (so
each meets the same swings of the machine's load). Cells are medians over the rounds. The
proxy's CPU is the door's or PgBouncer's process's user and system time during `pgbench -c 4`,
as a share of one core. PgBouncer's set-up keeps the server connection in its pool when a
client leaves and hands it to the next login, so its set-ups fork no backend; direct and
through the door each set-up forks one.

{machine_rows(ctx)}
| Load average | {load_cell} |
| Postgres | {ctx["postgres"]} |
| PgBouncer | {ctx["bouncer"]} |

{load_note(float(ctx["load"].split(",")[0])).strip()}

{HEADER}
{chr(10).join(rows)}

| target (issue 37) | measured | verdict |
|---|---|---|
{chr(10).join(targets)}

Round by round (the medians above are of these; the load is the 1-minute average as the round
started):

{ROUND_HEADER}
{chr(10).join(by_round)}
{profile}{END}
"""


def said(argv: list[str]) -> list[str]:
    """The command's options as the report names them: without ``--work`` (a scratch folder of
    this machine's, which changes nothing measured)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--work":
            skip = True
        elif not arg.startswith("--work="):
            kept.append(arg)
    return kept


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Benchmark the front door (root).")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every way")
    parser.add_argument("--seconds", type=int, default=10, help="pgbench's -T")
    parser.add_argument("--work", default="/var/tmp/pgoverlay-bench-frontdoor", help="work dir")
    parser.add_argument("--profile", metavar="DIR", help="profile the door with py-spy, into DIR")
    parser.add_argument("--no-report", action="store_true", help="print, do not write the doc")
    args = parser.parse_args(argv)
    bouncer = bouncer_version()
    work, load = start(args.work)
    settings = Settings(
        home=work / "pool",
        port_min=PORTS[0],
        port_max=PORTS[1],
        runtime="local",
        service_gc_interval=0,
        door_address="127.0.0.1",
        door_host="localhost",
        door_port=DOOR_PORT,
        door_https_port=DOOR_HTTPS_PORT,
        door_max_per_source=100,
        access_unmasked=True,  # the small base is not masked; a reviewer's login needs this
    )
    install = pgbin.newest(settings.pg_bindir)
    owner = proc.OsUser.lookup(settings.os_user)
    started, t_start = dt.datetime.now(dt.UTC), time.monotonic()
    results: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    pool, ways = None, None
    round_loads: list[float] = []  # the 1-minute load average as each round started
    hot: tuple[int, list[tuple[float, str]]] | None = None
    parts: tuple[int, list[tuple[float, str]]] | None = None
    dismantle(settings)  # what an interrupted run left
    try:
        datadir = build_source(work, owner, install, small_app)
        with cluster.running(install, datadir, owner=owner, scratch=work / "tmp") as srv:
            dsn = make_conninfo(
                host=os.fspath(srv.socket_dir), port=srv.port, user="postgres", dbname="app"
            )
            pool = poolmod.init(settings, size="2G")
            seed.seed(pool, BASE, source_dsn=dsn)
        b = branch.create(pool, BRANCH, base_name=BASE)
        init = subprocess.run(
            ["pgbench", "-i", "-s", "10", "-q", "-h", "127.0.0.1", "-p", str(b.port),
             "-U", b.user, b.database],
            env={"PATH": os.environ["PATH"], "PGPASSWORD": b.password},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if init.returncode != 0:
            raise RuntimeError(f"pgbench -i failed: {init.stderr.strip()}")
        serve.start(settings)
        ways = Ways(work, pool, b, Reviewer(settings))
        order = list(WAYS)
        for i in range(args.rounds):
            round_loads.append(os.getloadavg()[0])
            turn = i % len(order)
            measured = ways.measure(order[turn:] + order[:turn], args.seconds)
            for way in order:
                results[way].append(measured[way])
                print(f"round {i + 1}: {way}: {results[way][-1]}", flush=True)
        if args.profile:
            stacks = ways.profile(Path(args.profile).resolve(), args.seconds)
            hot = where_cpu(stacks)
            for share, kind in hot[1]:
                print(f"{share:6.1%}  {kind}", flush=True)
            setup_stacks, setups = ways.profile_setups(Path(args.profile).resolve(), args.seconds)
            parts = (setups, setup_parts(setup_stacks, setups))
            for ms, name in parts[1]:
                print(f"{ms:7.2f} ms per set-up  {name}", flush=True)
        section = render(
            results,
            cmd=" ".join(["python bench/frontdoor.py", *said(argv)]),
            rounds=args.rounds,
            seconds=args.seconds,
            started=started,
            minutes=(time.monotonic() - t_start) / 60,
            load=load,
            round_loads=round_loads,
            end_load=", ".join(f"{x:.2f}" for x in os.getloadavg()),
            postgres=install.version,
            bouncer=bouncer,
            hot=hot,
            setup_parts=parts,
        )
    finally:
        if ways is not None:
            ways.stop()
        serve.stop(settings, wait=30)
        if pool is not None:
            pool.close()
        dismantle(settings)
        shutil.rmtree(work, ignore_errors=True)
    if not args.no_report:
        write_report(section, start=START, end=END)
    sys.stdout.write(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
