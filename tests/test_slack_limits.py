"""Issue 23: Slack's rate limits kept with nothing lost, against the strict Slack stand-in: posts to
one channel queue in order at ``[slack] pace`` (the queue and its age visible for ``/healthz``),
successive updates of one message coalesce (last state wins) while updates of different messages
of one channel go in parallel, and a 429 waits ``Retry-After``."""

from __future__ import annotations

import asyncio
import time

from bot.slack.api import Budget, Delivery, web_client
from bot.slack.outbox import SlackOutbox
from handlers.reply import Reply
from tests.fixtures.slack import ANNOUNCE, BOT_TOKEN, FakeSlack
from tests.support_handlers import wait_until


def _outbox(fake: FakeSlack, pace: float = 1.0) -> SlackOutbox:
    return SlackOutbox(
        web_client(BOT_TOKEN, base_url=fake.api_url),
        Delivery(default_channel=ANNOUNCE, pace=pace, settle=0.0),
    )


async def test_posts_to_one_channel_queue_in_order_at_pace_and_the_queue_shows_its_age(
    fake_slack: FakeSlack,
) -> None:
    """Six posts made at once to one channel go one per second, in the order made, with no 429; while they wait the queue shows its depth and age; then it is empty."""
    outbox = _outbox(fake_slack)
    began = time.monotonic()
    tasks = [asyncio.create_task(outbox.post(Reply(title=f"post {i}"), ANNOUNCE)) for i in range(6)]

    async def queued() -> bool:
        return int(outbox.queue()["channels"].get(ANNOUNCE, {}).get("depth", 0)) >= 4

    await wait_until(queued, timeout=10)
    await wait_until(lambda: _aged(outbox, 0.5), timeout=10)
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    took = time.monotonic() - began
    assert [m["text"] for m in fake_slack.posted_to(ANNOUNCE)] == [f"post {i}" for i in range(6)]
    assert 4.5 <= took < 15
    assert [c for c in await fake_slack.calls() if c.status == 429] == []
    assert outbox.queue() == {"depth": 0, "oldest_s": 0.0, "channels": {}}


async def _aged(outbox: SlackOutbox, seconds: float) -> bool:
    return float(outbox.queue()["oldest_s"]) >= seconds


async def test_updates_of_one_message_coalesce_and_different_messages_update_in_parallel(
    fake_slack: FakeSlack,
) -> None:
    """Ten states of one message while its update waits send the newest only; eight messages of one channel are updated within one pace, not one per second."""
    outbox = _outbox(fake_slack)
    for i in range(8):
        await outbox.announce(f"incident:j{i}:1", Reply(title=f"j{i} down"), ANNOUNCE)
    begun = len(await fake_slack.calls("chat.update"))
    started = time.monotonic()
    await asyncio.gather(
        *(outbox.announce(f"incident:j{i}:1", Reply(title=f"j{i} resolved"), ANNOUNCE) for i in range(8))
    )
    assert time.monotonic() - started < 3  # not paced per channel: chat.update is Tier 3, per workspace
    states = [outbox.announce("incident:j0:1", Reply(title=f"j0 state {n}"), ANNOUNCE) for n in range(10)]
    await asyncio.gather(*states)
    updates = (await fake_slack.calls("chat.update", ok=True))[begun:]
    assert len(updates) <= 8 + 2  # the ten states: at most the first and the newest
    (head, *_) = [m for m in fake_slack.posted_to(ANNOUNCE) if m["text"].startswith("j0")]
    assert fake_slack.message(ANNOUNCE, str(head["ts"]))["text"] == "j0 state 9"
    assert [c for c in await fake_slack.calls() if c.status == 429] == []


async def test_a_429_waits_retry_after_and_the_post_lands_once(fake_slack: FakeSlack) -> None:
    """Slack answering 429 with Retry-After 1: the post waits that long and lands once."""
    outbox = _outbox(fake_slack, pace=0)
    fake_slack.rate_limit_next("chat.postMessage", retry_after=1)
    began = time.monotonic()
    await outbox.post(Reply(title="once"), ANNOUNCE)
    assert time.monotonic() - began >= 1.0
    assert [m["text"] for m in fake_slack.posted_to(ANNOUNCE)] == ["once"]
    assert [c.status for c in await fake_slack.calls("chat.postMessage")] == [429, 200]


async def test_the_tier3_budget_lets_a_burst_through_then_keeps_the_rate() -> None:
    """A budget of 3 at once and 10 per second: the fourth call waits about a tenth of a second; waiters show in its backlog."""
    budget = Budget(3, 10.0)
    began = time.monotonic()
    for _ in range(3):
        await budget.wait()
    assert time.monotonic() - began < 0.05
    waiter = asyncio.create_task(budget.wait())
    await asyncio.sleep(0)
    assert budget.backlog()[0] == 1
    await asyncio.wait_for(waiter, 5)
    assert time.monotonic() - began >= 0.09 and budget.backlog() == (0, 0.0)


async def test_429s_past_the_client_s_own_retries_are_waited_out_not_lost(fake_slack: FakeSlack) -> None:
    """Five 429s in a row (slack_sdk retries three times): the outbox waits out the rest and the post still lands, once."""
    outbox = _outbox(fake_slack, pace=0)
    for _ in range(5):
        fake_slack.rate_limit_next("chat.postMessage", retry_after=0)
    await outbox.post(Reply(title="once"), ANNOUNCE)
    assert [m["text"] for m in fake_slack.posted_to(ANNOUNCE)] == ["once"]
    assert [c.status for c in await fake_slack.calls("chat.postMessage")] == [429] * 5 + [200]
    assert outbox.failures == []
