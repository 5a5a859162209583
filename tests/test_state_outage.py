"""Nothing forgotten when Redis dies: ``serve`` with a verified run and an open incident, its
redis-server SIGKILLed (embedded: started again by Pitstop; standalone: restarted with its AOF)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from handlers.views.read import status_command
from pipeline.config import Config, RedisSettings, StateSettings, WatchSettings
from pipeline.state.incidents import IncidentStore
from pipeline.state.redisconn import Outage, StoreWatch, open_redis
from tests.fixtures.slack import kill_matching
from tests.test_slack_http import MakeStack, _verdict, make_stack

__all__ = ["make_stack"]  # the served stack, over this module's own Redis

INTERVAL = 2.0  #: the job's watch interval, seconds
AWAY = "state store was unreachable"


async def until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Await ``check()`` (sync or async) until it is truthy, at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def standalone(tmp_path: Path) -> subprocess.Popen[bytes]:
    """A redis-server on a unix socket under ``tmp_path`` with an AOF in ``tmp_path``."""
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            "0",
            "--unixsocket",
            str(tmp_path / "r.sock"),
            "--dir",
            str(tmp_path),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
        ],
        stdout=subprocess.DEVNULL,
    )
    return proc


@pytest.fixture(params=["embedded", "standalone"])
async def redis_server(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[list[subprocess.Popen[bytes]]]:
    """The standalone redis-server's processes (the last one live), or none for the embedded one."""
    server: list[subprocess.Popen[bytes]] = []
    if request.param == "standalone":
        server.append(standalone(tmp_path))
        await until(lambda: (tmp_path / "r.sock").exists(), 30, "redis-server listening")
    try:
        yield server
    finally:
        for proc in server:
            proc.kill()
            proc.wait()


@pytest.fixture
def redis_config(redis_server: list[subprocess.Popen[bytes]], tmp_path: Path) -> Config:
    """This test's own durable Redis (overrides the shared fixture: this one gets SIGKILLed)."""
    url = f"unix://{tmp_path / 'r.sock'}" if redis_server else None
    return Config(redis=RedisSettings(url=url), state=StateSettings(dir=tmp_path / "state"))


