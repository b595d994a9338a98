#!/usr/bin/env python3
"""Discard benchmark: what giving a destroyed branch's blocks back to the host costs, and how
soon the pool image shrinks.

    sudo .venv/bin/python bench/discard.py [--rounds 5] [--pool-size 8G] [--work DIR]

Builds a small throwaway source and seeds one base into each of two pool images of its own:
pool A mounted as `pool init` mounts it (with discard), pool B mounted again without discard
after the seed, as an older pgoverlay left it, so every destroy runs `fstrim` afterwards. A third
mode, "neither", destroys in pool B with that trim skipped: the blocks then stay in the image,
which shows what giving them back costs. In every round each mode takes its turn: create a
branch, fill it with ~200 MiB and CHECKPOINT, time `branch.destroy`, then watch `pool.img`'s
allocation until it stops falling. In the same rounds the whole command
`pgoverlay branch destroy` is timed for pools A and B. The Markdown section replaces the one
between the discard markers in docs/benchmarks.md. A measurement script: it asserts nothing
about timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import psycopg
from common import build_source, dismantle, machine_rows, small_app, start
from engine_report import write_report
from psycopg.conninfo import make_conninfo

from pgoverlay.errors import TimeoutExpiredError
from pgoverlay.runner import branch, proc, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool, discard, mounts
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.units import format_bytes

START, END = "<!-- discard:start -->", "<!-- discard:end -->"
BASE = "discard-bench"
MODES = {
    "discard": "A: mounted with discard",
    "fstrim": "B: without discard, `fstrim` after the destroy",
    "neither": "B: without discard, no `fstrim` (blocks kept)",
}
CLI_MODES = ("discard", "fstrim")
FILL_ROWS = 100_000  # rows of 1,920 bytes, stored inline: ~200 MiB of table
SETTLE_TIMEOUT = 10.0  # watch the allocation this long at most after a destroy
SETTLE_QUIET = 2.0  # ... and stop once it has not fallen for this long
SETTLE_LOOK = 0.05  # at most this long between two looks
MiB = 1024**2
HEADER = (
    "| mode | destroy in-process | destroy as a process | allocation left right after destroy "
    "| allocation left after waiting | time for the image to give the blocks back |\n"
    "|---|---|---|---|---|---|"
)


@dataclass
class Sample:
    destroy_s: float
    filled: int  # allocation the fill added above the level before the create
    left_now: int  # allocation above that level right after the destroy
    left_after: int  # ... once it stopped falling (or the watch timed out)
    back_s: float | None  # destroy's end until the last fall; None: it never fell
    timed_out: bool


@dataclass
class Results:
    inproc: dict[str, list[Sample]] = field(default_factory=lambda: {m: [] for m in MODES})
    cli: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in CLI_MODES})
    trim_after_neither: list[float] = field(default_factory=list)


def now() -> float:
    return time.monotonic()


def allocated(pool: Pool) -> int:
    return discard.allocated_bytes(pool.home / "pool.img")


def fill(pool: Pool, name: str) -> None:
    """Write ~200 MiB into branch ``name``, through to the image."""
    with psycopg.connect(
        **branch.connection(pool, branch.get(pool, name)).connect_kwargs(), autocommit=True
    ) as conn:
        conn.execute("CREATE TABLE ballast (filler text)")
        conn.execute("ALTER TABLE ballast ALTER COLUMN filler SET STORAGE PLAIN")
        conn.execute(
            "INSERT INTO ballast SELECT repeat(md5(g::text), 60) "
            f"FROM generate_series(1, {FILL_ROWS}) g"
        )
        conn.execute("CHECKPOINT")
    os.sync()


def filled_branch(pool: Pool, name: str) -> tuple[int, int]:
    """Create and fill branch ``name``: the image's allocation before the create, and after."""
    os.sync()
    before = allocated(pool)
    branch.create(pool, name, base_name=BASE)
    fill(pool, name)
    return before, allocated(pool)


def settle(pool: Pool, destroyed_at: float) -> tuple[int, float | None, bool]:
    """Watch the image's allocation until it has not fallen for SETTLE_QUIET seconds, or
    SETTLE_TIMEOUT passed: (the allocation then, seconds from ``destroyed_at`` to its last
    fall or None, whether the watch timed out). No sync: what the host sees by itself."""
    last = allocated(pool)
    last_change = now()
    last_fall: float | None = None

    def quiet() -> bool:
        nonlocal last, last_change, last_fall
        value, t = allocated(pool), now()
        if value < last:
            last_change, last_fall = t, t - destroyed_at
        last = value
        return t - last_change >= SETTLE_QUIET

    try:
        wait_for(
            quiet,
            timeout=SETTLE_TIMEOUT,
            what="the allocation to stop falling",
            max_interval=SETTLE_LOOK,
        )
    except TimeoutExpiredError:
        return last, last_fall, True
    return last, last_fall, False


