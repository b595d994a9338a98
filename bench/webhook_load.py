#!/usr/bin/env python3
"""Webhook load benchmark: delivery acknowledgement latency while the workers are busy.

    sudo .venv/bin/python bench/webhook_load.py [--deliveries 2000] [--rate 200] [--keep]

A pool of its own, the fake GitHub API (tests/fakegithub.py), a real `pgoverlay webhook serve`
on loopback, and two scenarios in one run. Busy: 10 senders post paced, signed `pull_request`
deliveries for PRs that each get a fresh branch, while both workers create branches and run
migrations; then a bounded wait for the queue to drain and checks that nothing was lost or run
twice. Idle: deliveries the listener records and ignores, sent to the then idle listener. The
report replaces the webhook section of docs/benchmarks.md. No timing is asserted; a failed
correctness check exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import io
import json
import multiprocessing
import os
import platform
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import sysconfig
import tarfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
import requests
import yaml
from engine_report import REPORT, first_field, quantile, write_report
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.fspath(ROOT / "tests"))
from test_webhook_e2e import AS_LISTENER, SYSTEM_PYTHON  # noqa: E402

from fakegithub import FakeGitHub  # noqa: E402
from pgoverlay.runner import branch, demo, seed  # noqa: E402
from pgoverlay.runner import pool as poolmod  # noqa: E402
from pgoverlay.runner.polling import wait_for  # noqa: E402
from pgoverlay.runner.pool import mounts  # noqa: E402
from pgoverlay.runner.postgres import binaries as pgbin  # noqa: E402
from pgoverlay.runner.service import serve  # noqa: E402
from pgoverlay.runner.settings import Settings  # noqa: E402
from pgoverlay.runner.units import format_bytes  # noqa: E402
from pgoverlay.webhook.signature import sign  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "github" / "webhooks"
START, END = "<!-- webhook:start -->", "<!-- webhook:end -->"
REPO, OTHER, BASE_NAME, FIRST_PR = "acme/shop", "acme/elsewhere", "bench", 100
SECRET, TOKEN, BASE_SHA = "webhook-bench-secret", "ghp_webhookBenchToken0123", "b" * 40
PORTS = "56300-56399"
LISTENER_USER = "pgoverlay-webhook"  # the user `webhook setup` makes by default
TARGET_P99_MS, REDELIVERED, BASELINE = 50.0, 0.05, 500  # ms; share of the ids; deliveries
console = Console(highlight=False)


@dataclass(frozen=True)
class Delivery:
    index: int  # its slot in the schedule: sent at start + index / rate
    delivery_id: str
    pr: int
    action: str
    head_sha: str
    redelivery: bool
    body: bytes


@dataclass(frozen=True)
class Ack:
    status: int  # 0: no answer
    seconds: float  # request sent -> response received
    lag: float  # how late the request left against its slot
    sent_at: float


def payload(template: dict[str, Any], action: str, pr: int, sha: str, before: str | None) -> bytes:
    """A real-shaped delivery for ``REPO``, as GitHub sends it: compact JSON."""
    data = json.loads(json.dumps(template))
    data.update(action=action, number=pr)
    pull = data["pull_request"]
    pull.update(number=pr, state="open", draft=False, merged=False, labels=[])
    for side, side_sha in (("head", sha), ("base", BASE_SHA)):
        pull[side]["sha"] = side_sha
        pull[side]["repo"]["full_name"] = REPO
    data["repository"]["full_name"] = REPO
    if action == "synchronize":
        data.update(before=before, after=sha)
    return json.dumps(data, separators=(",", ":")).encode()


def plan(total: int, prs: int, share: float, rng: random.Random) -> list[Delivery]:
    """New deliveries round-robin over the PRs (opened first), redeliveries mixed in later."""
    templates = {
        a: json.loads((FIXTURES / f"pull_request.{a}.json").read_text())
        for a in ("opened", "synchronize")
    }
    fresh = total - round(total * share)
    heads: dict[int, list[str]] = {}
    rows: list[tuple[float, Delivery]] = []
    for i in range(fresh):
        pr = FIRST_PR + i % prs
        pushes = heads.setdefault(pr, [])
        action = "synchronize" if pushes else "opened"
        sha = hashlib.sha1(f"{pr}/{len(pushes)}".encode()).hexdigest()
        body = payload(templates[action], action, pr, sha, pushes[-1] if pushes else None)
        pushes.append(sha)
        delivery_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        rows.append((float(i), Delivery(0, delivery_id, pr, action, sha, False, body)))
    for j in rng.sample(range(fresh - 1), min(total - fresh, fresh - 1)):
        rows.append((rng.uniform(j + 0.5, fresh - 0.5), replace(rows[j][1], redelivery=True)))
    rows.sort(key=lambda row: row[0])
    return [replace(d, index=i) for i, (_, d) in enumerate(rows)]


def tarball(sha: str, files: dict[str, str]) -> bytes:
    """A GitHub-style tarball: one top-level folder holding the repository at ``sha``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"acme-shop-{sha[:7]}/{name}")
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def send(url: str, mine: list[Delivery], acks: dict[int, Ack], t0: float, rate: float) -> None:
    """One client: its deliveries in schedule order, over one keep-alive connection."""
    with requests.Session() as session:
        for d in mine:
            due = t0 + d.index / rate
            time.sleep(max(due - time.perf_counter(), 0.0))
            headers = {
                "X-GitHub-Event": "pull_request",
                "X-GitHub-Delivery": d.delivery_id,
                "X-Hub-Signature-256": sign(SECRET, d.body),
                "Content-Type": "application/json",
                "User-Agent": "GitHub-Hookshot/bench",
            }
            start = time.perf_counter()
            try:
                status = session.post(url, data=d.body, headers=headers, timeout=10).status_code
            except requests.RequestException:
                status = 0
            acks[d.index] = Ack(status, time.perf_counter() - start, start - due, start)


