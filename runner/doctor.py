"""Checks that tell whether this host can run branches, one verdict per line."""

from __future__ import annotations

import grp
import os
import platform
import pwd
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pgoverlay.errors import PgoverlayError
from pgoverlay.runner import proc
from pgoverlay.runner.pool import (
    PLAIN_COST,
    Pool,
    PoolInfo,
    discard,
    mounts,
    read_info,
    supports_reflink,
)
from pgoverlay.runner.pool.registry import Registry
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.runtime.choose import choose, tools_for, verify
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


def _interpreter(settings: Settings) -> Check:
    """Can the service group's members (the runner's user, the listener) run this command?"""
    from pgoverlay.runner import interpreter

    group = settings.service_group
    found = interpreter.refusal(interpreter.needed(), gid=interpreter.group_id(group))
    if found is None:
        return Check(
            "interpreter",
            "ok",
            f"{sys.executable} (Python {platform.python_version()}, environment {sys.prefix}) "
            f"runs for the {group} group's members",
        )
    return Check(
        "interpreter",
        "fail",
        f"the {group} group's members cannot run this pgoverlay: {found}; the runner's user, "
        "the webhook listener and the systemd units get 'Permission denied': install with "
        "scripts/install.sh, which builds the environment in /usr/local/lib/pgoverlay from "
        "Debian's /usr/bin/python3",
    )


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
    if info.down:
        return [
            Check(
                "pool",
                "fail",
                f"the pool at {settings.home} is down for maintenance (`pgoverlay pool down`): "
                "run `pgoverlay pool init` to bring it back",
            )
        ]
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
    checks.append(_discard(settings, info))
    db = root / "registry.db"
    if db.exists() and os.access(db, os.R_OK):
        registry = Registry(db)
        needed = sorted({b.pg_major for b in registry.bases() if b.pg_major})
        registry.close()
        checks += _majors(settings, needed)
    return checks


def _warm(settings: Settings) -> list[Check]:
    """Each base's warm branches: how many are ready of how many wanted, and their memory."""
    from pgoverlay.runner.branch import warm
    from pgoverlay.runner.units import format_bytes

    if os.geteuid() != 0 or read_info(settings.home) is None:
        return []
    try:
        pool = Pool.open(settings)
    except PgoverlayError:
        return []  # _pool says why
    try:
        states = warm.states(pool)
    finally:
        pool.close()
    checks = []
    for s in states:
        each = s.memory_each
        memory = (
            f", {format_bytes(each)} each ({format_bytes(sum(s.pss_bytes))} in all)" if each else ""
        )
        checks.append(
            Check(
                f"warm {s.base_name}",
                "ok" if s.ready >= s.target else "warn",
                f"{s.ready} of {s.target} warm branches ready on {s.runtime}{memory}"
                + (
                    ""
                    if s.ready >= s.target
                    else ": the engine service or `pgoverlay gc` starts the rest"
                ),
            )
        )
    return checks


def _size(count: int) -> str:
    return f"{count / GIB:.1f} GiB" if count >= GIB else f"{count / 1024**2:.0f} MiB"


def _discard(settings: Settings, info: PoolInfo) -> Check:
    """Do freed blocks go back to the host? With an image: what the image really occupies next to
    what the pool uses."""
    root = settings.home / "pool"
    if info.mode != "image":
        point = mounts.containing(root)
        if discard.discards(point):
            return Check("discard", "ok", f"the host filesystem at {point} is mounted with discard")
        return Check(
            "discard",
            "warn",
            f"the host filesystem at {point} is mounted without discard: blocks freed by "
            "destroyed branches keep their bytes on the disk until it is trimmed; enable "
            "`fstrim.timer` (or mount it with discard)",
        )
    usage = shutil.disk_usage(root)
    image = settings.home / "pool.img"
    sizes = (
        f"pool.img occupies {_size(discard.allocated_bytes(image))} of the host's disk for "
        f"{_size(usage.total - usage.free)} used in the pool"
    )
    if discard.discards(root):
        return Check("discard", "ok", f"freed blocks go back to the host; {sizes}")
    return Check(
        "discard",
        "warn",
        f"the pool image is mounted without discard (pgoverlay trims it after every destroy, "
        f"reset and seed); {sizes}: run `pgoverlay pool init` when no branch exists, or after "
        "a reboot, to mount it with discard",
    )


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


def _runtime(settings: Settings) -> Check:
    """Which runtime new branches get, and why."""
    choice = choose(settings, "branch")
    return Check("runtime", "ok" if choice.usable else "fail", f"{choice.name} ({choice.reason})")


def _psql(settings: Settings) -> Check:
    """Which psql the Action's migrations run with, and why."""
    choice = choose(settings, "psql")
    try:
        psql = tools_for("psql", settings=settings, major=0).tool("psql")  # 0: the newest
    except PgoverlayError as err:
        return Check("psql", "fail", str(err))
    return Check("psql", "ok", f"{choice.name}, {psql} ({choice.reason})")


def _door(settings: Settings) -> Check:
    """Whether the front door answers, and its certificate: the admin's, or the self-signed one
    it made, by the SHA-256 fingerprint readers check before they trust it."""
    from pgoverlay.runner.door import pidfile, reach, tls

    if settings.door.cert_file is not None:
        cert = settings.door.cert_file
        kind = "the admin's certificate"
    else:
        cert = pidfile.door_dir(settings) / tls.CERT_NAME
        kind = "its own self-signed certificate"
    try:
        print_ = tls.fingerprint(cert)
    except PgoverlayError:
        print_ = ""
    where = f"port {settings.door.port}, pages on {settings.door.https_port}"
    if not reach.answering(settings):
        made = f"; {kind}, SHA-256 {print_}" if print_ else ""
        return Check(
            "front door",
            "warn",
            f"not answering on {where}: start it with `pgoverlay door --start`{made}",
        )
    if not print_:
        return Check("front door", "warn", f"answering on {where}, but {cert} cannot be read")
    return Check("front door", "ok", f"answering on {where}; {kind}, SHA-256 {print_}")


