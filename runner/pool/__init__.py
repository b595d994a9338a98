"""The pool: where bases and branches live, on a filesystem where copy-up is a reflink clone.

Layout under ``PGOVERLAY_HOME``::

    pool.json                 how the pool was made (mode, image size)
    pool.img                  sparse XFS image with reflink (image mode only)
    pool/                     the data root (the image's mount point in image mode)
        registry.db           state (see registry.py); root's alone (0600)
        locks/                one flock file per base name and branch; root's alone
        staging/              base versions being seeded: each one the Postgres user's
        store/                prepared base versions; root-only, nobody else can reach them
        bases/NAME/VERSION    read-only bind mount of store/NAME/VERSION: the overlay lower
        branches/NAME/        root's: upper, work and log (the Postgres user's), data (the
                              overlay's mount point) and conf (root's)

Root never trusts what another user can write: every directory above a branch's own files is
root's, so the Postgres user cannot swap a mount target, a lock or the registry for a link.
Where root works inside the Postgres user's directories it goes through ``safefs``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pgoverlay.errors import (
    ConfigError,
    NotRootError,
    OverlayUnsupportedError,
    PoolError,
    UnsafePathError,
)
from pgoverlay.runner import proc, safefs
from pgoverlay.runner.names import check_name
from pgoverlay.runner.pool import discard, mounts
from pgoverlay.runner.pool.registry import Registry
from pgoverlay.runner.proc import OsUser
from pgoverlay.runner.proc import require_root as require_root  # the door's process asks it there
from pgoverlay.runner.service.address import SOCKET_ROOT, pool_id
from pgoverlay.runner.settings import Settings

log = logging.getLogger(__name__)

Mode = Literal["native", "image", "plain"]
FICLONE = 0x40049409
GIB = 1024**3
DEFAULT_IMAGE_MAX = 64 * GIB

PLAIN_COST = (
    "plain OverlayFS copies a whole file into a branch as soon as Postgres opens it, and Postgres "
    "opens every table file read-write even to read it: each table a branch touches costs its "
    "full size in disk and time"
)


def supports_reflink(directory: Path) -> bool:
    """Try a FICLONE between two scratch files in ``directory``."""
    src = directory / ".reflink-probe-src"
    dst = directory / ".reflink-probe-dst"
    for path in (src, dst):  # made afresh: never written through a link left in their place
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    fresh = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with open(os.open(src, os.O_RDWR | fresh, 0o600), "r+b") as s:
            s.write(b"x" * 4096)
            s.flush()
            with open(os.open(dst, os.O_WRONLY | fresh, 0o600), "wb") as d:
                fcntl.ioctl(d.fileno(), FICLONE, s.fileno())
        return True
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY):
            return False
        raise
    finally:
        for path in (src, dst):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def fs_type(path: Path) -> str:
    return mounts.mounted().get(mounts.containing(path), "unknown")


@dataclass(frozen=True)
class PoolInfo:
    mode: Mode
    image_bytes: int
    down: bool = False  # taken down for maintenance (`pool down`) until the next `pool init`


class Pool:
    """An initialised, mounted pool, with its registry open."""

    def __init__(self, settings: Settings, info: PoolInfo) -> None:
        self.settings = settings
        self.info = info
        self.home = settings.home
        self.root = settings.home / "pool"
        self.registry = Registry(
            self.root / "registry.db", ports=(settings.port_min, settings.port_max)
        )
        self.owner = OsUser.lookup(settings.os_user)

    def close(self) -> None:
        self.registry.close()

    @functools.cached_property
    def id(self) -> str:
        """A short id of this pool, for socket paths and Docker labels (every branch's socket
        path asks: worked out once, as its home does not move while the pool is open)."""
        return pool_id(self.home)

    @property
    def socket_root(self) -> Path:
        """This pool's directory of branch sockets (short: socket paths are limited to 107
        bytes)."""
        return SOCKET_ROOT / self.id

    def make_socket_root(self) -> None:
        """Create the socket directories' parents, root's (each branch's own socket directory
        is its user's). /run is emptied by a reboot."""
        safefs.make_dir(SOCKET_ROOT, uid=0, gid=0, mode=0o755, exist_ok=True)
        safefs.make_dir(self.socket_root, uid=0, gid=0, mode=0o755, exist_ok=True)

    # paths: every one is checked to stay inside the pool --------------------------------
    def _inside(self, path: Path) -> Path:
        return safefs.inside(self.root, path)

    def lock_path(self, kind: str, name: str) -> Path:
        check_name(name, what=kind)
        return self._inside(self.root / "locks" / f"{kind}-{name}.lock")

    def staging_dir(self, name: str, version: int) -> Path:
        check_name(name, what="base")
        return self._inside(self.root / "staging" / f"{name}-{int(version)}")

    def store_dir(self, name: str, version: int) -> Path:
        check_name(name, what="base")
        return self._inside(self.root / "store" / name / str(int(version)))

    def base_dir(self, name: str, version: int) -> Path:
        check_name(name, what="base")
        return self._inside(self.root / "bases" / name / str(int(version)))

    def schema_file(self, name: str, version: int) -> Path:
        """The base version's schema as a branch fresh from it has it (``trace.schema``)."""
        check_name(name, what="base")
        return self._inside(self.root / "schemas" / name / f"{int(version)}.json")

    def workload_file(self, name: str, version: int) -> Path:
        """Production's statements kept with the base version (``seed.workload``)."""
        check_name(name, what="base")
        return self._inside(self.root / "workloads" / name / f"{int(version)}.json")

    def branch_dir(self, name: str) -> Path:
        check_name(name)
        return self._inside(self.root / "branches" / name)

    def branch_dirs(self, names: list[str]) -> dict[str, Path]:
        """``branch_dir`` of each name, the pool's folders resolved once for all of them: every
        checked name is one entry of the same folder, so one check of that folder covers them
        (a list of a thousand branches would otherwise resolve it a thousand times)."""
        folder = self.root / "branches"
        for name in names:
            check_name(name)
        if names:
            self._inside(folder / names[0])
        return {name: folder / name for name in names}

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @classmethod
    def open(cls, settings: Settings) -> Pool:
        """Open an initialised pool; say how to fix it if it is not ready."""
        if os.geteuid() != 0:
            raise NotRootError(
                f"the pool's registry {settings.home / 'pool' / 'registry.db'} is root's alone: "
                "run this command as root on the runner (a workflow's user asks the engine "
                "service instead: `pgoverlay branch ...`)"
            )
        info = read_info(settings.home)
        if info is None:
            raise PoolError(
                f"no pool at {settings.home}: run `pgoverlay pool init` first "
                "(or set PGOVERLAY_HOME to an existing pool)"
            )
        if info.down:
            raise PoolError(
                f"the pool at {settings.home} is down for maintenance (`pgoverlay pool down`): "
                "run `pgoverlay pool init` to bring it and its branches back"
            )
        if info.mode == "image" and not mounts.is_mounted(settings.home / "pool"):
            raise PoolError(
                f"the pool image {settings.home / 'pool.img'} is not mounted (after a reboot?): "
                "run `pgoverlay pool init` to mount it again"
            )
        return cls(settings, info)


def read_info(home: Path) -> PoolInfo | None:
    path = home / "pool.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return PoolInfo(
        mode=data["mode"],
        image_bytes=int(data.get("image_bytes", 0)),
        down=bool(data.get("down", False)),
    )


