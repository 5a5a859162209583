"""Issue 21 against the strict Slack stand-in: no duplicate on Slack's ambiguous answers, a fix in
words for every permanent error, an alert that always reaches a person, and the owner paged."""

from __future__ import annotations

import pytest

from bot.slack_api import web_client
from bot.slack_outbox import SlackOutbox
from handlers.reply import Reply
from tests.fixtures.slack import ANNOUNCE, BOT_TOKEN, FakeSlack


def _outbox(fake: FakeSlack, **kw: object) -> SlackOutbox:
    options: dict[str, object] = {"backoff": 0.05, "settle": 0.0, **kw}
    return SlackOutbox(
        web_client(BOT_TOKEN, base_url=fake.api_url), default_channel=ANNOUNCE, pace=0, **options
    )  # type: ignore[arg-type]


# --- no duplicate on an ambiguous answer ---------------------------------------------------------


@pytest.mark.parametrize("error", ["fatal_error", "internal_error"])
async def test_http_200_fatal_or_internal_error_is_looked_up_not_posted_again(
    fake_slack: FakeSlack, error: str
) -> None:
    """A post Slack stored but answered with HTTP 200 fatal_error / internal_error is found by its metadata: one message."""
    outbox = _outbox(fake_slack)
    fake_slack.fail_next("chat.postMessage", error=error)
    await outbox.post(Reply(title="once"), ANNOUNCE)
    assert [m["text"] for m in fake_slack.posted_to(ANNOUNCE)] == ["once"]
    assert len(await fake_slack.calls("chat.postMessage")) == 1
    assert await fake_slack.calls("conversations.history", ok=True) and outbox.failures == []


async def test_thread_lookup_passes_oldest_and_pages_through_a_long_thread(
    fake_slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a thread longer than one page, an ambiguous reply is found on a later page (with oldest), not resent."""
    monkeypatch.setattr("bot.slack_outbox.PAGE", 3)
    fake_slack.rate_limits = False
    outbox = _outbox(fake_slack)
    await outbox.announce("run:r-1", Reply(title="headline"), ANNOUNCE)
    for i in range(7):
        await outbox.thread("run:r-1", Reply(title=f"note {i}"), ANNOUNCE)
    fake_slack.fail_next("chat.postMessage", error="fatal_error")
    await outbox.thread("run:r-1", Reply(title="verdict RUNNING"), ANNOUNCE)
    head = fake_slack.posted_to(ANNOUNCE)[0]
    texts = [m["text"] for m in fake_slack.thread(ANNOUNCE, str(head["ts"]))]
    assert texts == [f"note {i}" for i in range(7)] + ["verdict RUNNING"]
    looks = await fake_slack.calls("conversations.replies", ok=True)
    assert len(looks) == 3 and all(c.args.get("oldest") for c in looks)
    assert [bool(c.args.get("cursor")) for c in looks] == [False, True, True]


async def test_a_message_listed_late_is_looked_for_again_before_resending(fake_slack: FakeSlack) -> None:
    """A stored post Slack lists only later is missed by the first look, found by the second: one message."""
    fake_slack.visible_after = 0.3
    outbox = _outbox(fake_slack, settle=1.0)
    fake_slack.fail_next("chat.postMessage", reset=True)
    await outbox.post(Reply(title="once"), ANNOUNCE)
    assert [m["text"] for m in fake_slack.posted_to(ANNOUNCE)] == ["once"]
    looks = await fake_slack.calls("conversations.history", ok=True)
    assert [len(c.response["messages"]) for c in looks] == [0, 1]
