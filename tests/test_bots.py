"""Issue 34, part 4: bots are not people.  Signed Events API deliveries from other bots (a relay's
``app_mention``, a ``bot_message``, an app's DM) run nothing and are logged, unless ``[auth] bots``
lists the bot; over HTTP against the fake Slack, on the served stack of tests/test_slack_http.py."""

from __future__ import annotations

from typing import Any

import pytest

from bot.slack.app import bot_ids
from handlers.text import HELP_TITLE
from pipeline.config import parse_config
from pipeline.errors import ConfigError
from pipeline.state import keys
from tests.test_slack_http import MakeStack, Stack, make_stack  # noqa: F401 (a fixture)

RELAY = {"bot_id": "B0RELAY", "app_id": "A0RELAY", "user": "U0RELAYBOT"}  #: an incident bot's fields


def _mention(text: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "app_mention",
        "text": f"<@U0PITSTOPBOT> {text}",
        "ts": "5.1",
        "channel": "C0TEAM",
        **fields,
    }


async def _audited(stack: Stack) -> int:
    return len(await stack.runtime.ctx.redis.client.xrange(keys.audit(stack.runtime.ctx.redis.prefix)))


async def test_a_bots_mention_runs_nothing_and_is_logged(
    make_stack: MakeStack,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A relay bot quoting "@pitstop restart JOB" (bot_id, bot_profile, app_id or a bot_message), in a
    channel or a DM, is acked and logged with its id and the fix; no run, no audit entry, no post."""
    stack = await make_stack()
    events = [
        _mention(f"restart {stack.job}", **RELAY),
        _mention(f"restart {stack.job}", user="U0RELAYBOT", bot_profile={"id": "B0PROFILE", "name": "relay"}),
        _mention(f"restart {stack.job}", user="U0RELAYBOT", app_id="A0WORKFLOW"),
        {
            "type": "message",
            "subtype": "bot_message",
            "channel_type": "im",
            "channel": "D0DM",
            "text": "help",
        },
        {"type": "message", "channel_type": "im", "channel": "D0DM", "text": "help", **RELAY},
    ]
    for i, event in enumerate(events):
        assert await stack.event(event, event_id=f"EvBot{i}") == 200
    await stack.runtime.surface.drain(10)
    assert await stack.runtime.ctx.runs.recent(stack.job) == []
    assert await _audited(stack) == 0
    assert await stack.fake.calls("chat.postMessage") == []
    logged = [r.getMessage() for r in caplog.records if "from bot" in r.getMessage()]
    assert len(logged) == len(events), logged
    assert logged[0] == (
        "ignored a app_mention from bot B0RELAY in C0TEAM: bots run nothing"
        " - list B0RELAY in [auth] bots to let it act as its bot user"
    )
    assert "from bot B0PROFILE " in logged[1] and "from bot A0WORKFLOW " in logged[2]
    assert "from bot bot_message in D0DM" in logged[3]


async def test_a_listed_bot_acts_as_its_bot_user(make_stack: MakeStack) -> None:  # noqa: F811
    """With ``[auth] bots = ["A0RELAY"]`` (its app id) the relay's mention is answered in its thread
    and audited as its bot user; another bot stays refused."""
    stack = await make_stack(bots=("A0RELAY",))
    assert await stack.event(_mention("help", **RELAY), event_id="EvListed") == 200
    assert await stack.event(_mention("help", bot_id="B0OTHER", user="U0OTHERBOT"), event_id="EvOther") == 200
    (posted,) = await stack.fake.wait_for("chat.postMessage")
    assert posted.args["thread_ts"] == "5.1" and posted.args["text"].startswith(HELP_TITLE)
    await stack.runtime.surface.drain(10)
    entries = await stack.runtime.ctx.redis.client.xrange(keys.audit(stack.runtime.ctx.redis.prefix))
    assert [e[1]["user"] for e in entries] == ["U0RELAYBOT"]


def test_bot_ids_tell_a_bot_from_a_person() -> None:
    """A person's event has no bot ids; a bot's carries its bot, app and profile ids, a bare bot_message none."""
    assert bot_ids({"type": "app_mention", "user": "U0MAYA"}) is None
    assert bot_ids({**RELAY, "bot_profile": {"id": "B0RELAY", "app_id": "A0RELAY"}}) == ["B0RELAY", "A0RELAY"]
    assert bot_ids({"subtype": "bot_message"}) == []


def test_auth_bots_takes_bot_and_app_ids_only() -> None:
    """``[auth] bots`` entries are bot ids (B…) or app ids (A…); a name is refused, naming the key."""
    assert parse_config({"auth": {"bots": ["B0RELAY", "A0RELAY"]}}).auth.bots == ["B0RELAY", "A0RELAY"]
    with pytest.raises(ConfigError, match=r"auth\.bots.*'relay' is not a bot id"):
        parse_config({"auth": {"bots": ["relay"]}})