def write_info(home: Path, info: PoolInfo) -> None:
    """Record how the pool was made (and whether it is down) in ``pool.json``."""
    data: dict[str, Any] = {"mode": info.mode, "image_bytes": info.image_bytes}
    if info.down:
        data["down"] = True
    (home / "pool.json").write_text(json.dumps(data, indent=2) + "\n")


def parse_size(text: str) -> int:
    units = {"": 1, "K": 1024, "M": 1024**2, "G": GIB, "T": 1024**4}
    clean = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = clean[-1:] if clean[-1:] in units and not clean[-1:].isdigit() else ""
    number = clean[: len(clean) - len(unit)]
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise ConfigError(
            f"cannot read size {text!r}: use a number with K, M, G or T, e.g. 40G"
        ) from None
    if value <= 0:
        raise ConfigError(f"size {text!r} must be positive")
    return int(value)


def _make_image(image: Path, size: int) -> None:
    free = shutil.disk_usage(image.parent).free
    if size > free:
        raise PoolError(
            f"the pool image would be {size / GIB:.1f} GiB but only {free / GIB:.1f} GiB is free "
            f"under {image.parent}: pass a smaller --size or free some space"
        )
    if shutil.which("mkfs.xfs") is None:
        raise PoolError("mkfs.xfs not found: install xfsprogs (apt-get install xfsprogs)")
    with open(image, "wb") as handle:
        handle.truncate(size)
    os.chmod(image, 0o600)
    try:
        proc.run(["mkfs.xfs", "-q", "-m", "reflink=1", "-L", "pgoverlay", image], timeout=600)
    except BaseException:
        image.unlink(missing_ok=True)
        raise


def _check_reachable(home: Path, owner: OsUser) -> None:
    """Postgres runs as ``owner``: every directory above the pool must let it through."""
    for parent in reversed(home.resolve().parents):
        st = parent.stat()
        if st.st_mode & 0o001:
            continue
        if st.st_uid == owner.uid and st.st_mode & 0o100:
            continue
        if st.st_gid == owner.gid and st.st_mode & 0o010:
            continue
        raise ConfigError(
            f"{parent} does not let the {owner.name} user through (mode "
            f"{st.st_mode & 0o777:o}), so Postgres could not reach the pool under it: "
            f"run `chmod o+x {parent}` or choose another PGOVERLAY_HOME"
        )


