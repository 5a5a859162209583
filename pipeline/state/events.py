"""Events in a Redis stream: what happened (a verdict, an alert, a digest), for any process to await
with a bound (``pitstop say --wait``, the demo's ``wait verdict dflash within 90``, tests)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis

from pipeline.state import keys
from pipeline.state.redisconn import Store

STREAM_MAXLEN = 10_000
BLOCK_S = 4.0  #: longest single XREAD block, under redis-py 8's 5 s default socket timeout


class EventKind(StrEnum):
    """The kinds of event; the values are what the demo script's ``wait`` names."""

    STEP = "step"
    VERDICT = "verdict"
    ALERT = "alert"
    RESOLVED = "resolved"
    DIGEST = "digest"
    RESTART = "restart"


@dataclass(frozen=True)
class Event:
    """One event: its stream id, kind, job, time (unix s) and data."""

    id: str
    kind: EventKind
    job: str
    ts: float
    data: dict[str, Any]


class Events(Store):
    """Publish and await events on the ``events`` stream."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        super().__init__(client, prefix)
        self.key = keys.events(prefix)

    async def publish(self, kind: EventKind, job: str, /, **data: Any) -> str:
        """Append an event; returns its stream id."""
        fields = {"kind": kind.value, "job": job, "ts": repr(time.time()), "data": json.dumps(data)}
        return str(await self.client.xadd(self.key, fields, maxlen=STREAM_MAXLEN, approximate=True))  # type: ignore[arg-type]

    async def last_id(self) -> str:
        """The id of the newest event, or ``0-0``: wait for events after it."""
        newest = await self.client.xrevrange(self.key, count=1)
        return str(newest[0][0]) if newest else "0-0"

    async def wait_for(self, kind: EventKind, job: str | None, *, after: str, timeout: float) -> Event | None:
        """The first event of ``kind`` (for ``job``, any job if None) after stream id ``after``, or None
        if none came within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        cursor = after
        while (left := deadline - time.monotonic()) > 0:
            got: Any = await self.client.xread(
                {self.key: cursor}, count=100, block=max(1, int(min(left, BLOCK_S) * 1000))
            )
            for _stream, entries in got or []:
                for entry_id, fields in entries:
                    cursor = entry_id
                    if fields.get("kind") == kind.value and (
                        job is None or fields.get("job", "").lower() == job.lower()
                    ):
                        data = json.loads(fields["data"])
                        return Event(str(entry_id), kind, fields["job"], float(fields["ts"]), data)
        return None
