"""The scheduler end to end: verification posts when due, after downtime, across replicas;
leader takeover; automatic restarts bounded by the crash-loop limit; digests on the leader only."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from bot.runtime.scheduler import PitstopScheduler
from handlers.outbox import MemoryOutbox
from pipeline.config import AutoRestart, Config, DigestSettings
from pipeline.config.jobs import CrashClass
from pipeline.state import keys
from pipeline.state.events import Event, EventKind
from tests.test_watch import MENTION, Harness, open_harness, until


async def _events(
    h: Harness, kind: EventKind, job: str, after: str, *, count: int, timeout: float
) -> list[Event]:
    """Await ``count`` events of ``kind`` for ``job`` after stream id ``after`` (bounded)."""
    out: list[Event] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and (left := deadline - time.monotonic()) > 0:
        # at most 4 s per XREAD: redis-py's default socket timeout is 5 s
        ev = await h.ctx.events.wait_for(kind, job, after=after, timeout=min(left, 4.0))
        if ev is not None:
            out.append(ev)
            after = ev.id
    return out


@pytest.fixture
async def harness(tmp_path: Path, redis_config: Config) -> AsyncIterator[Harness]:
    """Jobs ``train`` (stays up, 1 s start window) and ``crash`` (2 s start window)."""
    async with open_harness(
        tmp_path, redis_config, {"train": {"start_window": 1.0}, "crash": {"start_window": 2.0}}
    ) as h:
        yield h


async def test_verification_posted_when_due_with_the_right_verdict(harness: Harness) -> None:
    """A job that stays up gets RUNNING at launch + start_window; one that exits after 1 s gets EXITED."""
    h, ctx = harness, harness.ctx
    sched = PitstopScheduler(ctx, leader_ttl=1.0, poll_interval=0.2)
    await sched.start()
    try:
        assert sched.is_leader
        after = await ctx.events.last_id()
        h.set_mode("crash", exit_after=1.0)
        up = await h.launch("train", verify=False)
        down = await h.launch("crash", verify=False)
        [ev_up] = await _events(h, EventKind.VERDICT, "train", after, count=1, timeout=15)
        [ev_down] = await _events(h, EventKind.VERDICT, "crash", after, count=1, timeout=15)
        assert ev_up.data["verdict"] == "RUNNING" and ev_up.data["run_id"] == up.id
        assert ev_down.data["verdict"] == "EXITED" and ev_down.data["run_id"] == down.id
        assert up.launched_at is not None and down.launched_at is not None
        assert ev_up.ts >= up.launched_at + 1.0
        assert ev_down.ts >= down.launched_at + 2.0
        verdicts = {p.key: p.reply.title for p in ctx.outbox.of("thread")}
        assert verdicts[f"run:{up.id}"].startswith("RUNNING") or "RUNNING" in verdicts[f"run:{up.id}"]
        assert "exit" in verdicts[f"run:{down.id}"].lower()
        assert len(ctx.outbox.of("thread")) == 2
    finally:
        await sched.stop()


async def test_verification_due_while_down_runs_once_at_start(harness: Harness) -> None:
    """A verification that came due while no scheduler ran is delivered once when one starts."""
    h, ctx = harness, harness.ctx
    run = await h.launch("train", verify=False)
    assert run.launched_at is not None
    assert await until(lambda: _past(run.launched_at + 1.2), 5)
    after = await ctx.events.last_id()
    sched = PitstopScheduler(ctx, leader_ttl=1.0, poll_interval=0.2)
    await sched.start()
    try:
        [ev] = await _events(h, EventKind.VERDICT, "train", after, count=1, timeout=10)
        assert ev.data["run_id"] == run.id and ev.data["verdict"] == "RUNNING"
        assert await _events(h, EventKind.VERDICT, "train", ev.id, count=1, timeout=1.0) == []
        assert [p.key for p in ctx.outbox.of("thread")] == [f"run:{run.id}"]
    finally:
        await sched.stop()


async def test_replicas_post_once_and_a_follower_takes_over(harness: Harness) -> None:
    """Two replicas on one Redis: the verdict and the alert are posted once; when the leader dies
    (stops without releasing) the other takes the lease within the TTL and carries on."""
    h, a = harness, harness.ctx
    b_box = MemoryOutbox()
    b = await h.context("B", b_box)
    sa = PitstopScheduler(a, leader_ttl=1.0, poll_interval=0.2)
    sb = PitstopScheduler(b, leader_ttl=1.0, poll_interval=0.2)
    await sa.start()
    await sb.start()
    try:
        assert sa.is_leader and not sb.is_leader
        after = await a.events.last_id()
        run = await h.launch("train", verify=False)
        [verdict] = await _events(h, EventKind.VERDICT, "train", after, count=1, timeout=10)
        assert verdict.data["run_id"] == run.id and verdict.data["instance"] == "A"
        assert await until(lambda: _has_state(h), 5)  # the watcher has seen it alive
        await h.kill("train")
        [alert] = await _events(h, EventKind.ALERT, "train", after, count=1, timeout=10)
        assert alert.data["alert"] == "dead" and alert.data["instance"] == "A"
        # the leader dies without a word: its lease must expire before B may lead
        await sa.stop(release=False)
        died = time.monotonic()
        assert await until(lambda: _true(sb.is_leader), 5)
        assert time.monotonic() - died < 2.5
        after = await a.events.last_id()
        rerun = await h.launch("train", verify=False, ctx=b)
        [verdict2] = await _events(h, EventKind.VERDICT, "train", after, count=1, timeout=10)
        assert verdict2.data["run_id"] == rerun.id and verdict2.data["instance"] == "B"
        [resolved] = await _events(h, EventKind.RESOLVED, "train", after, count=1, timeout=10)
        assert resolved.data["instance"] == "B"
        assert await _events(h, EventKind.ALERT, "train", after, count=1, timeout=1.0) == []
        both = h.outbox.posted + b_box.posted
        assert len([p for p in both if p.kind == "thread" and p.key == f"run:{run.id}"]) == 1
        assert len([p for p in both if p.kind == "thread" and p.key == f"run:{rerun.id}"]) == 1
        assert len(h.alerts(h.outbox) + h.alerts(b_box)) == 1
        assert len(h.thread("resolved after", h.outbox) + h.thread("resolved after", b_box)) == 1
    finally:
        await sa.stop()
        await sb.stop()


async def test_jobs_are_scheduled_with_explicit_misfire_and_coalesce(
    tmp_path: Path, redis_config: Config
) -> None:
    """Every job sets misfire_grace_time, coalesce and max_instances=1; jobs on one host share one
    watch job; digests use an interval or a crontab in the configured timezone."""
    async with open_harness(
        tmp_path,
        redis_config,
        {
            "one": {"digest": DigestSettings(every=3600)},
            "two": {"digest": DigestSettings(cron="0 9 * * 1-5")},
        },
    ) as h:
        config = h.config.model_copy(
            update={"scheduler": h.config.scheduler.model_copy(update={"timezone": "Europe/Berlin"})}
        )
        h.ctx.config = config
        sched = PitstopScheduler(h.ctx, leader_ttl=3.0, poll_interval=0.5)
        await sched.start()
        try:
            aps = sched._scheduler
            assert aps is not None
            jobs = {j.id: j for j in aps.get_jobs()}
            assert set(jobs) == {"leader", "verify", "watch:local:0.3", "digest:one", "digest:two"}
            for job in jobs.values():
                assert job.coalesce is True and job.max_instances == 1 and job.misfire_grace_time >= 1
            assert jobs["watch:local:0.3"].args[2] == ["one", "two"]
            assert isinstance(jobs["digest:one"].trigger, IntervalTrigger)
            cron = jobs["digest:two"].trigger
            assert isinstance(cron, CronTrigger) and str(cron.timezone) == "Europe/Berlin"
        finally:
            await sched.stop()


async def test_a_tick_longer_than_its_interval_skips_the_next_without_a_warning(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A 0.5 s verify tick every 0.1 s: ticks keep coming, and APScheduler's "skipped: maximum number
    of running instances reached" warning is not logged."""
    ticks: list[float] = []

    async def slow_delivery() -> list[object]:
        ticks.append(time.monotonic())
        await asyncio.sleep(0.5)  # the slow work itself
        return []

    async def three_ticks() -> bool:
        return len(ticks) >= 3

    monkeypatch.setattr(harness.ctx.service, "deliver_due", slow_delivery)
    sched = PitstopScheduler(harness.ctx, leader_ttl=3.0, poll_interval=0.1)
    with caplog.at_level(logging.INFO, logger="apscheduler"):
        await sched.start()
        try:
            assert await until(three_ticks, 10)
        finally:
            await sched.stop()
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("apscheduler")]
    assert any("Added job" in m for m in messages)  # APScheduler's own log still reaches us
    assert not [m for m in messages if "maximum number of running instances" in m]


