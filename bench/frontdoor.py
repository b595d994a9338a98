#!/usr/bin/env python3
"""Front-door benchmark: a branch reached directly, and through the front door, side by side.

    sudo .venv/bin/python bench/frontdoor.py [--rounds 3] [--seconds 10] [--work DIR]

Builds a small throwaway source, seeds one base into a pool of its own, creates one branch and
fills it with `pgbench -i -s 10`. The door runs in a child process of its own (as the service
runs it), with a self-signed certificate for localhost; the clients verify it
(`sslmode=verify-full`). In every round each way takes its turn:

- per-query latency: one psycopg connection running `SELECT 1` (p50 and p99 of single queries
  after a warm-up);
- throughput: `pgbench -S -c 4 -j 2 -T SECONDS` and `pgbench -S -c 1 -j 1 -T SECONDS` (tps);
- connection set-up: connect, log in, run `SELECT 1`, close (p50).

The ways: the branch's own port (plain TCP, as before the door), the door with TLS on uvloop's
loop and on asyncio's own, the door without TLS from loopback (what TLS costs apart), and
PgBouncer (the proven proxy) in front of the same branch, in session mode and in
transaction mode. PgBouncer gets what the door has: the same certificate and key, offered to
clients that verify it (client_tls_sslmode=require; the clients' verify-full), plaintext to the
branch on loopback, SCRAM logins checked against the branch role's verifier (read from the
branch's catalog as the engine, written to its auth_file; the password itself is in no file
and no argument list), one [databases] entry naming the branch. Session mode is the one a
reviewer's session needs (SET, temporary tables, prepared statements, LISTEN live as long as
the client's connection); transaction mode is measured beside it as PgBouncer's fastest mode,
though it would break those. PgBouncer runs as the pool's OS user (it refuses root), one
process, on a free loopback port; it must be on PATH (Debian: apt-get install pgbouncer), the
door itself does not need it. Then the pinned rounds: `pgbench -S -c 4` again for direct, the
door and PgBouncer's session mode, with the branch's server and pgbench on one CPU and the
proxy alone on the other (taskset and sched_setaffinity). Cells are the median over the
rounds. Targets: added p50 latency at most 0.1 ms, pgbench at least 0.9x, set-up overhead at
most 5 ms. The Markdown
section replaces the one between the front door's markers in docs/benchmarks.md. A
measurement script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from common import build_source, dismantle, machine_rows, small_app, start
from engine_report import write_report
from psycopg.conninfo import make_conninfo

from pgoverlay.runner import audit, branch, proc, safefs, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.pool.registry import Branch
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.settings import Settings

START, END = "<!-- frontdoor:start -->", "<!-- frontdoor:end -->"
BASE = "door-bench"
BRANCH = "door-bench"
WAYS = {
    "direct": "direct to the branch's port (plain TCP)",
    "door-uvloop": "through the door, TLS, uvloop",
    "door-asyncio": "through the door, TLS, asyncio's loop",
    "door-plain": "through the door, no TLS (loopback), uvloop",
    "bouncer-session": "PgBouncer, TLS, pool_mode=session",
    "bouncer-transaction": "PgBouncer, TLS, pool_mode=transaction",
}
BOUNCER_MODES = {"bouncer-session": "session", "bouncer-transaction": "transaction"}
QUERIES, WARM_UP, SETUPS = 5000, 500, 60
HEADER = (
    "| way | query p50 | query p99 | pgbench -S -c 4 tps | -c 1 tps | set-up p50 | added p50 "
    "| -c 4 vs direct | -c 1 vs direct | added set-up | proxy's CPU under -c 4 |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def now() -> float:
    return time.perf_counter()


# -- the door's child process ---------------------------------------------------------------


def serve_door(args: argparse.Namespace) -> int:
    """Run a door for one branch until stdin closes; print its port first."""
    from pgoverlay.runner.door import tls
    from pgoverlay.runner.door.router import FrontDoor, Route

    settings = Settings(home=Path(args.home), port_min=56450, port_max=56499, runtime="local")
    settings = settings.replace(door_plaintext_loopback=args.plain, door_max_per_source=100)
    route = Route(host="127.0.0.1", port=args.branch_port, database=args.database)
    log = audit.AuditLog(Path(args.audit), uid=0, gid=0)

    async def resolve(name: str, *, may_wake: Callable[[], bool]) -> Route | None:
        return route if name == BRANCH else None

    async def main() -> None:
        context = tls.server_context(tls.Pair(cert=Path(args.cert), key=Path(args.key)))
        door = FrontDoor(settings, ssl_context=context, resolve=resolve, audit=log.write)
        await door.start(host="127.0.0.1", port=0)
        sys.stdout.write(f"{door.port}\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await door.close()

    if args.loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
    log.close()
    return 0


def proc_cpu(pid: int) -> float:
    """A process's CPU seconds so far (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class DoorChild:
    def __init__(self, work: Path, settings: Settings, b: Branch, way: str) -> None:
        cert, key = work / "door" / "door.crt", work / "door" / "door.key"
        argv = [
            sys.executable,
            os.path.abspath(__file__),
            "--serve-door",
            "--home", os.fspath(settings.home),
            "--branch-port", str(b.port),
            "--database", b.database,
            "--cert", os.fspath(cert),
            "--key", os.fspath(key),
            "--audit", os.fspath(work / "door.jsonl"),
            "--loop", "asyncio" if way == "door-asyncio" else "uvloop",
        ]  # fmt: skip
        if way == "door-plain":
            argv.append("--plain")
        self.child = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.child.stdout is not None
        self.port = int(self.child.stdout.readline())

    def cpu(self) -> float:
        return proc_cpu(self.child.pid)

    def stop(self) -> None:
        assert self.child.stdin is not None
        self.child.stdin.close()
        self.child.wait(timeout=30)


