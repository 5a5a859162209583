"""When Pitstop last watched: a gap between two watch cycles is a time nobody was watching."""

from __future__ import annotations

from pipeline.state import keys
from pipeline.state.redisconn import Store


class WatchClock(Store):
    """The time of the last finished watch cycle, of any leader (``keys.watched_at``)."""

    async def mark(self, now: float) -> float | None:
        """Record a cycle finished at ``now`` (unix s); returns the previous cycle's time (None for the
        first), swapped atomically so that among replicas one caller sees each gap."""
        previous = await self.client.set(keys.watched_at(self.prefix), repr(now), get=True)
        return None if previous is None else float(previous)
