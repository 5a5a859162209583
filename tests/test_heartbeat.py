"""A watcher for the watcher: ``[health] heartbeat_url`` pinged after watch rounds (a real aiohttp
server), ``URL/fail`` with the reason when a job's death would reach no one (issue 34: Slack refusing
the token, an alert told to no one; an unreachable host is not Pitstop's failure), and the "was not
watching" post of a leader back after a gap."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from bot.runtime.scheduler import UNTOLD_HOLD, Heartbeat, PitstopScheduler, Vitals, heartbeat_state
from bot.runtime.serve import HEALTH_TTL, open_runtime
from pipeline.config import Config, HealthSettings, WatchSettings, parse_config
from pipeline.errors import ConfigError, ExitCode
from pipeline.state.deliveries import UndeliveredAlert, UndeliveredAlerts
from tests.fixtures.slack import BOT_TOKEN, SIGNING_SECRET, FakeSlack, kill_matching, slack_config
from tests.fixtures.ssh import InProcessHost, JobFactory
from tests.test_slack_http import Ticks
from tests.test_watch import Harness, _true, open_harness, until

INTERVAL = 0.5  #: the job's watch interval, seconds


class PingServer:
    """A heartbeat service: counts GETs and POSTs of ``/ping/ID`` and ``/ping/ID/fail`` (a POST's body
    in :attr:`bodies`); :attr:`got` wakes waiters."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.bodies: list[str] = []
        self.got = asyncio.Condition()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.text()
        async with self.got:
            self.hits.append(request.path)
            self.bodies.append(body)
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
    app.router.add_post("/ping/{tail:.*}", server.handle)
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
    """A round pings once all groups reported: the URL when all were fine, the reason to URL/fail when one failed."""
    server, url = pings
    beat = Heartbeat(url, ["watch:a:30", "watch:b:30"])
    try:
        await beat.cycle_done("watch:a:30")
        await beat.cycle_done("watch:a:30")
        assert server.hits == []
        await beat.cycle_done("watch:b:30", "the watch cycle of b failed: boom")
        await beat.cycle_done("watch:a:30")
        await beat.cycle_done("watch:b:30")
        assert await server.wait(2) == ["/ping/abc-123/fail", "/ping/abc-123"]
        assert server.bodies == ["the watch cycle of b failed: boom", ""]
    finally:
        await beat.aclose()


async def test_an_unanswered_heartbeat_is_logged_by_host_only(caplog: pytest.LogCaptureFixture) -> None:
    """A heartbeat service that refuses connections costs a warning naming its host, never the
    secret URL, and not the watch."""
    beat = Heartbeat("http://127.0.0.1:9/ping/secret-uuid", ["watch:a:30"])
    try:
        await beat.cycle_done("watch:a:30")
        await beat.ping("an alert reached no one")
    finally:
        await beat.aclose()
    logged = [r.getMessage() for r in caplog.records if "heartbeat" in r.getMessage()]
    assert len(logged) == 2 and all(m.startswith("heartbeat to 127.0.0.1 failed: ") for m in logged), logged
    assert not any("secret-uuid" in r.getMessage() for r in caplog.records)


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


# --- issue 34: the heartbeat means "someone will be told" ----------------------------------------


async def _fail_hit(server: PingServer, timeout: float = 30.0) -> str:
    """The body of the first ``URL/fail`` ping, awaited (bounded)."""
    async with asyncio.timeout(timeout), server.got:
        await server.got.wait_for(lambda: any(h.endswith("/fail") for h in server.hits))
    return server.bodies[next(i for i, h in enumerate(server.hits) if h.endswith("/fail"))]


async def test_an_unreachable_host_keeps_the_heartbeat_ok(
    harness: Harness, pings: tuple[PingServer, str]
) -> None:
    """A GPU host that stops answering is the job's incident, told as such: every round still pings the URL, never /fail."""
    server, _ = pings
    assert isinstance(harness.host, InProcessHost)
    await harness.host.host.close()  # stops listening: every probe fails
    sched = PitstopScheduler(harness.ctx, leader_ttl=2.0)
    await sched.start()
    try:
        assert await until(lambda: _true(harness.alerts()), 30)  # the host's incident is told
        seen = len(server.hits)
        assert await server.wait(seen + 2) == ["/ping/abc-123"] * (seen + 2)
    finally:
        await sched.stop()


