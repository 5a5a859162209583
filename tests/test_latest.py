"""Last state wins: handlers.runs.view.Latest delivers at the consumer's pace, coalescing what waited."""

from __future__ import annotations

import asyncio

from handlers.runs.view import Latest


async def test_puts_while_a_delivery_is_slow_are_coalesced_into_the_last() -> None:
    """Values put while a delivery is held are not delivered one by one: only the newest follows."""
    gate = asyncio.Event()
    started = asyncio.Event()
    delivered: list[int] = []

    async def deliver(value: int) -> None:
        started.set()
        await gate.wait()
        delivered.append(value)

    latest: Latest[int] = Latest(deliver, "test")
    latest.put(1)
    await asyncio.wait_for(started.wait(), 5)
    for value in (2, 3, 4):
        latest.put(value)  # returns at once although the surface is stuck
    assert delivered == []
    gate.set()
    await asyncio.wait_for(latest.flush(), 5)
    assert delivered == [1, 4]


async def test_a_failed_delivery_is_logged_and_the_next_value_still_delivered(caplog) -> None:  # type: ignore[no-untyped-def]
    """A surface error does not stop later deliveries, and is logged with what it was."""
    delivered: list[str] = []

    async def deliver(value: str) -> None:
        if value == "bad":
            raise RuntimeError("slack is down")
        delivered.append(value)

    latest: Latest[str] = Latest(deliver, "run r-1")
    latest.put("bad")
    await asyncio.wait_for(latest.flush(), 5)
    latest.put("good")
    await asyncio.wait_for(latest.flush(), 5)
    assert delivered == ["good"]
    assert "could not deliver run r-1" in caplog.text


async def test_flush_with_nothing_put_returns() -> None:
    """Flushing a Latest that never got a value returns at once and delivers nothing."""
    delivered: list[int] = []

    async def deliver(value: int) -> None:
        delivered.append(value)

    latest: Latest[int] = Latest(deliver, "test")
    await asyncio.wait_for(latest.flush(), 5)
    assert delivered == []