def _check_root_only(home: Path) -> None:
    """Nobody but root may rename the pool away: every directory above it is root's and not
    writable by others (a sticky one, like /var/tmp, protects root's entries in it)."""
    for parent in home.parents:
        st = parent.stat()
        open_to_others = st.st_mode & 0o022 and not st.st_mode & 0o1000
        if st.st_uid != 0 or open_to_others:
            raise ConfigError(
                f"{parent} is writable by a user other than root (owner uid {st.st_uid}, mode "
                f"{st.st_mode & 0o7777:o}), who could move the pool under it away: make it "
                f"root's (`chown root: {parent}; chmod go-w {parent}`) or choose another "
                "PGOVERLAY_HOME"
            )


def init(settings: Settings, *, size: str | None = None, allow_plain: bool = False) -> Pool:
    """Prepare the pool; safe to run again (after a reboot it mounts what needs mounting)."""
    require_root()
    if not mounts.overlay_supported():
        raise OverlayUnsupportedError(
            "this kernel has no OverlayFS: load it with `modprobe overlay` "
            "(or use a kernel built with CONFIG_OVERLAY_FS)"
        )
    home = settings.home
    owner = OsUser.lookup(settings.os_user)
    home.mkdir(parents=True, exist_ok=True)
    _check_reachable(home, owner)
    _check_root_only(home.resolve())
    safefs.make_dir(home.resolve(), uid=0, gid=0, mode=0o755, exist_ok=True)
    root = home / "pool"
    root.mkdir(exist_ok=True)
    info = read_info(home)
    if info is None:
        _forget_an_earlier_pool(home)
        if supports_reflink(home):
            info = PoolInfo(mode="native", image_bytes=0)
        elif allow_plain:
            info = PoolInfo(mode="plain", image_bytes=0)
            log.warning("using plain OverlayFS: %s", PLAIN_COST)
        else:
            free = shutil.disk_usage(home).free
            wanted = parse_size(size) if size else min(DEFAULT_IMAGE_MAX, int(free * 0.8))
            info = PoolInfo(mode="image", image_bytes=wanted)
    if info.mode == "image":
        image = home / "pool.img"
        if not image.exists():
            _make_image(image, info.image_bytes)
        if not mounts.is_mounted(root):
            _mount(image, root)
    # Made root's before the registry is read: an earlier release let Postgres's user own it.
    _own_layout(root, socket_root=SOCKET_ROOT / pool_id(home))
    if info.mode == "image":
        _ensure_discard(home / "pool.img", root)
    if info.mode == "image" and not supports_reflink(root):
        raise PoolError(f"{home / 'pool.img'} is mounted at {root} but does not support reflink")
    info = PoolInfo(mode=info.mode, image_bytes=info.image_bytes)  # up again
    write_info(home, info)
    pool = Pool(settings, info)
    pool.make_socket_root()
    remount_bases(pool)
    return pool


# What a pool keeps in its home that no new pool at that home may take over: the API token
# store (an old token must not be good for the new pool) and the front door's key.
EARLIER_POOL = ("api", "door")


def _forget_an_earlier_pool(home: Path) -> None:
    """Before a new pool is made at ``home``: remove the API tokens and the door's key an
    earlier pool there left (an earlier release's `pool rm` kept them), so no token issued for
    the old pool is ever good for the new one."""
    for name in EARLIER_POOL:
        path = home / name
        if os.path.lexists(path):
            log.warning("removing %s: left by an earlier pool at %s, not this one's", path, home)
            safefs.remove_tree(path)


# Every directory of the pool is root's; the Postgres user reaches only what it must traverse.
LAYOUT = (
    ("locks", 0o700),
    ("store", 0o700),
    ("tmp", 0o711),
    ("staging", 0o711),
    ("bases", 0o755),
    ("branches", 0o711),
    ("schemas", 0o700),
    ("workloads", 0o700),
)


