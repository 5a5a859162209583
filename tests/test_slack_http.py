"""Pitstop over HTTP against the fake Slack, on real parts (Redis, SSH, processes, the scheduler):
signed requests, ack first, one message per restart updated in place, Slack's limits kept."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.runtime.serve import FRESH, HttpServer, SlackRuntime, admin_app, http_app, open_runtime, start_http
from bot.slack import blocks
from bot.slack.api import Delivery, web_client
from bot.slack.outbox import SlackOutbox
from handlers.context import Context
from handlers.reply import Reply, Status, StepLine
from handlers.text import HELP_TITLE
from pipeline.config import Config
from pipeline.errors import UnknownRun
from pipeline.state import keys
from pipeline.state.deliveries import Posts
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunStore
from tests.fixtures.slack import (
    ANNOUNCE,
    BOT_TOKEN,
    SIGNING_SECRET,
    FakeSlack,
    block_action,
    event_callback,
    form_body,
    kill_matching,
    sign,
    slack_config,
    slash_command,
    validate_blocks,
)
from tests.fixtures.ssh import InProcessHost, JobFactory, JobSetup

CHANNEL = ANNOUNCE
FORM = "application/x-www-form-urlencoded"
JSON = "application/json"


@dataclass
class Ticks:
    """A monotonic clock a test moves (seconds)."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Stack:
    """``pitstop serve`` (HTTP) on a free port with a real job on the in-process SSH host, and its
    admin listener on another; the health and metrics reuse is timed by :attr:`clock`."""

    fake: FakeSlack
    server: HttpServer
    runtime: SlackRuntime
    setup: JobSetup
    http: aiohttp.ClientSession
    admin: HttpServer
    clock: Ticks

    @property
    def job(self) -> str:
        """The job's name."""
        return self.setup.name

    async def details(self) -> dict[str, Any]:
        """``GET /healthz/details`` on the admin listener, read afresh (the clock moved past :data:`FRESH`)."""
        self.clock.now += FRESH
        async with self.http.get(f"{self.admin.url}/healthz/details") as resp:
            state: dict[str, Any] = await resp.json()
            assert resp.status == (200 if state["ok"] else 503)
            return state

    async def post(
        self,
        body: str,
        *,
        content_type: str = FORM,
        headers: dict[str, str] | None = None,
        signed: bool = True,
    ) -> tuple[int, str, float]:
        """POST ``body`` to /slack/events; returns status, response text and seconds taken."""
        hdrs = {
            "Content-Type": content_type,
            **(sign(SIGNING_SECRET, body) if signed else {}),
            **(headers or {}),
        }
        started = time.monotonic()
        async with self.http.post(
            f"{self.server.url}/slack/events", data=body.encode(), headers=hdrs
        ) as resp:
            text = await resp.text()
            return resp.status, text, time.monotonic() - started

    async def command(self, text: str, **kw: Any) -> tuple[int, str, float]:
        """A signed slash command; returns status, the ack body and seconds to the ack."""
        kw.setdefault("response_url", self.fake.response_url())
        return await self.post(form_body(slash_command(text, **kw)))

    async def answered(self, url: str, count: int = 1) -> list[dict[str, Any]]:
        """The ``count`` answers posted to the response_url ``url`` (waited for, bounded)."""
        tag = url.rsplit("/", 1)[1]
        calls = await self.fake.wait_for("response_url", count, where=lambda c: c.path.endswith(tag))
        return [c.args for c in calls]

    async def answer(self, text: str, **kw: Any) -> dict[str, Any]:
        """The answer to a slash command, which follows its empty ack on its response_url."""
        url = self.fake.response_url()
        status, body, _ = await self.command(text, response_url=url, **kw)
        assert status == 200 and body == ""
        (late,) = await self.answered(url)
        return late

    async def event(self, event: dict[str, Any], *, event_id: str | None = None, retry: int = 0) -> int:
        """A signed Events API delivery; returns the HTTP status."""
        headers = {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"} if retry else {}
        status, _, _ = await self.post(
            json.dumps(event_callback(event, event_id=event_id)), content_type=JSON, headers=headers
        )
        return status


MakeStack = Callable[..., Awaitable[Stack]]


async def _verdict(ctx: Context, run_id: str, *, timeout: float) -> str | None:
    """The run's verdict once it has one (polled, at most ``timeout`` s), else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(UnknownRun):
            run = await ctx.runs.get(run_id)
            if run.verdict is not None:
                return run.verdict.value
        await asyncio.sleep(0.2)
    return None


@pytest.fixture
async def make_stack(
    fake_slack: FakeSlack, redis_config: Config, ssh_server: InProcessHost, job_factory: JobFactory
) -> AsyncIterator[MakeStack]:
    """Builds the served stack: ``make_stack(opts=(), operators=("*",), extra_jobs=0, bots=(), **job_fields)``."""
    async with contextlib.AsyncExitStack() as stack:

        async def make(
            *,
            opts: tuple[str, ...] = (),
            operators: tuple[str, ...] = ("*",),
            extra_jobs: int = 0,
            bots: tuple[str, ...] = (),
            **job_fields: Any,
        ) -> Stack:
            setup = job_factory(ssh_server, opts=opts, **job_fields)
            stack.callback(kill_matching, setup.token)
            config = slack_config(
                setup.config, redis_config, operators=operators, extra_jobs=extra_jobs, bots=bots
            )
            clock = Ticks()
            runtime = await open_runtime(
                config,
                bot_token=BOT_TOKEN,
                api_url=fake_slack.api_url,
                signing_secret=SIGNING_SECRET,
                clock=clock,
            )
            stack.push_async_callback(runtime.close, 30)
            server = await start_http(http_app(runtime.surface, runtime.health), host="127.0.0.1", port=0)
            stack.push_async_callback(server.close)
            admin = await start_http(admin_app(runtime.health, runtime.metrics), host="127.0.0.1", port=0)
            stack.push_async_callback(admin.close)
            http = await stack.enter_async_context(aiohttp.ClientSession())
            return Stack(fake_slack, server, runtime, setup, http, admin, clock)

        yield make


@pytest.fixture
async def stack(make_stack: MakeStack) -> Stack:
    """The served stack with a quiet job that is not running."""
    return await make_stack()


async def test_command_is_acked_empty_then_answered_on_response_url(stack: Stack) -> None:
    """A signed `help` is acked with an empty 200, then answered on its response_url with blocks and a fallback text."""
    url = stack.fake.response_url()
    status, ack, _ = await stack.command("help", response_url=url)
    assert status == 200 and ack == ""
    (body,) = await stack.answered(url)
    assert body["response_type"] == "in_channel"
    assert body["text"].startswith(HELP_TITLE)
    assert validate_blocks(body["blocks"]) == []
    audit = await stack.runtime.ctx.redis.client.xrange(keys.audit(stack.runtime.ctx.redis.prefix))
    assert len(audit) == 1 and audit[0][1]["user"] == "U0OPERATOR1"


async def test_bad_stale_or_missing_signatures_are_refused(stack: Stack) -> None:
    """A bad signature, a timestamp older than 5 minutes, a wrong secret or no headers get 401, and nothing runs."""
    body = form_body(slash_command(f"restart {stack.job}", response_url=stack.fake.response_url()))
    bad = {**sign(SIGNING_SECRET, body), "X-Slack-Signature": "v0=" + "0" * 64}
    stale = sign(SIGNING_SECRET, body, timestamp=int(time.time()) - 6 * 60)
    wrong_secret = sign("not-the-secret", body)
    for headers in (bad, stale, wrong_secret):
        status, _, _ = await stack.post(body, headers=headers, signed=False)
        assert status == 401
    status, _, _ = await stack.post(body, signed=False)
    assert status == 401
    assert await stack.runtime.ctx.runs.recent(stack.job) == []
    assert await stack.fake.calls("chat.postMessage") == []


async def test_restart_taking_20_s_is_acked_at_once_and_updated_step_by_step(make_stack: MakeStack) -> None:
    """A restart whose stop takes 20 s (the job ignores SIGTERM) is acked at once; its one message is updated
    as each step completes, ending with the verified verdict, and the verdict goes in its thread."""
    stack = await make_stack(opts=("ignore_term=1",), stop_timeout=20.0)
    ctx = stack.runtime.ctx
    started = await stack.answer(f"start {stack.job}")
    assert started["text"].startswith("queued run r-1")
    assert (await _verdict(ctx, "r-1", timeout=30)) == "RUNNING"

    url = stack.fake.response_url()
    status, _, took = await stack.command(f"restart {stack.job}", response_url=url)
    assert status == 200 and took < 2.0  # generous: the remote part takes 20 s
    (body,) = await stack.answered(url)
    assert body["text"].startswith("queued run r-2") and body["response_type"] == "ephemeral"
    assert (await _verdict(ctx, "r-2", timeout=60)) == "RUNNING"

    headline = await stack.runtime.outbox.where("run:r-2")
    assert headline is not None and headline[0] == CHANNEL
    updates = await stack.fake.wait_for(
        "chat.update", count=1, where=lambda c: c.args["ts"] == headline[1] and "RUNNING" in c.args["text"]
    )
    texts = [
        c.args["text"] for c in await stack.fake.calls("chat.update", ok=True) if c.args["ts"] == headline[1]
    ]
    stop_running = next(i for i, t in enumerate(texts) if "… stop" in t)
    stop_done = next(i for i, t in enumerate(texts) if "✓ stop" in t)
    assert stop_running < stop_done < texts.index(updates[0].args["text"])
    stop_line = next(line for line in texts[-1].splitlines() if line.startswith("✓ stop"))
    assert float(stop_line.split()[2]) >= 19.0
    assert all(
        f"✓ {step}" in texts[-1] or f"- {step}" in texts[-1] for step in ("preflight", "launch", "verify")
    )
    thread = stack.fake.thread(CHANNEL, headline[1])
    assert any("RUNNING" in (m["text"] or "") for m in thread)
    assert stack.fake.warnings == []


async def test_follow_answers_with_the_runs_message_and_keeps_it_updated_until_its_verdict(
    stack: Stack,
) -> None:
    """`follow r-N` of a run started outside Slack is answered with the run's message, which is then
    posted in the channel and updated step by step until its verdict."""
    ctx = stack.runtime.ctx
    run = await ctx.runs.create(stack.job, "U0OPERATOR1", action="start")
    answer = await stack.answer(f"follow {run.id}")
    assert answer["text"].startswith(f"{run.id}: start of {stack.job}")
    await ctx.restarter.start(run)
    (updated,) = await stack.fake.wait_for("chat.update", 1, where=lambda c: "RUNNING" in c.args["text"])
    headline = await stack.runtime.outbox.where(f"run:{run.id}")
    assert headline == (updated.args["channel"], updated.args["ts"]) and headline[0] == "C0COMMANDS"
    assert "✓ launch" in updated.args["text"]


async def test_retried_slash_command_acts_once(stack: Stack) -> None:
    """The same slash command delivered again with X-Slack-Retry-Num: 1 starts one run, not two, and is answered once."""
    url = stack.fake.response_url()
    body = form_body(slash_command(f"restart {stack.job}", response_url=url))
    first = await stack.post(body)
    again = await stack.post(body, headers={"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"})
    assert first[0] == again[0] == 200
    answers = await stack.answered(url, 1)
    assert answers[0]["text"].startswith("queued run r-1")
    await stack.runtime.surface.drain(30)
    await stack.runtime.dispatcher.drain(30)
    # the retry was acted on by nobody and answered by nobody: no "duplicate" reply
    assert [a["text"] for a in await stack.answered(url, 1)] == [answers[0]["text"]]
    assert len(await stack.runtime.ctx.runs.recent(stack.job)) == 1
    headlines = [c for c in await stack.fake.calls("chat.postMessage") if "thread_ts" not in c.args]
    assert len(headlines) == 1


async def test_retried_event_is_answered_once(stack: Stack) -> None:
    """A mention redelivered with X-Slack-Retry-Num: 1 (same event_id) is acted on and answered once."""
    event = {
        "type": "app_mention",
        "user": "U0OPERATOR1",
        "text": "<@U0PITSTOPBOT> help",
        "ts": "7.1",
        "channel": "C0T",
    }
    assert await stack.event(event, event_id="EvRETRY") == 200
    await stack.fake.wait_for("chat.postMessage")
    assert await stack.event(event, event_id="EvRETRY", retry=1) == 200
    await stack.runtime.surface.drain(10)
    assert len(await stack.fake.calls("chat.postMessage")) == 1
    assert len(await stack.runtime.ctx.redis.client.xrange(keys.audit(stack.runtime.ctx.redis.prefix))) == 1


async def test_ack_does_not_wait_for_the_answer(stack: Stack) -> None:
    """While the dispatcher is held before it starts (no parse, dedupe or audit yet), the slash command is
    already acked; the answer follows on response_url once it runs."""
    dispatcher = stack.runtime.dispatcher
    release = asyncio.Event()
    handle = dispatcher.handle

    async def held(req: Any) -> Reply:
        await release.wait()
        return await handle(req)

    dispatcher.handle = held  # type: ignore[method-assign]
    url = stack.fake.response_url()
    status, ack, _ = await stack.command(f"status {stack.job}", response_url=url)
    assert status == 200 and ack == ""
    assert await stack.runtime.ctx.redis.client.xrange(keys.audit(stack.runtime.ctx.redis.prefix)) == []
    release.set()
    (late,) = await stack.answered(url)
    assert stack.job in "\n".join(blocks.block_texts(late["blocks"]))
    assert validate_blocks(late["blocks"]) == []


async def test_long_log_and_80_jobs_fit_slacks_limits(make_stack: MakeStack) -> None:
    """A 6,000-character log and a listing of 80 jobs are delivered within the block and text limits."""
    stack = await make_stack(extra_jobs=79)
    stack.setup.log.write_text("".join(f"step {i:04d} " + "x" * 50 + "\n" for i in range(150)))
    logs = await stack.answer(f"logs {stack.job} 150")
    assert validate_blocks(logs["blocks"]) == [] and len(logs["text"]) <= blocks.MAX_FALLBACK
    texts = blocks.block_texts(logs["blocks"])
    assert any("earlier characters omitted" in t and "step 0149" in t for t in texts)
    listing = await stack.answer("status")
    assert validate_blocks(listing["blocks"]) == [] and len(listing["blocks"]) <= blocks.MAX_BLOCKS
    shown = "\n".join(blocks.block_texts(listing["blocks"]))
    assert all(f"{stack.job}-{i}" in shown for i in range(1, 80))


async def test_mention_is_answered_in_its_thread_and_errors_privately(stack: Stack) -> None:
    """`@pitstop help` is answered in the mention's thread; a mistyped job goes only to its author."""
    for text, event_id in (("<@U0PITSTOPBOT> help", "Ev1"), ("<@U0PITSTOPBOT> restart nosuchjob", "Ev2")):
        event = {
            "type": "app_mention",
            "user": "U0OPERATOR1",
            "text": text,
            "ts": "1700000001.000100",
            "channel": "C0TEAM",
        }
        assert await stack.event(event, event_id=event_id) == 200
    (posted,) = await stack.fake.wait_for("chat.postMessage")
    assert posted.args["thread_ts"] == "1700000001.000100"
    assert posted.args["text"].startswith(HELP_TITLE)
    (private,) = await stack.fake.wait_for("chat.postEphemeral")
    assert private.args["user"] == "U0OPERATOR1" and "nosuchjob" in private.args["text"]
    assert validate_blocks(private.args["blocks"]) == []


async def test_direct_message_is_answered_and_bot_messages_ignored(stack: Stack) -> None:
    """A DM is answered in the DM; the bot's own messages and edits are not."""
    dm = {
        "type": "message",
        "channel_type": "im",
        "user": "U0OPERATOR1",
        "text": "help",
        "ts": "1.2",
        "channel": "D0DM",
    }
    own = {**dm, "bot_id": "B0PITSTOP", "user": "U0PITSTOPBOT", "text": "help"}
    edit = {**dm, "subtype": "message_changed"}
    for event in (dm, own, edit):
        assert await stack.event(event) == 200
    (posted,) = await stack.fake.wait_for("chat.postMessage")
    assert posted.args["channel"] == "D0DM" and "thread_ts" not in posted.args
    await stack.runtime.surface.drain(5)
    assert len(await stack.runtime.ctx.redis.client.xrange(keys.audit(stack.runtime.ctx.redis.prefix))) == 1


async def test_confirm_button_starts_the_restart(make_stack: MakeStack) -> None:
    """A job with confirm = true answers with Confirm/Cancel; clicking Confirm replaces the prompt with the queued run."""
    stack = await make_stack(confirm=True)
    body = await stack.answer(f"restart {stack.job}")
    assert body["response_type"] == "ephemeral"
    actions = next(b for b in body["blocks"] if b["type"] == "actions")
    confirm = next(e for e in actions["elements"] if blocks.action_of(e["action_id"]) == "confirm")
    payload = block_action(confirm["action_id"], confirm["value"], response_url=stack.fake.response_url())
    status, _, _ = await stack.post(form_body({"payload": json.dumps(payload)}))
    assert status == 200
    (answer,) = await stack.fake.wait_for("response_url", where=lambda c: c.args.get("replace_original"))
    assert answer.args["replace_original"] is True and answer.args["text"].startswith("queued run r-1")
    await stack.fake.wait_for("chat.postMessage", where=lambda c: c.args["channel"] == CHANNEL)


async def test_app_home_lists_jobs(stack: Stack) -> None:
    """Opening the App Home publishes a home view listing the jobs."""
    event = {"type": "app_home_opened", "user": "U0OPERATOR1", "channel": "D0DM", "tab": "home"}
    assert await stack.event(event) == 200
    (published,) = await stack.fake.wait_for("views.publish")
    view = published.args["view"]
    assert published.args["user_id"] == "U0OPERATOR1" and view["type"] == "home"
    assert validate_blocks(view["blocks"], blocks.MAX_HOME_BLOCKS) == []
    assert stack.job in "\n".join(blocks.block_texts(view["blocks"]))


async def test_user_groups_decide_roles(make_stack: MakeStack) -> None:
    """With operators = a user group, a member may restart and a non-member is refused privately (one usergroups.list)."""
    stack = await make_stack(operators=("S0ONCALL",))
    member = await stack.answer(f"restart {stack.job}", user="U0OPERATOR1")
    other = await stack.answer(f"restart {stack.job}", user="U0SOMEONE")
    assert member["text"].startswith("queued run r-1")
    assert other["response_type"] == "ephemeral" and "operator" in other["text"]
    assert len(await stack.fake.calls("usergroups.list")) == 1


async def test_healthz_details_report_redis_and_slack(stack: Stack) -> None:
    """The admin listener's /healthz/details answers JSON with Redis and Slack state, 200 when both are fine."""
    state = await stack.details()
    assert state["ok"] is True
    assert state["redis"]["ok"] is True and state["redis"]["ms"] >= 0
    assert state["slack"]["ok"] is True and state["slack"]["bot_user"] == "U0PITSTOPBOT"


# --- the Slack outbox: headline posted once, updated in place, threads, uploads, 429, pacing ---


def _run_reply(n: int, outcome: str = "ok") -> Reply:
    steps = tuple(
        StepLine(s, outcome if i == n - 1 else "ok", 0.1 * (i + 1))
        for i, s in enumerate(["preflight", "stop", "clear_cache", "patch", "launch", "verify"][:n])
    )
    return Reply(title=f"restart dflash (r-7) by <@U0OPERATOR1>: {n} steps", steps=steps, run_id="r-7")


async def test_outbox_announce_posts_once_then_updates_from_any_replica(
    fake_slack: FakeSlack, redis_handle: RedisHandle
) -> None:
    """The first announce posts, later ones update the same message in place, even from another replica."""
    client = web_client(BOT_TOKEN, base_url=fake_slack.api_url)
    one = SlackOutbox(client, Delivery(default_channel=CHANNEL, pace=0, instance="a"))
    two = SlackOutbox(client, Delivery(default_channel=CHANNEL, pace=0, instance="b"))
    one.bind(redis_handle.open_store(Posts), redis_handle.open_store(RunStore))
    two.bind(redis_handle.open_store(Posts), redis_handle.open_store(RunStore))
    await one.announce("run:r-7", _run_reply(1), None)
    await one.announce("run:r-7", _run_reply(2), None)
    await two.announce("run:r-7", _run_reply(3), None)
    posted = await fake_slack.calls("chat.postMessage")
    updates = await fake_slack.wait_for("chat.update", count=2)
    assert len(posted) == 1 and posted[0].ok
    ts = posted[0].response["ts"]
    assert {u.args["ts"] for u in updates} == {ts}
    stored = await redis_handle.client.hgetall(keys.posts(redis_handle.prefix, "run:r-7"))
    assert stored["channel"] == CHANNEL and stored["ts"] == ts
    assert "✓ patch" not in fake_slack.message(CHANNEL, ts)["text"]
    assert "✓ clear_cache 0.3 s" in fake_slack.message(CHANNEL, ts)["text"]
    await two.thread("run:r-7", Reply(title="verdict RUNNING 8/8", status=Status.OK), None)
    replies = fake_slack.thread(CHANNEL, ts)
    assert [r["text"] for r in replies] == ["verdict RUNNING 8/8"]
    assert fake_slack.warnings == []


async def test_outbox_uploads_chart_with_upload_v2(fake_slack: FakeSlack, tmp_path: Path) -> None:
    """A digest's chart is uploaded through getUploadURLExternal, the upload URL and completeUploadExternal."""
    chart = tmp_path / "digest.png"
    chart.write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 1000)
    client = web_client(BOT_TOKEN, base_url=fake_slack.api_url)
    outbox = SlackOutbox(client, Delivery(default_channel=CHANNEL, pace=0))
    await outbox.post(Reply(title="digest dflash: 1,412 tokens/s", chart=str(chart)), None)
    (done,) = await fake_slack.wait_for("files.completeUploadExternal")
    (upload,) = await fake_slack.calls("upload")
    assert upload.args["size"] == chart.stat().st_size
    assert done.args["channel_id"] == CHANNEL
    assert fake_slack.uploads[done.args["files"][0]["id"]]["data"] == chart.read_bytes()


