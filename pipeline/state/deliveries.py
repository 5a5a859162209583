"""Exactly-once deliveries: a Slack delivery acted on is remembered, so retries and double clicks act once.

Slack redelivers an event it thinks was not acknowledged, and a person may click a button twice;
both arrive with the same delivery id (the event id, the slash command's or action's trigger id).
The first claims the id with ``SET NX EX``; every later one is a duplicate.  (Alerts are
de-duplicated by their incident: :mod:`pipeline.state.incidents`.)
"""

from __future__ import annotations

import redis.asyncio as aioredis

from pipeline.state import keys
from pipeline.state.redisconn import Store

DEFAULT_TTL = 3600  #: seconds a delivery id is remembered (Slack retries within minutes)


class Deliveries(Store):
    """Claim delivery ids, each kept ``ttl`` s."""

    def __init__(self, client: aioredis.Redis, prefix: str, *, ttl: int = DEFAULT_TTL) -> None:
        super().__init__(client, prefix)
        self.ttl = ttl

    async def claim(self, delivery_id: str, owner: str = "1") -> bool:
        """Claim ``delivery_id`` for ``owner`` (the instance that acts on it): True for the first delivery,
        False for a repeat."""
        return bool(
            await self.client.set(keys.delivery(self.prefix, delivery_id), owner, nx=True, ex=self.ttl)
        )

    async def seen(self, delivery_id: str) -> bool:
        """True when ``delivery_id`` was already claimed."""
        return bool(await self.client.exists(keys.delivery(self.prefix, delivery_id)))
