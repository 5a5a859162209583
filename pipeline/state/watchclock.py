"""When Pitstop last watched: a gap between two watch cycles is a time nobody was watching."""

from __future__ import annotations

import redis.asyncio as aioredis

from pipeline.state import keys


class WatchClock:
    """The time of the last finished watch cycle, of any leader (``keys.watched_at``).

    :param client: an asyncio Redis client (``decode_responses=True``).
    :param prefix: the key prefix.
    """

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    async def mark(self, now: float) -> float | None:
        """Record a cycle finished at ``now`` (unix s).

        :returns: the previous cycle's time, or None for the first; swapped atomically, so among
            replicas one caller sees each gap.
        """
        previous = await self.client.set(keys.watched_at(self.prefix), repr(now), get=True)
        return None if previous is None else float(previous)
