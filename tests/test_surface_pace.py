"""The runner never waits for a surface: typed in Slack, a restart runs to its verification while
Slack answers no post at all; the run's message follows at Slack's pace, its updates coalesced
(last state wins), its headline before its thread replies."""

from __future__ import annotations

import asyncio
import time

from bot.slack.api import Delivery, Pacer, web_client
from bot.slack.app import AckGate
from bot.slack.outbox import SlackOutbox
from handlers.context import Context
from handlers.reply import Reply, StepLine
from pipeline.state.events import Event, EventKind
from pipeline.verdict import Outcome, Step
from tests.fixtures.slack import ANNOUNCE, BOT_TOKEN, FakeSlack
from tests.test_slack_http import MakeStack, make_stack  # noqa: F401 (a fixture)

DEFAULT_PACE = 1.0  #: [slack] pace's default: seconds between posts to one channel


async def _steps_until(
    ctx: Context, job: str, after: str, step: Step, outcome: Outcome, *, timeout: float = 60.0
) -> list[Event]:
    """The ``step`` events of ``job`` after stream id ``after`` up to ``step`` reaching ``outcome``
    (awaited, at most ``timeout`` s)."""
    seen: list[Event] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        event = await ctx.events.wait_for(EventKind.STEP, job, after=after, timeout=left)
        if event is None:
            break
        after = event.id
        seen.append(event)
        if event.data["step"] == step.value and event.data["outcome"] == outcome.value:
            return seen
    raise AssertionError(
        f"{step.value} never {outcome.value}; seen {[(e.data['step'], e.data['outcome']) for e in seen]}"
    )


async def _verdict_event(ctx: Context, job: str, run_id: str | None, after: str) -> Event:
    """The VERDICT event of ``run_id`` (any run of ``job`` if None) after stream id ``after``
    (awaited, at most 60 s)."""
    deadline = time.monotonic() + 60.0
    while (left := deadline - time.monotonic()) > 0:
        event = await ctx.events.wait_for(EventKind.VERDICT, job, after=after, timeout=left)
        if event is None:
            break
        after = event.id
        if run_id is None or event.data.get("run_id") == run_id:
            return event
    raise AssertionError(f"no verdict for {run_id}")


async def test_slash_command_restart_reaches_verify_while_slack_holds_every_post(
    make_stack: MakeStack,  # noqa: F811
) -> None:
    """With Slack holding every chat.postMessage and chat.update, a slash-command restart still runs to
    verify WAITING; released, its message shows the verdict after fewer updates than step changes, and
    its headline was posted before every reply in its thread."""
    stack = await make_stack()
    ctx, fake = stack.runtime.ctx, stack.fake
    stack.runtime.outbox.pacer = Pacer(DEFAULT_PACE)
    fake.hold("chat.postMessage", "chat.update")
    after = await ctx.events.last_id()
    url = fake.response_url()
    status, ack, _ = await stack.command(f"restart {stack.job}", response_url=url)
    assert status == 200 and ack == ""

    steps = await _steps_until(ctx, stack.job, after, Step.VERIFY, Outcome.WAITING)
    await fake.wait_held("chat.postMessage")  # the run's headline is stuck in Slack …
    assert await fake.calls("chat.postMessage") == [] and await fake.calls("chat.update") == []
    run_id = str(steps[0].data["run_id"])
    assert {e.data["run_id"] for e in steps} == {run_id}
    run = await ctx.runs.get(run_id)  # … and yet every step up to the launch has ended, well
    assert [(s.step, s.outcome) for s in run.steps] == [
        (Step.PREFLIGHT, Outcome.OK),
        (Step.STOP, Outcome.OK),
        (Step.CLEAR_CACHE, Outcome.SKIPPED),
        (Step.PATCH, Outcome.SKIPPED),
        (Step.LAUNCH, Outcome.OK),
        (Step.VERIFY, Outcome.WAITING),
    ]
    (answer,) = await stack.answered(url)  # the requester's answer does not wait for the channel
    assert answer["text"].startswith(f"queued run {run_id}")

    verdict_after = steps[-1].id
    fake.release()
    verdict = await _verdict_event(ctx, stack.job, run_id, verdict_after)
    assert verdict.data["verdict"] == "RUNNING"
    where = await stack.runtime.outbox.where(f"run:{run_id}")
    assert where is not None and where[0] == ANNOUNCE
    message = fake.message(*where)
    assert "RUNNING" in message["text"] and "✓ verify" in message["text"]
    assert message["updates"] < len(steps)  # coalesced: not one update per step change
    posts = await fake.calls("chat.postMessage", ok=True)
    head = next(i for i, c in enumerate(posts) if c.response["ts"] == where[1])
    thread = [i for i, c in enumerate(posts) if c.args.get("thread_ts") == where[1]]
    assert len(thread) >= 2 and all(i > head for i in thread)  # the launch summary and the verdict
    assert fake.warnings == []


