"""The network API's pool: the way in through the front door, and the bases a branch may be
made of."""

from __future__ import annotations

from fastapi import APIRouter

from pgoverlay.runner.service.views import BaseView
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


@router.get("/bases")
def bases(e: Engine) -> list[BaseView]:
    return e.bases()