async def test_redis_sigkilled_under_serve_loses_nothing(
    make_stack: MakeStack, redis_server: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """History, the open incident and the job record survive a SIGKILLed redis-server; the watcher is back
    within three intervals and one post says the state store was away."""
    stack = await make_stack(watch=WatchSettings(interval=INTERVAL))
    runtime, ctx = stack.runtime, stack.runtime.ctx
    started = await stack.answer(f"start {stack.job}")
    assert started["text"].startswith("queued run r-1")
    assert (await _verdict(ctx, "r-1", timeout=60)) == "RUNNING"
    kill_matching(stack.setup.token)
    incidents = ctx.redis.open_store(IncidentStore)
    opened = await until(lambda: incidents.incident(stack.job), 60, "an incident opened")
    await asyncio.sleep(1.5)  # the AOF is fsynced every second: what Redis itself promises to keep

    watch = runtime.store_watch
    assert watch is not None and runtime.scheduler is not None
    if redis_server:
        redis_server[-1].send_signal(signal.SIGKILL)
        redis_server[-1].wait()
        await until(lambda: watch.down_since and time.time() - watch.down_since > 2 * INTERVAL, 60, "outage")
        redis_server.append(standalone(tmp_path))
    else:
        os.kill(ctx.redis.embedded.pid, signal.SIGKILL)
    await stack.fake.wait_for("chat.postMessage", 1, where=lambda c: AWAY in (c.args.get("text") or ""))
    back = time.monotonic()
    await until(lambda: runtime.scheduler.is_leader, 3 * INTERVAL, "the watcher back")
    assert time.monotonic() - back <= 3 * INTERVAL

    assert [r.id for r in await ctx.runs.recent(stack.job)] == ["r-1"]
    assert (await ctx.runs.get("r-1")).verdict is not None
    kept = await incidents.incident(stack.job)
    assert kept is not None and kept.n == opened.n and kept.opened_at == opened.opened_at
    status = await status_command(ctx, stack.job)
    (where,) = [line for line in status.lines if line.startswith("state in ")]
    assert str(tmp_path) in where and "fsynced each second" in where
    health = await runtime.health()
    assert health["redis"]["aof"] is True and str(tmp_path) in health["redis"]["data"]
    posts = [c for c in await stack.fake.calls("chat.postMessage") if AWAY in (c.args.get("text") or "")]
    assert len(posts) == 1


@pytest.mark.parametrize("redis_server", ["standalone"], indirect=True)
async def test_verification_due_during_the_outage_is_delivered_once(
    make_stack: MakeStack, redis_server: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """A verification that comes due while redis-server is down is delivered once it is back: the run gets
    its verdict and its thread one verdict reply, not one per verify tick that failed meanwhile."""
    stack = await make_stack(watch=WatchSettings(interval=INTERVAL), start_window=3.0)
    runtime, ctx = stack.runtime, stack.runtime.ctx
    started = await stack.answer(f"start {stack.job}")
    assert started["text"].startswith("queued run r-1")
    due = await until(lambda: ctx.service.queue.due_at("r-1"), 60, "r-1 queued for verification")
    await asyncio.sleep(1.5)  # the AOF is fsynced every second: what Redis itself promises to keep

    watch = runtime.store_watch
    assert watch is not None
    redis_server[-1].send_signal(signal.SIGKILL)
    redis_server[-1].wait()
    await until(lambda: time.time() > due + 2 * INTERVAL and watch.down_since, 60, "due while Redis is down")
    redis_server.append(standalone(tmp_path))
    await stack.fake.wait_for("chat.postMessage", 1, where=lambda c: AWAY in (c.args.get("text") or ""))

    assert (await _verdict(ctx, "r-1", timeout=60)) == "RUNNING"
    headline = await runtime.outbox.where("run:r-1")
    assert headline is not None
    channel, ts = headline
    await stack.fake.wait_for(
        "chat.postMessage",
        1,
        where=lambda c: c.args.get("thread_ts") == ts and "RUNNING" in (c.args.get("text") or ""),
    )
    assert await ctx.service.queue.due_at("r-1") is None  # delivered: dequeued, its claim done for good
    verdicts = [m for m in stack.fake.thread(channel, ts) if "RUNNING" in (m["text"] or "")]
    assert len(verdicts) == 1, verdicts


async def test_two_replicas_tell_of_one_outage_once(tmp_path: Path) -> None:
    """Two processes on one standalone redis-server both see it SIGKILLed and back: the outage is told by
    one of them, once."""
    server = [standalone(tmp_path)]
    await until(lambda: (tmp_path / "r.sock").exists(), 30, "redis-server listening")
    url, config = f"unix://{tmp_path / 'r.sock'}", Config()
    told: list[tuple[str, Outage]] = []
    handles = [await open_redis(config, url=url, prefix="outage:") for _ in range(2)]
    watches: list[StoreWatch] = []
    for name, handle in zip("AB", handles, strict=True):

        async def back(outage: Outage, name: str = name) -> None:
            told.append((name, outage))

        watches.append(StoreWatch(handle, grace=0.5, on_back=back, every=0.1))
    tasks = [asyncio.create_task(w.run()) for w in watches]
    try:
        server[0].send_signal(signal.SIGKILL)
        server[0].wait()
        await until(lambda: all(w.down_since and time.time() - w.down_since > 1 for w in watches), 30, "down")
        server.append(standalone(tmp_path))
        await until(lambda: all(w.last_outage for w in watches), 60, "both handled Redis's return")
        assert len(told) == 1, told
        assert told[0][1].seconds > 0.5
    finally:
        for w in watches:
            w.stop()
        await asyncio.gather(*tasks)
        for h in handles:
            await h.aclose()
        for proc in server:
            proc.kill()
            proc.wait()
