"""Issue 21 against the strict Slack stand-in: no duplicate on Slack's ambiguous answers, a fix in
words for every permanent error, an alert that always reaches a person, and the owner paged."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bot.runtime.assembly import build_context
from bot.slack import blocks
from bot.slack.api import Delivery, web_client
from bot.slack.outbox import SlackOutbox
from handlers.reply import Reply, Status
from handlers.views.read import status_command
from handlers.watch.acks import ack_command
from handlers.watch.cycle import Watcher
from pipeline.config import Config
from pipeline.state.deliveries import Posts, UndeliveredAlerts
from tests.fixtures.slack import ANNOUNCE, BOT_TOKEN, Channel, FakeSlack
from tests.test_slack_http import MakeStack, make_stack  # noqa: F401 (a fixture)
from tests.test_watch import JOBS, cycles_for, open_harness, until


def _outbox(fake: FakeSlack, **kw: object) -> SlackOutbox:
    options: dict[str, object] = {"backoff": 0.05, "settle": 0.0, **kw}
    return SlackOutbox(
        web_client(BOT_TOKEN, base_url=fake.api_url), Delivery(default_channel=ANNOUNCE, pace=0, **options)
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
    monkeypatch.setattr("bot.slack.api.PAGE", 3)
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


# --- every permanent error has a fix in words ----------------------------------------------------


@pytest.mark.parametrize(
    ("channel", "error", "fix"),
    [
        (Channel("C0RO", read_only=True), "restricted_action", "posting there is restricted"),
        (Channel("C0THREADS", thread_only=True), "restricted_action", "posting there is restricted"),
        (Channel("C0EKM", ekm=True), "ekm_access_denied", "Enterprise Key Management"),
    ],
)
async def test_a_channel_refusal_is_told_to_the_requester_with_its_fix(
    fake_slack: FakeSlack, caplog: pytest.LogCaptureFixture, channel: Channel, error: str, fix: str
) -> None:
    """A run post refused for a channel's policy reaches the requester by DM with the code and the fix, and is logged with the code."""
    fake_slack.add_channel(channel)
    outbox = _outbox(fake_slack)
    outbox.requested_by("run:r-2", "U0OPERATOR1")
    await outbox.announce("run:r-2", Reply(title="restart of dflash"), channel.id)
    (dm,) = fake_slack.posted_to("D0OPERATOR1")
    assert error in str(dm["text"]) and fix in str(dm["text"]) and "restart of dflash" in str(dm["text"])
    assert any(error in r.getMessage() and channel.id in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("error", "fix"),
    [
        ("token_revoked", "was revoked"),
        ("token_expired", "token rotation"),
        ("account_inactive", "deactivated"),
        ("invalid_auth", "no longer valid"),
    ],
)
async def test_a_dead_token_is_logged_with_its_code_and_fix(
    fake_slack: FakeSlack, caplog: pytest.LogCaptureFixture, error: str, fix: str
) -> None:
    """With the bot token dead nothing can be posted: the log says the code and what to do."""
    if error == "invalid_auth":
        fake_slack.bot_token = "xoxb-another"
    else:
        fake_slack.token_error = error
    outbox = _outbox(fake_slack)
    outbox.requested_by("run:r-3", "U0OPERATOR1")
    await outbox.announce("run:r-3", Reply(title="restart of dflash"), "C0TEAM")
    assert fake_slack.messages == {}
    assert outbox.last_failure is not None and outbox.last_failure["error"] == error
    told = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(error in line and fix in line for line in told), told


# --- an alert always reaches a person ------------------------------------------------------------

ALERT = "incident:dflash:1"


def _alert(title: str = "dflash is down: 0/8 processes on gpu1") -> Reply:
    return Reply(title=title, status=Status.ERROR, lines=("last alive 02:10 UTC",), thread_key=ALERT)


async def test_an_alert_refused_in_the_announce_channel_goes_to_the_fallback_and_lives_there(
    fake_slack: FakeSlack,
) -> None:
    """An alert refused in the announce channel itself is posted in fallback_channel, saying where and why; its updates follow it."""
    fake_slack.channels[ANNOUNCE].read_only = True
    fake_slack.add_channel(Channel("C0FALLBACK"))
    outbox = _outbox(fake_slack, fallback_channel="C0FALLBACK")
    await outbox.announce(ALERT, _alert(), ANNOUNCE)
    (posted,) = fake_slack.posted_to("C0FALLBACK")
    text = "\n".join(blocks.block_texts(posted["blocks"]))  # type: ignore[arg-type]
    assert str(posted["text"]).startswith("dflash is down: 0/8 processes on gpu1")
    assert f"<#{ANNOUNCE}>: restricted_action - posting there is restricted" in text
    assert "last alive 02:10 UTC" in text
    assert outbox.last_undelivered is not None and outbox.last_undelivered["told"] == ["C0FALLBACK"]
    await outbox.announce(ALERT, _alert("dflash is down: acknowledged"), ANNOUNCE)
    await outbox.thread(ALERT, Reply(title="reminder"), ANNOUNCE)
    assert len(fake_slack.posted_to("C0FALLBACK")) == 2 and posted["updates"] == 1
    assert fake_slack.thread("C0FALLBACK", str(posted["ts"]))[0]["text"] == "reminder"


