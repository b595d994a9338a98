"""The network API's pool: the way in through the front door (the bases a branch may be made
of are an engine operation's route, in ``api_branches``)."""

from __future__ import annotations

from fastapi import APIRouter

from pgoverlay.runner.web.deps import Door, Engine

router = APIRouter()


@router.get("/pool")
def pool(e: Engine, door: Door) -> dict[str, object]:
    return {
        "door_name": door.host,
        "door_port": door.port,
        "door_https_port": door.https_port,
        "app_sslmode": door.app_sslmode,
    }
