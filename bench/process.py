#!/usr/bin/env python3
"""Start-up benchmark: what users wait for, measured as whole processes.

    sudo .venv/bin/python bench/process.py [--checkout DIR] [--label after] [--runs 15]
        [--act-runs 5] [--work DIR] [--baseline FILE] [--no-report]

``--checkout`` is the pgoverlay checkout measured (default: this one); its own virtual
environment (``DIR/.venv``) runs every command, its CLI makes the pool and seeds the base
(`base seed NAME --demo --scale 1`) and starts the pool's engine service, and `act` runs its
action.yml. So the same script measures an older checkout as a baseline: its figures are kept in
``WORK/results-LABEL.json``, and ``--baseline`` puts them next to this run's in the report.

Each round runs, in turn and as root: `pgoverlay --help`, `branch list`, `branch status`,
`branch connect` and `base list` (a branch exists), then `branch create` + `branch destroy`
(each a process) paired with `pg_ctl start -w` + `pg_ctl stop -m fast` of a plain copy of the
same base on the same disk; which of the pair goes first alternates. A wall time is
``time.perf_counter()`` around ``subprocess.run`` (hyperfine is not installed).

Then `act` runs the test suite's workflow (tests/test_action_e2e.py, against the fake GitHub
API of tests/fakegithub.py) as an unprivileged runner of the `pgoverlay` group: once to fill
the tool cache, then ``--act-runs`` times `opened` (create, migrate, comment) and `closed`
(destroy, comment). act's log gives each step's time; the Action's own log line
(`pgoverlay: timings: ...`, where the checkout prints one) splits the run step into its start
(interpreter and imports), branch, migrations and comment.

The Markdown section replaces the one between the process markers in docs/benchmarks.md. A
measurement script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import grp
import json
import os
import pwd
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine_report import REPORT, machine_line, write_report

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.fspath(ROOT / "tests"))

START, END = "<!-- process:start -->", "<!-- process:end -->"
BASE = "procbench"
BRANCH = "procbench-b"
PORTS = (56500, 56599)
RUNNER = "pgo-bench-runner"
REPO, PR = "acme/shop", 7
TOKEN = "ghs_benchJobToken0123456789"
READ_ONLY = {
    "help": ["--help"],
    "branch list": ["branch", "list"],
    "branch status": ["branch", "status", BRANCH],
    "branch connect": ["branch", "connect", BRANCH],
    "base list": ["base", "list"],
}


def service_pids(home: Path) -> list[int]:
    """The engine service of the pool at ``home`` (started by `pool init`): found by its
    environment."""
    wanted = f"PGOVERLAY_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if b"pgoverlay\0service" in cmdline and wanted in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def timed(argv: list[str], env: dict[str, str], **kwargs: Any) -> float:
    """Wall seconds of one whole process; it must succeed."""
    started = time.perf_counter()
    # From /: `python -m pgoverlay` (the service `pool init` starts) must not find a checkout's
    # pgoverlay/ folder in the working directory before the measured checkout's own.
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, check=False, cwd="/", **kwargs
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {"median": statistics.median(ordered), "p90": p90, "n": len(ordered)}


class Bench:
    def __init__(self, checkout: Path, work: Path) -> None:
        self.checkout = checkout
        self.bin = checkout / ".venv" / "bin"
        self.work = work
        self.home = work / "pool"
        # Python writes its bytecode caches as it would for a user (an install has them), and
        # branches run as processes: a Docker daemon other work starts and stops on this shared
        # machine would otherwise decide `auto` from one round to the next.
        inherited = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.env = {
            **inherited,
            "PGOVERLAY_RUNTIME": "local",
            "PGOVERLAY_HOME": os.fspath(self.home),
            "PGOVERLAY_PORT_MIN": str(PORTS[0]),
            "PGOVERLAY_PORT_MAX": str(PORTS[1] - 10),  # the top ten: the plain copy's
        }

    def cli(self, *args: str) -> float:
        return timed([os.fspath(self.bin / "pgoverlay"), *self.spelled(args)], self.env)

    def untimed(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`pgoverlay ARGS` as root, for its answer."""
        return subprocess.run(
            [os.fspath(self.bin / "pgoverlay"), *self.spelled(args)],
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
            cwd="/",
        )

    @functools.cached_property
    def has_base_group(self) -> bool:
        """Whether the checkout has `pgoverlay base` (from 2026-12-02)."""
        done = subprocess.run(
            [os.fspath(self.bin / "pgoverlay"), "base", "--help"],
            env=self.env,
            capture_output=True,
            check=False,
            cwd="/",
        )
        return done.returncode == 0

    def spelled(self, args: tuple[str, ...]) -> tuple[str, ...]:
        """``args`` as the measured checkout spells them: an older one than the `base` command
        group has `seed NAME` for `base seed NAME`, and `seed list|rm|warm` for the rest (the
        new checkout takes both, with a deprecation line, but is measured in its own)."""
        if args[:1] != ("base",) or self.has_base_group:
            return args
        return ("seed", *args[2:]) if args[1:2] == ("seed",) else ("seed", *args[1:])

    # -- setup ------------------------------------------------------------------------------
    def prepare(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o755)
        try:
            self.cli("pool", "init", "--size", "3G")  # starts the engine service too
        except SystemExit as err:  # a busy machine may keep the service from answering in time
            print(f"pool init again: {err}", file=sys.stderr)
            self.cli("pool", "init", "--size", "3G")
        self.cli("base", "seed", BASE, "--demo", "--scale", "1")
        self.cli("branch", "create", BRANCH)

    def plain_copy(self) -> tuple[Path, Path, int]:
        """A plain copy of the base's data directory on the pool's disk, for pg_ctl."""
        from pgoverlay.runner.pool import Pool
        from pgoverlay.runner.settings import Settings

        pool = Pool.open(Settings(home=self.home))
        base = pool.registry.latest_base(BASE)
        assert base is not None
        copy = pool.root / "bench-plain"
        shutil.rmtree(copy, ignore_errors=True)
        subprocess.run(["cp", "-a", os.fspath(pool.base_dir(base.name, base.version)), copy])
        copy.chmod(0o700)
        pool.close()
        sockets = Path(tempfile.mkdtemp(prefix="procbench-", dir="/var/tmp"))
        owner = pwd.getpwnam("postgres")
        for path in (copy, sockets):
            subprocess.run(["chown", "-R", "postgres:postgres", os.fspath(path)], check=True)
        (copy / "postmaster.pid").unlink(missing_ok=True)
        return copy, sockets, owner.pw_uid

    def wait_warm(self) -> None:
        """Until the base has a ready warm branch (the service tops up every 2 s)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            listed = self.untimed("base", "list", "--json")
            base = next(b for b in json.loads(listed.stdout) if b["name"] == BASE)
            if any(w["ready"] for w in base.get("warm", [])):
                return
            time.sleep(0.2)
        raise SystemExit("the engine service did not start a warm branch within 60 s")

    def supports_warm(self) -> bool:
        """Whether the checkout measured keeps warm branches (`base warm`)."""
        return "--count" in self.untimed("base", "warm", "--help", check=False).stdout

    # -- rounds -----------------------------------------------------------------------------
    def rounds(self, runs: int) -> dict[str, list[float]]:
        from pgoverlay.runner.postgres import binaries as pgbin

        pg_ctl = os.fspath(pgbin.newest(None).tool("pg_ctl"))
        copy, sockets, uid = self.plain_copy()
        opts = (
            f"-p {PORTS[1]} -k {sockets} -c listen_addresses=127.0.0.1 -c shared_buffers=32MB "
            "-c logging_collector=off -c archive_mode=off"
        )
        as_pg: dict[str, Any] = {"user": uid, "group": pwd.getpwuid(uid).pw_gid}
        found: dict[str, list[float]] = {name: [] for name in READ_ONLY}
        found |= {"create": [], "destroy": [], "create+destroy": [], "pg_ctl": []}
        found |= {"pg_ctl start": [], "pg_ctl stop": []}
        warm = self.supports_warm()
        if warm:
            found |= {"create (warm)": [], "destroy (warm)": []}

        def pgoverlay_pair() -> None:
            created = self.cli("branch", "create", "procbench-x")
            destroyed = self.cli("branch", "destroy", "procbench-x")
            found["create"].append(created)
            found["destroy"].append(destroyed)
            found["create+destroy"].append(created + destroyed)

        def warm_pair() -> None:
            """Create claiming a warm branch the engine service started (and so holds a session
            to), as in steady use: `base warm` starts one in its own process, an untimed create
            takes that one, and the service starts its replacement. None is kept after, so the
            cold pair never finds one."""
            self.cli("base", "warm", BASE, "--count", "1")
            self.cli("branch", "create", "procbench-v")
            self.cli("branch", "destroy", "procbench-v")
            self.wait_warm()
            created = self.cli("branch", "create", "procbench-w")
            destroyed = self.cli("branch", "destroy", "procbench-w")
            self.cli("base", "warm", BASE, "--count", "0")
            found["create (warm)"].append(created)
            found["destroy (warm)"].append(destroyed)

        def pg_ctl_pair() -> None:
            log = os.fspath(sockets / "log")
            base = [pg_ctl, "-D", os.fspath(copy), "-l", log]
            start = timed([*base, "-o", opts, "-w", "start"], self.env, **as_pg)
            stop = timed([*base, "-m", "fast", "-w", "stop"], self.env, **as_pg)
            found["pg_ctl start"].append(start)
            found["pg_ctl stop"].append(stop)
            found["pg_ctl"].append(start + stop)

        for args in READ_ONLY.values():  # not measured: fills the bytecode caches
            self.cli(*args)
        try:
            for i in range(runs):
                for name, args in READ_ONLY.items():
                    found[name].append(self.cli(*args))
                pair: list[Callable[[], None]] = [pgoverlay_pair, pg_ctl_pair]
                pair += [warm_pair] if warm else []
                for step in pair[i % len(pair) :] + pair[: i % len(pair)]:
                    step()
        finally:
            shutil.rmtree(copy, ignore_errors=True)
            shutil.rmtree(sockets, ignore_errors=True)
        return found

    # -- the Action under act ---------------------------------------------------------------
    def action(self, runs: int) -> dict[str, list[float]]:
        from fakegithub import FakeGitHub
        from helpers import os_user

        user = os_user(RUNNER, groups=["pgoverlay"])
        root = Path(tempfile.mkdtemp(prefix="procbench-act-", dir="/var/tmp"))
        found: dict[str, list[float]] = {}
        try:
            with FakeGitHub() as github:
                github.add_token(TOKEN, "github-actions[bot]", kind="installation")
                github.add_pull(REPO, PR, "0" * 40, "0" * 40)
                scenario = ActScenario(root, self, github, user)
                head = scenario.commit_migration()
                for kind in ("opened", "closed"):  # fills the tool cache (its install is cold)
                    scenario.act(kind, head)
                for _ in range(runs):
                    for kind in ("opened", "closed"):
                        for key, value in scenario.act(kind, head).items():
                            found.setdefault(f"{kind}: {key}", []).append(value)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return found

    def service_pids(self) -> list[int]:
        return service_pids(self.home)

    def teardown(self) -> None:
        from pgoverlay.runner.polling import wait_for

        # `pool rm` removes the service's socket and the service exits when it notices; on a
        # busy machine that may be after the unmount is tried. Stop it first, and wait.
        pids = self.service_pids()
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not self.service_pids(), timeout=60, what="the engine service to exit")
        done = self.untimed("pool", "rm", "--yes", check=False)
        if done.returncode != 0:  # leave the pool for a look rather than delete under a mount
            print(f"pool rm failed, {self.home} is left:\n{done.stderr}", file=sys.stderr)
            return
        shutil.rmtree(self.home, ignore_errors=True)


WORKFLOW = """\
on:
  pull_request:
    types: [opened, closed]
