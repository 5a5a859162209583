"""Pitstop over Socket Mode against the fake Slack's websocket, on real parts: envelopes in, acks out,
a `disconnect` answered by reconnecting; /healthz and /metrics served on the admin listener, its only one."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.runtime.metrics import CONTENT_TYPE
from bot.runtime.serve import SlackRuntime, connect_socket, open_runtime, serve
from bot.slack import blocks
from bot.slack.socket_mode import wait_after
from handlers.text import HELP_TITLE
from pipeline.config import Config
from pipeline.errors import ExitCode, SlackUnavailable
from pipeline.state import keys
from tests.fixtures.slack import (
    APP_TOKEN,
    BOT_TOKEN,
    MAX_SOCKETS,
    FakeSlack,
    block_action,
    envelope,
    event_callback,
    kill_matching,
    open_app_socket,
    slack_config,
    slash_command,
    validate_blocks,
)
from tests.fixtures.ssh import InProcessHost, JobFactory, JobSetup
from tests.test_prometheus import NAMES


@dataclass
class Linked:
    """``pitstop serve --socket`` connected to the fake Slack."""

    fake: FakeSlack
    runtime: SlackRuntime
    setup: JobSetup


@pytest.fixture
async def linked(
    fake_slack: FakeSlack, redis_config: Config, ssh_server: InProcessHost, job_factory: JobFactory
) -> AsyncIterator[Linked]:
    """The runtime connected over Socket Mode, with a job that asks for confirmation; closed after."""
    setup = job_factory(ssh_server, confirm=True)
    config = slack_config(setup.config, redis_config)
    runtime = await open_runtime(config, bot_token=BOT_TOKEN, api_url=fake_slack.api_url)
    try:
        runtime.socket = await connect_socket(runtime.surface, app_token=APP_TOKEN)
        await fake_slack.wait_connected(1)
        yield Linked(fake_slack, runtime, setup)
    finally:
        await runtime.close(30)
        kill_matching(setup.token)


async def test_slash_command_envelope_is_acked_then_answered(linked: Linked) -> None:
    """A slash command over the socket is acked empty by envelope id, then answered on its response_url."""
    env = envelope("slash_commands", slash_command("help", response_url=linked.fake.response_url()))
    await linked.fake.socket_send(env)
    ack = await linked.fake.wait_ack(env["envelope_id"])
    assert not ack.get("payload")
    (answer,) = await linked.fake.wait_for("response_url")
    assert answer.args["text"].startswith(HELP_TITLE)
    assert validate_blocks(answer.args["blocks"]) == []
    assert linked.fake.connections_opened == 1


async def test_event_envelope_is_acked_then_answered(linked: Linked) -> None:
    """A mention over the socket is acked empty at once, then answered with chat.postMessage in its thread."""
    event = {
        "type": "app_mention",
        "user": "U0OPERATOR1",
        "text": "<@U0PITSTOPBOT> help",
        "ts": "1.5",
        "channel": "C0T",
    }
    env = envelope("events_api", event_callback(event, event_id="EvSOCK1"))
    await linked.fake.socket_send(env)
    ack = await linked.fake.wait_ack(env["envelope_id"])
    assert not ack.get("payload")
    (posted,) = await linked.fake.wait_for("chat.postMessage")
    assert posted.args["thread_ts"] == "1.5" and posted.args["text"].startswith(HELP_TITLE)


async def test_retried_event_envelope_is_answered_once(linked: Linked) -> None:
    """An events_api envelope redelivered with retry_attempt 1 (same event_id) is acked but not acted on again."""
    event = {
        "type": "app_mention",
        "user": "U0OPERATOR1",
        "text": "<@U0PITSTOPBOT> help",
        "ts": "2.5",
        "channel": "C0T",
    }
    first = envelope("events_api", event_callback(event, event_id="EvSOCK2"))
    await linked.fake.socket_send(first)
    await linked.fake.wait_for("chat.postMessage")
    again = envelope("events_api", first["payload"], retry_attempt=1)
    await linked.fake.socket_send(again)
    await linked.fake.wait_ack(again["envelope_id"])
    await linked.runtime.surface.drain(10)
    assert len(await linked.fake.calls("chat.postMessage")) == 1
    ctx = linked.runtime.ctx
    assert len(await ctx.redis.client.xrange(keys.audit(ctx.redis.prefix))) == 1


async def test_redelivered_slash_command_is_acted_on_once_without_a_duplicate_reply(linked: Linked) -> None:
    """A slash command envelope redelivered with retry_attempt 1 (same trigger_id) is acked in time and neither acted on nor answered again."""
    first = envelope("slash_commands", slash_command("help", response_url=linked.fake.response_url()))
    await linked.fake.socket_send(first)
    await linked.fake.wait_for("response_url")
    again = {**envelope("slash_commands", first["payload"]), "retry_attempt": 1, "retry_reason": "timeout"}
    await linked.fake.socket_send(again)
    await linked.fake.wait_ack(again["envelope_id"])
    await linked.runtime.surface.drain(10)
    assert len(await linked.fake.calls("response_url")) == 1 and linked.fake.operation_timeouts == []
    ctx = linked.runtime.ctx
    assert len(await ctx.redis.client.xrange(keys.audit(ctx.redis.prefix))) == 1


async def test_button_envelopes_confirm_a_restart(linked: Linked) -> None:
    """A restart that needs confirmation is confirmed by a button click over the socket and starts its run."""
    env = envelope(
        "slash_commands",
        slash_command(f"restart {linked.setup.name}", response_url=linked.fake.response_url()),
    )
    await linked.fake.socket_send(env)
    await linked.fake.wait_ack(env["envelope_id"])
    (prompt,) = await linked.fake.wait_for("response_url")
    actions = next(b for b in prompt.args["blocks"] if b["type"] == "actions")
    confirm = next(e for e in actions["elements"] if blocks.action_of(e["action_id"]) == "confirm")
    click = envelope(
        "interactive",
        block_action(confirm["action_id"], confirm["value"], response_url=linked.fake.response_url()),
    )
    await linked.fake.socket_send(click)
    await linked.fake.wait_ack(click["envelope_id"])
    (answer,) = await linked.fake.wait_for("response_url", where=lambda c: c.args.get("replace_original"))
    assert answer.args["text"].startswith("queued run r-1") and answer.args["replace_original"] is True


async def test_disconnect_makes_the_client_reconnect_and_keep_serving(linked: Linked) -> None:
    """On Slack's `disconnect` (refresh_requested) the client opens a new connection and keeps serving on it."""
    await linked.fake.socket_disconnect("refresh_requested")
    await linked.fake.wait_connected(2, timeout=30)
    assert linked.fake.connections_opened == 2
    env = envelope("slash_commands", slash_command("help", response_url=linked.fake.response_url()))
    await linked.fake.socket_send(env)
    await linked.fake.wait_ack(env["envelope_id"], timeout=20)
    (answer,) = await linked.fake.wait_for("response_url", timeout=20)
    assert answer.args["text"].startswith(HELP_TITLE)
    assert linked.fake.open_sockets()[-1] is linked.fake._ws[-1]
    health = await linked.runtime.slack_health()
    assert health["socket_mode"] == "connected"