async def test_outbox_waits_out_a_429(fake_slack: FakeSlack) -> None:
    """A 429 is answered by waiting Retry-After and trying again; the post arrives."""
    client = web_client(BOT_TOKEN, base_url=fake_slack.api_url)
    outbox = SlackOutbox(client, Delivery(default_channel=CHANNEL, pace=0))
    fake_slack.rate_limit_next("chat.postMessage", retry_after=1)
    await outbox.post(Reply(title="hello"), None)
    limited, posted = await fake_slack.calls("chat.postMessage")
    assert limited.status == 429 and posted.ok
    assert posted.at - limited.at >= 0.95
    assert outbox.failures == []


async def test_outbox_paces_posts_to_one_channel(fake_slack: FakeSlack) -> None:
    """Posts to one channel are at least [slack] pace apart; another channel is not held back."""
    client = web_client(BOT_TOKEN, base_url=fake_slack.api_url)
    outbox = SlackOutbox(client, Delivery(default_channel=CHANNEL, pace=2.0))

    async def three() -> None:
        for i in range(3):
            await outbox.post(Reply(title=f"post {i}"), None)

    same_channel = asyncio.create_task(three())
    await fake_slack.wait_for("chat.postMessage", 1)
    # the next post to CHANNEL waits 2 s for its pace; one to another channel goes out meanwhile
    await outbox.post(Reply(title="elsewhere"), "C0OTHER")
    await asyncio.wait_for(same_channel, 30)
    calls = await fake_slack.calls("chat.postMessage")
    assert [c.args["channel"] for c in calls] == [CHANNEL, "C0OTHER", CHANNEL, CHANNEL]
    same = [c.at for c in calls if c.args["channel"] == CHANNEL]
    # the outbox paces when each post starts; the stand-in sees it arrive after the client's own
    # latency, which a loaded machine stretches for one post and not the next: half the pace is
    # the bound (unpaced, the three arrive within milliseconds)
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(same)), same


async def test_outbox_without_channel_logs_and_does_not_raise(fake_slack: FakeSlack) -> None:
    """With no channel configured a post is refused in the log, never as an exception."""
    client = web_client(BOT_TOKEN, base_url=fake_slack.api_url)
    outbox = SlackOutbox(client, Delivery(default_channel=None, pace=0))
    await outbox.announce("run:r-1", Reply(title="x"), None)
    await outbox.post(Reply(title="x"), None)
    assert len(outbox.failures) == 2 and "announce_channel" in outbox.failures[0]
    assert await fake_slack.calls("chat.postMessage") == []
