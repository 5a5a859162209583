"""Verdict delivery: one claim, one verification, one post per run — whoever gets there first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from handlers.outbox import MemoryOutbox
from pipeline.config import Config
from pipeline.state import keys
from pipeline.state.events import EventKind
from pipeline.state.runs import RunStore
from pipeline.verdict import Outcome, Step, Verdict
from tests.test_watch import Harness, open_harness


@pytest.fixture
async def harness(tmp_path: Path, redis_config: Config) -> AsyncIterator[Harness]:
    """One job ``train`` with a 1 s start window."""
    async with open_harness(tmp_path, redis_config, {"train": {"start_window": 1.0}}) as h:
        yield h


async def test_two_processes_deliver_one_verdict(harness: Harness) -> None:
    """Two processes delivering the same run at once: one verifies and posts, the other gets None."""
    h, a = harness, harness.ctx
    b_box = MemoryOutbox()
    b = await h.context("B", b_box)
    after = await a.events.last_id()
    run = await h.launch("train", verify=False)
    assert await a.redis.client.zscore(keys.runs_unverified(a.redis.prefix), run.id) is not None
    got = await asyncio.gather(a.service.deliver(run.id), b.service.deliver(run.id))
    delivered = [r for r in got if r is not None]
    assert len(delivered) == 1 and delivered[0].verdict is Verdict.RUNNING
    threads = h.outbox.of("thread") + b_box.of("thread")
    assert [(p.key, p.reply.title) for p in threads] == [(f"run:{run.id}", delivered[0].verdict_line)]
    headlines = h.outbox.of("announce") + b_box.of("announce")
    assert len(headlines) == 1 and headlines[0].reply.run_id == run.id and headlines[0].channel == "CTRAIN"
    event = await a.events.wait_for(EventKind.VERDICT, "train", after=after, timeout=5)
    assert event is not None and event.data["verdict"] == "RUNNING" and event.data["run_id"] == run.id
    assert await a.redis.client.zscore(keys.runs_unverified(a.redis.prefix), run.id) is None
    # later attempts (a retry of `say --wait`, the next poll) post nothing more
    assert await b.service.deliver(run.id) is None
    assert await a.service.deliver_due() == []
    assert len(h.outbox.of("thread") + b_box.of("thread")) == 1


async def test_exited_job_gets_exited_verdict_with_evidence(harness: Harness) -> None:
    """A job that exits after its start gets the EXITED verdict, with its log as evidence, in its thread."""
    h, ctx = harness, harness.ctx
    h.set_mode("train", exit_after=0.3)
    run = await h.launch("train", verify=False)
    got = await ctx.service.deliver(run.id)
    assert got is not None and got.verdict is Verdict.EXITED
    post = ctx.outbox.of("thread")[0]
    assert post.reply.title == got.verdict_line and post.reply.status.value == "error"
    assert post.reply.log is not None and "RuntimeError: synthetic crash" in post.reply.log


async def test_interrupted_delivery_is_posted_again_without_verifying_again(harness: Harness) -> None:
    """A delivery that died after verifying (its claim expired) is posted by the next process, once."""
    h, ctx = harness, harness.ctx
    run = await h.launch("train")  # verified, verdict recorded, but never posted
    await ctx.redis.client.zadd(keys.runs_unverified(ctx.redis.prefix), {run.id: 0})
    assert await ctx.service.queue.due() == [run.id]
    delivered = await ctx.service.deliver_due()
    assert [r.id for r in delivered] == [run.id]
    assert delivered[0].finished_at == run.finished_at  # not verified a second time
    assert len(ctx.outbox.of("thread")) == 1
    assert await ctx.service.queue.due() == []


async def test_unknown_run_is_dropped(harness: Harness) -> None:
    """An unverified id without a run record is dropped from the set and posts nothing."""
    ctx = harness.ctx
    await ctx.redis.client.zadd(keys.runs_unverified(ctx.redis.prefix), {"r-999": 0})
    assert await ctx.service.deliver("r-999") is None
    assert await ctx.service.queue.due() == [] and ctx.outbox.posted == []


async def test_verification_racing_a_take_over_tells_one_verdict(harness: Harness) -> None:
    """Verification deciding a run while another replica takes it over as INTERRUPTED: one wins, one verdict is told."""
    h, a = harness, harness.ctx
    b_box = MemoryOutbox()
    b = await h.context("B", b_box)
    dead = RunStore(a.redis.client, a.redis.prefix)  # a replica that died mid-launch: no heartbeat
    run = await dead.create("train", "U0TEST", action="start")
    run.owner = "replica-killed"
    run = await a.restarter.start(run)
    launch = run.step(Step.LAUNCH)
    assert launch is not None and await a.service.queue.due_at(run.id) is not None  # queued for verification
    launch.outcome, launch.ended_at = Outcome.RUNNING, None  # it died before the launch step ended
    await dead.record_step(run)
    delivered, taken = await asyncio.gather(a.service.deliver(run.id), b.service.recover())
    stored = await a.runs.get(run.id)
    told = [p.reply.title for p in h.outbox.of("thread") + b_box.of("thread") if p.key == f"run:{run.id}"]
    assert told == [stored.verdict_line]
    if delivered is None:  # the take-over won: verification wrote nothing and posted nothing
        assert [i.run.id for i in taken] == [run.id] and stored.verdict is Verdict.INTERRUPTED
    else:
        assert taken == [] and stored.verdict is delivered.verdict is not Verdict.INTERRUPTED
    events = await a.redis.client.xrange(keys.events(a.redis.prefix))
    verdicts = [f for _, f in events if f["kind"] == EventKind.VERDICT.value and run.id in f["data"]]
    assert len(verdicts) == 1
    assert (
        await a.service.deliver(run.id) is None and await a.service.queue.due_at(run.id) is None
    )  # nothing more