async def test_refused_app_token_fails_at_once(fake_slack: FakeSlack, redis_config: Config) -> None:
    """A wrong app token is a clear SlackUnavailable error, not an endless reconnect loop."""
    runtime = await open_runtime(
        redis_config, bot_token=BOT_TOKEN, api_url=fake_slack.api_url, scheduler=False
    )
    try:
        with pytest.raises(SlackUnavailable, match=r"apps\.connections\.open failed: invalid_auth"):
            await connect_socket(runtime.surface, app_token="xapp-wrong")
    finally:
        with contextlib.suppress(Exception):
            await runtime.close(5)


async def test_refused_bot_token_fails_at_start(fake_slack: FakeSlack, redis_config: Config) -> None:
    """A wrong bot token stops `pitstop serve` at start with a clear SlackUnavailable error."""
    with pytest.raises(SlackUnavailable, match=r"auth\.test failed: invalid_auth"):
        await open_runtime(redis_config, bot_token="xoxb-wrong", api_url=fake_slack.api_url)


async def test_disconnect_warning_keeps_serving_and_link_disabled_shows_in_health(linked: Linked) -> None:
    """After a `warning` disconnect the client still answers; after `link_disabled` /healthz says Socket Mode is down."""
    await linked.fake.socket_disconnect("warning")
    env = envelope("slash_commands", slash_command("help", response_url=linked.fake.response_url()))
    await linked.fake.socket_send(env)
    await linked.fake.wait_ack(env["envelope_id"], timeout=20)
    (answer,) = await linked.fake.wait_for("response_url", timeout=20)  # acked empty, answered after
    assert answer.args["text"].startswith(HELP_TITLE)
    await linked.fake.socket_disconnect("link_disabled")
    await linked.fake.wait_for("apps.connections.open", ok=False, timeout=30)  # it tried, and was refused
    health = await linked.runtime.slack_health()
    assert health["ok"] is False and health["socket_mode"] == "reconnecting"