async def test_an_alert_rescued_to_the_fallback_channel_dms_the_owners_outside_it(
    fake_slack: FakeSlack,
) -> None:
    """An alert refused in the announce channel and rescued to fallback_channel still DMs each owner not in that channel."""
    fake_slack.channels[ANNOUNCE].read_only = True
    fake_slack.add_channel(Channel("C0FALLBACK", users={"U0INSIDE"}))
    outbox = _outbox(fake_slack, fallback_channel="C0FALLBACK")
    alert = replace(_alert(), owners=("U0INSIDE", "U0OUTSIDE"))
    await outbox.announce(ALERT, alert, ANNOUNCE)
    assert len(fake_slack.posted_to("C0FALLBACK")) == 1
    (dm,) = fake_slack.posted_to("D0OUTSIDE")
    assert str(dm["text"]).startswith("dflash is down")
    assert fake_slack.posted_to("D0INSIDE") == []


async def test_an_alert_no_channel_takes_goes_to_owners_then_admins_by_dm(fake_slack: FakeSlack) -> None:
    """Job channel read-only, announce archived, fallback unset: the owners (a group expanded) and the admins get the alert by DM, with both refusals."""
    fake_slack.add_channel(Channel("C0RO", read_only=True))
    fake_slack.channels[ANNOUNCE].archived = True
    outbox = _outbox(fake_slack, page_by_dm=lambda key: ["S0ONCALL", "U0ADMIN01"] if key == ALERT else [])
    await outbox.announce(ALERT, _alert(), "C0RO")
    for dm in ("D0OPERATOR1", "D0ADMIN01"):
        (got,) = fake_slack.posted_to(dm)
        text = "\n".join(blocks.block_texts(got["blocks"]))  # type: ignore[arg-type]
        assert str(got["text"]).startswith("dflash is down") and "restricted_action" in text
        assert "is_archived" in text and "last alive 02:10 UTC" in text
    assert outbox.last_undelivered is not None
    assert outbox.last_undelivered["told"] == ["U0OPERATOR1", "U0ADMIN01"]


async def test_healthz_and_status_show_the_last_undelivered_alert(make_stack: MakeStack) -> None:  # noqa: F811
    """With every channel refusing, the job's owner gets the alert by DM and /healthz/details and `status` show the undelivered alert."""
    served = await make_stack(owners=["U0OWNER01"])
    served.fake.channels[ANNOUNCE].read_only = True
    key = f"incident:{served.job}:1"
    await served.runtime.outbox.announce(key, Reply(title=f"{served.job} is down", thread_key=key), ANNOUNCE)
    (dm,) = served.fake.posted_to("D0OWNER01")
    assert str(dm["text"]).startswith(f"{served.job} is down")
    state = await served.details()
    last = state["slack"]["last_undelivered_alert"]
    assert (
        last["channel"] == ANNOUNCE and last["error"] == "restricted_action" and last["told"] == ["U0OWNER01"]
    )
    answer = await served.answer(f"status {served.job}")
    text = "\n".join(blocks.block_texts(answer["blocks"]))
    assert f"{served.job} is down - restricted_action in" in text and "last undelivered alert" in text


# --- the owner is paged --------------------------------------------------------------------------


async def test_owners_are_mentioned_and_those_outside_the_channel_dmed_until_ack(
    fake_slack: FakeSlack, tmp_path: Path, redis_config: Config
) -> None:
    """A killed job's alert mentions its owners and last starter; the owners outside its channel get it by DM, reminders too, until ack; status names them."""
    fake_slack.rate_limits = False
    fake_slack.add_channel(Channel("CTRAIN", users={"U0INSIDE"}))
    fake_slack.add_channel(Channel("CANNOUNCE"))
    async with open_harness(tmp_path, redis_config, {"train": JOBS["train"]}) as h:
        train = h.config.jobs["train"].model_copy(
            update={"owners": ["U0INSIDE", "U0OUTSIDE"], "notify_last_actor": True}
        )
        slack = h.config.slack.model_copy(update={"pace": 0})
        config = h.config.model_copy(update={"jobs": {"train": train}, "slack": slack})
        outbox = _outbox(fake_slack)
        ctx = await build_context(config, outbox, instance="B")
        h.extra.append(ctx)
        outbox.bind(ctx.redis.open_store(Posts), ctx.runs, ctx.redis.open_store(UndeliveredAlerts))
        ctx.restarter.verify_poll = 0.1
        watcher = Watcher(ctx, remind_every=0.4)
        await h.launch("train", ctx=ctx)  # started by U0TEST
        await watcher.cycle("local", ["train"])
        await h.kill("train")

        async def dms(user: str) -> int:
            return len(fake_slack.posted_to(f"D{user[1:]}"))

        async def reminded() -> bool:
            return await dms("U0OUTSIDE") >= 2

        assert await until(reminded, 15, lambda: watcher.cycle("local", ["train"]))
        (headline,) = [m for m in fake_slack.posted_to("CTRAIN") if m.get("thread_ts") is None]
        assert str(headline["text"]).startswith("train is down")
        first = "\n".join(blocks.block_texts(headline["blocks"]))  # type: ignore[arg-type]
        for ref in ("<!subteam^S0ONCALL>", "<@U0INSIDE>", "<@U0OUTSIDE>", "<@U0TEST>"):
            assert ref in first, ref
        assert await dms("U0INSIDE") == 0 and await dms("U0TEST") >= 2
        dm = fake_slack.posted_to("D0OUTSIDE")[0]
        assert str(dm["text"]).startswith("train is down") and "not in <#CTRAIN>" in _text(dm)
        status = await status_command(ctx, "train")
        assert "train is owned by <@U0INSIDE>, <@U0OUTSIDE>, <@U0TEST>" in status.lines
        await ack_command(ctx, "train", "U0ACK")
        before = await dms("U0OUTSIDE"), await dms("U0TEST")
        await cycles_for(watcher, 1.2)
        assert (await dms("U0OUTSIDE"), await dms("U0TEST")) == before


def _text(msg: dict[str, object]) -> str:
    return "\n".join(blocks.block_texts(msg["blocks"]))  # type: ignore[arg-type]