# -- PgBouncer's process --------------------------------------------------------------------


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


def scram_verifier(pool: poolmod.Pool, b: Branch) -> str:
    """The branch role's SCRAM verifier, as the engine reads it from the branch's catalog:
    what PgBouncer checks a client's proof against, and (its keys being the server's) what
    lets it log in to the branch with the client's own proof; no password goes anywhere."""
    base = pool.registry.base(b.base_name, b.base_version)
    if base is None:
        raise RuntimeError(f"base {b.base_name} v{b.base_version} of {b.name} is not registered")
    with branch._engine_connection(pool, b, base) as conn:
        row = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (b.user,))
        found = row.fetchone()
    if found is None or not str(found[0] or "").startswith("SCRAM-SHA-256$"):
        raise RuntimeError(f"the role {b.user} of {b.name} has no SCRAM verifier to give PgBouncer")
    return str(found[0])


class BouncerChild:
    """PgBouncer in front of ``b``, as the pool's OS user, on a free loopback port.

    Its folder is root's (0755) and each file in it made afresh through safefs: the auth_file
    (the verifier) and the key 0600 and the user's, so PgBouncer can read them and nobody but
    root can swap them. Logs go to a file root opened."""

    def __init__(self, work: Path, pool: poolmod.Pool, b: Branch, way: str) -> None:
        owner, root = pool.owner, work / "bouncer"
        safefs.make_dir(root, uid=0, gid=0, mode=0o755, exist_ok=True)
        pair = work / "door" / "door.crt", work / "door" / "door.key"
        cert, key, users = root / "client.crt", root / "client.key", root / "userlist.txt"
        safefs.write_new(cert, pair[0].read_text(), uid=owner.uid, gid=owner.gid, mode=0o644)
        key_pem = safefs.read_regular(pair[1], limit=65536, what="the door's key").decode()
        safefs.write_new(key, key_pem, uid=owner.uid, gid=owner.gid, mode=0o600)
        line = f'"{b.user}" "{scram_verifier(pool, b)}"\n'
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
pool_mode = {BOUNCER_MODES[way]}
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


def params(way: str, b: Branch, port: int, ca: Path) -> dict[str, Any]:
    if way == "direct":
        return {"host": "127.0.0.1", "port": b.port, "dbname": b.database, "sslmode": "disable"}
    common = {"host": "localhost", "port": port, "dbname": BRANCH}
    if way == "door-plain":
        return {**common, "sslmode": "disable"}
    if way == "bouncer-transaction":
        common["prepare"] = False
    return {**common, "sslmode": "verify-full", "sslrootcert": os.fspath(ca)}


