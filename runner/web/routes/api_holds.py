"""A branch's hold, in the network API: one job of a pull request at a time, whichever runner
it landed on (the Action takes its branch's hold for its whole run)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from pgoverlay import errors
from pgoverlay.runner.service.answers import Name
from pgoverlay.runner.web.deps import Admitted, Engine

router = APIRouter(prefix="/branches/{name}/hold")


class HoldRequest(BaseModel):
    """Take a branch's hold for ``seconds`` (renewed by the holder), waiting at most ``wait``
    seconds for another job's to end."""

    model_config = ConfigDict(extra="forbid", strict=True)
    seconds: int = Field(default=120, ge=10, le=600)
    wait: int = Field(default=25, ge=0, le=50)


class Held(BaseModel):
    hold: str
    seconds: int


@dataclass
class _Hold:
    id: str
    until: float  # time.monotonic()


@dataclass
class Holds:
    """Which job holds each branch, by repository id and branch name: one job of a pull request
    at a time, whichever runner it landed on (the Action takes its branch's hold for its whole
    run). Kept in the door's memory: a door that restarts forgets them, and a job holding one
    renews it or loses it when it lapses. A repository may hold at most ``most`` at once."""

    most: int = 64
    _held: dict[tuple[int, str], _Hold] = field(default_factory=dict)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def _lapse(self) -> None:
        now = time.monotonic()
        for key in [k for k, h in self._held.items() if h.until <= now]:
            del self._held[key]

    async def take(self, key: tuple[int, str], *, seconds: int, wait: float) -> str:
        deadline = time.monotonic() + wait
        async with self._changed:
            while True:
                self._lapse()
                held = self._held.get(key)
                if held is None:
                    if sum(k[0] == key[0] for k in self._held) >= self.most:
                        raise errors.LimitReachedError(
                            f"this repository's jobs hold {self.most} branches at once, the "
                            "most the pool allows: let some finish, then try again"
                        )
                    made = _Hold(secrets.token_urlsafe(16), time.monotonic() + seconds)
                    self._held[key] = made
                    return made.id
                now = time.monotonic()
                if now >= deadline:
                    raise errors.LockBusyError(
                        f"another job of this repository holds branch {key[1]} (for "
                        f"{held.until - now:.0f} s more unless it renews it): try again"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._changed.wait(), timeout=min(deadline, held.until) - now
                    )

    async def renew(self, key: tuple[int, str], hold: str, *, seconds: int) -> None:
        async with self._changed:
            self._lapse()
            held = self._held.get(key)
            if held is None or not secrets.compare_digest(held.id, hold):
                raise errors.LockBusyError(
                    f"this job's hold on branch {key[1]} lapsed (another job may hold it now): "
                    "re-run the job"
                )
            held.until = time.monotonic() + seconds

    async def give_back(self, key: tuple[int, str], hold: str) -> bool:
        """True when ``hold`` was the branch's, and is given back now."""
        async with self._changed:
            held = self._held.get(key)
            if held is not None and secrets.compare_digest(held.id, hold):
                del self._held[key]
                self._changed.notify_all()
                return True
            return False


def _holds(request: Request) -> Holds:
    found: Holds = request.app.state.holds
    return found


Holding = Annotated[Holds, Depends(_holds)]


@router.post("")
async def hold(
    e: Engine, vouched: Admitted, holds: Holding, name: Name, body: Annotated[HoldRequest, Body()]
) -> Held:
    made = await holds.take((vouched.repository_id, name), seconds=body.seconds, wait=body.wait)
    return Held(hold=made, seconds=body.seconds)


@router.post("/{hold}/renew")
async def renew(e: Engine, vouched: Admitted, holds: Holding, name: Name, hold: str) -> Held:
    await holds.renew((vouched.repository_id, name), hold, seconds=120)
    return Held(hold=hold, seconds=120)


@router.delete("/{hold}", status_code=204)
async def give_back(e: Engine, vouched: Admitted, holds: Holding, name: Name, hold: str) -> None:
    if await holds.give_back((vouched.repository_id, name), hold):
        # The job that held the branch ended: the credential it was given goes with it
        # (another repository's branch of that name, which it held the name of, keeps its).
        with contextlib.suppress(errors.NotOwnerError):
            await asyncio.to_thread(e.end_job, name)