def load(url: str, deliveries: list[Delivery], clients: int, rate: float) -> dict[int, Ack]:
    """Send on schedule from ``clients`` threads; a PR's deliveries stay on one (in order)."""
    lanes: dict[int, list[Delivery]] = {}
    for d in deliveries:
        lanes.setdefault(d.pr % clients, []).append(d)
    acks: dict[int, Ack] = {}
    t0 = time.perf_counter() + 0.5
    threads = [threading.Thread(target=send, args=(url, m, acks, t0, rate)) for m in lanes.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return acks


def load_elsewhere(url: str, deliveries: list[Delivery], clients: int, rate: float) -> list[Ack]:
    """The clients get a process of their own: the fake GitHub, busy answering the workers,
    must not hold their GIL while they time requests."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        job = pool.submit(load, url, deliveries, clients, rate)
        acks = job.result(timeout=len(deliveries) / rate + 600)
    return [acks.get(d.index, Ack(-1, 0.0, 0.0, 0.0)) for d in deliveries]


def move_heads(
    github: FakeGitHub,
    deliveries: list[Delivery],
    rate: float,
    start: float,
    stop: threading.Event,
) -> None:
    """GitHub's side of each push: the pull request's head moves in the API when the push is
    made, before its `synchronize` is delivered (the senders start after ``start``). Workers
    act on the head the API gives them, not on the delivery's."""
    for d in deliveries:
        if d.redelivery or d.action != "synchronize":
            continue
        if stop.wait(max(start + d.index / rate - time.perf_counter(), 0.0)):
            return
        with github.locked():
            github.pull(REPO, d.pr)["head_sha"] = d.head_sha


def read_only(path: Path, query: str, args: tuple[Any, ...] = ()) -> list[Any]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return db.execute(query, args).fetchall()
    finally:
        db.close()


def processes(pid: int) -> str:
    """How the listener runs: one process, or intake plus a worker process at some nice."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if not children:
        return "one process (intake and workers share it)"
    nice = [
        int(Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1].split()[16]) for c in children
    ]
    return f"intake, and a worker process at nice {', '.join(map(str, nice))}"


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.work = args, Path(args.work).resolve()
        low, _, high = args.ports.partition("-")
        self.ports = (int(low), int(high))
        self.settings = Settings(
            home=self.work / "pool-home",
            port_min=self.ports[0],
            port_max=self.ports[1],
            # one repository's many pull requests at once: above the service's default limits
            max_branches=args.prs + 10,
            max_branches_per_repository=args.prs + 10,
        )
        self.install = pgbin.newest(self.settings.pg_bindir)
        self.state = self.work / "listener-state"  # the listener's state_dir
        self.queue = self.state / "queue.db"  # the default place in it
        self.log = self.work / "listener.log"
        self.pool: poolmod.Pool | None = None
        self.listener: subprocess.Popen[bytes] | None = None
        self.processes = ""

    def open_pool(self) -> poolmod.Pool:
        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o755)  # Postgres (another user) must reach what is below
        self.pool = pool = poolmod.init(self.settings, size="4G")
        for b in pool.registry.branches():  # left by a kept or killed run
            branch.destroy(pool, b.name)
        shutil.rmtree(self.state, ignore_errors=True)
        if pool.registry.latest_base(BASE_NAME) is None:  # a small base (~35 MB): enough here
            demo.seed_demo(pool, BASE_NAME, scale=1)
        console.log(serve.start(self.settings))  # the listener asks the engine service
        return pool

    def start_listener(self, github: FakeGitHub) -> str:
        config = self.work / "webhook.yml"  # every setting can come from the file too
        repos = {REPO: {"migrations": "db/migrations"}}
        auth = {"secret": SECRET, "token": TOKEN, "api_url": github.url}
        settings = {"repositories": repos, "workers": self.args.workers, "reconcile_interval": 3600}
        config.write_text(yaml.safe_dump({**auth, **settings}))
        config.chmod(0o644)
        # The listener runs as its own user (it refuses root), made as an admin makes it.
        setup = ["webhook", "setup", "--user", LISTENER_USER, "--state-dir", str(self.state)]
        subprocess.run(
            [sys.executable, "-P", "-m", "pgoverlay", *setup], check=True, capture_output=True
        )
        env = {
            **os.environ,
            "PGOVERLAY_HOME": os.fspath(self.settings.home),
            "PGOVERLAY_PORT_MIN": str(self.ports[0]),
            "PGOVERLAY_PORT_MAX": str(self.ports[1]),
            "PGOVERLAY_WEBHOOK_CONFIG": os.fspath(config),
            "PGOVERLAY_WEBHOOK_STATE_DIR": os.fspath(self.state),
        }
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        serve = ["webhook", "serve", "--host", "127.0.0.1", "--port", str(port)]
        purelib = sysconfig.get_paths()["purelib"]
        self.listener = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", AS_LISTENER, purelib, LISTENER_USER, *serve],
            env=env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: self.healthy(url), timeout=120, what="the listener's /healthz")
        self.processes = processes(self.listener.pid)
        return url

    def healthy(self, url: str) -> bool:
        if self.listener is None or self.listener.poll() is not None:
            raise RuntimeError(f"the listener exited: {self.log.read_text()[-2000:]}")
        with contextlib.suppress(requests.ConnectionError):
            return requests.get(f"{url}/healthz", timeout=2).status_code == 200
        return False

    def stop_listener(self) -> float:
        """SIGTERM, as systemd sends; the seconds it took to exit."""
        child, self.listener, start = self.listener, None, time.perf_counter()
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=180)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=30)
        return time.perf_counter() - start

    def run(self, github: FakeGitHub, deliveries: list[Delivery]) -> dict[str, Any]:
        a = self.args
        url = self.start_listener(github)
        console.log(f"sending {len(deliveries)} deliveries from {a.clients} clients …")
        sent_all = threading.Event()
        pushes = threading.Thread(
            target=move_heads, args=(github, deliveries, a.rate, time.perf_counter(), sent_all)
        )
        pushes.start()
        try:
            acks = load_elsewhere(f"{url}/webhook", deliveries, a.clients, a.rate)
        finally:
            sent_all.set()
            pushes.join()
        sent, sent_wall = time.perf_counter(), time.time()
        opens = "SELECT count(*) FROM jobs WHERE kind = 'open'"
        busy_opens = read_only(
            self.queue, opens + " AND (finished_at IS NULL OR finished_at > ?)", (sent_wall,)
        )[0][0]
        console.log("waiting for the queue to drain …")
        busy = "SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')"
        wait_for(
            lambda: read_only(self.queue, busy)[0][0] == 0,
            timeout=a.drain_timeout,
            what="the job queue to drain",
            max_interval=1.0,
        )
        drain = time.perf_counter() - sent
        console.log(f"baseline: {a.baseline} deliveries of {OTHER} to the idle listener …")
        fresh = [d for d in deliveries if not d.redelivery]  # a repeated body is a duplicate
        moved = [(d, d.body.replace(b'"acme/shop"', b'"acme/elsewhere"')) for d in fresh]
        other = [replace(d, delivery_id=f"b-{d.index}", body=b) for d, b in moved[: a.baseline]]
        baseline = load_elsewhere(f"{url}/webhook", other, a.clients, a.rate)
        stop = self.stop_listener()
        return dict(
            acks=acks,
            baseline=baseline,
            drain=drain,
            stop=stop,
            busy_opens=busy_opens,
            processes=self.processes,
        )

    def verify(
        self, github: FakeGitHub, deliveries: list[Delivery], run: dict[str, Any]
    ) -> Counter[str]:
        assert self.pool is not None
        c: Counter[str] = Counter()
        fresh = [d for d in deliveries if not d.redelivery]
        for d, ack in zip(deliveries, run["acks"], strict=True):
            c[f"ack_{ack.status}"] += 1
            c["ack_unexpected"] += ack.status != (200 if d.redelivery else 202)
        c["baseline_not_204"] = sum(ack.status != 204 for ack in run["baseline"])
        recorded = {row[0] for row in read_only(self.queue, "SELECT delivery_id FROM deliveries")}
        c["lost"] = sum(d.delivery_id not in recorded for d in fresh)
        jobs = Counter(row[0] for row in read_only(self.queue, "SELECT delivery_id FROM jobs"))
        c["jobs"] = sum(jobs.values())
        c["deliveries_with_2_jobs"] = sum(n > 1 for n in jobs.values())
        for state, n in read_only(self.queue, "SELECT state, count(*) FROM jobs GROUP BY state"):
            c[f"state_{state}"] = n
        c["attempts"] = read_only(self.queue, "SELECT max(attempts) FROM jobs")[0][0] or 0
        ended = re.findall(r" job (\d+) (?:done|failed)", self.log.read_text())
        c["jobs_ended_twice"] = sum(n > 1 for n in Counter(ended).values())
        statuses: dict[str, Counter[str]] = {}
        for s in github.state.statuses:
            statuses.setdefault(str(s["sha"]), Counter())[str(s["state"])] += 1
        c["heads_worked_twice"] = sum(
            n["pending"] > 1 or n["success"] + n["failure"] + n["error"] > 1
            for n in statuses.values()
        )
        per_pr = Counter(x["issue"] for x in github.state.comments)
        c["comments_extra"] = sum(n - 1 for n in per_pr.values())
        names = [b.name for b in self.pool.registry.branches()]
        last = {d.pr: d.head_sha for d in fresh}
        c["prs_without_one_branch"] = sum(names.count(f"shop-pr-{pr}") != 1 for pr in last)
        for pr, sha in last.items():
            made = self.pool.registry.branch(f"shop-pr-{pr}")
            if made is not None:
                with psycopg.connect(**branch.connection(self.pool, made).connect_kwargs()) as conn:
                    row = conn.execute("SELECT obj_description('widgets'::regclass)").fetchone()
                c["branches_not_at_last_push"] += (row[0] if row else None) != sha
        c["violations"] = len(github.violations)
        return c

    def cleanup(self, *, keep: bool) -> None:
        self.stop_listener()
        serve.stop(self.settings)
        pool, self.pool = self.pool, None
        if pool is not None and not keep:
            for b in pool.registry.branches():
                branch.destroy(pool, b.name)
            for v in pool.registry.bases():
                seed.remove_version(pool, v.name, v.version)
            shutil.rmtree(pool.socket_root, ignore_errors=True)
        if pool is not None:
            pool.close()
        if not keep:
            pool_mount = os.fspath(self.settings.home / "pool")
            for target in [*mounts.mounts_under(self.work), pool_mount]:
                mounts.unmount(Path(target))  # deepest first, the pool image last
            shutil.rmtree(self.work, ignore_errors=True)


def checks(a: argparse.Namespace, c: Counter[str], fresh: int) -> list[tuple[str, int, int]]:
    """(what, counted, expected) for every correctness check."""
    return [
        ("new deliveries acknowledged 202 (queued)", c["ack_202"], fresh),
        ("redeliveries acknowledged 200 (duplicate)", c["ack_200"], a.deliveries - fresh),
        ("answers other than expected (202 new, 200 redelivery)", c["ack_unexpected"], 0),
        ("new deliveries missing from the queue's deliveries table", c["lost"], 0),
        ("jobs queued (one per new delivery: redeliveries queue none)", c["jobs"], fresh),
        ("deliveries with more than one job", c["deliveries_with_2_jobs"], 0),
        ("job ids ended more than once (listener log)", c["jobs_ended_twice"], 0),
        ("heads given a second pending or final commit status", c["heads_worked_twice"], 0),
        ("PRs without exactly one branch", c["prs_without_one_branch"], 0),
        ("branches whose schema is not the PR's last push", c["branches_not_at_last_push"], 0),
        ("extra PR comments (one sticky comment per PR)", c["comments_extra"], 0),
        ("baseline deliveries not acknowledged 204 (ignored)", c["baseline_not_204"], 0),
        ("fake GitHub OpenAPI violations", c["violations"], 0),
    ]


def latency_row(label: str, acks: list[Ack], *, target: bool) -> str:
    answered = [a for a in acks if a.status > 0]
    ms = [a.seconds * 1000 for a in answered]
    p = [quantile(ms, q) for q in (0.5, 0.9, 0.99)]
    span = max(a.sent_at + a.seconds for a in answered) - min(a.sent_at for a in answered)
    verdict = ("**met**" if p[2] < TARGET_P99_MS else "**not met**") if target else ""
    return (
        f"| {label} | {p[0]:.1f} | {p[1]:.1f} | {p[2]:.1f} | {max(ms):.1f} | {len(ms) / span:.0f}/s"
        f" ({len(ms)} in {span:.1f} s) | {max(a.lag for a in acks) * 1000:.0f} | {verdict} |"
    )


def render(a: argparse.Namespace, run: dict[str, Any], c: Counter[str]) -> str:
    ram = int(first_field("/proc/meminfo", "MemTotal").split()[0]) * 1024
    rows = [
        f"| {w} | {n} | {e} | {'ok' if n == e else '**FAILED**'} |"
        for w, n, e in checks(a, c, run["fresh"])
    ]
    states = ", ".join(f"{k[6:]} {v}" for k, v in sorted(c.items()) if k.startswith("state_"))
    nl = "\n"
    return f"""\
{START}
## Webhook listener under load

Generated by `{" ".join(["python bench/webhook_load.py", *run["argv"]])}`: a real
`pgoverlay webhook serve` (uvicorn, {a.workers} workers) on loopback, with the fake GitHub API.
Two scenarios, in one run:

- **Busy workers.** {a.clients} senders (threads with keep-alive sessions, in a process of their
  own) send {a.deliveries} signed `pull_request` deliveries (compact JSON shaped like GitHub's
  examples, {format_bytes(run["body_bytes"])} on average) at up to {a.rate:g} a second: {a.prs}
  PRs, each `opened` (a fresh branch) then pushed to (`synchronize`),
  {a.deliveries - run["fresh"]} of them redeliveries of earlier ids. Every push carries a
  migration with `SELECT pg_sleep({a.sleep:g})`. The {a.prs} fresh branches keep both workers
  creating branches and migrating for the whole scenario: when its last delivery was
  acknowledged, {run["busy_opens"]} of the {a.prs} `opened` jobs had not finished yet.
- **Idle workers.** Once the queue has drained, {a.baseline} deliveries of a repository outside
  the allow-list (recorded, acknowledged 204, no job).

*Acknowledgement latency*: from sending a request to its HTTP response, timed by the client.

### Machine

| | |
|---|---|
| Date | {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC (the run took {run["elapsed"] / 60:.1f} min) |
| CPU | {first_field("/proc/cpuinfo", "model name")}, {os.cpu_count()} cores |
| RAM | {format_bytes(ram)} |
| Kernel | {platform.system()} {platform.release()} |
| Work dir | `{a.work}` on {poolmod.fs_type(Path(a.work))}; the pool is a sparse xfs image in it |
| Queue | SQLite (WAL, synchronous=FULL) in the listener's `state_dir`: the default place |
| Listener | {run["processes"]} |
| Postgres | {run["postgres"]} |

### Acknowledgement latency (ms)

Target: p99 under {TARGET_P99_MS:g} ms while the workers migrate.

| deliveries | median | p90 | p99 | max | throughput | latest start behind schedule (ms) | target |
|---|---|---|---|---|---|---|---|
{latency_row("busy: workers create fresh branches and migrate", run["acks"], target=True)}
{latency_row("idle workers", run["baseline"], target=False)}

The tail moves from run to run: branch starts and migrations compete with the listener for the
CPU and the disk. Run it more than once before reading much into one p99.

### Nothing lost, nothing run twice

| check | counted | expected | |
|---|---|---|---|
{nl.join(rows)}

Jobs by final state: {states}; most starts of one job: {c["attempts"]}. The queue drained
{run["drain"]:.1f} s after the last acknowledgement (a push skips its PR's older queued pushes).
SIGTERM then stopped the listener in {run["stop"]:.1f} s.
{END}
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Load the webhook listener (run as root).")
    add = parser.add_argument
    add("--deliveries", type=int, default=2000, help="requests, redeliveries included")
    add("--prs", type=int, default=60, help="pull requests the deliveries are spread over")
    add("--rate", type=float, default=200.0, help="deliveries a second, at most")
    add("--clients", type=int, default=10, help="senders (client threads)")
    add("--workers", type=int, default=2, help="the listener's workers")
    add("--sleep", type=float, default=0.5, help="pg_sleep seconds in every migration")
    add("--drain-timeout", type=float, default=900.0, help="seconds to wait for the queue")
    add("--work", default="/var/tmp/pgoverlay-webhook-bench", help="work directory")
    add("--ports", default=PORTS, help="the branches' port range, LOW-HIGH")
    add("--keep", action="store_true", help="keep the pool, its base and the branches")
    a = parser.parse_args(argv)
    if not (a.prs >= 1 and 2 * a.prs < a.deliveries <= 100_000 and a.rate > 0 and a.clients > 0):
        parser.error("need 1+ PRs, 2+ deliveries per PR (100,000 at most), a rate and a client")
    a.baseline = min(BASELINE, a.deliveries)
    poolmod.require_root()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally blocks run
    started = time.perf_counter()
    deliveries = plan(a.deliveries, a.prs, REDELIVERED, random.Random(1))
    bench = Bench(a)
    try:
        console.log(f"pool and base under {bench.work} …")
        bench.open_pool()
        with FakeGitHub() as github:
            github.add_token(TOKEN, "pgoverlay-bot")
            old = {"db/migrations/000_old.sql": "SELECT 1;\n"}
            github.add_tarball(REPO, BASE_SHA, tarball(BASE_SHA, old))
            for d in (d for d in deliveries if not d.redelivery):
                if d.action == "opened":
                    github.add_pull(REPO, d.pr, d.head_sha, BASE_SHA)
                sql = f"SELECT pg_sleep({a.sleep:g});\nCREATE TABLE widgets (id int);\n"
                sql += f"COMMENT ON TABLE widgets IS '{d.head_sha}';\n"  # the push it came from
                new = {**old, "db/migrations/001_widgets.sql": sql}
                github.add_tarball(REPO, d.head_sha, tarball(d.head_sha, new))
            run = bench.run(github, deliveries)
            console.log("verifying …")
            counts = bench.verify(github, deliveries, run)
        run.update(argv=argv, elapsed=time.perf_counter() - started, postgres=bench.install.version)
        run.update(fresh=sum(not d.redelivery for d in deliveries))
        run.update(body_bytes=sum(len(d.body) for d in deliveries) // len(deliveries))
        write_report(render(a, run, counts), start=START, end=END)
        console.log(f"report written to {REPORT}")
    finally:
        bench.cleanup(keep=a.keep)
    failed = [what for what, n, want in checks(a, counts, run["fresh"]) if n != want]
    for what in failed:
        console.print(f"[red]check failed:[/] {what}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
