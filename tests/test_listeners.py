"""Issue 34, part 5: two listeners.  The public one serves ``/slack/events`` and a bare ``/healthz``;
``/healthz/details`` and ``/metrics`` are on the admin listener (loopback by default), which reads
its state at most once per second.  Real listeners on loopback ports, against the fake Slack and a
real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import aiohttp
import pytest

from bot.runtime.serve import FRESH, HEALTH_TTL, serve
from pipeline.config import Config
from pipeline.errors import ExitCode, UsageError
from pipeline.state.incidents import Incident, IncidentKind, IncidentStore
from tests.fixtures.slack import BOT_TOKEN, SIGNING_SECRET, FakeSlack, kill_matching, slack_config
from tests.fixtures.ssh import InProcessHost, JobFactory
from tests.test_slack_http import MakeStack, Stack, make_stack  # noqa: F401 (a fixture)


@pytest.fixture
async def served(make_stack: MakeStack) -> Stack:  # noqa: F811
    """The served HTTP stack (tests/test_slack_http.py) with a quiet job that is not running."""
    return await make_stack()


async def _get(stack: Stack, url: str) -> tuple[int, str, str]:
    async with stack.http.get(url) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def _config_calls(stack: Stack) -> int:
    """How many CONFIG commands Redis has run (each health reading runs one ``CONFIG GET dir``)."""
    stats = await stack.runtime.ctx.redis.client.info("commandstats")
    calls = [v["calls"] for k, v in stats.items() if k.startswith("cmdstat_config")]
    return int(sum(calls))


async def test_the_public_listener_tells_only_ok_or_unavailable(served: Stack) -> None:
    """Public GET /healthz is a bare `ok` (200), then `unavailable` (503) once Slack refuses the
    token; the public listener has no /healthz/details or /metrics; the admin one has all three."""
    public, admin = served.server.url, served.admin.url
    assert await _get(served, f"{public}/healthz") == (200, "text/plain; charset=utf-8", "ok")
    for path in ("/healthz/details", "/metrics"):
        assert (await _get(served, f"{public}{path}"))[0] == 404
        assert (await _get(served, f"{admin}{path}"))[0] == 200
    served.fake.token_error = "token_revoked"
    served.clock.now += HEALTH_TTL  # past the reuse of the last auth.test
    assert await _get(served, f"{public}/healthz") == (503, "text/plain; charset=utf-8", "unavailable")
    assert await _get(served, f"{admin}/healthz") == (503, "text/plain; charset=utf-8", "unavailable")
    details = await served.details()
    assert details["slack"] == {**details["slack"], "ok": False, "error": "token_revoked"}


async def test_health_checks_and_scrapes_read_state_at_most_once_a_second(served: Stack) -> None:
    """Forty health checks on both listeners within one second run Redis's CONFIG GET once; a scrape
    within the second is the last one's page, one after it sees an incident opened meanwhile."""
    public, admin = served.server.url, served.admin.url
    before = await _config_calls(served)
    hits = [_get(served, f"{public}/healthz") for _ in range(20)]
    hits += [_get(served, f"{admin}/healthz/details") for _ in range(20)]
    assert {status for status, _, _ in await asyncio.gather(*hits)} == {200}
    assert await _config_calls(served) == before + 1
    served.clock.now += FRESH
    assert (await _get(served, f"{public}/healthz"))[0] == 200
    assert await _config_calls(served) == before + 2

    first = (await _get(served, f"{admin}/metrics"))[2]
    job, host = served.job, served.runtime.config.jobs[served.job].host
    now = time.time()
    incident = Incident(job=job, host=host, kind=IncidentKind.DEAD, opened_at=now, notified_at=now)
    assert await served.runtime.ctx.redis.open_store(IncidentStore).open(incident) is not None
    assert (await _get(served, f"{admin}/metrics"))[2] == first
    served.clock.now += FRESH
    fresh = (await _get(served, f"{admin}/metrics"))[2]
    assert f'pitstop_job_state{{job="{job}",state="dead"}} 1.0' in fresh


async def test_serve_over_http_listens_publicly_and_on_a_loopback_admin_port(
    fake_slack: FakeSlack,
    redis_config: Config,
    ssh_server: InProcessHost,
    job_factory: JobFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`pitstop serve` says where its two listeners are: the public one (events, bare /healthz), the
    admin one on 127.0.0.1 (/healthz, /healthz/details, /metrics)."""
    setup = job_factory(ssh_server)
    config = slack_config(setup.config, redis_config)
    kwargs = {"bot_token": BOT_TOKEN, "signing_secret": SIGNING_SECRET, "api_url": fake_slack.api_url}
    serving = asyncio.create_task(serve(config, **kwargs, host="127.0.0.1", port=0, admin_port=0))
    said = ""
    try:
        async with asyncio.timeout(60):
            while "GET /metrics on " not in said:
                assert not serving.done(), serving
                await asyncio.sleep(0.05)
                said += capsys.readouterr().err
        public, admin = (part.split()[0] for part in said.split(" on ")[1:])
        assert said.startswith(f"serving Slack on {public} (POST /slack/events, GET /healthz); serving GET ")
        assert admin.startswith("http://127.0.0.1:") and admin != public
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{admin}/metrics") as resp:
                assert resp.status == 200
            async with http.get(f"{public}/metrics") as resp:
                assert resp.status == 404
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        kill_matching(setup.token)


async def test_serve_over_http_on_a_public_port_taken_is_a_usage_error(
    fake_slack: FakeSlack, redis_config: Config
) -> None:
    """A public port taken stops `pitstop serve` with a usage error naming the address and --host/--port."""
    kwargs = {"bot_token": BOT_TOKEN, "signing_secret": SIGNING_SECRET, "api_url": fake_slack.api_url}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=rf"cannot listen on 127\.0\.0\.1:{port} .*--host/--port") as err:
            async with asyncio.timeout(60):
                await serve(redis_config, **kwargs, host="127.0.0.1", port=port, admin_port=0)
    assert err.value.exit_code is ExitCode.USAGE
