#!/usr/bin/env python3
"""Warm-branch benchmark: create-to-ready with and without warm branches, the claim broken
down, and what idle warm branches cost.

    sudo .venv/bin/python bench/warm.py [--sizes 1,5] [--samples 25] [--idle 5] [--keep]

Builds (or reuses) the engine benchmark's pgbench sources and bases in its own work dir, then
for each size takes turns: a cold create, a warm claim with the page cache dropped first, and a
warm claim with the cache as it is. "Ready" is what a user waits for: `branch.create` returned
and a real TCP login with the new password ran `SELECT 1`. Writes the section between the warm
markers of docs/benchmarks.md. A measurement script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import secrets
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import psycopg
from engine import SCALE_PER_GIB, Bench, console
from engine_report import SizeRun, machine_line, shown_args, write_report

from pgoverlay.runner import branch
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.branch import access, primed, warm
from pgoverlay.runner.postgres import roles
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.units import format_bytes

START, END = "<!-- warm:start -->", "<!-- warm:end -->"
METHODS = {
    "cold": "cold create (no warm branch)",
    "warm-dropped": "warm claim, page cache dropped first",
    "before-dropped": "warm claim as before, page cache dropped first",
    "warm": "warm claim, page cache as it is",
    "before": "warm claim as before, page cache as it is",
}
CACHED = {"warm", "before"}  # the methods that leave the page cache as it is
STEPS = ("lock and registry", "connect", "password", "login", "total")  # of a warm claim


def now() -> float:
    return time.perf_counter()


def login(pool: poolmod.Pool, b: Any) -> None:
    with psycopg.connect(**branch.connection(pool, b).connect_kwargs(), connect_timeout=10) as c:
        c.execute("SELECT 1")


@contextmanager
def timed_password(steps: dict[str, float]) -> Iterator[None]:
    """Time the claim's password step: the engine's connection, then its one statement."""
    original, connect = access.claim_login, access.engine_connection

    def timed(*args: Any, **kwargs: Any) -> None:
        start = now()
        try:
            original(*args, **kwargs)
        finally:
            steps["password"] = now() - start - steps.get("connect", 0.0)

    def timed_connect(*args: Any, **kwargs: Any) -> Any:
        start = now()
        try:
            return connect(*args, **kwargs)
        finally:
            steps["connect"] = now() - start

    access.claim_login = timed
    access.engine_connection = timed_connect
    try:
        yield
    finally:
        access.claim_login = original
        access.engine_connection = connect


class _Inline:
    """A verifier computed when the claim asks for it, on its own thread."""

    def __init__(self, password: str) -> None:
        self.password = password

    def result(self) -> str:
        return roles.scram_verifier(self.password)


@contextmanager
def as_before(pool: poolmod.Pool) -> Iterator[None]:
    """The claim as it was before it skipped work, for a side-by-side run in one process:
    no held session (a new engine connection each time), the verifier computed after it, and
    both registry transactions and the ALTER ROLE waiting for the disk."""
    take, password, set_password = primed.take, primed.password, roles.set_password
    transaction = pool.registry.transaction

    def take_none(key: str) -> None:
        conn = take(key)
        if conn is not None:
            conn.close()

    def new_password() -> tuple[str, Any]:
        made = secrets.token_urlsafe(24)
        return made, _Inline(made)

    def flushed(*args: Any, **kwargs: Any) -> None:
        set_password(*args, **{**kwargs, "flush": True})

    primed.take, primed.password, roles.set_password = take_none, new_password, flushed

    def always_durable(durable: bool = True) -> Any:
        return transaction(durable=True)

    pool.registry.transaction = always_durable  # type: ignore[method-assign]  # for this run only
    try:
        yield
    finally:
        primed.take, primed.password, roles.set_password = take, password, set_password
        del pool.registry.transaction


class WarmBench(Bench):
    def __init__(
        self, work: Path, *, samples: int, idle: int, pool_size: str, ports: tuple[int, int]
    ) -> None:
        super().__init__(work, drop_caches=True, pool_size=pool_size, creates=0)
        self.settings = Settings(home=work / "pool-home", port_min=ports[0], port_max=ports[1])
        self.samples, self.idle = samples, idle
        self.ready: dict[str, dict[str, list[float]]] = {}
        self.claims: dict[str, list[dict[str, float]]] = {}
        self.memory: dict[str, Any] = {}

    @property
    def p(self) -> poolmod.Pool:
        assert self.pool is not None
        return self.pool

    def keep_warm(self, base: str, count: int) -> None:
        self.p.registry.set_warm_target(base, "local", count)
        done = warm.replenish(self.p)
        if done.problems:
            raise RuntimeError("; ".join(done.problems))

    def one(self, run: SizeRun, method: str, i: int) -> float:
        base = f"bench-{run.key}"
        name = f"w{i}-{method}"
        self.keep_warm(base, 0 if method == "cold" else 1)
        if method not in CACHED:
            self.drop_caches()
        steps: dict[str, float] = {"connect": 0.0}  # none when the warm branch's is held
        before = as_before(self.p) if method.startswith("before") else nullcontext()
        with before, timed_password(steps):
            start = now()
            made = branch.create(self.p, name, base_name=base, runtime="local")
            created = now()
            login(self.p, made)
            total = now() - start
        steps["login"] = total - (created - start)
        warm_claim = made.slot != name
        if warm_claim != (method != "cold"):
            raise RuntimeError(f"{method} sample {i} was {'warm' if warm_claim else 'cold'}")
        if warm_claim:
            steps["total"] = total
            steps["lock and registry"] = (
                total - steps["connect"] - steps["password"] - steps["login"]
            )
            self.claims.setdefault(f"{run.label} {method}", []).append(steps)
        branch.destroy(self.p, name)
        return total

    def run_size(self, run: SizeRun, cycles: int) -> None:  # noqa: ARG002 - engine's signature
        self.ensure_source(run)
        with self.source(run, {}) as srv:
            self.ensure_base(run, srv)
        samples: dict[str, list[float]] = {m: [] for m in METHODS}
        for i in range(self.samples):
            for method in METHODS:
                samples[method].append(self.one(run, method, i))
            console.log(
                f"{run.label} {i + 1}/{self.samples}: "
                + ", ".join(f"{m} {v[-1] * 1000:.1f} ms" for m, v in samples.items())
            )
        self.keep_warm(f"bench-{run.key}", 0)
        self.ready[run.label] = samples

    def idle_cost(self, run: SizeRun) -> None:
        """Start ``idle`` warm branches of the base, let them settle, then measure each one's
        memory and their CPU over a minute. (The host's available memory is no measure on a
        shared machine: other work's use swings by more than a warm branch takes.)"""
        base = f"bench-{run.key}"
        self.keep_warm(base, 0)
        self.keep_warm(base, self.idle)
        time.sleep(10)  # let start-up work (checkpointer, autovacuum launcher) settle
        ready = warm.warm_branches(self.p)
        first = [warm.usage(self.p, b) for b in ready]
        time.sleep(60)
        second = [warm.usage(self.p, b) for b in ready]
        pss = [u.pss_bytes for u in second if u is not None]
        cpu = [
            (b.cpu_seconds - a.cpu_seconds) / 60
            for a, b in zip(first, second, strict=True)
            if a is not None and b is not None
        ]
        self.memory = {
            "size": run.label,
            "count": len(ready),
            "processes": statistics.median([u.processes for u in second if u is not None]),
            "pss_each": statistics.median(pss),
            "pss_all": sum(pss),
            "cpu_each": statistics.median(cpu),
        }
        self.keep_warm(base, 0)

    def sweep(self) -> None:
        if self.pool is not None:
            for target in self.pool.registry.warm_targets():
                self.pool.registry.set_warm_target(target.base_name, target.runtime, 0)
            warm.replenish(self.pool, start=False)
        super().sweep()


def ms(values: list[float], q: float = 0.5) -> str:
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.1f}"


