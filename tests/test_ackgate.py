"""The ack gate: work after an ack waits for a lull in the acks being made, but never longer than its patience."""

from __future__ import annotations

import asyncio
import contextlib

from bot.slack.app import AckGate


async def test_lull_returns_at_once_when_nothing_is_being_acked() -> None:
    """With no request being acked, a follow-up starts without waiting."""
    gate = AckGate(patience=60)
    await asyncio.wait_for(gate.lull(), 5)


async def test_follow_up_starts_when_the_last_ack_went_out() -> None:
    """A follow-up waits while two requests are being acked and starts once both are done."""
    gate = AckGate(patience=60)
    first, second = gate.acking(), gate.acking()
    first.__enter__()
    second.__enter__()
    waiter = asyncio.create_task(gate.lull())
    first.__exit__(None, None, None)
    await asyncio.sleep(0)
    assert not waiter.done() and gate.in_flight == 1
    second.__exit__(None, None, None)
    await asyncio.wait_for(waiter, 5)
    assert gate.in_flight == 0


async def test_follow_up_is_delayed_not_starved() -> None:
    """Under acks that never stop, a follow-up still starts after its patience."""
    gate = AckGate(patience=0.05)
    with gate.acking():
        await asyncio.wait_for(gate.lull(), 5)
        assert gate.in_flight == 1


async def test_follow_ups_beyond_the_slots_queue() -> None:
    """With two slots, a third follow-up waits until one of the first two ends."""
    gate = AckGate(patience=60, concurrency=2)
    release = asyncio.Event()
    running: list[int] = []

    async def work(i: int) -> None:
        async with gate.follow_up():
            running.append(i)
            await release.wait()

    tasks = [asyncio.create_task(work(i)) for i in range(3)]
    for _ in range(50):  # let every task run as far as it can
        await asyncio.sleep(0)
    assert running == [0, 1]
    release.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert sorted(running) == [0, 1, 2]


async def test_follow_up_waits_for_a_quiet_spell_after_the_last_ack() -> None:
    """Right after an ack went out (nothing in flight, but not quiet for long) a follow-up still waits."""
    gate = AckGate(patience=60, quiet=60)
    with gate.acking():
        pass
    waiter = asyncio.create_task(gate.lull())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiter.done() and gate.in_flight == 0
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
