"""One restart in flight per job: the redis-py Lock with its holder, renewal past the TTL, release at
the end of the launch, a crashed holder freeing it within the TTL, and 50 requests at once."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from typing import Any

import pytest
import time_machine

from handlers.context import Context
from handlers.outbox import MemoryOutbox
from handlers.request.dispatch import Dispatcher, Request
from handlers.text import lock_forced_note, lock_free, queued, run_lock_lost, unlock_not_held, unlocked
from pipeline.state import keys
from pipeline.state.audit import AuditOutcome
from pipeline.state.locks import InFlight, JobLock, Locks
from pipeline.state.redisconn import RedisHandle
from tests.support_handlers import (
    ADMIN,
    OPERATOR,
    OPS_GROUP,
    StandInRestarter,
    handler_config,
    make_context,
    wait_until,
)

CONFIG = handler_config(other={"host": "gpu1", "lock_scope": "host"})


@pytest.fixture
def ctx(redis_handle: RedisHandle) -> Context:
    """A Context on real Redis with the stand-in restarter."""
    return make_context(CONFIG, redis_handle)


def _req(text: str, user: str = OPERATOR, **kw: Any) -> Request:
    return Request(text=text, user=user, delivery_id=uuid.uuid4().hex, **kw)


def _restarter(ctx: Context) -> StandInRestarter:
    assert isinstance(ctx.restarter, StandInRestarter)
    return ctx.restarter


async def test_refusal_names_holder_age_and_step(redis_handle: RedisHandle) -> None:
    """A refused acquire raises InFlight (exit 4) worded exactly: who, how long ago, which step."""
    client, prefix = redis_handle.client, redis_handle.prefix
    held = JobLock(client, prefix, "job:dflash", ttl=10)
    await held.acquire(job="dflash", action="restart", user=OPERATOR, run_id="r-42", step="launch")
    now = 1_796_133_731.0
    await client.hset(keys.lock_holder(prefix, "job:dflash"), "started_at", repr(now - 40.2))
    with pytest.raises(InFlight) as info, time_machine.travel(now, tick=False):
        await JobLock(client, prefix, "job:dflash", ttl=10).acquire(
            job="dflash", action="restart", user=ADMIN
        )
    assert info.value.message == (
        "restart of dflash already in flight - started by <@U0OPERATOR1> 40 s ago, now at: launch"
    )
    assert int(info.value.exit_code) == 4
    holder = await Locks(client, prefix).holder("job:dflash")
    assert holder is not None and (holder.user, holder.run_id, holder.step) == (OPERATOR, "r-42", "launch")
    await held.release()
    assert await Locks(client, prefix).holder("job:dflash") is None
    again = JobLock(client, prefix, "job:dflash", ttl=10)
    await again.acquire(job="dflash", action="restart", user=ADMIN)
    await again.release()


async def test_host_scope_serialises_jobs_of_one_host(ctx: Context) -> None:
    """Two jobs with lock_scope = "host" on one host exclude each other; a job-scoped one does not."""
    ctx.restarter = StandInRestarter(CONFIG, ctx.runs, launch_s=2.0)
    d = Dispatcher(ctx, lock_ttl=5)
    try:
        first = await d.handle(_req("restart eagle"))
        assert first.exit_code == 0
        other = await d.handle(_req("restart other", user=ADMIN))
        assert other.exit_code == 4
        assert other.title.startswith("restart of eagle already in flight - started by <@U0OPERATOR1>")
        independent = await d.handle(_req("restart dflash", user=ADMIN))
        assert independent.exit_code == 0
    finally:
        await d.drain(30)


async def test_renewal_keeps_the_lock_past_its_ttl(redis_handle: RedisHandle) -> None:
    """With renewal running, a 1.5 s lock is still held (and refuses others) after 2.5 s."""
    client, prefix = redis_handle.client, redis_handle.prefix
    lock = JobLock(client, prefix, "job:dflash", ttl=1.5)
    await lock.acquire(job="dflash", action="restart", user=OPERATOR)
    lock.start_renewal()
    await asyncio.sleep(2.5)  # time passing beyond the TTL is what this test is about
    assert lock.held and not lock.lost
    assert await client.pttl(keys.lock(prefix, "job:dflash")) > 0
    assert await client.pttl(keys.lock_holder(prefix, "job:dflash")) > 0
    with pytest.raises(InFlight):
        await JobLock(client, prefix, "job:dflash", ttl=1.0).acquire(
            job="dflash", action="restart", user=ADMIN
        )
    await lock.release()
    assert not await client.exists(keys.lock(prefix, "job:dflash"))


async def test_lock_without_renewal_expires(redis_handle: RedisHandle) -> None:
    """Without renewal the lock frees itself within its TTL, and its holder notices it was lost."""
    client, prefix = redis_handle.client, redis_handle.prefix
    lock = JobLock(client, prefix, "job:dflash", ttl=0.5)
    await lock.acquire(job="dflash", action="restart", user=OPERATOR)

    async def free() -> bool:
        return await Locks(client, prefix).holder("job:dflash") is None

    await wait_until(free, timeout=3)
    taker = JobLock(client, prefix, "job:dflash", ttl=5)
    await taker.acquire(job="dflash", action="restart", user=ADMIN)
    await lock.release()
    assert lock.lost
    assert (await Locks(client, prefix).holder("job:dflash")) is not None  # the new holder's record survives
    await taker.release()


async def test_sequence_longer_than_ttl_keeps_the_lock(ctx: Context) -> None:
    """A 4 s launch under a 1.5 s lock keeps it throughout (renewed); a request during it is refused."""
    ctx.restarter = StandInRestarter(CONFIG, ctx.runs, step_s=0.05, launch_s=4.0)
    d = Dispatcher(ctx, lock_ttl=1.5)
    try:
        assert (await d.handle(_req("restart dflash"))).exit_code == 0
        await asyncio.wait_for(_restarter(ctx).in_launch.wait(), 10)
        await asyncio.sleep(2.0)  # longer than the TTL, still inside the launch
        refused = await d.handle(_req("restart dflash", user=ADMIN))
        assert refused.exit_code == 4 and refused.ephemeral
        assert refused.title.startswith("restart of dflash already in flight - started by <@U0OPERATOR1> ")
        assert refused.title.endswith("now at: launch")
        await d.drain(30)
        final = [p for p in _outbox(ctx).of("announce") if p.key == "run:r-1"][-1].reply
        assert run_lock_lost("dflash") not in final.lines
        assert len(await _restarter(ctx).calls()) == 1
    finally:
        await d.drain(30)


def _outbox(ctx: Context) -> MemoryOutbox:
    assert isinstance(ctx.outbox, MemoryOutbox)
    return ctx.outbox


async def test_lock_is_released_when_the_launch_ends(ctx: Context) -> None:
    """Verification must not hold the lock: once the launch step ends, a new restart is accepted even
    though the first sequence is still finishing."""
    ctx.restarter = StandInRestarter(CONFIG, ctx.runs, step_s=0.05, after_launch_s=3.0)
    d = Dispatcher(ctx, lock_ttl=5)
    try:
        await d.handle(_req("restart dflash"))
        await asyncio.wait_for(_restarter(ctx).launched.wait(), 10)
        assert d.in_flight == 1
        assert await Locks(ctx.redis.client, ctx.redis.prefix).holder("job:dflash") is None
        lock = await d.handle(_req("lock dflash"))
        assert lock.title == lock_free("dflash")
    finally:
        await d.drain(30)


async def test_unlock_forces_release_and_the_run_warns(ctx: Context) -> None:
    """``unlock`` (admin only) frees a held lock, is audited, tells the run's thread; the run's final
    message warns that its lock was lost and still shows its true outcome."""
    ctx.restarter = StandInRestarter(CONFIG, ctx.runs, step_s=0.05, launch_s=2.0)
    d = Dispatcher(ctx, lock_ttl=3)
    try:
        await d.handle(_req("restart dflash"))
        await asyncio.wait_for(_restarter(ctx).in_launch.wait(), 10)
        denied = await d.handle(_req("unlock dflash"))
        assert denied.exit_code == 3
        forced = await d.handle(_req("unlock dflash", user=ADMIN))
        assert forced.title == unlocked("job:dflash", ADMIN, OPERATOR)
        assert (await d.audit.recent(outcomes={AuditOutcome.FORCED}, count=1))[0].user == ADMIN
        assert _outbox(ctx).of("thread")[0].reply.title == lock_forced_note(ADMIN)
        await d.drain(30)
        final = [p for p in _outbox(ctx).of("announce") if p.key == "run:r-1"][-1].reply
        assert run_lock_lost("dflash") in final.lines
        assert final.steps[-1].text() == "… verify: waiting"
        again = await d.handle(_req("unlock dflash", user=ADMIN))
        assert again.title == unlock_not_held("job:dflash")
    finally:
        await d.drain(30)


_HOLDER = """
import asyncio, sys
import redis.asyncio as aioredis
from pipeline.state.locks import JobLock

