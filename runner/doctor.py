"""Checks that tell whether this host can run branches, one verdict per line."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Literal

from pgoverlay.errors import PgoverlayError
from pgoverlay.runner import mounts, pgbin
from pgoverlay.runner.pool import PLAIN_COST, read_info, supports_reflink
from pgoverlay.runner.registry import Registry
from pgoverlay.runner.settings import Settings

Verdict = Literal["ok", "warn", "fail"]
GIB = 1024**3


@dataclass(frozen=True)
class Check:
    name: str
    verdict: Verdict
    detail: str


def _root() -> Check:
    if os.geteuid() == 0:
        return Check("root", "ok", "running as root")
    return Check("root", "fail", "not root: run pgoverlay with sudo")


def _overlay() -> Check:
    try:
        if mounts.overlay_supported():
            return Check("overlayfs", "ok", "the kernel supports OverlayFS")
    except PgoverlayError:
        pass
    return Check("overlayfs", "fail", "no OverlayFS in this kernel: run `modprobe overlay`")


def _pool(settings: Settings) -> list[Check]:
    info = read_info(settings.home)
    root = settings.home / "pool"
    if info is None:
        return [Check("pool", "fail", f"no pool at {settings.home}: run `pgoverlay pool init`")]
    if info.mode == "image" and not mounts.is_mounted(root):
        return [
            Check("pool", "fail", f"pool image not mounted at {root}: run `pgoverlay pool init`")
        ]
    checks = [Check("pool", "ok", f"{root} ({info.mode})")]
    if info.mode == "plain":
        checks.append(Check("reflink", "warn", f"plain OverlayFS pool: {PLAIN_COST}"))
    elif os.geteuid() == 0 and supports_reflink(root):
        checks.append(Check("reflink", "ok", "copy-up is a reflink clone: reads copy no data"))
    else:
        checks.append(Check("reflink", "fail", f"{root} does not support reflink"))
    usage = shutil.disk_usage(root)
    verdict: Verdict = (
        "ok" if usage.free > 2 * GIB else ("warn" if usage.free > 256 * 1024**2 else "fail")
    )
    checks.append(
        Check(
            "free space",
            verdict,
            f"{usage.free / GIB:.1f} GiB free of {usage.total / GIB:.1f} GiB in the pool",
        )
    )
    db = root / "registry.db"
    if db.exists() and os.access(db, os.R_OK):
        registry = Registry(db)
        needed = sorted({b.pg_major for b in registry.bases() if b.pg_major})
        registry.close()
        have = pgbin.installs(settings.pg_bindir)
        for major in needed:
            if major in have:
                checks.append(
                    Check(f"postgres {major}", "ok", f"bases of Postgres {major} can branch")
                )
            else:
                checks.append(
                    Check(
                        f"postgres {major}",
                        "fail",
                        f"a base needs Postgres {major}: install postgresql-{major}",
                    )
                )
    return checks


def _binaries(settings: Settings) -> Check:
    try:
        found = pgbin.installs(settings.pg_bindir)
    except PgoverlayError as err:
        return Check("postgres binaries", "fail", str(err))
    usable = {m: i for m, i in found.items() if m >= pgbin.MIN_MAJOR}
    if not usable:
        return Check(
            "postgres binaries",
            "fail",
            "no Postgres 14+ server binaries: apt-get install postgresql",
        )
    listed = ", ".join(f"{i.version} ({i.bindir})" for _, i in sorted(usable.items()))
    return Check("postgres binaries", "ok", listed)


def _docker() -> Check:
    try:
        import docker

        client = docker.from_env(timeout=3)
        version = client.version().get("Version", "?")
        client.close()
        return Check("docker", "ok", f"Docker {version} reachable")
    except Exception as err:  # any failure just means "not reachable"
        reason = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        return Check(
            "docker", "warn", f"Docker not reachable ({reason}); the local runtime is used"
        )


def run(settings: Settings) -> list[Check]:
    return [_root(), _overlay(), *_pool(settings), _binaries(settings), _docker()]


def blocking(checks: list[Check]) -> bool:
    return any(c.verdict == "fail" for c in checks)
