"""What scheduled digests remember of a job between runs: where the metric log was read to, the
ranks seen so far, and the last digest's headline numbers (for the ±% change)."""

from __future__ import annotations

from pipeline.state import keys
from pipeline.state.redisconn import Store


class DigestMemory(Store):
    """Digest bookkeeping in Redis (stored as the digest modules write it)."""

    async def offset(self, job: str) -> dict[str, str]:
        """The last scheduled digest's log offset fields (empty if none)."""
        return await self.hash(keys.digest_offset(self.prefix, job))

    async def ranks(self, job: str) -> dict[str, str]:
        """Every rank a digest saw → its JSON ``{"role", "last_ts"}``."""
        return await self.hash(keys.digest_ranks(self.prefix, job))

    async def add_ranks(self, job: str, fields: dict[str, str]) -> None:
        """Record ranks seen (rank → JSON)."""
        await self.client.hset(keys.digest_ranks(self.prefix, job), mapping=fields)  # type: ignore[arg-type]

    async def last(self, job: str) -> str | None:
        """The last scheduled digest's headline (JSON), or None."""
        raw = await self.client.get(keys.digest_last(self.prefix, job))
        return None if raw is None else str(raw)

    async def save(self, job: str, offset: dict[str, str], last: str | None) -> None:
        """A scheduled digest is done: its log offset, and its headline when it had metric lines."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(keys.digest_offset(self.prefix, job), mapping=offset)  # type: ignore[arg-type]
            if last is not None:
                pipe.set(keys.digest_last(self.prefix, job), last)
            await pipe.execute()
