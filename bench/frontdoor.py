#!/usr/bin/env python3
"""Front-door benchmark: a branch reached directly, and through the front door, side by side.

    sudo .venv/bin/python bench/frontdoor.py [--rounds 3] [--seconds 10] [--work DIR]

Builds a small throwaway source, seeds one base into a pool of its own, creates one branch and
fills it with `pgbench -i -s 10`. The door runs in a child process of its own (as the service
runs it), with a self-signed certificate for localhost; the clients verify it
(`sslmode=verify-full`). In every round each way takes its turn:

- per-query latency: one psycopg connection running `SELECT 1` (p50 and p99 of single queries
  after a warm-up);
- throughput: `pgbench -S -c 4 -j 2 -T SECONDS` (tps);
- connection set-up: connect, log in, run `SELECT 1`, close (p50).

The ways: the branch's own port (plain TCP, as before the door), the door with TLS on uvloop's
loop and on asyncio's own, and the door without TLS from loopback (what TLS costs apart). Cells
are the median over the rounds. Targets: added p50 latency at most 0.1 ms, pgbench at least
0.9x, set-up overhead at most 5 ms. The Markdown section replaces the one between the front
door's markers in docs/benchmarks.md. A measurement script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from common import build_source, dismantle, machine_rows, small_app, start
from engine_report import write_report
from psycopg.conninfo import make_conninfo

from pgoverlay.runner import audit, branch, proc, seed
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
}
QUERIES, WARM_UP, SETUPS = 5000, 500, 60
HEADER = (
    "| way | query p50 | query p99 | pgbench -S tps | set-up p50 | added p50 | pgbench "
    "| added set-up | door's CPU under pgbench |\n|---|---|---|---|---|---|---|---|---|"
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

    async def resolve(name: str) -> Route | None:
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
        """The child's CPU seconds so far (user and system)."""
        fields = Path(f"/proc/{self.child.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        assert self.child.stdin is not None
        self.child.stdin.close()
        self.child.wait(timeout=30)


# -- the measurements -----------------------------------------------------------------------


def params(way: str, b: Branch, port: int, ca: Path) -> dict[str, Any]:
    if way == "direct":
        return {"host": "127.0.0.1", "port": b.port, "dbname": b.database, "sslmode": "disable"}
    common = {"host": "localhost", "port": port, "dbname": BRANCH}
    if way == "door-plain":
        return {**common, "sslmode": "disable"}
    return {**common, "sslmode": "verify-full", "sslrootcert": os.fspath(ca)}


def latency(conninfo: dict[str, Any], password: str, user: str) -> tuple[float, float]:
    with psycopg.connect(**conninfo, user=user, password=password, autocommit=True) as conn:
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
        with psycopg.connect(**conninfo, user=user, password=password, autocommit=True) as c:
            c.execute("SELECT 1").fetchone()
        times.append(now() - t0)
    return statistics.median(times)


def pgbench(conninfo: dict[str, Any], password: str, user: str, seconds: int) -> float:
    env = {
        "PATH": os.environ["PATH"],
        "PGPASSWORD": password,
        "PGSSLMODE": conninfo["sslmode"],
        **({"PGSSLROOTCERT": conninfo["sslrootcert"]} if "sslrootcert" in conninfo else {}),
    }
    argv = [
        "pgbench", "-S", "-c", "4", "-j", "2", "-T", str(seconds), "-n",
        "-h", conninfo["host"], "-p", str(conninfo["port"]), "-U", user, conninfo["dbname"],
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 120)
    found = re.search(r"tps = ([0-9.]+)", done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"pgbench failed: {done.stderr.strip() or done.stdout.strip()}")
    return float(found.group(1))


def measure(way: str, work: Path, settings: Settings, b: Branch, seconds: int) -> dict[str, float]:
    child = None if way == "direct" else DoorChild(work, settings, b, way)
    try:
        info = params(way, b, child.port if child else 0, work / "door" / "door.crt")
        p50, p99 = latency(info, b.password, b.user)
        cpu = child.cpu() if child else 0.0
        tps = pgbench(info, b.password, b.user, seconds)
        cpu = (child.cpu() - cpu) / seconds if child else 0.0
        return {
            "p50": p50,
            "p99": p99,
            "tps": tps,
            "cpu": cpu,
            "setup": setup_time(info, b.password, b.user),
        }
    finally:
        if child is not None:
            child.stop()


# -- the report ------------------------------------------------------------------------------


def render(results: dict[str, list[dict[str, float]]], **ctx: Any) -> str:
    def med(way: str, key: str) -> float:
        return statistics.median(r[key] for r in results[way])

    rows = []
    for way, label in WAYS.items():
        p50, p99, tps, setup, cpu = (med(way, k) for k in ("p50", "p99", "tps", "setup", "cpu"))
        if way == "direct":
            extra = "–", "–", "–", "–"
        else:
            extra = (
                f"{cpu * 100:.0f}%",
                f"{(p50 - med('direct', 'p50')) * 1000:+.3f} ms",
                f"{tps / med('direct', 'tps'):.2f}x",
                f"{(setup - med('direct', 'setup')) * 1000:+.1f} ms",
            )
        rows.append(
            f"| {label} | {p50 * 1000:.3f} ms | {p99 * 1000:.3f} ms | {tps:,.0f} | "
            f"{setup * 1000:.1f} ms | {extra[1]} | {extra[2]} | {extra[3]} | {extra[0]} |"
        )
    return f"""{START}
## Front door: a branch directly and through the door

Generated by `{ctx["cmd"]}`. One branch of a small base, filled with `pgbench -i -s 10`; the
door in a child process of its own, its self-signed certificate verified by the clients
(`sslmode=verify-full`). In each of {ctx["rounds"]} rounds every way takes its turn:
{QUERIES} single `SELECT 1` on one psycopg connection (after {WARM_UP} unmeasured), `pgbench
-S -c 4 -j 2 -T {ctx["seconds"]}`, and {SETUPS} connection set-ups (connect, SCRAM login,
`SELECT 1`, close). Cells are medians over the rounds. Targets: added p50 latency at most
0.1 ms, pgbench at least 0.9x, set-up overhead at most 5 ms. The door's CPU is its process's
user and system time during pgbench, as a share of one core.

{machine_rows(ctx)}
| Load average | {ctx["load"]} (1, 5, 15 min) when the run started; the machine is shared |
| Postgres | {ctx["postgres"]} |

{HEADER}
{chr(10).join(rows)}
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
                results[way].append(measure(way, work, settings, b, args.seconds))
                print(f"round {i}: {way}: {results[way][-1]}", flush=True)
        section = render(
            results,
            cmd=" ".join(["python bench/frontdoor.py", *argv]),
            rounds=args.rounds,
            seconds=args.seconds,
            started=started,
            minutes=(time.monotonic() - t_start) / 60,
            load=load,
            postgres=install.version,
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
