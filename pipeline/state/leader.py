"""The scheduler leader lease: one Pitstop process among replicas runs scheduled jobs; and when it
last watched (a gap between two watch cycles is a time nobody was watching).

Only the holder of the lease (``keys.leader``: the holder's id, with a TTL) runs verifications,
watch cycles and digests; it renews it every ``ttl / 3``, and if it dies another process takes
over within ``ttl``.  A holder trusts its lease locally only until ``renewed_at + ttl * SAFETY``
(monotonic, measured from *before* the renewing command), so one whose renewals stall stops
acting as leader before the key can expire under it.  Claims in Redis remain the backstop.
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from pipeline.state import keys
from pipeline.state.redisconn import DELETE_IF_HELD, Store, ms, unavailable

SAFETY = 0.8  #: fraction of the TTL a holder trusts its lease after a successful renewal

# KEYS[1] lease key; ARGV[1] holder id; ARGV[2] ttl in ms.  1 if held by ARGV[1] afterwards.
_ACQUIRE_OR_EXTEND = """local v = redis.call('GET', KEYS[1])
if v == false then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0"""


class LeaderLease:
    """A Redis lease naming the one process that runs scheduled jobs.

    :param holder: this process's id (``Context.instance``); stored as the lease's value.
    :param ttl: seconds the lease lives without renewal; renew every ``ttl / 3``.
    :raises ValueError: if ``ttl`` is not positive.
    """

    def __init__(self, client: aioredis.Redis, prefix: str, holder: str, ttl: float = 10.0) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        self.client = client
        self.key = keys.leader(prefix)
        self.holder = holder
        self.ttl = ttl
        self._valid_until = 0.0
        self._acquire = client.register_script(_ACQUIRE_OR_EXTEND)
        self._release = client.register_script(DELETE_IF_HELD)

    @property
    def renew_every(self) -> float:
        """Seconds between renewals: a third of the TTL."""
        return self.ttl / 3

    @property
    def is_leader(self) -> bool:
        """True while the last successful acquire/renew is recent enough to trust."""
        return time.monotonic() < self._valid_until

    async def acquire(self) -> bool:
        """Take the lease if it is free, or extend it if this process holds it (the renewal: one that
        expired and nobody else took is taken back).

        :returns: whether this process holds the lease now.
        :raises StateUnavailable: if Redis cannot be reached (the local lease is dropped
            first, so :attr:`is_leader` turns False).
        """
        started, held = time.monotonic(), 0
        try:
            with unavailable():
                held = await self._acquire(keys=[self.key], args=[self.holder, ms(self.ttl)])
        finally:  # a failed renewal drops the local lease too
            self._valid_until = started + self.ttl * SAFETY if held == 1 else 0.0
        return bool(held == 1)

    async def release(self) -> bool:
        """Give the lease up if this process holds it (True), so another can take over at once
        (StateUnavailable if Redis cannot be reached)."""
        self._valid_until = 0.0
        with unavailable():
            return bool(await self._release(keys=[self.key], args=[self.holder]))

    def forget(self) -> None:
        """Stop trusting the lease locally without touching Redis (it expires by itself)."""
        self._valid_until = 0.0


class WatchClock(Store):
    """The time of the last finished watch cycle, of any leader (``keys.watched_at``)."""

    async def mark(self, now: float) -> float | None:
        """Record a cycle finished at ``now`` (unix s); returns the previous cycle's time (None for the
        first), swapped atomically so that among replicas one caller sees each gap."""
        previous = await self.client.set(keys.watched_at(self.prefix), repr(now), get=True)
        return None if previous is None else float(previous)
