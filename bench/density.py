#!/usr/bin/env python3
"""Density benchmark: a thousand branches on one host, most of them suspended, a hundred of
them in use at a time, reached through the real front door.

    sudo .venv/bin/python bench/density.py [--branches 1000] [--active 100] [--gib 1]
        [--connections 400] [--cold 15] [--wake-gib 5] [--work DIR] [--keep]

Builds (or reuses, from its work dir) a pgbench source of ``--gib`` GiB, seeds it into a pool
of its own, starts the pool's engine service and `pgoverlay door` (as the service starts them,
with the door's self-signed certificate, which the clients verify: ``sslmode=verify-full``).
Then:

1. ``--branches`` branches are created in batches and each is suspended as its batch ends
   (a thousand running servers would not fit); the service's ``list`` (with layer sizes) and
   ``status`` and the door's lookup (``branch NAME`` without its layer) are timed through the
   service's socket with 0, ``--active`` and all of them made, and `pgoverlay branch list`
   as a whole process;
2. ``--active`` random branches are woken by a first connection through the door; then
   ``--connections`` connections go to random branches of that active set, and every tenth
   one an active branch is suspended (as an idle one would be) and a random suspended branch
   takes its place, its first connection waking it (a wake with the page cache as it is);
3. ``--cold`` times: the page cache dropped (``sync; echo 3 > drop_caches``), a connection to
   a suspended branch, and one to a branch that is up;
4. gc's wall time, the host's memory (MemAvailable) with none, all suspended, and the active
   set up, the memory (PSS) of the branches' servers, the layers' sizes and the pool's disk.

With ``--wake-gib 5`` a second base of that size gets ``--cold`` branches, each measured
once cold and once with the cache as it is. Every latency is connect-to-first-result: TCP
connect, TLS, the login (SCRAM) through the door and a primary-key read of pgbench_accounts.
Writes the section between the density markers of docs/benchmarks.md. A measurement script:
it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from common import dismantle, machine_rows, start
from engine import SCALE_PER_GIB, Bench, console
from engine_report import SizeRun, shown_args, write_report

from pgoverlay.errors import PgoverlayError
from pgoverlay.runner import branch
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.door import tls
from pgoverlay.runner.pool.registry import Branch
from pgoverlay.runner.service import serve
from pgoverlay.runner.service.client import RemoteEngine, client
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.units import format_bytes

START, END = "<!-- density:start -->", "<!-- density:end -->"
# The branches' ports: every branch keeps one, suspended or not. Below the kernel's ephemeral
# range (ip_local_port_range, 32768 and up by default), as the default 20000-29999 is: a
# suspended branch holds no socket on its port, and an outgoing connection's local port taken
# from that range meanwhile would stop it from starting again.
PORTS = (30000, 31199)
DOOR_PORT, DOOR_HTTPS_PORT = 31300, 31301
BATCH = 25  # branches created before the batch is suspended
LOOKUPS = 15  # timed requests per measure of list, status and lookup
ROTATE_EVERY = 10  # connections between two changes of the active set
READ_SQL = "SELECT abalance FROM pgbench_accounts WHERE aid = %s"


def now() -> float:
    return time.perf_counter()


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def meminfo(field_name: str) -> int:
    """A /proc/meminfo field, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/meminfo has no {field_name}")


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms" if values else "–"


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def spread(values: list[float]) -> str:
    """p50 / p99 (n), in ms."""
    if not values:
        return "–"
    return f"{statistics.median(values) * 1000:.0f} / {p99(values) * 1000:.0f} ms (n={len(values)})"


@dataclass
class Servers:
    """The branches' Postgres processes: how many, and their proportional memory (PSS, which
    shares the base's cached pages and the executable fairly between them)."""

    processes: int
    pss_bytes: int