def connect(conninfo: dict[str, Any], password: str, user: str) -> psycopg.Connection[Any]:
    """A client connection; in PgBouncer's transaction mode without psycopg's server-side
    prepared statements (the next transaction may run on another server connection, and
    PgBouncer 1.18 does not track them), as psycopg's documentation asks."""
    conninfo = dict(conninfo)
    threshold = 5 if conninfo.pop("prepare", True) else None
    return psycopg.connect(
        **conninfo, user=user, password=password, autocommit=True, prepare_threshold=threshold
    )


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


def setup_time(conninfo: dict[str, Any], password: str, user: str) -> float:
    times = []
    for _ in range(SETUPS):
        t0 = now()
        with connect(conninfo, password, user) as c:
            c.execute("SELECT 1").fetchone()
        times.append(now() - t0)
    return statistics.median(times)


def pgbench(
    conninfo: dict[str, Any],
    password: str,
    user: str,
    seconds: int,
    *,
    clients: int,
    cpus: set[int] | None = None,
) -> float:
    """``pgbench -S`` (simple protocol, which every way and pool mode takes) with ``clients``
    clients on ``min(clients, 2)`` threads: the machine's two cores; with ``cpus``, on those
    CPUs only, in one thread."""
    env = {
        "PATH": os.environ["PATH"],
        "PGPASSWORD": password,
        "PGSSLMODE": conninfo["sslmode"],
        **({"PGSSLROOTCERT": conninfo["sslrootcert"]} if "sslrootcert" in conninfo else {}),
    }
    threads = min(clients, 2) if cpus is None else 1
    argv = [
        "pgbench", "-S", "-c", str(clients), "-j", str(threads), "-T", str(seconds), "-n",
        "-h", conninfo["host"], "-p", str(conninfo["port"]), "-U", user, conninfo["dbname"],
    ]  # fmt: skip
    if cpus is not None:
        argv = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *argv]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 120)
    found = re.search(r"tps = ([0-9.]+)", done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"pgbench failed: {done.stderr.strip() or done.stdout.strip()}")
    return float(found.group(1))


def measure(way: str, work: Path, pool: poolmod.Pool, b: Branch, seconds: int) -> dict[str, float]:
    child: DoorChild | BouncerChild | None = None
    if way in BOUNCER_MODES:
        child = BouncerChild(work, pool, b, way)
    elif way != "direct":
        child = DoorChild(work, pool.settings, b, way)
    try:
        info = params(way, b, child.port if child else 0, work / "door" / "door.crt")
        p50, p99 = latency(info, b.password, b.user)
        cpu = child.cpu() if child else 0.0
        tps = pgbench(info, b.password, b.user, seconds, clients=4)
        cpu = (child.cpu() - cpu) / seconds if child else 0.0
        return {
            "p50": p50,
            "p99": p99,
            "tps": tps,
            "tps1": pgbench(info, b.password, b.user, seconds, clients=1),
            "cpu": cpu,
            "setup": setup_time(info, b.password, b.user),
        }
    finally:
        if child is not None:
            child.stop()


# The pinned runs: the branch's server (its postmaster, so every backend it forks) and pgbench
# on one CPU, the proxy alone on the other; direct, the same without a proxy. What a proxy
# costs a client when it has a core of its own, as on a host with cores to spare, rather than
# when it takes its CPU from pgbench and the backends.
PINNED = ("direct", "door-uvloop", "bouncer-session")
SERVER_CPU, PROXY_CPU = 0, 1


def postmaster_pid(b: Branch) -> int:
    """The pid of the process listening on the branch's port (its postmaster)."""
    found = subprocess.run(
        ["ss", "-ltnpH", f"sport = :{b.port}"], capture_output=True, text=True, check=True
    )
    pids = {int(p) for p in re.findall(r"pid=(\d+)", found.stdout)}
    if len(pids) != 1:
        raise RuntimeError(f"cannot tell the branch's postmaster from {found.stdout!r}")
    return pids.pop()


