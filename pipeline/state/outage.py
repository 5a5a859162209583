"""The state store's outages: noticed, the embedded server restarted, told once it is back.

:class:`StoreWatch` pings Redis; while it does not answer, it revives a dead embedded server with
backoff and logs an error once the outage outlasts ``grace``.  When Redis answers again after such
an outage, or after a revival (whose last second of writes may be lost), the :class:`Outage` is
told once among replicas: the first to claim it in ``keys.outage_told`` tells it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass

from redis.backoff import ExponentialBackoff

from pipeline.errors import StateUnavailable
from pipeline.state import keys
from pipeline.state.redisconn import RedisHandle

log = logging.getLogger(__name__)

BACKOFF = ExponentialBackoff(cap=10.0, base=0.2)  #: seconds between tries while Redis is away

# KEYS[1] outage_told; ARGV[1] start, ARGV[2] end (unix s).  1 if this outage is the first to tell of
# a time Redis was away (no told outage ended after it began), else 0.
_CLAIM = """
local told = tonumber(redis.call('GET', KEYS[1]) or '0')
if told >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', 604800)
return 1
"""


@dataclass(frozen=True)
class Outage:
    """A time Redis did not answer: ``start`` and ``end`` are Unix times (s)."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        """How long it lasted, in seconds."""
        return self.end - self.start


class StoreWatch:
    """Watches one :class:`RedisHandle`; run :meth:`run` as a task, end it with :meth:`stop`.

    :param grace: seconds of outage after which it is reported (two watch intervals).
    :param on_back: awaited once Redis is back after an outage longer than ``grace`` or a revival.
    :param every: seconds between pings while Redis answers.
    """

    def __init__(
        self,
        handle: RedisHandle,
        *,
        grace: float,
        on_back: Callable[[Outage], Awaitable[None]],
        every: float = 1.0,
    ) -> None:
        self.handle = handle
        self.grace = grace
        self.every = every
        self.on_back = on_back
        self.down_since: float | None = None  #: Unix time (s) the current outage began, else None
        #: the last outage seen to end, once told (here or by a replica) or found too short to tell
        self.last_outage: Outage | None = None
        self._logged = self._revived = False
        self._stopped = asyncio.Event()

    def stop(self) -> None:
        """Make :meth:`run` return at its next wait (a cancellation alone can be lost in a ``wait_for``)."""
        self._stopped.set()

    async def _pause(self, seconds: float) -> None:
        with suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    async def run(self) -> None:
        """Ping, revive and report until :meth:`stop` (or cancelled)."""
        failures = 0
        while not self._stopped.is_set():
            try:
                await self.handle.round_trip()
            except StateUnavailable as exc:
                failures += 1
                await self._down(exc)
                await self._pause(BACKOFF.compute(failures))
                continue
            failures = 0
            if self.down_since is not None:
                outage, self.down_since = Outage(self.down_since, time.time()), None
                log.warning("Redis answers again after %.0f s", outage.seconds)
                if outage.seconds > self.grace or self._revived:
                    key = keys.outage_told(self.handle.prefix)
                    try:  # told by the first replica whose outage no told one overlaps
                        if await self.handle.client.eval(
                            _CLAIM, 1, key, repr(outage.start), repr(outage.end)
                        ):
                            await self.on_back(outage)
                    except Exception:
                        log.exception("telling of the Redis outage failed")
                self.last_outage = outage
            await self._pause(self.every)

    async def _down(self, exc: StateUnavailable) -> None:
        """Note the outage, log it once it outlasts :attr:`grace`, and try to revive the server."""
        now = time.time()
        if self.down_since is None:
            self.down_since, self._logged, self._revived = now, False, False
            log.warning("Redis does not answer: %s", exc.detail)
        elif now - self.down_since > self.grace and not self._logged:
            self._logged = True
            log.error(
                "state store unreachable since %s (%.0f s): %s",
                time.strftime("%H:%M:%S UTC", time.gmtime(self.down_since)),
                now - self.down_since,
                exc.detail,
            )
        try:
            self._revived = await self.handle.revive() or self._revived
        except StateUnavailable as err:
            log.warning("could not start the embedded Redis again: %s", err.detail)