jobs:
  database:
    runs-on: [self-hosted, pgoverlay]
    steps:
      - uses: actions/checkout@v4
      - uses: pgoverlay/action@v1
        with:
          migrations: db/migrations
"""

CHECKOUT = """\
name: checkout stand-in
description: Copies the test repository into the workspace.
runs:
  using: composite
  steps:
    - shell: bash
      env: { SOURCE: "${{ env.TEST_REPOSITORY }}" }
      run: cp -a "$SOURCE/." "$GITHUB_WORKSPACE/"
"""

# act: "✅  Success - Main Install pgoverlay [1.234567ms]" (or s, m...)
STEP = re.compile(r"Success - Main (?P<step>.+?) \[(?P<value>[\d.]+)(?P<unit>ms|s|m)\]")
TIMINGS = re.compile(r"pgoverlay: timings: (?P<items>.+)")
STEPS = {"Install pgoverlay": "install step", "Branch, migrate, comment": "run step"}


class ActScenario:
    """A git repository with a PR, as tests/test_action_e2e.py makes one."""

    def __init__(self, root: Path, bench: Bench, github: Any, user: pwd.struct_passwd) -> None:
        self.root, self.bench, self.github, self.user = root, bench, github, user
        self.repo = root / "repo"
        (root / "checkout").mkdir()
        (root / "checkout" / "action.yml").write_text(CHECKOUT)
        (self.repo / ".github" / "workflows").mkdir(parents=True)
        (self.repo / "db" / "migrations").mkdir(parents=True)
        (self.repo / ".github/workflows/db.yml").write_text(WORKFLOW)
        self.tool_cache = root / "toolcache"
        self.tool_cache.mkdir()
        self.git("init", "-q", "-b", "main")
        (self.repo / "db/migrations/000_existing.sql").write_text("SELECT 1;\n")
        self.base_sha = self.commit()
        self.git("checkout", "-qb", "feature")

    def git(self, *args: str) -> str:
        env = {
            "PATH": os.environ["PATH"],
            **{
                f"GIT_{who}_{what}": value
                for who in ("AUTHOR", "COMMITTER")
                for what, value in (("NAME", "dev"), ("EMAIL", "dev@example.com"))
            },
        }
        return subprocess.run(
            ["git", "-c", "safe.directory=*", "-C", os.fspath(self.repo), *args],
            check=True,
            env=env,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def commit(self) -> str:
        self.git("add", "-A")
        self.git("commit", "-qm", "change")
        subprocess.run(
            ["chown", "-R", f"{self.user.pw_uid}:{self.user.pw_gid}", os.fspath(self.root)],
            check=True,
        )
        return self.git("rev-parse", "HEAD")

    def commit_migration(self) -> str:
        (self.repo / "db/migrations/001_widgets.sql").write_text(
            "CREATE TABLE widgets (id int PRIMARY KEY, name text);\n"
        )
        return self.commit()

    def event(self, action: str, head_sha: str) -> Path:
        fixtures = ROOT / "tests" / "fixtures" / "github" / "webhooks"
        name = "opened" if action == "opened" else "closed"
        payload = json.loads((fixtures / f"pull_request.{name}.json").read_text())
        payload.update(action=action, number=PR)
        pull = payload["pull_request"]
        pull.update(number=PR, merged=False, draft=False)
        for side, sha in (("head", head_sha), ("base", self.base_sha)):
            pull[side]["sha"] = sha
            pull[side]["repo"].update(full_name=REPO, name="shop")
        payload["repository"].update(full_name=REPO, name="shop")
        path = self.root / f"{action}.json"
        path.write_text(json.dumps(payload))
        os.chown(path, self.user.pw_uid, self.user.pw_gid)
        return path

    def act(self, action: str, head_sha: str) -> dict[str, float]:
        """One workflow run; the seconds of its steps and of the Action's phases."""
        env = {
            "PGOVERLAY_HOME": self.bench.env["PGOVERLAY_HOME"],
            "PGOVERLAY_PORT_MIN": self.bench.env["PGOVERLAY_PORT_MIN"],
            "PGOVERLAY_PORT_MAX": self.bench.env["PGOVERLAY_PORT_MAX"],
            "PGOVERLAY_RUNTIME": "local",
            "GITHUB_API_URL": self.github.url,
            "TEST_REPOSITORY": os.fspath(self.repo),
            "RUNNER_TOOL_CACHE": os.fspath(self.tool_cache),
        }
        argv = [
            os.fspath(Path(sys.executable).parent / "act"),
            "pull_request", "-e", os.fspath(self.event(action, head_sha)),
            "-W", ".github/workflows/db.yml",
            "-P", "self-hosted=-self-hosted", "-P", "pgoverlay=-self-hosted",
            "--local-repository", f"pgoverlay/action@v1={self.bench.checkout}",
            "--local-repository", f"actions/checkout@v4={self.root / 'checkout'}",
            "--action-cache-path", os.fspath(self.root / "act-cache"),
            "-s", f"GITHUB_TOKEN={TOKEN}",
            *[arg for key, value in env.items() for arg in ("--env", f"{key}={value}")],
        ]  # fmt: skip
        done = subprocess.run(
            argv,
            cwd=self.repo,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            user=self.user.pw_uid,
            group=self.user.pw_gid,
            extra_groups=[grp.getgrnam("pgoverlay").gr_gid],
            env={
                "PATH": os.environ["PATH"],
                "HOME": self.user.pw_dir,
                "USER": self.user.pw_name,
                "LANG": "C.UTF-8",
                **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
            },
        )
        log = done.stdout + done.stderr
        if done.returncode != 0:
            raise SystemExit(f"act {action} failed:\n{log[-4000:]}")
        return parse_act_log(log)