def measure_pinned(way: str, work: Path, pool: poolmod.Pool, b: Branch, seconds: int) -> float:
    """``pgbench -S -c 4`` tps with the server and pgbench on one CPU, the proxy on the other."""
    postmaster = postmaster_pid(b)
    every = os.sched_getaffinity(postmaster)
    os.sched_setaffinity(postmaster, {SERVER_CPU})
    child: DoorChild | BouncerChild | None = None
    try:
        if way in BOUNCER_MODES:
            child = BouncerChild(work, pool, b, way)
        elif way != "direct":
            child = DoorChild(work, pool.settings, b, way)
        if child is not None:
            os.sched_setaffinity(child.child.pid, {PROXY_CPU})
        info = params(way, b, child.port if child else 0, work / "door" / "door.crt")
        return pgbench(info, b.password, b.user, seconds, clients=4, cpus={SERVER_CPU})
    finally:
        if child is not None:
            child.stop()
        os.sched_setaffinity(postmaster, every)


# -- the report ------------------------------------------------------------------------------


def render(
    results: dict[str, list[dict[str, float]]], pinned: dict[str, list[float]], **ctx: Any
) -> str:
    def med(way: str, key: str) -> float:
        return statistics.median(r[key] for r in results[way])

    def pinned_ratio(way: str) -> str:
        return f"{statistics.median(pinned[way]) / statistics.median(pinned['direct']):.2f}x"

    pinned_rows = "\n".join(
        f"| {WAYS[way]} | {statistics.median(pinned[way]):,.0f} | "
        + ("–" if way == "direct" else pinned_ratio(way))
        + " |"
        for way in PINNED
    )

    def ratio(way: str, key: str) -> str:
        return f"{med(way, key) / med('direct', key):.2f}x"

    rows = []
    for way, label in WAYS.items():
        p50, p99, tps, tps1, setup = (med(way, k) for k in ("p50", "p99", "tps", "tps1", "setup"))
        if way == "direct":
            extra = ["–"] * 5
        else:
            extra = [
                f"{(p50 - med('direct', 'p50')) * 1000:+.3f} ms",
                ratio(way, "tps"),
                ratio(way, "tps1"),
                f"{(setup - med('direct', 'setup')) * 1000:+.1f} ms",
                f"{med(way, 'cpu') * 100:.0f}%",
            ]
        rows.append(
            f"| {label} | {p50 * 1000:.3f} ms | {p99 * 1000:.3f} ms | {tps:,.0f} | {tps1:,.0f} | "
            f"{setup * 1000:.1f} ms | {' | '.join(extra)} |"
        )
    door, session, tx = "door-uvloop", "bouncer-session", "bouncer-transaction"
    return f"""{START}
## Front door: a branch directly, through the door and through PgBouncer

Generated by `{ctx["cmd"]}`. One branch of a small base, filled with `pgbench -i -s 10`; the
door in a child process of its own, its self-signed certificate verified by the clients
(`sslmode=verify-full`). PgBouncer {ctx["bouncer"]} (Debian's package) in front of the same
branch, beside the door: the same certificate and key to its clients
(`client_tls_sslmode=require`, the clients verifying it the same way), plaintext to the
branch on loopback as the door's, SCRAM logins checked against the branch role's verifier in
its `auth_file`, one process as the pool's OS user. `pool_mode=session` is the mode a
reviewer's session needs (its SET, temporary tables, prepared statements and LISTEN last as
long as its connection); `pool_mode=transaction` is there for comparison only (it breaks
those; psycopg runs it without server-side prepared statements). In each of {ctx["rounds"]}
rounds every way takes its turn: {QUERIES} single `SELECT 1` on one psycopg connection (after
{WARM_UP} unmeasured), `pgbench -S -c 4 -j 2 -T {ctx["seconds"]}`, `pgbench -S -c 1 -j 1 -T
{ctx["seconds"]}`, and {SETUPS} connection set-ups (connect, SCRAM login, `SELECT 1`, close).
Cells are medians over the rounds. Targets: added p50 latency at most 0.1 ms, pgbench at
least 0.9x, set-up overhead at most 5 ms. The proxy's CPU is the door's or PgBouncer's
process's user and system time during `pgbench -c 4`, as a share of one core.

On this run, with 4 clients, the door (TLS, uvloop) reached {ratio(door, "tps")} of direct
and PgBouncer in session mode {ratio(session, "tps")} ({ratio(tx, "tps")} in transaction
mode); with one client, {ratio(door, "tps1")} and {ratio(session, "tps1")}. Both are one
process on the machine's two cores, which pgbench's clients and the backends share with them;
the machine is shared with other work too, so figures move between runs. PgBouncer's set-up
is not the door's kind: it keeps the server connection in its pool when a client leaves and
hands it to the next login, so its set-ups start no backend (a pooler's gain, which the door,
one backend per client by design, does not have), while direct and through the door each
set-up forks one.

{machine_rows(ctx)}
| Load average | {ctx["load"]} (1, 5, 15 min) when the run started; the machine is shared |
| Postgres | {ctx["postgres"]} |
| PgBouncer | {ctx["bouncer"]} |

{HEADER}
{chr(10).join(rows)}

With a core of its own. The same `pgbench -S -c 4` (in one thread), pinned: the branch's
server (its postmaster, so every backend) and pgbench on CPU {SERVER_CPU}, the proxy alone on CPU
{PROXY_CPU}; direct runs the same without a proxy: what a proxy costs its clients when it does
not take its CPU from pgbench and the backends, as it does above (its hop each way, and TLS
on the client's side, remain). Medians of {ctx["rounds"]} rounds: the door
{pinned_ratio(door)} of direct, PgBouncer {pinned_ratio(session)}.

| way | pgbench -S -c 4 tps, pinned | vs direct |
|---|---|---|
{pinned_rows}
{END}
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Benchmark the front door (root).")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every way")
    parser.add_argument("--seconds", type=int, default=10, help="pgbench's -T")
    parser.add_argument("--work", default="/var/tmp/pgoverlay-bench-frontdoor", help="work dir")
    parser.add_argument("--no-report", action="store_true", help="print, do not write the doc")
    parser.add_argument("--serve-door", action="store_true", help=argparse.SUPPRESS)
    for name in ("--home", "--database", "--cert", "--key", "--audit", "--loop"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--branch-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_door:
        return serve_door(args)
    bouncer = bouncer_version()
    work, load = start(args.work)
    settings = Settings(home=work / "pool", port_min=56450, port_max=56499, runtime="local")
    install = pgbin.newest(settings.pg_bindir)
    owner = proc.OsUser.lookup(settings.os_user)
    started, t_start = dt.datetime.now(dt.UTC), time.monotonic()
    results: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    pool = None
    try:
        datadir = build_source(work, owner, install, small_app)
        with cluster.running(install, datadir, owner=owner, scratch=work / "tmp") as srv:
            dsn = make_conninfo(
                host=os.fspath(srv.socket_dir), port=srv.port, user="postgres", dbname="app"
            )
            pool = poolmod.init(settings, size="2G")
            seed.seed(pool, BASE, source_dsn=dsn)
        b = branch.create(pool, BRANCH, base_name=BASE)
        from pgoverlay.runner.door import tls

        (work / "door").mkdir(exist_ok=True)
        tls.self_signed(work / "door", host="localhost", uid=0, gid=0)
        init = subprocess.run(
            ["pgbench", "-i", "-s", "10", "-q", "-h", "127.0.0.1", "-p", str(b.port),
             "-U", b.user, b.database],
            env={"PATH": os.environ["PATH"], "PGPASSWORD": b.password},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if init.returncode != 0:
            raise RuntimeError(f"pgbench -i failed: {init.stderr.strip()}")
        for i in range(1, args.rounds + 1):
            for way in WAYS:
                results[way].append(measure(way, work, pool, b, args.seconds))
                print(f"round {i}: {way}: {results[way][-1]}", flush=True)
        pinned: dict[str, list[float]] = {way: [] for way in PINNED}
        if len(os.sched_getaffinity(0)) >= 2:
            for i in range(1, args.rounds + 1):
                for way in PINNED:
                    pinned[way].append(measure_pinned(way, work, pool, b, args.seconds))
                    print(f"pinned round {i}: {way}: {pinned[way][-1]:,.0f} tps", flush=True)
        else:
            raise SystemExit("the pinned runs need two CPUs")
        section = render(
            results,
            pinned,
            cmd=" ".join(["python bench/frontdoor.py", *argv]),
            rounds=args.rounds,
            seconds=args.seconds,
            started=started,
            minutes=(time.monotonic() - t_start) / 60,
            load=load,
            postgres=install.version,
            bouncer=bouncer,
        )
    finally:
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
