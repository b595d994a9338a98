#!/usr/bin/env python3
"""The Action step's wall time on the pool's own runner (the engine's socket) and on a runner
without the pool (the `server` input: the network API and the front door over TLS), side by
side in the same rounds.

    sudo .venv/bin/python bench/actionstep.py [--runs 15] [--work DIR] [--no-report]

One pool (this checkout's CLI: `pool init`, `base seed NAME --demo --scale 1`, its engine
service), its front door with the network API on (`pgoverlay door` as its own user, a test
CA's certificate, a local OIDC issuer and a policy admitting acme's repositories:
tests/apikit.py), the runner's token service a job asks for its OIDC token, and the fake
GitHub API (tests/fakegithub.py) for the comment and the Deployment.

The step is what action/run.sh runs, as it runs it: `bash action/run.sh run` (which starts
`pgoverlay-action run`), a whole process with a job's environment (the `GITHUB_*` variables, an
`INPUT_*` for every input of action.yml at its default but `migrations: db/migrations` and
`migrations-select: all`), timed from the parent around the process. Two jobs of two pull
requests of acme/shop, each in its own workspace with one migration:

- **local**: a user in the `pgoverlay` group, the pool's settings in its environment, the
  engine service's socket;
- **server**: another user, neither root nor in the group, no pool settings, `server` and
  `server-ca` set and the runner's token variables (`ACTIONS_ID_TOKEN_REQUEST_*`): the API on
  the door's HTTPS port, the branch through the door's Postgres port over verified TLS.

One untimed round first (bytecode, the issuer's keys, the door's first connections); then
``--runs`` rounds, each side opening its pull request (create the branch, apply the migration,
write a new comment: the PR's comments are cleared before) and closing it (destroy the branch,
edit the comment), the two sides taking turns at going first. The Action's own log line
(`pgoverlay: timings: ...`) splits the step into its phases: its start (the interpreter and its
imports), prepare, branch, migrations, comment, deployment, the engine's other answers and the
report; the table takes them as the line names them.

The Markdown section replaces the one between the actionstep markers in docs/benchmarks.md.
A measurement script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import grp
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from common import machine_rows, start
from engine_report import write_report
from process import TIMINGS, TOKEN, Bench, quantiles

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- actionstep:start -->", "<!-- actionstep:end -->"
BASE = "stepbench"
PORTS = (58700, 58799)  # the bench pool's branches (process.py's Bench has its own range)
REPO, REPO_ID = "acme/shop", 4711
LOCAL_USER = "pgo-bench-runner"  # the pool's own runner: in the `pgoverlay` group
HOSTED_USER = "pgo-bench-hosted"  # a runner without the pool: neither root nor in the group
SIDES = {"local": 7, "server": 8}  # side -> its pull request's number
KINDS = {"opened": "ready", "closed": "destroyed"}  # event -> the status the step must give
POLICY = "owners:\n  - acme\nrepositories:\n  - acme/*\n"
MIGRATION = "CREATE TABLE widgets (id int PRIMARY KEY, name text);\n"


def input_defaults() -> dict[str, str]:
    """An ``INPUT_<NAME>`` for every input of action.yml, at its default, as the run step's
    ``env:`` passes them (the token's default is the job's token)."""
    import yaml

    inputs = yaml.safe_load((ROOT / "action.yml").read_text())["inputs"]
    found = {}
    for name, spec in inputs.items():
        value = str(spec.get("default", ""))
        found[f"INPUT_{name.upper().replace('-', '_')}"] = TOKEN if "${{" in value else value
    return found


class Job:
    """One side's runner: its user, its workspace with one migration, its step's files."""

    def __init__(self, side: str, user: pwd.struct_passwd, env: dict[str, str]) -> None:
        self.side, self.user, self.extra = side, user, env
        self.number = SIDES[side]
        self.dir = Path(tempfile.mkdtemp(prefix=f"stepbench-{side}-", dir="/var/tmp"))
        self.workspace = self.dir / "workspace"
        (self.workspace / "db" / "migrations").mkdir(parents=True)
        (self.workspace / "db" / "migrations" / "001_widgets.sql").write_text(MIGRATION)
        (self.dir / "temp").mkdir()
        self.groups = [grp.getgrnam("pgoverlay").gr_gid] if side == "local" else []

    def event(self, kind: str, head_sha: str) -> Path:
        fixtures = ROOT / "tests" / "fixtures" / "github" / "webhooks"
        payload: dict[str, Any] = json.loads((fixtures / f"pull_request.{kind}.json").read_text())
        payload.update(action=kind, number=self.number)
        pull = payload["pull_request"]
        pull.update(number=self.number, merged=False, draft=False)
        pull["head"]["sha"] = head_sha
        for repo in (payload["repository"], pull["head"]["repo"], pull["base"]["repo"]):
            repo.update(full_name=REPO, name=REPO.partition("/")[2], id=REPO_ID)
            repo["owner"]["login"] = REPO.partition("/")[0]
        path = self.dir / f"event-{kind}.json"
        path.write_text(json.dumps(payload))
        return path

    def step(self, kind: str, *, github: str) -> dict[str, float]:
        """One step, timed whole; its seconds, and its phases' from its timings line."""
        head_sha = "a" * 40
        event = self.event(kind, head_sha)
        for name in ("output", "summary"):
            (self.dir / name).write_text("")
        subprocess.run(
            ["chown", "-R", f"{self.user.pw_uid}:{self.user.pw_gid}", os.fspath(self.dir)],
            check=True,
        )
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self.user.pw_dir,
            "USER": self.user.pw_name,
            "LANG": "C.UTF-8",
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_EVENT_PATH": os.fspath(event),
            "GITHUB_EVENT_NAME": "pull_request",
            "GITHUB_REPOSITORY": REPO,
            "GITHUB_API_URL": github,
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_RUN_ID": "1",
            "GITHUB_SHA": head_sha,
            "GITHUB_REF": f"refs/pull/{self.number}/merge",
            "GITHUB_WORKSPACE": os.fspath(self.workspace),
            "GITHUB_OUTPUT": os.fspath(self.dir / "output"),
            "GITHUB_STEP_SUMMARY": os.fspath(self.dir / "summary"),
            "RUNNER_TEMP": os.fspath(self.dir / "temp"),
            "ACTION_PATH": os.fspath(ROOT),
            "PGOVERLAY_BIN": os.fspath(ROOT / ".venv" / "bin" / "pgoverlay"),
            **input_defaults(),
            "INPUT_MIGRATIONS": "db/migrations",
            "INPUT_MIGRATIONS_SELECT": "all",
            **self.extra,
        }
        started = time.perf_counter()
        done = subprocess.run(
            ["bash", os.fspath(ROOT / "action" / "run.sh"), "run"],
            env=env,
            user=self.user.pw_uid,
            group=self.user.pw_gid,
            extra_groups=self.groups,
            cwd=self.workspace,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        seconds = time.perf_counter() - started
        log = done.stdout + done.stderr
        out = read_outputs(self.dir / "output")
        wrong = done.returncode != 0 or out.get("status") != KINDS[kind]
        if kind == "opened":
            wrong = wrong or out.get("migrations-applied") != "1"
        if wrong:
            raise SystemExit(
                f"the {self.side} step ({kind}) ended {done.returncode}, its outputs "
                f"{sorted(out.items())!r}:\n{log[-4000:]}"
            )
        found = {"step": seconds}
        timings = TIMINGS.search(log)
        if timings:
            for item in timings["items"].split(","):
                phase, value, _ = item.split()
                found[phase] = float(value)
        return found

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def read_outputs(path: Path) -> dict[str, str]:
    """The outputs a step wrote to its GITHUB_OUTPUT file (``key<<DELIMITER`` blocks, or
    run.sh's ``status=failed``)."""
    values: dict[str, str] = {}
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        key, _, delimiter = lines[i].partition("<<")
        if not delimiter:
            name, _, value = lines[i].partition("=")
            values[name] = value
            i += 1
            continue
        end = lines.index(delimiter, i + 1)
        values[key] = "\n".join(lines[i + 1 : end])
        i = end + 1
    return values


@contextmanager
def front_door(bench: Bench, work: Path) -> Iterator[tuple[Any, Any]]:
    """The pool's door with the network API on, and the runner's token service for the server
    side's pull request; (the door, the token service)."""
    from apikit import running_door

    from oidckit import TokenService, pull_request_job
    from pgoverlay.runner.pool import Pool
    from pgoverlay.runner.settings import Settings

    settings = Settings(home=bench.home, port_min=PORTS[0], port_max=PORTS[1], runtime="local")
    pool = Pool.open(settings)
    try:
        base = pool.registry.latest_base(BASE)
        assert base is not None
        folder = work / "door"
        folder.mkdir(parents=True, exist_ok=True)
        with running_door(pool, base, folder, policy=POLICY, audience="url") as api:
            claims = pull_request_job(
                repository=REPO,
                repository_id=REPO_ID,
                number=SIDES["server"],
                head_ref="bench",
                runner_environment="github-hosted",
            )
            with TokenService(api.issuer, api.key) as tokens:
                yield api, tokens.add_job(**claims)
    finally:
        pool.close()


def measure(bench: Bench, work: Path, runs: int) -> dict[str, dict[str, list[float]]]:
    """One untimed round, then ``runs`` rounds of both sides; each value's samples by side."""
    from fakegithub import FakeGitHub
    from helpers import os_user

    local_user = os_user(LOCAL_USER, groups=["pgoverlay"])
    hosted_user = os_user(HOSTED_USER)
    found: dict[str, dict[str, list[float]]] = {side: {} for side in SIDES}
    with ExitStack() as stack:
        github = stack.enter_context(FakeGitHub())
        github.add_token(TOKEN, "github-actions[bot]", kind="installation")
        for number in SIDES.values():
            github.add_pull(REPO, number, "a" * 40, "0" * 40)
        api, tokens = stack.enter_context(front_door(bench, work))
        pool_env = {
            key: bench.env[key]
            for key in ("PGOVERLAY_HOME", "PGOVERLAY_PORT_MIN", "PGOVERLAY_PORT_MAX")
        }
        jobs = {
            "local": Job("local", local_user, {**pool_env, "PGOVERLAY_RUNTIME": "local"}),
            "server": Job(
                "server",
                hosted_user,
                {
                    "INPUT_SERVER": api.server,
                    "INPUT_SERVER_CA": api.certs.ca_file.read_text(),
                    **tokens.env(),
                },
            ),
        }
        for job in jobs.values():
            stack.callback(job.close)

        def one(side: str) -> dict[str, float]:
            results: dict[str, float] = {}
            for kind in KINDS:
                if kind == "opened":
                    with github.locked():
                        github.state.comments.clear()
                for key, value in jobs[side].step(kind, github=github.url).items():
                    results[f"{kind}: {key}"] = value
                with github.locked():
                    comments = len(github.state.comments)
                if comments != 1:  # opened writes the comment, closed edits it
                    raise SystemExit(f"the {side} step ({kind}) left {comments} comments, not 1")
            return results

        for side in SIDES:  # untimed: bytecode, the issuer's keys, first connections
            one(side)
        sides = list(SIDES)
        for i in range(runs):
            for side in sides if i % 2 == 0 else sides[::-1]:
                for key, value in one(side).items():
                    found[side].setdefault(key, []).append(value)
            print(f"round {i + 1}: " + ", ".join(
                f"{side} opened {found[side]['opened: step'][-1]:.2f} s" for side in SIDES
            ), flush=True)  # fmt: skip
    return found


def table(found: dict[str, dict[str, list[float]]]) -> str:
    rows = [
        "| what | local: median | local: p90 | server: median | server: p90 | "
        "server - local (medians) | n |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    # The whole step first, then the phases of the Action's timings line, as it lists them.
    keys = list(dict.fromkeys(key for side in SIDES for key in found[side]))
    for kind in KINDS:
        phases = [k.split(": ", 1)[1] for k in keys if k.startswith(f"{kind}: ")]
        for part in ["step", *(phase for phase in phases if phase != "step")]:
            key = f"{kind}: {part}"
            if not all(found[side].get(key) for side in SIDES):
                continue
            local, server = (quantiles(found[side][key]) for side in SIDES)
            label = f"{kind}: the whole step" if part == "step" else f"{kind}: {part}"
            rows.append(
                f"| {label} | {local['median'] * 1000:.0f} ms | {local['p90'] * 1000:.0f} ms | "
                f"{server['median'] * 1000:.0f} ms | {server['p90'] * 1000:.0f} ms | "
                f"{(server['median'] - local['median']) * 1000:+.0f} ms | "
                f"{int(min(local['n'], server['n']))} |"
            )
    return "\n".join(rows)


def render(found: dict[str, dict[str, list[float]]], **ctx: Any) -> str:
    def median(side: str, key: str) -> float:
        return statistics.median(found[side][key])

    local, server = median("local", "opened: step"), median("server", "opened: step")
    return f"""{START}
## The Action step: the pool's socket against `server:` (`bench/actionstep.py`)

The Action's run step as action/run.sh runs it (`bash action/run.sh run`, which starts
`pgoverlay-action run`), timed whole from its parent, with a job's environment: every input at
action.yml's default but `migrations: db/migrations` and `migrations-select: all`, the comment
and the Deployment written to the fake GitHub API. Two pull requests of acme/shop, each with one
migration (`CREATE TABLE`), on a base of `base seed NAME --demo --scale 1`
(`PGOVERLAY_RUNTIME=local`). **local**: a user of the `pgoverlay` group on the pool's host,
through the engine service's socket. **server**: a user neither root nor in the group, with
`server` and `server-ca` set: the job's OIDC token from the runner's token service (a local
issuer's), the branch asked of the network API on the front door's HTTPS port (the test CA's
certificate, verified), the migration and the `database-url` through the door's Postgres port
over verified TLS. Both on this one machine, over loopback: the network adds no latency of its
own. {ctx["runs"]} rounds after an untimed one, the two sides taking turns at going first;
`opened` creates the branch, applies the migration and writes a new comment, `closed` destroys
the branch and edits the comment. The phases are the Action's own log line
(`pgoverlay: timings:`; `start` is the interpreter's start and its imports).

On this run (`{ctx["cmd"]}`) an opened pull request's step took {local:.2f} s on the socket
and {server:.2f} s with `server:` (medians), {server - local:+.2f} s.

{machine_rows(ctx)}
| Load average | {ctx["load"]} (1, 5, 15 min) when the run started; the machine is shared |

{table(found)}
{END}
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--work", default="/var/tmp/bench-actionstep", help="work dir")
    parser.add_argument("--no-report", action="store_true", help="leave docs/benchmarks.md")
    args = parser.parse_args(argv)
    work, load = start(args.work)
    started, t_start = dt.datetime.now(dt.UTC), time.monotonic()
    bench = Bench(ROOT, work / "pool-run")
    bench.env.update(PGOVERLAY_PORT_MIN=str(PORTS[0]), PGOVERLAY_PORT_MAX=str(PORTS[1]))
    try:
        bench.work.mkdir(parents=True, exist_ok=True)
        os.chmod(bench.work, 0o755)
        bench.cli("pool", "init", "--size", "3G")  # starts the engine service too
        bench.cli("base", "seed", BASE, "--demo", "--scale", "1")
        found = measure(bench, work, args.runs)
    finally:
        bench.teardown()
        shutil.rmtree(work, ignore_errors=True)
    section = render(
        found,
        cmd=" ".join(["python bench/actionstep.py", *argv]),
        runs=args.runs,
        started=started,
        minutes=(time.monotonic() - t_start) / 60,
        load=load,
    )
    if not args.no_report:
        write_report(section, start=START, end=END)
    sys.stdout.write(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
