#!/usr/bin/env python3
"""Engine service benchmark: what asking the root service costs a workflow, against root's own
engine, measured as users wait (whole processes) and as a program asks (one request).

    sudo .venv/bin/python bench/service.py [--rounds 7] [--work DIR]

Builds a small throwaway source, seeds one base into a pool of its own and starts the pool's
engine service as `pool init` does where there is no systemd. In every round each way takes its
turn creating a branch (until a TCP login with its password succeeds) and destroying it:

- root's engine in this process (`branch.create` / `branch.destroy`: the engine alone);
- the service's client in this process, as an unprivileged user of the `pgoverlay` group would
  ask (one HTTP request on the Unix socket for each);
- the whole command `pgoverlay branch create` + `pgoverlay branch destroy` as root (engine in the
  process);
- the same commands as an unprivileged user of the group (they ask the service).

The Markdown section replaces the one between the service markers in docs/benchmarks.md. A
measurement script: it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import time

import psycopg
from common import build_source, dismantle, machine_rows, small_app, start
from engine_report import write_report
from psycopg.conninfo import make_conninfo

from pgoverlay.runner import branch, proc, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.service import serve
from pgoverlay.runner.service.client import client
from pgoverlay.runner.service.models import CreateRequest
from pgoverlay.runner.settings import Settings

START, END = "<!-- service:start -->", "<!-- service:end -->"
BASE = "service-bench"
USER = "pgoverlay-bench"
WAYS = {
    "engine": "root's engine, in the process",
    "client": "the service's client, in the process (group user)",
    "root_cli": "`pgoverlay branch create` + `destroy`, as root",
    "user_cli": "`pgoverlay branch create` + `destroy`, as a group user (through the service)",
}


def now() -> float:
    return time.monotonic()


def login(url: str) -> None:
    with psycopg.connect(url, connect_timeout=10) as conn:
        conn.execute("SELECT 1")


def env_for(settings: Settings) -> dict[str, str]:
    return {**os.environ, **serve.settings_environ(settings), "PGOVERLAY_SERVICE_AUTOSTART": "0"}


def as_user(user: pwd.struct_passwd, group: int) -> None:
    os.setgroups([group])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)


# Runs the command as a user of the group, in the same process: the interpreter starts as root
# (it may live where that user cannot read), imports what the command needs, then drops root.
_AS_USER = """
import os, sys
import pgoverlay.cli, pgoverlay.runner.service.client
os.setgroups([int(sys.argv[3])])
os.setgid(int(sys.argv[2]))
os.setuid(int(sys.argv[1]))
raise SystemExit(pgoverlay.cli.main(sys.argv[4:]))
"""


def command(argv: list[str], settings: Settings, *, user: pwd.struct_passwd | None) -> str:
    if user is None:
        full = [sys.executable, "-P", "-m", "pgoverlay", *argv]
    else:
        group = serve.group_id(settings.service_group)
        ids = [str(user.pw_uid), str(user.pw_gid), str(group)]
        full = [sys.executable, "-P", "-c", _AS_USER, *ids, *argv]
    done = subprocess.run(
        full,
        env=env_for(settings),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd="/",
    )
    if done.returncode != 0:
        raise RuntimeError(f"`pgoverlay {' '.join(argv)}` failed: {done.stderr.strip()}")
    return done.stdout


def cycle(way: str, pool: poolmod.Pool, name: str, user: pwd.struct_passwd) -> tuple[float, float]:
    """Create (until a TCP login succeeds) and destroy ``name`` the way ``way`` does; the two
    times in seconds."""
    settings = pool.settings
    t0 = now()
    if way == "engine":
        b = branch.create(pool, name)
        login(branch.connection(pool, b).url)
        t1 = now()
        branch.destroy(pool, name)
    elif way == "client":
        engine = client(settings)
        engine.create(CreateRequest(name=name))
        login(engine.connection(name).url)
        t1 = now()
        engine.destroy(name)
    else:
        who = user if way == "user_cli" else None
        # A user of the group names the repository its branch is for (root need not).
        command(["branch", "create", name, "--repository", "bench/service"], settings, user=who)
        login(command(["branch", "connect", name, "--url"], settings, user=who).strip())
        t1 = now()
        command(["branch", "destroy", name], settings, user=who)
    return t1 - t0, now() - t1


def span(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med * 1000:.0f} ms ({min(values) * 1000:.0f} – {max(values) * 1000:.0f})"


def render(results: dict[str, list[tuple[float, float]]], **ctx: object) -> str:
    rows = []
    for way, label in WAYS.items():
        creates = [c for c, _ in results[way]]
        destroys = [d for _, d in results[way]]
        rows.append(f"| {label} | {span(creates)} | {span(destroys)} |")
    return f"""{START}
