"""Where a branch's files live (its layout) and how its directories are made and removed."""

from __future__ import annotations

from pathlib import Path

from pgoverlay.errors import PoolFullError
from pgoverlay.runner import safefs
from pgoverlay.runner.branch.conf import write_conf
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.runtime import Layout


def layout(pool: Pool, key: str) -> Layout:
    """Where the branch whose files go by ``key`` (``Branch.key``: its slot, else its name)
    lives."""
    return Layout(root=pool.branch_dir(key), socket_dir=pool.socket_root / key)


def layouts(pool: Pool, keys: list[str]) -> dict[str, Layout]:
    """``layout`` of each key, the pool's folders checked once for all of them."""
    dirs = pool.branch_dirs(keys)
    return {key: Layout(root=dirs[key], socket_dir=pool.socket_root / key) for key in keys}


def make_dirs(pool: Pool, lay: Layout, *, user: str, superuser: str, database: str) -> None:
    """The branch's directory is root's, so the branches' user cannot swap what root mounts
    or reads there; that user owns only what its Postgres writes: upper, work, log, sockets."""
    uid, gid = pool.owner.uid, pool.owner.gid
    try:
        safefs.make_dir(lay.root, uid=0, gid=0, mode=0o711)
        for path, owner, mode in (
            (lay.upper, (uid, gid), 0o700),
            (lay.work, (uid, gid), 0o700),
            (lay.data, (0, 0), 0o700),
            (lay.conf, (0, 0), 0o755),
            (lay.log, (uid, gid), 0o700),
        ):
            safefs.make_dir(path, uid=owner[0], gid=owner[1], mode=mode)
        make_socket_dir(pool, lay)
    except OSError as err:
        if err.errno == 28:  # ENOSPC
            raise PoolFullError("the pool is full: destroy branches or grow the pool") from None
        raise
    write_conf(pool, lay, user=user, superuser=superuser, database=database)


def make_socket_dir(pool: Pool, lay: Layout) -> None:
    pool.make_socket_root()
    safefs.make_dir(
        lay.socket_dir, uid=pool.owner.uid, gid=pool.owner.gid, mode=0o700, exist_ok=True
    )


def empty_workdir(work: Path) -> None:
    """Empty OverlayFS's work directory (the kernel leaves root-owned, mode 000 directories in
    it), without following any link the branches' user put there."""
    safefs.empty_dir(work)


def remove_dirs(lay: Layout) -> None:
    safefs.remove_tree(lay.root)
    safefs.remove_tree(lay.socket_dir)