def render(bench: WarmBench, argv: list[str], started: dt.datetime, load: float) -> str:
    lines = [
        START,
        "## Warm branches",
        "",
        f"Generated by `python bench/warm.py {shown_args(argv)}` on "
        f"{started:%Y-%m-%d %H:%M} UTC. "
        "Create-to-ready: `branch.create` returned and a real TCP login with the new password "
        f"ran `SELECT 1`. Methods take turns; {bench.samples} samples each; milliseconds.",
        "",
        "| Size | Method | Median | p90 | Min | Max |",
        "|---|---|---|---|---|---|",
    ]
    for size, samples in bench.ready.items():
        for method, values in samples.items():
            lines.append(
                f"| {size} | {METHODS[method]} | {ms(values)} | {ms(values, 0.9)} | "
                f"{min(values) * 1000:.1f} | {max(values) * 1000:.1f} |"
            )
    lines += [
        "",
        "The claim broken down (median ms): the branch's lock and the two registry "
        "transactions (one binds name, password and owner, one marks it ready; neither waits "
        "for the disk) with the choice of base and runtime; the engine's connection over the "
        "private socket (none when this process holds the session it locked the warm "
        "branch's role with, as the engine service does); setting the password (one "
        "`ALTER ROLE` with a SCRAM verifier computed ahead, not waiting for the WAL flush); "
        "the user's first login (TCP, SCRAM).",
        "",
        "| Claim | " + " | ".join(STEPS) + " |",
        "|---|" + "---|" * len(STEPS),
    ]
    for label, claims in bench.claims.items():
        cells = [ms([c[s] for c in claims]) for s in STEPS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    m = bench.memory
    if m:
        lines += [
            "",
            f"Idle cost: {m['count']} warm branches of the {m['size']} base, measured 10 s after "
            f"they started, CPU over the next minute. Each runs {m['processes']:.0f} processes "
            f"and takes {format_bytes(int(m['pss_each']))} of memory (proportional set size, "
            f"median; {format_bytes(int(m['pss_all']))} for all); CPU "
            f"{m['cpu_each'] * 100:.2f} % of a core each.",
        ]
    lines += ["", machine_line(bench.install.major, load), END, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Benchmark warm branches (run as root).")
    parser.add_argument("--sizes", default="1,5", help="database sizes in GiB (default: 1,5)")
    parser.add_argument("--samples", type=int, default=25, help="creates per method and size")
    parser.add_argument("--idle", type=int, default=5, help="warm branches for the idle cost")
    parser.add_argument("--work", default="/var/tmp/pgoverlay-bench-warm", help="work directory")
    parser.add_argument("--keep", action="store_true", help="keep pool and sources for a re-run")
    parser.add_argument("--pool-size", default="40G", help="sparse pool image size")
    parser.add_argument("--ports", default="56900-56999", help="ports of branches and sources")
    args = parser.parse_args(argv)
    low, _, high = args.ports.partition("-")
    gibs = sorted({float(x) for x in args.sizes.split(",") if x.strip()})
    poolmod.require_root()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bench = WarmBench(
        Path(args.work).resolve(),
        samples=args.samples,
        idle=args.idle,
        pool_size=args.pool_size,
        ports=(int(low), int(high)),
    )
    runs = [SizeRun(gib=g, scale=max(1, round(g * SCALE_PER_GIB))) for g in gibs]
    started, load = dt.datetime.now(dt.UTC), os.getloadavg()[0]
    try:
        bench.open_pool()
        bench.sweep()
        for run in runs:
            bench.run_size(run, 0)
        if args.idle:
            bench.idle_cost(runs[0])
        write_report(render(bench, argv, started, load), start=START, end=END)
        console.log("report written")
    finally:
        bench.sweep()
        if not args.keep:
            bench.remove_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
