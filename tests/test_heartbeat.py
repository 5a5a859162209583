"""A watcher for the watcher: ``[health] heartbeat_url`` pinged after watch rounds (a real aiohttp
server), and the "was not watching" post of a leader back after a gap."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from bot.runtime.scheduler import Heartbeat, PitstopScheduler
from pipeline.config import Config, HealthSettings, parse_config
from pipeline.errors import ConfigError
from tests.test_watch import Harness, open_harness

INTERVAL = 0.5  #: the job's watch interval, seconds


class PingServer:
    """A heartbeat service: counts GETs of ``/ping/ID`` and ``/ping/ID/fail``; :attr:`got` wakes waiters."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.got = asyncio.Condition()

    async def handle(self, request: web.Request) -> web.Response:
        async with self.got:
            self.hits.append(request.path)
            self.got.notify_all()
        return web.Response(text="OK")

    async def wait(self, count: int, timeout: float = 30.0) -> list[str]:
        """The first ``count`` hits, awaited (bounded)."""
        async with asyncio.timeout(timeout), self.got:
            await self.got.wait_for(lambda: len(self.hits) >= count)
        return self.hits[:count]


@pytest.fixture
async def pings() -> AsyncIterator[tuple[PingServer, str]]:
    """A real aiohttp heartbeat service on a free port, and its ping URL."""
    server = PingServer()
    app = web.Application()
    app.router.add_get("/ping/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield server, f"http://127.0.0.1:{port}/ping/abc-123"
    finally:
        await runner.cleanup()


@pytest.fixture
async def harness(
    tmp_path: Path, redis_config: Config, pings: tuple[PingServer, str]
) -> AsyncIterator[Harness]:
    """Job ``train`` watched every :data:`INTERVAL` s, with the heartbeat URL of :func:`pings`."""
    config = redis_config.model_copy(update={"health": HealthSettings(heartbeat_url=pings[1])})
    async with open_harness(tmp_path, config, {"train": {"interval": INTERVAL}}) as h:
        yield h


async def test_leader_pings_the_heartbeat_after_each_watch_cycle(
    harness: Harness, pings: tuple[PingServer, str]
) -> None:
    """Each watch cycle of the leader is a GET of the heartbeat URL, none of them /fail."""
    server, _ = pings
    sched = PitstopScheduler(harness.ctx, leader_ttl=2.0)
    await sched.start()
    try:
        assert await server.wait(3) == ["/ping/abc-123"] * 3
    finally:
        await sched.stop()


async def test_a_failed_cycle_pings_fail_and_a_round_waits_for_every_group(
    pings: tuple[PingServer, str],
) -> None:
    """A round pings once all groups reported: the URL when all were fine, URL/fail when one failed."""
    server, url = pings
    beat = Heartbeat(url, ["watch:a:30", "watch:b:30"])
    try:
        await beat.cycle_done("watch:a:30", True)
        await beat.cycle_done("watch:a:30", True)
        assert server.hits == []
        await beat.cycle_done("watch:b:30", False)
        await beat.cycle_done("watch:a:30", True)
        await beat.cycle_done("watch:b:30", True)
        assert await server.wait(2) == ["/ping/abc-123/fail", "/ping/abc-123"]
    finally:
        await beat.aclose()


async def test_an_unanswered_heartbeat_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    """A heartbeat service that refuses connections costs a warning, not the watch."""
    beat = Heartbeat("http://127.0.0.1:9/ping", ["watch:a:30"])
    try:
        await beat.cycle_done("watch:a:30", True)
    finally:
        await beat.aclose()
    assert any("heartbeat http://127.0.0.1:9/ping failed" in r.getMessage() for r in caplog.records)


def test_check_config_takes_only_http_heartbeat_urls() -> None:
    """``[health] heartbeat_url`` must be http or https."""
    assert parse_config({"health": {"heartbeat_url": "https://hc-ping.com/x"}}).health.heartbeat_url
    with pytest.raises(ConfigError, match=r"health\.heartbeat_url"):
        parse_config({"health": {"heartbeat_url": "ftp://hc-ping.com/x"}})


async def _gap(harness: Harness, server: PingServer, intervals: float) -> list[str]:
    """A leader watches, stops for ``intervals`` watch intervals, another comes back: the posts of
    its return (a ping follows each cycle's gap check)."""
    first = PitstopScheduler(harness.ctx, leader_ttl=2.0)
    await first.start()
    try:
        await server.wait(1)
    finally:
        await first.stop()
    seen = len(server.hits)
    await asyncio.sleep(intervals * INTERVAL)  # the time nobody watches: what these tests are about
    second = PitstopScheduler(harness.ctx, leader_ttl=2.0)
    await second.start()
    try:
        await server.wait(seen + 1)  # a ping follows the cycle's gap check and post
    finally:
        await second.stop()
    return [p.reply.title for p in harness.outbox.of("post")]


async def test_leader_back_after_4_intervals_says_it_was_not_watching(
    harness: Harness, pings: tuple[PingServer, str]
) -> None:
    """A leader back after 4 watch intervals posts once when nobody watched and what it found."""
    (post,) = await _gap(harness, pings[0], 4)
    assert post.startswith("Pitstop was not watching from ")
    assert "; on return: train " in post


async def test_the_return_post_lists_the_jobs_of_every_watch_group(
    tmp_path: Path, redis_config: Config, pings: tuple[PingServer, str]
) -> None:
    """Jobs watched at different intervals are different watch groups: the one post of the return lists
    them all, whichever group's cycle found the gap."""
    config = redis_config.model_copy(update={"health": HealthSettings(heartbeat_url=pings[1])})
    jobs = {"train": {"interval": INTERVAL}, "evals": {"interval": INTERVAL * 3}}
    async with open_harness(tmp_path, config, jobs) as h:
        (post,) = await _gap(h, pings[0], 6)
    assert post.startswith("Pitstop was not watching from ")
    assert "train " in post and "evals " in post, post


async def test_leader_back_after_1_interval_posts_nothing(
    harness: Harness, pings: tuple[PingServer, str]
) -> None:
    """A gap of 1 watch interval is no gap worth a post."""
    assert await _gap(harness, pings[0], 1) == []