async def test_a_restart_ended_early_publishes_its_verdict_while_slack_holds_its_message(
    make_stack: MakeStack,  # noqa: F811
) -> None:
    """A restart its pre-flight refuses (the workdir is gone) publishes its verdict event while Slack still
    holds its headline; released, the verdict is posted in the thread under that headline."""
    stack = await make_stack(workdir="/nonexistent/pitstop-surface-pace")
    ctx, fake = stack.runtime.ctx, stack.fake
    stack.runtime.outbox.pacer = Pacer(DEFAULT_PACE)
    fake.hold("chat.postMessage", "chat.update")
    after = await ctx.events.last_id()
    assert (await stack.command(f"restart {stack.job}", response_url=fake.response_url()))[0] == 200
    verdict = await _verdict_event(ctx, stack.job, None, after)
    assert verdict.data["verdict"] == "PREFLIGHT_FAILED"
    await fake.wait_held("chat.postMessage")
    assert await fake.calls("chat.postMessage") == []
    fake.release()
    head, reply = await fake.wait_for("chat.postMessage", 2)
    assert head.args.get("thread_ts") is None and reply.args["thread_ts"] == head.response["ts"]
    assert reply.args["text"] == verdict.data["line"]


async def test_an_answer_held_by_slack_does_not_hold_the_next_command_back(
    make_stack: MakeStack,  # noqa: F811
) -> None:
    """With one follow-up slot and Slack holding the answer to a first command on its response_url,
    a restart typed next still runs to its launch; both answers arrive once released."""
    stack = await make_stack()
    ctx, fake = stack.runtime.ctx, stack.fake
    stack.runtime.surface.acks = AckGate(concurrency=1)
    fake.hold("response_url")
    first, second = fake.response_url(), fake.response_url()
    assert (await stack.command("help", response_url=first))[0] == 200
    await fake.wait_held("response_url")
    after = await ctx.events.last_id()
    assert (await stack.command(f"restart {stack.job}", response_url=second))[0] == 200
    # within the 30 s after which the held answer's own request would give up and free its slot
    await _steps_until(ctx, stack.job, after, Step.LAUNCH, Outcome.OK, timeout=20.0)
    assert await fake.calls("response_url") == []
    fake.release()
    assert (await stack.answered(first))[0]["text"]
    assert (await stack.answered(second))[0]["text"].startswith("queued run")


def _state(n: int) -> Reply:
    """The run message of r-9 with ``n`` steps ended."""
    names = ["preflight", "stop", "clear_cache", "patch", "launch"]
    steps = tuple(StepLine(s, "ok", 0.1) for s in names[:n])
    return Reply(title=f"restart dflash (r-9): {n} steps", steps=steps, run_id="r-9")


async def test_outbox_coalesces_updates_held_by_slack_and_threads_after_the_headline(
    fake_slack: FakeSlack,
) -> None:
    """Announces of one message made while Slack holds its headline send only the newest state once
    released, and a thread reply made meanwhile lands under that headline, after it."""
    outbox = SlackOutbox(
        web_client(BOT_TOKEN, base_url=fake_slack.api_url), Delivery(default_channel=ANNOUNCE, pace=0)
    )
    fake_slack.hold("chat.postMessage", "chat.update")
    first = asyncio.create_task(outbox.announce("run:r-9", _state(1), None))
    await fake_slack.wait_held("chat.postMessage")
    later = [asyncio.create_task(outbox.announce("run:r-9", _state(n), None)) for n in (2, 3, 4, 5)]
    reply = asyncio.create_task(outbox.thread("run:r-9", Reply(title="r-9: dflash launched"), None))
    await asyncio.sleep(0)  # let them all queue behind the held headline
    fake_slack.release()
    await asyncio.wait_for(asyncio.gather(first, *later, reply), 10)
    posts = await fake_slack.calls("chat.postMessage", ok=True)
    updates = await fake_slack.calls("chat.update", ok=True)
    assert [p.args.get("thread_ts") for p in posts] == [None, posts[0].response["ts"]]
    assert len(updates) == 1 and "5 steps" in updates[0].args["text"]
    assert "5 steps" in fake_slack.message(ANNOUNCE, posts[0].response["ts"])["text"]