async def test_crash_loop_restarts_three_times_then_gives_up(tmp_path: Path, redis_config: Config) -> None:
    """A crash-looping job with auto_restart max 3 is restarted 3 times (backoff doubling), then
    one 'crash loop - giving up' alert; the restarts go through the dispatcher as pitstop-auto."""
    policy = AutoRestart(max=3, within=600, backoff=0.2, on=list(CrashClass))  # its crashes are exceptions
    async with open_harness(
        tmp_path, redis_config, {"loop": {"start_window": 1.0, "auto_restart": policy}}
    ) as h:
        ctx = h.ctx
        sched = PitstopScheduler(ctx, leader_ttl=2.0, poll_interval=0.2)
        await sched.start()
        try:
            after = await ctx.events.last_id()
            await h.launch("loop", verify=False)
            [first] = await _events(h, EventKind.VERDICT, "loop", after, count=1, timeout=10)
            assert first.data["verdict"] == "RUNNING"
            assert await until(lambda: _has_state(h, "loop"), 5)
            # every launch from now on crashes, each at a later step (the same exception at the same
            # step would be a bug no restart fixes: no automatic restart at all)
            h.set_mode("loop", exit_after=0.3, resume=True)
            await h.kill("loop")
            restarts = await _events(h, EventKind.RESTART, "loop", after, count=3, timeout=40)
            assert [e.data["attempt"] for e in restarts] == [1, 2, 3]
            assert all(e.data["auto"] for e in restarts)
            alerts = await _events(h, EventKind.ALERT, "loop", after, count=2, timeout=20)
            assert [e.data["alert"] for e in alerts] == ["dead", "crash_loop"]
            verdicts = await _events(h, EventKind.VERDICT, "loop", first.id, count=3, timeout=10)
            assert [v.data["verdict"] for v in verdicts] == ["EXITED"] * 3
            # backoff doubles: each restart waits about 0.2, 0.4, 0.8 s after the crash was known
            # (the events are stamped a little after the crash was seen, hence the 3/4 margin)
            assert restarts[0].ts - alerts[0].ts >= 0.15
            assert restarts[1].ts - verdicts[0].ts >= 0.3
            assert restarts[2].ts - verdicts[1].ts >= 0.6
            assert alerts[1].ts >= verdicts[2].ts  # gave up only after the third restart failed too
            assert await _events(h, EventKind.RESTART, "loop", restarts[-1].id, count=1, timeout=2.0) == []
            gave_up = h.thread(f"{MENTION} loop crashed again after 3")
            assert len(gave_up) == 1
            assert len(h.alerts()) == 1
            runs = await ctx.runs.recent("loop", 10)
            assert [r.requested_by for r in runs[:3]] == ["pitstop-auto"] * 3
            assert await ctx.redis.client.zcard(keys.auto_restarts(ctx.redis.prefix, "loop")) == 3
        finally:
            await sched.stop()