## Engine service: what asking it costs

Generated by `{ctx["cmd"]}`. One small base (10,000 rows) in a pool of its own, its engine
service started as `pool init` starts it where there is no systemd. In every round each way
takes its turn: create a branch until a TCP login with its password succeeds (for the commands,
`pgoverlay branch connect --url` is part of it: that is how a user gets the password), then
destroy it. Cells are the median with the range over {ctx["rounds"]} rounds. The commands'
times include the interpreter's start and imports (see issue 15's CLI overhead): compare the
two command rows with each other, and the two in-process rows with each other.

{machine_rows(ctx)}
| Load average | {ctx["load"]} (1, 5, 15 min) when the run started; the machine is shared |
| Postgres | {ctx["postgres"]} |

| way | create until login | destroy |
|---|---|---|
{chr(10).join(rows)}
{END}
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Benchmark the engine service (root).")
    parser.add_argument("--rounds", type=int, default=7, help="create/destroy pairs per way")
    parser.add_argument("--work", default="/var/tmp/pgoverlay-bench-service", help="work dir")
    args = parser.parse_args(argv)
    work, load = start(args.work)
    settings = Settings(home=work / "pool", port_min=56400, port_max=56449, runtime="local")
    install = pgbin.newest(settings.pg_bindir)
    owner = proc.OsUser.lookup(settings.os_user)
    started, t_start = dt.datetime.now(dt.UTC), now()
    results: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    pool = None
    try:
        datadir = build_source(work, owner, install, small_app)
        with cluster.running(install, datadir, owner=owner, scratch=work / "tmp") as srv:
            dsn = make_conninfo(
                host=os.fspath(srv.socket_dir), port=srv.port, user="postgres", dbname="app"
            )
            pool = poolmod.init(settings, size="2G")
            seed.seed(pool, BASE, source_dsn=dsn)
        serve.start(settings)
        group = serve.group_id(settings.service_group)
        try:
            user = pwd.getpwnam(USER)
        except KeyError:
            subprocess.run(["useradd", "--system", USER], check=True)
            user = pwd.getpwnam(USER)
        subprocess.run(["usermod", "-aG", settings.service_group, USER], check=True)
        for i in range(1, args.rounds + 1):
            for way in WAYS:
                # the client as the group user would run it: in a child that dropped root
                name = f"svc-bench-{way.replace('_', '-')}-{i}"
                if way == "client":
                    results[way].append(in_child(user, group, pool, name))
                else:
                    results[way].append(cycle(way, pool, name, user))
            print(f"round {i}/{args.rounds} done", flush=True)
        section = render(
            results,
            cmd=" ".join(["python bench/service.py", *argv]),
            rounds=args.rounds,
            started=started,
            minutes=(now() - t_start) / 60,
            load=load,
            postgres=install.version,
        )
    finally:
        serve.stop(settings)
        if pool is not None:
            pool.close()
        dismantle(settings)
        shutil.rmtree(work, ignore_errors=True)
    write_report(section, start=START, end=END)
    sys.stdout.write(section)
    return 0


def in_child(
    user: pwd.struct_passwd, group: int, pool: poolmod.Pool, name: str
) -> tuple[float, float]:
    """A client cycle in a forked child that dropped root for ``user``; its two times."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            as_user(user, group)
            c, d = cycle("client", pool, name, user)
            os.write(write_end, f"{c} {d}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as stream:
        text = stream.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or not text:
        raise RuntimeError("the client's cycle failed in its child")
    c, d = (float(x) for x in text.split())
    return c, d


if __name__ == "__main__":
    sys.exit(main())