def parse_act_log(log: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for match in STEP.finditer(log):
        step = STEPS.get(match["step"].strip())
        if step:
            scale = {"ms": 0.001, "s": 1.0, "m": 60.0}[match["unit"]]
            found[step] = float(match["value"]) * scale
    timings = TIMINGS.search(log)
    if timings:
        for item in timings["items"].split(","):
            phase, seconds, _ = item.split()
            found[phase] = float(seconds)
        if "run step" in found:
            spent = sum(found.get(p, 0.0) for p in ("branch", "migrations"))
            found["own (run step - branch - migrations)"] = found["run step"] - spent
            found["own + install"] = found["own (run step - branch - migrations)"] + found.get(
                "install step", 0.0
            )
    return found


# -- report ---------------------------------------------------------------------------------


def table(rows: dict[str, dict[str, float]], base: dict[str, dict[str, float]] | None) -> str:
    head = "| what | median | p90 | n |"
    rule = "|---|---:|---:|---:|"
    if base is not None:
        head = "| what | before: median | before: p90 | after: median | after: p90 | n |"
        rule = "|---|---:|---:|---:|---:|---:|"
    lines = [head, rule]
    for name, q in rows.items():
        now = f"{q['median'] * 1000:.0f} ms | {q['p90'] * 1000:.0f} ms"
        if base is None:
            lines.append(f"| {name} | {now} | {q['n']:.0f} |")
            continue
        old = base.get(name)
        then = f"{old['median'] * 1000:.0f} ms | {old['p90'] * 1000:.0f} ms" if old else "- | -"
        lines.append(f"| {name} | {then} | {now} | {q['n']:.0f} |")
    return "\n".join(lines)


def warm_line(cli: dict[str, list[float]]) -> str:
    if not cli.get("create (warm)"):
        return ""
    warm = statistics.median(cli["create (warm)"])
    start = statistics.median(cli["pg_ctl start"])
    return f"; `create (warm)` is {warm / start:.2f}x `pg_ctl start` alone"


def render(result: dict[str, Any], baseline: dict[str, Any] | None) -> str:
    cli = result["cli"]
    ratio = statistics.median(cli["create+destroy"]) / statistics.median(cli["pg_ctl"])
    base_cli = baseline["cli"] if baseline else None
    base_act = baseline["action"] if baseline else None
    before = f", before: {baseline['checkout_label']}" if baseline else ""
    return f"""{START}
## Start-up: whole processes (`bench/process.py`)

What a user waits for, each figure the wall time of whole processes (`time.perf_counter()`
around `subprocess.run`; hyperfine is not installed), as root on a prepared pool with one base
(`base seed NAME --demo --scale 1`) and one branch, `PGOVERLAY_RUNTIME=local`. `create+destroy` is
`pgoverlay branch create` then `pgoverlay branch destroy`, two processes; `pg_ctl` is
`pg_ctl start -w` then `pg_ctl stop -m fast` of a plain copy of the same base on the same disk,
the three taking turns at going first; `create (warm)` claims a warm branch the engine
service started (untimed before each: `base warm --count 1`, a create that takes the one that
command starts, and a wait for the service's replacement), where the checkout has them. The
pool's engine service runs (`pool init` starts it, with the commands' settings), so a checkout
whose root commands ask it (from 2026-12-01) is timed doing so.
Run {result["date"]} ({result["checkout_label"]}{before}):

{table({k: quantiles(v) for k, v in cli.items()}, base_cli)}

`create+destroy` is {ratio:.2f}x `pg_ctl` (medians){warm_line(cli)}.

The Action step under `act` (the e2e test's workflow, the fake GitHub API, warm tool cache;
`opened` creates the branch, applies one migration and writes the comment, `closed` destroys
it and edits the comment). Steps' times are act's; the run step's phases are the Action's own
log line (`pgoverlay: timings:`; `start` is the interpreter's start and its imports), so an
older checkout has only the steps:

{table({k: quantiles(v) for k, v in result["action"].items()}, base_act)}

{result["machine"]}
{END}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--label", default="after")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--act-runs", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/bench-overhead"))
    parser.add_argument("--baseline", type=Path, help="results JSON of an earlier run")
    parser.add_argument("--no-report", action="store_true", help="leave docs/benchmarks.md")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    bench = Bench(args.checkout.resolve(), args.work / f"run-{args.label}")
    try:
        bench.prepare()
        cli = bench.rounds(args.runs)
        action = bench.action(args.act_runs)
    finally:
        bench.teardown()
    from pgoverlay.runner.postgres import binaries as pgbin

    result = {
        "date": dt.date.today().isoformat(),
        "checkout_label": args.label,
        "cli": cli,
        "action": action,
        "machine": machine_line(pgbin.newest(None).major, load),
    }
    out = args.work / f"results-{args.label}.json"
    out.write_text(json.dumps(result, indent=2))
    baseline = None
    if args.baseline:
        baseline = json.loads(args.baseline.read_text())
        for part in ("cli", "action"):
            baseline[part] = {k: quantiles(v) for k, v in baseline[part].items()}
    section = render(result, baseline)
    print(section)
    if not args.no_report:
        write_report(section, start=START, end=END)
        print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