def _network_api(settings: Settings) -> list[Check]:
    """The network API: off, or its audience, policy and issuer (``callers.checks``)."""
    from pgoverlay.runner.callers import checks

    return [Check(name, verdict, detail) for name, verdict, detail in checks.network_api(settings)]


def _majors(settings: Settings, needed: list[int]) -> list[Check]:
    """Can the runtime chosen for each base's major version run a server of it?"""
    checks = []
    for major in needed:
        name = f"postgres {major}"
        try:
            choice = choose(settings, "branch", major=major)
            found = verify(settings, choice.name, major, what="a base")
        except PgoverlayError as err:
            checks.append(Check(name, "fail", str(err)))
            continue
        checks.append(
            Check(name, "ok", f"bases of Postgres {major} branch with {choice.name}: {found}")
        )
    return checks


LISTENER_STATE_DIR = Path("/var/lib/pgoverlay-webhook")  # the unit's, and the default


def listener(
    settings: Settings,
    *,
    user: str | None = None,
    state_dir: Path | None = None,
    path: str | None = None,
) -> list[Check]:
    """The webhook listener's part of this host, when it is configured here (its user
    exists): its user and group, its subordinate ids, its state folder, and the tools that map
    the ids. ``user``, ``state_dir`` and ``path`` (where to look for the tools) default to what
    `pgoverlay webhook setup` and the unit use."""
    from pgoverlay.runner import listener as account

    user = user or account.USER
    state_dir = state_dir or Path(os.environ.get("PGOVERLAY_WEBHOOK_STATE_DIR", LISTENER_STATE_DIR))
    setup = f"run `pgoverlay webhook setup --state-dir {state_dir}` as root"
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return []  # no listener on this host
    group = settings.service_group
    try:
        member = grp.getgrnam(group).gr_gid in os.getgrouplist(user, entry.pw_gid)
    except KeyError:
        member = False
    checks = [
        Check("listener user", "ok", f"{user} (uid {entry.pw_uid}), in the group {group}")
        if member
        else Check(
            "listener user",
            "fail",
            f"{user} is not in the group {group}, so it cannot ask the engine service: {setup}",
        )
    ]
    counts = account.subordinate_ranges(user)
    short = [f"{name} gives it {n}" for name, n in counts.items() if n < account.SUBID_COUNT]
    checks.append(
        Check(
            "listener ids",
            "fail",
            f"{user} needs {account.SUBID_COUNT} subordinate uids and gids for its jobs' "
            f"sandboxes, and {', '.join(short)}: {setup}",
        )
        if short
        else Check("listener ids", "ok", f"{user} has subordinate uids and gids for its jobs")
    )
    problem = account.state_problem(state_dir, uid=entry.pw_uid)
    checks.append(
        Check("listener state", "fail", f"{problem}: {setup}")
        if problem
        else Check("listener state", "ok", f"{state_dir}, the listener's alone (0700)")
    )
    search = path if path is not None else proc.child_env()["PATH"]
    for tool in ("newuidmap", "newgidmap"):
        found = shutil.which(tool, path=search)
        st = os.stat(found) if found is not None else None
        setuid = st is not None and st.st_uid == 0 and bool(st.st_mode & stat.S_ISUID)
        if found is None or not setuid:
            why = "missing" if found is None else f"{found} is not setuid root"
            checks.append(
                Check(
                    f"listener {tool}",
                    "fail",
                    f"{tool} is {why}, so jobs cannot be sandboxed: install the `uidmap` "
                    "package (`apt-get install uidmap`)",
                )
            )
        else:
            checks.append(Check(f"listener {tool}", "ok", found))
    return checks


EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ports(settings: Settings, *, ephemeral: Path = EPHEMERAL) -> Check:
    """Whether the branches' ports stay out of the kernel's ephemeral range: a port there may
    be taken by any outgoing connection while its branch is suspended (nothing listens on it),
    and the branch then cannot wake until that connection ends."""
    low, high = settings.port_min, settings.port_max
    where = f"PGOVERLAY_PORT_MIN/MAX {low}-{high}"
    try:
        first, last = (int(part) for part in ephemeral.read_text().split()[:2])
    except (OSError, ValueError):
        return Check("ports", "ok", f"{where} (the kernel's ephemeral range could not be read)")
    if low <= last and first <= high:
        return Check(
            "ports",
            "warn",
            f"{where} overlaps the kernel's ephemeral ports {first}-{last} "
            f"(net.ipv4.ip_local_port_range): an outgoing connection may take a suspended "
            f"branch's port, and it cannot wake until that connection ends; choose a range "
            f"below {first} (the default is 20000-29999)",
        )
    return Check("ports", "ok", f"{where}, outside the kernel's ephemeral ports {first}-{last}")


def run(settings: Settings) -> list[Check]:
    return [
        _root(),
        _interpreter(settings),
        _overlay(),
        _runtime(settings),
        _psql(settings),
        _door(settings),
        *_network_api(settings),
        _ports(settings),
        *_pool(settings),
        _binaries(settings),
        *_warm(settings),
        *listener(settings),
    ]


def blocking(checks: list[Check]) -> bool:
    return any(c.verdict == "fail" for c in checks)