def branch_servers(pool_root: Path) -> Servers:
    """Every process whose working directory is inside the pool (a Postgres server chdirs to
    its data directory)."""
    count = pss = 0
    root = os.fspath(pool_root.resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            if not cwd.startswith(root + "/"):
                continue
            rollup = (entry / "smaps_rollup").read_text()
        except OSError:
            continue
        count += 1
        for line in rollup.splitlines():
            if line.startswith("Pss:"):
                pss += int(line.split()[1]) * 1024
    return Servers(count, pss)


@dataclass
class Memory:
    label: str
    available: int
    used: int
    servers: Servers


@dataclass
class Lookups:
    """Response times through the service's socket (seconds), and the whole command's."""

    branches: int
    running: int
    listed: list[float] = field(default_factory=list)
    status: list[float] = field(default_factory=list)
    lookup: list[float] = field(default_factory=list)
    command: list[float] = field(default_factory=list)


@dataclass
class Results:
    creates: list[float] = field(default_factory=list)  # create until ready, in-process engine
    suspends: list[float] = field(default_factory=list)
    lookups: list[Lookups] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)
    wake_first: list[float] = field(default_factory=list)  # the active set's first wakes
    wake_rotating: list[float] = field(default_factory=list)  # wakes while the set is in use
    up: list[float] = field(default_factory=list)  # connections to active branches
    wake_cold: list[float] = field(default_factory=list)
    up_cold: list[float] = field(default_factory=list)
    big_cold: list[float] = field(default_factory=list)
    big_warm: list[float] = field(default_factory=list)
    big_up: list[float] = field(default_factory=list)
    gc_seconds: list[float] = field(default_factory=list)
    layer_logical: list[int] = field(default_factory=list)
    layer_physical: list[int] = field(default_factory=list)
    disk_before: int = 0
    disk_after: int = 0
    errors: list[str] = field(default_factory=list)


class Door:
    """`pgoverlay door` as a child process with the pool's settings, until ``stop``."""

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
        while not serve_answering(settings):
            if self.child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the front door did not start: see {self.log.name}")
            time.sleep(0.2)
        self.ca = settings.home / "door" / tls.CERT_NAME

    def stop(self) -> None:
        self.child.terminate()
        self.child.wait(timeout=30)
        self.log.close()


def serve_answering(settings: Settings) -> bool:
    from pgoverlay.runner.door.reach import answering

    return answering(settings)