async def test_too_many_websockets_backs_off_shows_in_health_and_connects_when_one_is_free(
    fake_slack: FakeSlack, redis_config: Config
) -> None:
    """With Slack's 10 Socket Mode connections taken, Pitstop's connection is refused: it waits between
    tries instead of reconnecting at once, /healthz says why, and it connects once a connection is free."""
    runtime = await open_runtime(
        redis_config, bot_token=BOT_TOKEN, api_url=fake_slack.api_url, scheduler=False
    )
    async with aiohttp.ClientSession() as http:
        others = [await open_app_socket(http, fake_slack) for _ in range(MAX_SOCKETS)]
        try:
            runtime.socket = await connect_socket(runtime.surface, app_token=APP_TOKEN)
            tries = await fake_slack.wait_for("apps.connections.open", 2 + MAX_SOCKETS, timeout=30)
            first, second = (c.at for c in tries[MAX_SOCKETS:])
            assert second - first >= wait_after(1) * 0.9  # not at once, as slack_sdk alone would
            health = await runtime.slack_health()
            assert health["ok"] is False and health["socket_mode"] == "refused"
            assert health["socket_refused"]["refused"] == "too_many_websockets"
            await others.pop().close()
            await fake_slack.wait_connected(MAX_SOCKETS + 1, timeout=60)
            async with asyncio.timeout(30):  # until the client has read the new connection's hello
                while (await runtime.slack_health())["socket_mode"] != "connected":
                    await asyncio.sleep(0.1)
        finally:
            for sock in others:
                await sock.close()
            await runtime.close(10)


async def _said(serving: asyncio.Task[None], capsys: pytest.CaptureFixture[str], words: str) -> str:
    """What ``serve`` printed to stderr until it said ``words`` (bounded)."""
    said = ""
    async with asyncio.timeout(60):
        while words not in said:
            assert not serving.done(), serving
            await asyncio.sleep(0.05)
            said += capsys.readouterr().err
    return said


async def test_socket_mode_serves_healthz_and_metrics_on_the_admin_listener(
    fake_slack: FakeSlack,
    redis_config: Config,
    ssh_server: InProcessHost,
    job_factory: JobFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`pitstop serve --socket` connected over Socket Mode listens only on its admin address: GET
    /metrics answers the Prometheus page, GET /healthz/details the JSON with the socket's state, GET
    /healthz a bare ok; no /slack/events."""
    setup = job_factory(ssh_server)
    config = slack_config(setup.config, redis_config)
    kwargs = {"bot_token": BOT_TOKEN, "app_token": APP_TOKEN, "api_url": fake_slack.api_url}
    serving = asyncio.create_task(serve(config, **kwargs, admin_host="127.0.0.1", admin_port=0))
    try:
        said = await _said(serving, capsys, " on http://")
        url = said.split(" on ", 1)[1].split()[0]
        assert said.startswith(
            "connected to Slack over Socket Mode; serving GET /healthz, GET /healthz/details, GET /metrics on "
        ), said
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/metrics") as resp:
                assert resp.status == 200 and resp.headers["Content-Type"] == CONTENT_TYPE
                families = list(text_string_to_metric_families(await resp.text()))
            assert {f.name for f in families} == NAMES
            seen = {s.labels.get("job") for f in families if f.name == "pitstop_job_state" for s in f.samples}
            assert seen == {setup.name}, seen
            async with http.get(f"{url}/healthz/details") as resp:
                health = await resp.json()
            assert health["slack"]["socket_mode"] == "connected", health
            async with http.get(f"{url}/healthz") as resp:
                assert (resp.status, await resp.text()) == (200, "ok")
            async with http.post(f"{url}/slack/events", data=b"{}") as resp:
                assert resp.status == 404
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        kill_matching(setup.token)


async def test_socket_mode_with_its_admin_port_taken_logs_it_and_serves_slack(
    fake_slack: FakeSlack,
    redis_config: Config,
    ssh_server: InProcessHost,
    job_factory: JobFactory,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`pitstop serve --socket` whose admin port is taken (another replica on the host, say) logs the
    address and the options to change it, and serves Slack all the same: a command is answered."""
    setup = job_factory(ssh_server)
    config = slack_config(setup.config, redis_config)
    kwargs = {"bot_token": BOT_TOKEN, "app_token": APP_TOKEN, "api_url": fake_slack.api_url}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        serving = asyncio.create_task(serve(config, **kwargs, admin_host="127.0.0.1", admin_port=port))
        try:
            said = await _said(serving, capsys, "connected to Slack over Socket Mode")
            assert "GET /metrics" not in said
            (line,) = [r.getMessage() for r in caplog.records if "cannot listen" in r.getMessage()]
            assert f"cannot listen on 127.0.0.1:{port} " in line and "--admin-host/--admin-port" in line
            assert line.endswith("serving Slack without /healthz/details and /metrics")
            env = envelope("slash_commands", slash_command("help", response_url=fake_slack.response_url()))
            await fake_slack.socket_send(env)
            (answer,) = await fake_slack.wait_for("response_url", timeout=30)
            assert answer.args["text"].startswith(HELP_TITLE)
        finally:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            kill_matching(setup.token)


def test_cli_refuses_a_public_listener_in_socket_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pitstop serve --socket --port 3000` is a usage error saying Socket Mode has no public listener."""
    from bot.cli import main

    (tmp_path / "pitstop.toml").write_text("")
    argv = ["serve", "--socket", "--port", "3000", "--config", str(tmp_path / "pitstop.toml")]
    assert main(argv) == ExitCode.USAGE
    assert "Socket Mode has none" in capsys.readouterr().err
