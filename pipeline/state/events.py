"""Events in a Redis stream: what happened (a verdict, an alert, a digest), for any process to await
with a bound (``pitstop say --wait``, the demo's ``wait verdict dflash within 90``, tests).  An
event about a run is also kept in the run's own stream, for ``follow r-N`` to replay and await."""

from __future__ import annotations

import json
import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Json

from pipeline.state import keys
from pipeline.state.redisconn import Store

STREAM_MAXLEN = 10_000
RUN_MAXLEN = 1_000  #: events kept per run (a run has a few dozen)
RUN_TTL = 7 * 86400  #: seconds a run's stream lives after its last event, well past any run's life
BLOCK_S = 4.0  #: longest single XREAD block, under redis-py 8's 5 s default socket timeout


class EventKind(StrEnum):
    """The kinds of event; the values are what the demo script's ``wait`` names."""

    STEP = "step"
    VERDICT = "verdict"
    ALERT = "alert"
    RESOLVED = "resolved"
    DIGEST = "digest"
    RESTART = "restart"
    ESCALATED = "escalated"  #: an escalation step of an unacknowledged incident was taken
    REQUEUED = "requeued"  #: the scheduler requeued a job (told once in its channel)


class Event(BaseModel, frozen=True):
    """One event: its stream id, kind, job, time (unix s) and data, read from a stream entry's fields
    as :meth:`Events.publish` wrote them."""

    id: str
    kind: EventKind
    job: str
    ts: float
    data: Json[dict[str, Any]]


class Events(Store):
    """Publish and await events on the ``events`` stream."""

    async def publish(self, kind: EventKind, job: str, /, **data: Any) -> str:
        """Append an event (one with a ``run_id`` to the run's stream too, in one transaction); returns
        its id on the shared stream."""
        fields: Any = {"kind": kind.value, "job": job, "ts": repr(time.time()), "data": json.dumps(data)}
        pipe = self.client.pipeline()
        pipe.xadd(keys.events(self.prefix), fields, maxlen=STREAM_MAXLEN, approximate=True)
        if data.get("run_id"):
            run_key = keys.run_events(self.prefix, str(data["run_id"]))
            pipe.xadd(run_key, fields, maxlen=RUN_MAXLEN, approximate=True)
            pipe.expire(run_key, RUN_TTL)
        return str((await pipe.execute())[0])

    async def read_run(self, run_id: str, after: str = "0-0", block: float = BLOCK_S) -> list[Event]:
        """The events of run ``run_id`` after stream id ``after`` (``0-0``: from its first); when there
        is none yet, the first to come within ``block`` s (at most :data:`BLOCK_S`), else []."""
        return await self._read(keys.run_events(self.prefix, run_id), after, block)

    async def _read(self, key: str, after: str, block: float) -> list[Event]:
        """Up to 100 events of the stream ``key`` after ``after``, waiting up to ``block`` s (at most
        :data:`BLOCK_S`) for the first."""
        wait = max(1, int(min(block, BLOCK_S) * 1000))
        got: Any = await self.client.xread({key: after}, count=100, block=wait)
        return [Event.model_validate({**f, "id": i}) for _stream, entries in got or [] for i, f in entries]

    async def last_id(self) -> str:
        """The id of the newest event, or ``0-0``: wait for events after it."""
        newest = await self.client.xrevrange(keys.events(self.prefix), count=1)
        return str(newest[0][0]) if newest else "0-0"

    async def wait_for(self, kind: EventKind, job: str | None, *, after: str, timeout: float) -> Event | None:
        """The first event of ``kind`` (for ``job``, any job if None) after stream id ``after``, or None
        if none came within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            for event in await self._read(keys.events(self.prefix), after, left):
                after = event.id
                if event.kind is kind and (job is None or event.job.lower() == job.lower()):
                    return event
        return None