class Density:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.settings = Settings(
            home=work / "pool-home",
            port_min=PORTS[0],
            port_max=PORTS[1],
            runtime="local",
            max_branches=args.branches + 100,
            service_gc_interval=0,  # gc is measured on its own
            door_address="127.0.0.1",
            door_host="localhost",
            door_port=DOOR_PORT,
            door_https_port=DOOR_HTTPS_PORT,
            door_max_per_source=100,
        )
        self.bench = Bench(work, drop_caches=True, pool_size=args.pool_size, creates=0)
        self.bench.settings = self.settings
        self.rng = random.Random(args.seed)
        self.results = Results()
        self.door: Door | None = None
        self.scales: dict[str, int] = {}  # base name -> its pgbench scale

    @property
    def pool(self) -> poolmod.Pool:
        assert self.bench.pool is not None
        return self.bench.pool

    # -- setting up -------------------------------------------------------------------------
    def base(self, gib: float) -> str:
        run = SizeRun(gib=gib, scale=max(1, round(gib * SCALE_PER_GIB)))
        self.bench.ensure_source(run)
        with self.bench.source(run, {}) as srv:
            self.bench.ensure_base(run, srv)
        name = f"bench-{run.key}"
        self.scales[name] = run.scale
        return name

    # -- one connection through the door ----------------------------------------------------
    def first_result(self, b: Branch) -> float:
        """Seconds from connect to the first row of a read, through the door."""
        assert self.door is not None
        aid = self.rng.randint(1, self.scales[b.base_name] * 100_000)
        started = now()
        with psycopg.connect(
            host="localhost",
            port=DOOR_PORT,
            dbname=b.name,
            user=b.user,
            password=b.password,
            sslmode="verify-full",
            sslrootcert=os.fspath(self.door.ca),
            connect_timeout=60,
        ) as conn:
            row = conn.execute(READ_SQL, (aid,)).fetchone()
        took = now() - started
        if row is None:
            raise RuntimeError(f"branch {b.name}: no row {aid}")
        return took

    # -- measures ---------------------------------------------------------------------------
    def memory(self, label: str) -> None:
        """The host's memory in this state, the page cache dropped first: what is left is what
        processes and the kernel hold, not which files happened to be read last."""
        time.sleep(2)  # the servers that just stopped have given their memory back
        drop_caches()
        total, available = meminfo("MemTotal"), meminfo("MemAvailable")
        servers = branch_servers(self.settings.home / "pool")
        self.results.memory.append(Memory(label, available, total - available, servers))
        console.log(
            f"memory {label}: available {format_bytes(available)}, "
            f"{servers.processes} server processes, PSS {format_bytes(servers.pss_bytes)}"
        )

    def lookups(self, engine: RemoteEngine, names: list[str], running: int) -> None:
        got = Lookups(branches=len(names), running=running)
        for _ in range(LOOKUPS):
            started = now()
            engine.branches(layer=True)
            got.listed.append(now() - started)
            if names:
                name = self.rng.choice(names)
                started = now()
                engine.branch(name, layer=True)
                got.status.append(now() - started)
                started = now()
                engine.branch(self.rng.choice(names))
                got.lookup.append(now() - started)
        for _ in range(max(3, LOOKUPS // 3)):
            started = now()
            subprocess.run(
                [sys.executable, "-P", "-m", "pgoverlay", "branch", "list"],
                env={**os.environ, **serve.settings_environ(self.settings)},
                capture_output=True,
                check=True,
                timeout=600,
                cwd="/",
            )
            got.command.append(now() - started)
        self.results.lookups.append(got)
        console.log(
            f"with {len(names)} branches ({running} running): list {median_ms(got.listed)}, "
            f"status {median_ms(got.status)}, lookup {median_ms(got.lookup)}, "
            f"`branch list` {median_ms(got.command)}"
        )

    # -- the run ----------------------------------------------------------------------------
    def create_suspended(self, base: str, count: int, prefix: str) -> list[str]:
        """``count`` branches of ``base``, each suspended once its batch is made."""
        names: list[str] = []
        for first in range(0, count, BATCH):
            batch = [f"{prefix}-{i:04d}" for i in range(first, min(count, first + BATCH))]
            for name in batch:
                started = now()
                branch.create(self.pool, name, base_name=base)
                self.results.creates.append(now() - started)
            for name in batch:
                started = now()
                branch.suspend(self.pool, name)
                self.results.suspends.append(now() - started)
            names.extend(batch)
            console.log(f"{len(names)}/{count} branches made and suspended")
        return names

    def connect_timed(self, name: str, into: list[float]) -> None:
        try:
            into.append(self.first_result(branch.get(self.pool, name)))
        except psycopg.Error as err:
            self.results.errors.append(f"{name}: {err}")
            console.log(f"connection to {name} failed: {err}")

    def run(self) -> None:
        args, r = self.args, self.results
        base = self.base(args.gib)
        big = self.base(args.wake_gib) if args.wake_gib else None
        serve.start(self.settings)
        engine = client(self.settings)
        self.door = Door(self.settings)
        r.disk_before = shutil.disk_usage(self.settings.home / "pool").used
        self.memory("no branch")
        self.lookups(engine, [], 0)

        names = self.create_suspended(base, min(args.active, args.branches), "dense")
        self.lookups(engine, names, 0)
        if args.branches > args.active:
            more = self.create_suspended(base, args.branches - args.active, "dense-more")
            names += more
        self.lookups(engine, names, 0)
        self.memory(f"{len(names)} suspended")
        r.disk_after = shutil.disk_usage(self.settings.home / "pool").used
        for name in names:
            size = branch.layer_size(self.pool, name)
            r.layer_logical.append(size.logical_bytes)
            r.layer_physical.append(size.physical_bytes)

        # the active set: woken by its first connections
        active = self.rng.sample(names, min(args.active, len(names)))
        for name in active:
            self.connect_timed(name, r.wake_first)
        console.log(f"{len(active)} woken: p50/p99 {spread(r.wake_first)}")
        self.memory(f"{len(active)} running, {len(names) - len(active)} suspended")
        self.lookups(engine, names, len(active))
        for i in range(args.connections):
            if i and i % ROTATE_EVERY == 0:
                leaving = self.rng.choice(active)
                try:
                    engine.suspend(leaving)
                except PgoverlayError as err:  # its wake failed (counted): it stays out
                    r.errors.append(f"{leaving}: {err}")
                sleeping = sorted(set(names) - set(active))
                if sleeping:
                    coming = self.rng.choice(sleeping)
                    active[active.index(leaving)] = coming
                    self.connect_timed(coming, r.wake_rotating)
            self.connect_timed(self.rng.choice(active), r.up)
        console.log(f"up {spread(r.up)}; rotating wakes {spread(r.wake_rotating)}")

        for _ in range(args.cold):
            sleeping = sorted(set(names) - set(active))
            if sleeping:
                drop_caches()
                self.connect_timed(self.rng.choice(sleeping), r.wake_cold)
            drop_caches()
            self.connect_timed(self.rng.choice(active), r.up_cold)
        console.log(f"cold: wake {spread(r.wake_cold)}, up {spread(r.up_cold)}")

        for _ in range(3):
            started = now()
            engine.gc()
            r.gc_seconds.append(now() - started)
        console.log(f"gc with {len(names)}: {median_ms(r.gc_seconds)}")

        if big is not None:
            bigs = self.create_suspended(big, args.cold, "dense-big")
            for name in bigs:
                drop_caches()
                self.connect_timed(name, r.big_cold)
                self.connect_timed(name, r.big_up)
                engine.suspend(name)
                self.connect_timed(name, r.big_warm)
            console.log(f"{args.wake_gib:g} GiB: cold {spread(r.big_cold)}")
        engine.close()

    def stop(self) -> None:
        if self.door is not None:
            self.door.stop()
        serve.stop(self.settings, wait=30)


def render(d: Density, **ctx: Any) -> str:
    r, args = d.results, d.args
    n = len(r.layer_logical)

    def mib(value: float) -> str:
        return f"{value / 2**20:.1f} MiB"

    memory_rows = "\n".join(
        f"| {m.label} | {format_bytes(m.used)} | {format_bytes(m.available)} "
        f"| {m.servers.processes} | {format_bytes(m.servers.pss_bytes)} |"
        for m in r.memory
    )
    base_mem = r.memory[0]
    suspended = r.memory[1] if len(r.memory) > 1 else base_mem
    active = r.memory[2] if len(r.memory) > 2 else suspended
    running = max(1, args.active)
    per_suspended = f"{(base_mem.available - suspended.available) / max(1, n) / 1024:+.0f} KiB"
    median_layer = (
        statistics.median(r.layer_logical or [0]),
        statistics.median(r.layer_physical or [0]),
    )
    lookup_rows = "\n".join(
        f"| {lk.branches} ({lk.running} running) | {median_ms(lk.listed)} "
        f"| {median_ms(lk.status)} | {median_ms(lk.lookup)} | {median_ms(lk.command)} |"
        for lk in r.lookups
    )
    big = ""
    if r.big_cold:
        big = (
            f"| {args.wake_gib:g} GiB base: wake, page cache dropped | {spread(r.big_cold)} |\n"
            f"| {args.wake_gib:g} GiB base: wake, page cache as it is | {spread(r.big_warm)} |\n"
            f"| {args.wake_gib:g} GiB base: branch up, right after its wake | {spread(r.big_up)} "
            "|\n"
        )
    errors = f"\n{len(r.errors)} connections failed: {r.errors[:3]}\n" if r.errors else ""
    return f"""{START}
## A thousand branches

Generated by `{ctx["cmd"]}`. One pool, one base of {args.gib:g} GiB (pgbench), its engine
service and `pgoverlay door` as `pool init` starts them; {n} branches created in batches of
{BATCH}, each batch suspended once made, then {args.active} of them in use at a time through
the front door (TLS verified, SCRAM login). Every latency is connect-to-first-result: TCP
connect, TLS, the login through the door and a primary-key read, as a client sees it; a
suspended branch is woken by that connection (the door holds it while the branch mounts and
starts). "Cache dropped": `sync; echo 3 > /proc/sys/vm/drop_caches` before each one. While in
use, every {ROTATE_EVERY}th connection an active branch is suspended and a random suspended
one takes its place. Latencies are p50 / p99 with the number of samples.

{machine_rows(ctx)}
| Load average | {ctx["load"]} (1, 5, 15 min) when the run started; the machine is shared |
| Postgres | {ctx["postgres"]} |

### Waking and connecting

| connection | p50 / p99 |
|---|---|
| suspended branch, page cache dropped | {spread(r.wake_cold)} |
| suspended branch, the {args.active} first wakes of the active set | {spread(r.wake_first)} |
| suspended branch, while {args.active} others are in use | {spread(r.wake_rotating)} |
| branch that is up, page cache dropped | {spread(r.up_cold)} |
| branch that is up ({args.active} in use) | {spread(r.up)} |
{big}
Creating a branch (until it answers) took {median_ms(r.creates)} (median of {len(r.creates)})
and suspending it {median_ms(r.suspends)}, with at most the {BATCH - 1} others of its batch
running.
{errors}
### Memory and disk

| host | memory used | MemAvailable | branch server processes | their memory (PSS) |
|---|---|---|---|---|
{memory_rows}

A suspended branch runs no process: {suspended.servers.processes} server processes with {n}
suspended, so it holds no memory of its own; what it keeps is on disk. Each memory row is read
after `drop_caches`, so the page cache does not count. MemAvailable went from
{format_bytes(base_mem.available)} with no branch to {format_bytes(suspended.available)} with {n}
suspended: the other work of this shared machine moves it more than they do (if the whole
change were theirs, {per_suspended} per suspended branch). A running branch's servers take
{mib(active.servers.pss_bytes / running)} each (PSS, {running} running).

Disk: the {n} writable layers hold {format_bytes(sum(r.layer_logical))} logically and
{format_bytes(sum(r.layer_physical))} physically (median {mib(median_layer[0])} /
{mib(median_layer[1])} each: most of a layer is reflinked from the base, which is what
"physically" leaves out); the pool's filesystem went from {format_bytes(r.disk_before)} to
{format_bytes(r.disk_after)} used (`df`) for all of them.

### The service with many branches

Medians of {LOOKUPS} requests through the service's socket: `list` is every branch with its
layer's size (what `pgoverlay branch list` asks), `status` one branch with its layer's size,
the lookup one branch without it (what the front door asks on each connection); the command is
`pgoverlay branch list` as a whole process (interpreter start included).

| branches | list | status | lookup | `pgoverlay branch list` |
|---|---|---|---|---|
{lookup_rows}

gc (`pgoverlay gc` through the service) with {n} branches: {median_ms(r.gc_seconds)}
(median of {len(r.gc_seconds)}).
{END}
"""


@contextmanager
def cleanup(d: Density, keep: bool) -> Iterator[None]:
    try:
        yield
    finally:
        d.stop()
        if d.bench.pool is not None and not keep:
            d.bench.pool.close()
            dismantle(d.settings)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Benchmark a thousand branches on one host.")
    parser.add_argument("--branches", type=int, default=1000, help="branches made (1000)")
    parser.add_argument("--active", type=int, default=100, help="in use at a time (100)")
    parser.add_argument("--gib", type=float, default=1.0, help="the base's size in GiB (1)")
    parser.add_argument("--connections", type=int, default=400, help="to the active set (400)")
    parser.add_argument("--cold", type=int, default=15, help="cold-cache samples of each (15)")
    parser.add_argument(
        "--wake-gib", type=float, default=0.0, help="also time wakes of a base this big (GiB)"
    )
    parser.add_argument("--pool-size", default="60G", help="the pool image (sparse)")
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--work", default="/var/tmp/pgoverlay-bench-density", help="work dir")
    parser.add_argument("--keep", action="store_true", help="leave the pool (and source)")
    parser.add_argument("--no-report", action="store_true", help="print, do not write the docs")
    args = parser.parse_args(argv)
    work, load = start(args.work)
    started, t_start = dt.datetime.now(dt.UTC), now()
    d = Density(args, work)
    dismantle(d.settings)  # what a run with --keep left
    d.bench.open_pool()
    with cleanup(d, args.keep):
        d.run()
        # measured while the pool is up; written once it is taken down
        section = render(
            d,
            cmd=" ".join(["python bench/density.py", shown_args(argv)]).strip(),
            started=started,
            minutes=(now() - t_start) / 60,
            load=load,
            postgres=d.bench.install.version,
        )
    if not args.no_report:
        write_report(section, start=START, end=END)
    sys.stdout.write(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
