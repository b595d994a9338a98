"""What the Docker runtime leaves beside the pool: containers and volumes, found by the labels
that name the pool. ``gc`` removes the ones nothing claims; ``pool rm`` removes them all."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from pgoverlay.errors import DockerError
from pgoverlay.runner.runtime import docker

log = logging.getLogger(__name__)


def reconcile(
    pool_id: str,
    *,
    known: Iterable[str],
    may_remove: Callable[[str, str], bool],
    stop_timeout: float,
) -> list[str]:
    """Remove this pool's containers and volumes that nothing claims (see
    ``docker.reconcile``); raises ``DockerError`` when the daemon does not answer."""
    client = docker.connect(timeout=10)
    try:
        return docker.reconcile(
            client,
            pool_id=pool_id,
            known=known,
            may_remove=may_remove,
            stop_timeout=stop_timeout,
        )
    finally:
        client.close()


def remove_all(pool_id: str) -> list[str]:
    """Every container and volume labelled with this pool, whatever made it."""
    try:
        client = docker.connect(timeout=10)
    except DockerError:
        log.info("no Docker daemon answers: no containers or volumes of this pool to remove")
        return []
    removed = []
    try:
        containers, volumes = docker.labelled(client, pool_id)
        for container in containers:
            container.remove(force=True)
            removed.append(f"removed container {container.name}")
        for volume in volumes:
            docker.remove_volume(client, volume.name)
            removed.append(f"removed volume {volume.name}")
    finally:
        client.close()
    return removed