@contextmanager
def trim_skipped() -> Iterator[None]:
    """Destroys in this process skip the fallback fstrim (mode "neither")."""
    with mock.patch.object(discard, "release", lambda root, *, image_mode: None):
        yield


def inproc_cycle(pool: Pool, mode: str, name: str) -> Sample:
    before, filled = filled_branch(pool, name)
    if mode == "neither":
        with trim_skipped():
            t0 = now()
            branch.destroy(pool, name)
    else:
        t0 = now()
        branch.destroy(pool, name)
    destroyed_at = now()
    left_now = allocated(pool)
    left_after, back_s, timed_out = settle(pool, destroyed_at)
    return Sample(
        destroy_s=destroyed_at - t0,
        filled=filled - before,
        left_now=left_now - before,
        left_after=left_after - before,
        back_s=back_s,
        timed_out=timed_out,
    )


def cli_env(settings: Settings) -> dict[str, str]:
    """The environment that points the `pgoverlay` command at a bench pool. SUDO_* are left
    out: under sudo the command ignores PGOVERLAY_* (and would look at the default pool)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_")}
    env.update(
        PGOVERLAY_HOME=os.fspath(settings.home),
        PGOVERLAY_PORT_MIN=str(settings.port_min),
        PGOVERLAY_PORT_MAX=str(settings.port_max),
        PGOVERLAY_RUNTIME="local",
    )
    return env


def cli_cycle(pool: Pool, name: str) -> float:
    filled_branch(pool, name)
    argv = [sys.executable, "-P", "-m", "pgoverlay", "branch", "destroy", name]
    t0 = now()
    done = subprocess.run(
        argv,
        env=cli_env(pool.settings),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd="/",
    )
    took = now() - t0
    if done.returncode != 0 or pool.registry.branch(name) is not None:
        raise RuntimeError(f"`pgoverlay branch destroy {name}` failed: {done.stderr.strip()}")
    settle(pool, now())  # the next cycle starts from a settled image
    return took


def mount_without_discard(settings: Settings) -> Pool:
    """Mount pool B's image again as an older pgoverlay did: without discard."""
    root = settings.home / "pool"
    for point in mounts.mounts_under(root):
        mounts.unmount(Path(point))
    mounts.unmount(root)
    proc.run(["mount", "-o", "loop,noatime", settings.home / "pool.img", root], timeout=120)
    if discard.discards(root):
        raise RuntimeError(f"{root} is still mounted with discard")
    pool = Pool.open(settings)
    poolmod.remount_bases(pool)
    return pool


def span(values: list[float], unit: str = "s", digits: int = 3) -> str:
    if not values:
        return "—"
    med = statistics.median(values)
    return f"{med:.{digits}f} {unit} ({min(values):.{digits}f} – {max(values):.{digits}f})"


def size_span(values: list[int]) -> str:
    med = int(statistics.median(values))
    return f"{_mib(med)} ({_mib(min(values))} – {_mib(max(values))})"


def _mib(n: int) -> str:
    if abs(n) < MiB:
        return f"{n / MiB:.1f} MiB"
    return ("-" if n < 0 else "") + format_bytes(abs(n))


def back_cell(samples: list[Sample]) -> str:
    given = [s for s in samples if s.left_after <= s.filled / 2]
    if not given:
        return "not given back"
    cell = span([s.back_s or 0.0 for s in given], digits=2)
    if len(given) < len(samples):
        cell += f"; kept in {len(samples) - len(given)} of {len(samples)}"
    timeouts = sum(s.timed_out for s in samples)
    if timeouts:
        cell += f"; still falling after {SETTLE_TIMEOUT:.0f} s in {timeouts}"
    return cell


