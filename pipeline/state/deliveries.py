"""Exactly-once deliveries: a Slack delivery acted on is remembered, so retries and double clicks act once.

This is about Slack's deliveries (a request arriving twice), not alerts: an alert is posted
once per incident by the incident's compare-and-set in :mod:`pipeline.state.incidents`.

Slack redelivers an event it thinks was not acknowledged (``X-Slack-Retry-Num``,
``retry_attempt``) and a person may click a button twice; both arrive with the same delivery
id (the event id, the slash command's trigger id, the action's trigger id).  The first one
claims the id with ``SET NX EX``; every later one is a duplicate.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from pipeline.state import keys
from pipeline.state.redisconn import Store

DEFAULT_TTL = 3600  #: seconds a delivery id is remembered (Slack retries within minutes)


class Deliveries(Store):
    """Claim delivery ids.

    :param ttl: seconds a claim is kept.
    """

    def __init__(self, client: aioredis.Redis, prefix: str, *, ttl: int = DEFAULT_TTL) -> None:
        super().__init__(client, prefix)
        self.ttl = ttl

    async def claim(self, delivery_id: str, owner: str = "1") -> bool:
        """Claim ``delivery_id``.

        :param owner: stored with the claim (the instance that acts on it).
        :returns: True for the first delivery, False for a repeat.
        """
        return bool(
            await self.client.set(keys.delivery(self.prefix, delivery_id), owner, nx=True, ex=self.ttl)
        )

    async def seen(self, delivery_id: str) -> bool:
        """True when ``delivery_id`` was already claimed."""
        return bool(await self.client.exists(keys.delivery(self.prefix, delivery_id)))