async def main() -> None:
    target, prefix = sys.argv[1], sys.argv[2]
    if target.startswith(("redis://", "rediss://", "unix://")):
        client = aioredis.Redis.from_url(target, decode_responses=True)
    else:
        client = aioredis.Redis(unix_socket_path=target, decode_responses=True)
    lock = JobLock(client, prefix, "job:dflash", ttl=2.0)
    await lock.acquire(job="dflash", action="restart", user="U0DOOMED001", run_id="r-9", step="launch")
    lock.start_renewal()
    print("locked", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_sigkilled_holder_frees_the_lock_within_its_ttl(
    ctx: Context, redis_handle: RedisHandle, redis_url: str | None
) -> None:
    """A separate process holding (and renewing) the lock is SIGKILLed: the lock is free within the
    2 s TTL, and until then requests are refused naming that holder."""
    target = redis_url or str(redis_handle.embedded.socket_file)
    assert target
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _HOLDER,
        target,
        redis_handle.prefix,
        stdout=asyncio.subprocess.PIPE,
        cwd=os.getcwd(),
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.strip() == b"locked"
        d = Dispatcher(ctx, lock_ttl=2)
        await asyncio.sleep(2.5)  # beyond the TTL: the other process's renewal keeps it
        refused = await d.handle(_req("restart dflash"))
        assert refused.exit_code == 4 and "started by <@U0DOOMED001>" in refused.title
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        killed_at = time.monotonic()

        async def free() -> bool:
            return not await ctx.redis.client.exists(keys.lock(ctx.redis.prefix, "job:dflash"))

        await wait_until(free, timeout=5)
        assert time.monotonic() - killed_at <= 2.0 + 0.5  # the TTL, plus polling slack
        accepted = await d.handle(_req("restart dflash"))
        assert accepted.exit_code == 0
        await d.drain(30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_fifty_concurrent_restarts_run_one_sequence(ctx: Context) -> None:
    """50 restart requests for one job from 50 people at once: exactly one sequence runs; the 49
    others are refused (exit 4, ephemeral) naming the one holder, and every request is audited."""
    ctx.restarter = StandInRestarter(CONFIG, ctx.runs, step_s=0.2)  # ~1 s sequence
    d = Dispatcher(ctx, lock_ttl=5)
    users = [f"U0PERSON{i:03d}" for i in range(50)]
    try:
        replies = await asyncio.gather(
            *(d.handle(Request("restart dflash", user=u, groups=(OPS_GROUP,), delivery_id=u)) for u in users)
        )
        accepted = [(u, r) for u, r in zip(users, replies, strict=True) if r.exit_code == 0]
        assert len(accepted) == 1
        winner, reply = accepted[0]
        assert reply.title == queued("r-1", "dflash")
        refused = [r for r in replies if r.exit_code != 0]
        assert len(refused) == 49
        for r in refused:
            assert r.exit_code == 4 and r.ephemeral
            assert r.title.startswith(f"restart of dflash already in flight - started by <@{winner}> ")
        await d.drain(30)
        assert len(await _restarter(ctx).calls()) == 1
        assert await _restarter(ctx).peak() == 1
        records = await d.audit.recent(count=100)
        assert sorted(e.outcome.value for e in records) == ["accepted"] + ["refused"] * 49
        assert await ctx.redis.client.get(keys.run_seq(ctx.redis.prefix)) == "1"  # no orphan runs
    finally:
        await d.drain(30)
