"""The verification queue: launched runs awaiting their verdict, and the one claim that delivers each.

A launched run is *queued* in ``keys.runs_unverified``, scored by its due time (unix s).  Whoever
comes first (the scheduler leader, ``pitstop say --wait``) *claims* it (``SET NX`` with a short
TTL its holder renews), verifies, posts, and marks it *done* (only the claim's holder may, else
:class:`~pipeline.errors.IllegalTransition`): dequeued, the claim kept as ``done:…`` for
:data:`DONE_TTL` s so it is never delivered twice.  A *released* claim leaves the run queued.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from pipeline.errors import IllegalTransition
from pipeline.state import keys
from pipeline.state.redisconn import DELETE_IF_HELD, EXTEND_IF_HELD, Store, ms

DONE_TTL = 7 * 86400.0  #: seconds a delivered claim is remembered

# KEYS[1] claim, KEYS[2] queue; ARGV[1] holder, ARGV[2] done ttl in ms, ARGV[3] run id.
_DONE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], 'done:' .. ARGV[1], 'PX', ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[3])
return 1
"""

# KEYS[1] claim, KEYS[2] queue; ARGV[1] run id.  Dequeues unless a delivery holds the claim.
_SETTLE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
return redis.call('ZREM', KEYS[2], ARGV[1])
"""


@dataclass(frozen=True)
class Claim:
    """A held claim on delivering one run's verdict."""

    run_id: str
    holder: str  #: the value stored in the claim (instance id and time)
    ttl: float  #: seconds the claim lives without :meth:`VerifyQueue.extend`


class VerifyQueue(Store):
    """Launched runs awaiting verification, and the claims that deliver them."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        super().__init__(client, prefix)
        self.key = keys.runs_unverified(prefix)

    async def enqueue(self, run_id: str, due: float, *, keep: bool = False) -> None:
        """Queue ``run_id``, due at ``due`` (unix s); with ``keep`` one already queued keeps its due time."""
        await self.client.zadd(self.key, {run_id: due}, nx=keep)

    async def requeue(self, run_id: str, due: float) -> None:
        """Move a queued run's due time to ``due`` (unix s); a run not queued stays out."""
        await self.client.zadd(self.key, {run_id: due}, xx=True)

    async def due_at(self, run_id: str) -> float | None:
        """When ``run_id``'s verification is due (unix s), or None if it is not queued."""
        score = await self.client.zscore(self.key, run_id)
        return None if score is None else float(score)

    async def due(self, *, now: float | None = None, limit: int = 100) -> list[str]:
        """Ids of queued runs due by ``now`` (default: now), oldest first."""
        now = time.time() if now is None else now
        return [str(i) for i in await self.client.zrangebyscore(self.key, "-inf", now, start=0, num=limit)]

    async def claim(self, run_id: str, holder: str, ttl: float) -> Claim | None:
        """Claim delivering ``run_id``'s verdict for ``ttl`` s; None if another delivery holds it (or did it)."""
        name = keys.verify_claim(self.prefix, run_id)
        return (
            Claim(run_id, holder, ttl) if await self.client.set(name, holder, nx=True, px=ms(ttl)) else None
        )

    async def extend(self, claim: Claim) -> bool:
        """Extend a held claim by its TTL; False if it was lost (expired, taken by another)."""
        name = keys.verify_claim(self.prefix, claim.run_id)
        return bool(await self.client.eval(EXTEND_IF_HELD, 1, name, claim.holder, ms(claim.ttl)))

    async def release(self, claim: Claim) -> None:
        """Give a claim up, leaving the run as it is in the queue (delivered again when due)."""
        await self.client.eval(DELETE_IF_HELD, 1, keys.verify_claim(self.prefix, claim.run_id), claim.holder)

    async def done(self, claim: Claim) -> None:
        """The verdict is delivered: the run leaves the queue and its claim is kept as done
        (IllegalTransition if this holder no longer holds the claim)."""
        name = keys.verify_claim(self.prefix, claim.run_id)
        if not await self.client.eval(_DONE, 2, name, self.key, claim.holder, ms(DONE_TTL), claim.run_id):
            raise IllegalTransition(
                f"verification of {claim.run_id}", "not claimed by this holder", "be done"
            )

    async def settle(self, run_id: str) -> None:
        """A verdict was decided: dequeue the run unless a delivery holds its claim (it will, when done)."""
        await self.client.eval(_SETTLE, 2, keys.verify_claim(self.prefix, run_id), self.key, run_id)

    async def drop(self, run_id: str) -> None:
        """Forget a queued run that no longer exists."""
        await self.client.zrem(self.key, run_id)