def render(results: Results, **ctx: object) -> str:
    rows = []
    for mode, label in MODES.items():
        samples = results.inproc[mode]
        cli = span(results.cli[mode]) if mode in results.cli else "—"
        rows.append(
            f"| {label} | {span([s.destroy_s for s in samples])} | {cli} | "
            f"{size_span([s.left_now for s in samples])} | "
            f"{size_span([s.left_after for s in samples])} | {back_cell(samples)} |"
        )
    filled = [s.filled for m in MODES for s in results.inproc[m]]
    return f"""{START}
## Discard: giving a destroyed branch's blocks back to the host

Generated by `{ctx["cmd"]}`. Two {ctx["pool_size"]} pool images with
the same small base: A mounted with `discard` (as `pool init` mounts it), B mounted without it
(as an older pgoverlay did), so pgoverlay runs `fstrim` on it after every destroy; "neither"
destroys in B with that `fstrim` skipped. In every round each mode takes its turn: create a
branch, fill it ({FILL_ROWS:,} rows of 1,920 bytes, then CHECKPOINT and sync; the fill added
{size_span(filled)} to `pool.img`'s allocated blocks), time `branch.destroy` in the process,
then read the allocation (at most {SETTLE_LOOK * 1000:.0f} ms apart, without syncing) until it
has not fallen for {SETTLE_QUIET:.0f} s (at most {SETTLE_TIMEOUT:.0f} s). Allocation left is
`pool.img`'s allocated bytes above the level before the create; the time to give the blocks
back runs from the destroy's return to the last fall (0 when they were back by then).
"Destroy as a process" is the whole command `pgoverlay branch destroy NAME` (interpreter start
included) on a branch filled the same way, A and B in turns within the same rounds. After every
"neither" round the image is trimmed, so the next round starts clean; that `fstrim` alone took
{span(results.trim_after_neither)}.
Cells are the median with the range over {ctx["rounds"]} rounds.

{machine_rows(ctx)}
| Load average | {ctx["load"]} (1, 5, 15 min) when the run started; the machine is shared |
| Work dir | `{ctx["work"]}` on {ctx["work_fs"]}; the pool images are sparse XFS files in it |
| Postgres | {ctx["postgres"]} |

{HEADER}
{chr(10).join(rows)}
{END}
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Benchmark discard on the pool image (root).")
    parser.add_argument("--rounds", type=int, default=5, help="destroys per mode")
    parser.add_argument("--pool-size", default="8G", help="sparse size of each pool image")
    parser.add_argument("--work", default="/var/tmp/pgoverlay-bench-discard", help="work dir")
    args = parser.parse_args(argv)
    work, load = start(args.work)
    settings_a = Settings(home=work / "pool-a", port_min=56300, port_max=56349, runtime="local")
    settings_b = Settings(home=work / "pool-b", port_min=56350, port_max=56399, runtime="local")
    install = pgbin.newest(settings_a.pg_bindir)
    owner = proc.OsUser.lookup(settings_a.os_user)
    started, t_start = dt.datetime.now(dt.UTC), now()
    results = Results()
    pools: dict[str, Pool] = {}
    try:
        datadir = build_source(work, owner, install, small_app)
        with cluster.running(install, datadir, owner=owner, scratch=work / "tmp") as srv:
            dsn = make_conninfo(
                host=os.fspath(srv.socket_dir), port=srv.port, user="postgres", dbname="app"
            )
            for settings in (settings_a, settings_b):
                p = poolmod.init(settings, size=args.pool_size)
                try:
                    seed.seed(p, BASE, source_dsn=dsn)
                finally:
                    p.close()
        pools["discard"] = Pool.open(settings_a)
        if not discard.discards(pools["discard"].root):
            raise RuntimeError("pool A is not mounted with discard")
        pools["fstrim"] = pools["neither"] = mount_without_discard(settings_b)
        for i in range(1, args.rounds + 1):
            for mode in MODES:
                sample = inproc_cycle(pools[mode], mode, f"discard-bench-{mode}-{i}")
                results.inproc[mode].append(sample)
                if mode == "neither":
                    t0 = now()
                    discard.trim(pools[mode].root)
                    results.trim_after_neither.append(now() - t0)
                    settle(pools[mode], now())
            for mode in CLI_MODES:
                results.cli[mode].append(cli_cycle(pools[mode], f"discard-bench-cli-{mode}-{i}"))
            done = "; ".join(
                f"{m} {results.inproc[m][-1].destroy_s:.3f} s, "
                f"left {_mib(results.inproc[m][-1].left_after)}"
                for m in MODES
            )
            cli = ", ".join(f"{m} {results.cli[m][-1]:.3f} s" for m in CLI_MODES)
            print(f"round {i}/{args.rounds}: {done}; as a process: {cli}", flush=True)
        section = render(
            results,
            cmd=" ".join(["python bench/discard.py", *argv]),
            pool_size=args.pool_size,
            rounds=args.rounds,
            started=started,
            minutes=(now() - t_start) / 60,
            load=load,
            work=work,
            work_fs=poolmod.fs_type(work),
            postgres=install.version,
        )
    finally:
        for p in {id(p): p for p in pools.values()}.values():
            p.close()
        for settings in (settings_a, settings_b):
            dismantle(settings)
        shutil.rmtree(work, ignore_errors=True)
    write_report(section, start=START, end=END)
    sys.stdout.write(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
