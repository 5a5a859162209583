"""The scheduler leader lease on real Redis: one holder, compare-and-extend, takeover on expiry."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipeline.state import keys
from pipeline.state.leader import LeaderLease
from pipeline.state.redisconn import RedisHandle


async def _until(predicate_coro: object, timeout: float) -> bool:
    """Poll an async predicate (a zero-argument coroutine function) until true or timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate_coro():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.05)
    return False


async def test_one_holder_at_a_time(redis_handle: RedisHandle) -> None:
    """The first process takes the lease; a second cannot while it is held; renewal keeps it."""
    a = LeaderLease(redis_handle.client, redis_handle.prefix, "a", ttl=5)
    b = LeaderLease(redis_handle.client, redis_handle.prefix, "b", ttl=5)
    assert await a.acquire() is True and a.is_leader
    assert await b.acquire() is False and not b.is_leader
    assert await a.acquire() is True
    assert await redis_handle.client.get(keys.leader(redis_handle.prefix)) == "a"
    pttl = await redis_handle.client.pttl(keys.leader(redis_handle.prefix))
    assert 0 < pttl <= 5000


async def test_release_hands_over_at_once(redis_handle: RedisHandle) -> None:
    """Releasing lets another take the lease immediately; a non-holder's release changes nothing."""
    a = LeaderLease(redis_handle.client, redis_handle.prefix, "a", ttl=5)
    b = LeaderLease(redis_handle.client, redis_handle.prefix, "b", ttl=5)
    await a.acquire()
    assert await b.release() is False
    assert await redis_handle.client.get(keys.leader(redis_handle.prefix)) == "a"
    assert await a.release() is True and not a.is_leader
    assert await b.acquire() is True


async def test_takeover_after_the_holder_stops_renewing(redis_handle: RedisHandle) -> None:
    """A holder that stops renewing loses the lease within the TTL and another takes over."""
    a = LeaderLease(redis_handle.client, redis_handle.prefix, "a", ttl=0.6)
    b = LeaderLease(redis_handle.client, redis_handle.prefix, "b", ttl=0.6)
    assert await a.acquire()
    started = time.monotonic()
    assert await _until(b.acquire, timeout=3)
    took = time.monotonic() - started
    assert 0.3 < took < 1.5
    assert not a.is_leader  # a trusts its lease only for ttl * SAFETY after its last renewal
    assert await a.acquire() is False  # the compare-and-extend refuses: b holds it now
    assert await redis_handle.client.get(keys.leader(redis_handle.prefix)) == "b"


def test_ttl_must_be_positive() -> None:
    """A lease needs a positive TTL."""
    with pytest.raises(ValueError, match="positive"):
        LeaderLease(None, "p:", "a", ttl=0)  # type: ignore[arg-type]