async def test_an_alert_told_to_no_one_fails_the_heartbeat_until_one_reaches_someone(
    harness: Harness, pings: tuple[PingServer, str]
) -> None:
    """The outbox's record of an alert that reached no one after the whole fallback chain turns the
    next ping into URL/fail with the reason; a later alert that reached someone turns it back."""
    server, _ = pings
    undelivered = harness.ctx.redis.open_store(UndeliveredAlerts)
    await undelivered.record("train is down", "C0GONE", "channel_not_found", [])
    sched = PitstopScheduler(harness.ctx, leader_ttl=2.0)
    await sched.start()
    try:
        body = await _fail_hit(server)
        assert body.startswith("an alert reached no one at ") and body.endswith(
            ": 'train is down' (C0GONE: channel_not_found, every fallback too)"
        ), body
        await undelivered.record("train is down", "C0GONE", "channel_not_found", ["U0OWNER01"])
        seen = len(server.hits)
        async with asyncio.timeout(30), server.got:
            await server.got.wait_for(lambda: server.hits[seen:].count("/ping/abc-123") >= 2)
    finally:
        await sched.stop()


async def test_slack_refusing_the_token_fails_the_heartbeat(
    fake_slack: FakeSlack,
    redis_config: Config,
    ssh_server: InProcessHost,
    job_factory: JobFactory,
    pings: tuple[PingServer, str],
) -> None:
    """`pitstop serve` pings the URL while Slack takes its token; once the stand-in answers
    token_revoked (auth.test included) the next round POSTs the reason to URL/fail."""
    server, url = pings
    setup = job_factory(ssh_server, watch=WatchSettings(interval=INTERVAL))
    config = slack_config(setup.config, redis_config).model_copy(
        update={"health": HealthSettings(heartbeat_url=url)}
    )
    clock = Ticks()
    runtime = await open_runtime(
        config, bot_token=BOT_TOKEN, api_url=fake_slack.api_url, signing_secret=SIGNING_SECRET, clock=clock
    )
    try:
        assert await server.wait(1) == ["/ping/abc-123"]
        fake_slack.token_error = "token_revoked"
        clock.now += HEALTH_TTL  # past the reuse of the last auth.test
        body = await _fail_hit(server)
        assert body.splitlines()[0] == (
            "Slack refuses Pitstop's token or cannot be reached (auth.test: token_revoked): alerts reach no one"
        )
    finally:
        await runtime.close(10)
        kill_matching(setup.token)


def test_heartbeat_state_is_ok_only_while_someone_will_be_told() -> None:
    """The one decision: ok with Slack fine and no untold alert (or one told, or older than the
    hold); each failure adds its line."""
    now = 1_800_000_000.0
    untold = UndeliveredAlert(at=now - 60, title="a is down", channel="C0X", error="is_archived", told=[])
    fine = {"ok": True, "team": "T", "bot_user": "U0B"}
    assert heartbeat_state(Vitals(now, slack=fine)) is None
    assert (
        heartbeat_state(Vitals(now, slack=fine, untold=untold.model_copy(update={"told": ["C0FB"]}))) is None
    )
    assert heartbeat_state(Vitals(now + UNTOLD_HOLD, slack=fine, untold=untold)) is None
    reason = heartbeat_state(
        Vitals(now, "the watch cycle of gpu1 failed: boom", {"ok": False, "error": "invalid_auth"}, untold)
    )
    assert reason is not None
    lines = reason.splitlines()
    assert len(lines) == 3 and "invalid_auth" in lines[0] and "'a is down'" in lines[1]
    assert lines[2] == "the watch cycle of gpu1 failed: boom"
    refusing = "the pager (pagerduty) refuses incidents: trigger of incident:a:1: HTTP 400"
    assert heartbeat_state(Vitals(now, slack=fine, pager=refusing)) == refusing  # a pager refusing pages


def test_the_heartbeat_url_may_come_from_the_environment_and_is_never_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``PITSTOP_HEARTBEAT_URL`` is read as a secret: an invalid one is a usage error that names the
    variable, not its value."""
    from bot.cli import main
    from bot.runtime.settings import from_environ

    env = from_environ({"PITSTOP_HEARTBEAT_URL": "https://hc-ping.com/s3cret"})
    assert env.heartbeat_url == "https://hc-ping.com/s3cret" and "s3cret" not in repr(env)
    (tmp_path / "pitstop.toml").write_text("")
    monkeypatch.setenv("PITSTOP_HEARTBEAT_URL", "ftp://hc-ping.com/s3cret")
    assert main(["serve", "--config", str(tmp_path / "pitstop.toml")]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "PITSTOP_HEARTBEAT_URL must be an http:// or https:// URL" in err and "s3cret" not in err
