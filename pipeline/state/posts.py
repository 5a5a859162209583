"""Where each run's or incident's headline lives in Slack, so any replica can update it, and the
last post Slack refused (for ``status`` and ``/healthz``).

A headline is posted by one replica: it *claims* the key (``HSETNX claim``), posts, and
*remembers* ``(channel, ts)``; a replica that lost the claim waits for the location instead.
"""

from __future__ import annotations

from pipeline.state import keys
from pipeline.state.redisconn import Store

POST_TTL = 30 * 86400  #: seconds a headline's location is kept


class Posts(Store):
    """Headline locations and the last refused post."""

    async def where(self, key: str) -> tuple[str, str] | None:
        """``(channel, ts)`` of ``key``'s headline, or None if none was posted."""
        got = await self.client.hmget(keys.posts(self.prefix, key), ["channel", "ts"])
        return (str(got[0]), str(got[1])) if got and got[0] and got[1] else None

    async def thread_of(self, key: str) -> tuple[str, str] | None:
        """``(channel, thread ts)`` where replies about ``key`` go: its headline's own thread, or,
        for a headline that is itself a reply (an incident told in a grouped post), its parent's."""
        got = await self.client.hmget(keys.posts(self.prefix, key), ["channel", "ts", "parent"])
        if not got or not got[0] or not got[1]:
            return None
        return str(got[0]), str(got[2] or got[1])

    async def remember(self, key: str, channel: str, ts: str, parent: str | None = None) -> None:
        """``key``'s headline is at ``(channel, ts)`` (kept :data:`POST_TTL` s), a reply in the
        thread of ``parent`` (a ts) if given."""
        name = keys.posts(self.prefix, key)
        fields = {"channel": channel, "ts": ts, **({"parent": parent} if parent else {})}
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(name, mapping=fields)  # type: ignore[arg-type]
            pipe.expire(name, POST_TTL)
            await pipe.execute()

    async def claim(self, key: str, instance: str) -> bool:
        """True if ``instance`` may post ``key``'s headline (no other replica is posting it)."""
        name = keys.posts(self.prefix, key)
        if await self.client.hsetnx(name, "claim", instance):
            await self.client.expire(name, POST_TTL)
            return True
        return bool(await self.client.hget(name, "claim") == instance)

    async def unclaim(self, key: str) -> None:
        """Give the claim on ``key``'s headline up (the post failed)."""
        await self.client.hdel(keys.posts(self.prefix, key), "claim")

    async def record_failure(self, failure: dict[str, str]) -> None:
        """Keep the last post Slack refused (``at`` unix s, ``where``, ``error``, ``line``)."""
        await self.client.hset(keys.delivery_failure(self.prefix), mapping=failure)  # type: ignore[arg-type]

    async def last_failure(self) -> dict[str, str]:
        """The last post Slack refused, as :meth:`record_failure` kept it (empty if none)."""
        return {
            str(k): str(v) for k, v in (await self.client.hgetall(keys.delivery_failure(self.prefix))).items()
        }