def _own_layout(root: Path, *, socket_root: Path) -> None:
    """Give every directory and file that must be root's to root, repairing a pool made by an
    older release (where the Postgres user owned the registry, locks/ and branches/). A link
    where a directory or file of the pool should be is refused, never followed."""
    safefs.make_dir(root, uid=0, gid=0, mode=0o711, exist_ok=True)
    for sub, mode in LAYOUT:
        safefs.make_dir(root / sub, uid=0, gid=0, mode=mode, exist_ok=True)
    for suffix in ("", "-wal", "-shm", "-journal"):
        safefs.repair_file(root / f"registry.db{suffix}", uid=0, gid=0, mode=0o600)
    with safefs.dir_under(root, "locks") as locks_fd:
        for name in os.listdir(locks_fd):
            try:
                safefs.repair_file(root / "locks" / name, uid=0, gid=0, mode=0o600)
            except UnsafePathError:
                log.warning("removing %s: not a lock file pgoverlay made", root / "locks" / name)
                os.unlink(name, dir_fd=locks_fd)
    with safefs.dir_under(root, "branches") as branches_fd:
        names = os.listdir(branches_fd)
    for name in names:
        branch = root / "branches" / name
        if os.path.islink(branch) or not branch.is_dir():
            raise UnsafePathError(
                f"{branch} is not a directory pgoverlay made: remove it (`rm {branch}`), then "
                "run `pgoverlay pool init` again"
            )
        safefs.make_dir(branch, uid=0, gid=0, mode=0o711, exist_ok=True)
        for sub, mode in (("conf", 0o755), ("data", 0o700)):
            path = branch / sub
            if os.path.lexists(path) and not mounts.is_mounted(path):
                safefs.make_dir(path, uid=0, gid=0, mode=mode, exist_ok=True)
        if (branch / "conf").is_dir():
            with safefs.dir_under(branch, "conf") as conf_fd:
                for entry in os.listdir(conf_fd):
                    safefs.repair_file(branch / "conf" / entry, uid=0, gid=0, mode=0o644)
    if socket_root.is_dir():
        safefs.make_dir(socket_root.parent, uid=0, gid=0, mode=0o755, exist_ok=True)
        safefs.make_dir(socket_root, uid=0, gid=0, mode=0o755, exist_ok=True)


def _mount(image: Path, root: Path) -> None:
    proc.run(["mount", "-o", discard.IMAGE_MOUNT_OPTIONS, image, root], timeout=120)


def _ensure_discard(image: Path, root: Path) -> None:
    """An image mounted before without discard is mounted again with it (XFS ignores discard on
    a remount) when no branch uses it, and trimmed once in any case, so the blocks it freed
    before go back to the host. The bases' binds are restored by ``remount_bases``."""
    if not discard.discards(root):
        branches = 0
        if (root / "registry.db").exists():
            registry = Registry(root / "registry.db")
            branches = len(registry.branch_names())
            registry.close()
        if discard.can_remount(root, branches=branches):
            for point in mounts.mounts_under(root):
                mounts.unmount(Path(point))
            proc.run(["umount", root], timeout=mounts.MOUNT_TIMEOUT, check=False)
            if not mounts.is_mounted(root):
                _mount(image, root)
        if not discard.discards(root):
            log.warning(
                "the pool image is mounted without discard and is in use: pgoverlay trims it "
                "after every destroy, reset and seed until it is mounted again (run "
                "`pgoverlay pool init` when no branch exists, or after a reboot)"
            )
    discard.trim(root)


def remount_bases(pool: Pool) -> None:
    """Make every prepared base version reachable, read-only, at its bases/ path."""
    for base in pool.registry.bases():
        if base.state != "ready":
            continue
        store = pool.store_dir(base.name, base.version)
        target = pool.base_dir(base.name, base.version)
        if store.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            mounts.bind_readonly(store, target)


def fault(pool: Pool, point: str) -> None:
    """Crash tests: die here, as a kill -9 would, if the settings ask for it
    (``PGOVERLAY_FAULT_POINT``). Every saga (seed, seed rm, branch create, reset, destroy) calls
    it after recording each step, so a test can stop it there and check what ``gc`` does."""
    if pool.settings.fault_point == point:
        os.kill(os.getpid(), signal.SIGKILL)


def release_freed(pool: Pool) -> None:
    """Blocks were freed in the pool (a destroy, a reset, a seed): see ``discard.release``."""
    discard.release(pool.root, image_mode=pool.info.mode == "image")


def describe(pool: Pool) -> dict[str, Any]:
    usage = shutil.disk_usage(pool.root)
    image = pool.home / "pool.img"
    # A native or plain pool discards as its host filesystem does: look at that mount.
    point = pool.root if pool.info.mode == "image" else Path(mounts.containing(pool.root))
    found: dict[str, Any] = {
        "home": os.fspath(pool.home),
        "mode": pool.info.mode,
        "filesystem": fs_type(pool.root),
        "reflink": pool.info.mode != "plain",
        "discard": discard.discards(point),
        "size_bytes": usage.total,
        "used_bytes": usage.total - usage.free,
        "free_bytes": usage.free,
    }
    if pool.info.mode == "image" and image.exists():
        found["image_allocated_bytes"] = discard.allocated_bytes(image)
    return found