async def test_scheduled_digests_come_from_the_leader_only(tmp_path: Path, redis_config: Config) -> None:
    """With two replicas, scheduled digests are built and posted by the lease holder alone."""
    async with open_harness(
        tmp_path, redis_config, {"train": {"start_window": 0.5, "digest": DigestSettings(every=1)}}
    ) as h:
        b_box = MemoryOutbox()
        b = await h.context("B", b_box)
        await h.launch("train")
        after = await h.ctx.events.last_id()
        sa = PitstopScheduler(h.ctx, leader_ttl=2.0, poll_interval=0.5)
        sb = PitstopScheduler(b, leader_ttl=2.0, poll_interval=0.5)
        await sa.start()
        await sb.start()
        try:
            digests = await _events(h, EventKind.DIGEST, "train", after, count=2, timeout=20)
            assert len(digests) == 2 and all(d.data["scheduled"] for d in digests)
            assert await until(lambda: _true(len(h.outbox.of("post")) >= 2), 10)
            assert b_box.of("post") == []
            assert all(p.channel == "CTRAIN" for p in h.outbox.of("post"))
        finally:
            await sa.stop()
            await sb.stop()


async def _has_state(h: Harness, job: str = "train") -> bool:
    state = await h.ctx.redis.client.hget(keys.watch_state(h.ctx.redis.prefix, job), "last_alive_at")
    return state is not None


async def _past(t: float) -> bool:
    return time.time() > t


async def _true(value: object) -> bool:
    return bool(value)
