"""Escalation policies on real Redis with an injected clock: each step once, at its time, across
replicas and a SIGKILLed leader; ack, a resolution and ``watch JOB off`` end the chain; the alert
and ``status`` show the next step."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
import tomllib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.runtime.assembly import build_context, close_context
from bot.runtime.scheduler import PitstopScheduler
from handlers.context import Context
from handlers.outbox import MemoryOutbox
from handlers.reply import Reply, Status
from handlers.request.dispatch import Dispatcher, Request
from handlers.views.read import status_command
from handlers.watch.acks import ack_command, watch_command
from handlers.watch.alerts import alert_reply
from handlers.watch.escalate import escalate_due
from pipeline import fmt
from pipeline.config import (
    AuthSettings,
    Config,
    HostConfig,
    JobConfig,
    PagerSettings,
    SlackSettings,
    parse_config,
)
from pipeline.errors import ConfigError
from pipeline.pager import open_pager
from pipeline.state import keys
from pipeline.state.events import EventKind
from pipeline.state.incidents import Incident, IncidentKind, IncidentStore
from tests.fixtures.pagers import API_TOKEN, ROUTING_KEY, PagerDutyStandIn

T0 = 1_800_000_000.0  #: when the test incident opened (unix s); the clock is the test's
STEPS = [
    {"after": "10m", "notify": ["owners"]},
    {"after": "30m", "notify": ["S0LEADS", "channel", "pager"]},
]
JOB = "train"
OWNER = "U0OWNER01"


def _config(redis_config: Config, pager_url: str, hours: str | None = None) -> Config:
    """One job on an unused host (never probed: its watch interval is an hour), owned by
    :data:`OWNER`, escalating through :data:`STEPS`, paging PagerDuty at ``pager_url``."""
    job = JobConfig(
        host="gpu1",
        workdir="/w",
        log="/w/train.log",
        match="train.py",
        launch=["python", "train.py"],
        owners=[OWNER],
        channel="CTRAIN",
        watch={"interval": 3600},  # type: ignore[arg-type]
        escalation={"steps": STEPS, "hours": hours},  # type: ignore[arg-type]
    )
    return redis_config.model_copy(
        update={
            "hosts": {
                "gpu1": HostConfig(address="127.0.0.1", port=1, connect_timeout=2)
            },  # refused: never probed but by status
            "jobs": {JOB: job},
            "slack": SlackSettings(announce_channel="CANNOUNCE"),
            "pager": PagerSettings(kind="pagerduty", url=pager_url),
        }
    )


@pytest.fixture
async def ctx(
    redis_config: Config, pagerduty: PagerDutyStandIn, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Context]:
    """A Context of instance A on a fresh prefix, its posts in a MemoryOutbox, its pager the
    PagerDuty stand-in (the routing key in the environment, as in production)."""
    monkeypatch.setenv("PAGERDUTY_ROUTING_KEY", ROUTING_KEY)
    built = await build_context(_config(redis_config, pagerduty.url), MemoryOutbox(), instance="A")
    try:
        yield built
    finally:
        await close_context(built)


async def _open(ctx: Context, opened_at: float = T0) -> Incident:
    store = ctx.redis.open_store(IncidentStore)
    inc = Incident(job=JOB, host="gpu1", kind=IncidentKind.DEAD, opened_at=opened_at, notified_at=opened_at)
    opened = await store.open(inc)
    assert opened is not None
    return opened


def _box(ctx: Context) -> MemoryOutbox:
    assert isinstance(ctx.outbox, MemoryOutbox)
    return ctx.outbox


def _notes(ctx: Context) -> list[str]:
    return [p.reply.title for p in _box(ctx).of("thread") if p.reply.title.startswith("escalated")]


async def _escalations(ctx: Context) -> list[dict[str, Any]]:
    """The data of every ESCALATED event on the shared stream, oldest first."""
    raw = await ctx.redis.client.xrange(keys.events(ctx.redis.prefix))
    return [json.loads(f["data"]) for _, f in raw if f["kind"] == EventKind.ESCALATED.value]


# --- configuration -------------------------------------------------------------------------------

_BASE = {
    "hosts": {"h": {"address": "x"}},
    "jobs": {"j": {"host": "h", "workdir": "/w", "log": "/l", "match": "x"}},
}


def _parse(policy: object, **more: object) -> Config:
    jobs = {"j": {**_BASE["jobs"]["j"], "escalation": policy}}  # type: ignore[dict-item]
    return parse_config({**_BASE, "jobs": jobs, **more})


def test_a_shared_policy_is_named_by_jobs_and_a_table_is_their_own() -> None:
    """``escalation = "NAME"`` reads ``[escalation.NAME]``; a table of steps is the job's own; durations in seconds."""
    shared = {"leads": {"steps": STEPS}}
    config = _parse("leads", escalation=shared, pager={"kind": "pagerduty"})
    policy = config.escalation_for("j")
    assert policy is not None and [s.after for s in policy.steps] == [600.0, 1800.0] and policy.pages
    assert _parse({"steps": STEPS[:1]}).escalation_for("j") == policy.model_copy(
        update={"steps": policy.steps[:1]}
    )
    assert config.pager is not None and config.pager.endpoint == "https://events.pagerduty.com/v2/enqueue"


@pytest.mark.parametrize(
    ("escalation", "more", "problem"),
    [
        (
            "lead",
            {"escalation": {"leads": {"steps": STEPS[:1]}}},
            "jobs.j.escalation: no [escalation.lead] - did you mean 'leads'?",
        ),
        ("leads", {}, "jobs.j.escalation: no [escalation.leads] (known: none)"),
        ({"steps": STEPS}, {}, 'jobs.j.escalation: a step notifies "pager" but there is no [pager]'),
        (
            {"steps": [{"after": "5m", "notify": ["bob"]}]},
            {},
            "jobs.j.escalation.steps[0].notify: notify 'bob': use \"owners\"",
        ),
        (
            {"steps": [STEPS[0], {"after": "5m", "notify": ["owners"]}]},
            {},
            "must be later than the one before",
        ),
        ({"steps": []}, {}, "jobs.j.escalation.steps: List should have at least 1 item"),
        ({"steps": STEPS[:1]}, {"pager": {"kind": "alertmanager"}}, "pager: url: required for alertmanager"),
    ],
)
def test_a_bad_policy_is_refused_naming_its_key(
    escalation: object, more: dict[str, object], problem: str
) -> None:
    """Unknown policy names (with did-you-mean), unknown notify entries, steps out of order, a
    "pager" step without [pager] and an Alertmanager without url are config errors on one line each."""
    with pytest.raises(ConfigError) as info:
        _parse(escalation, **more)
    shown = str(info.value)
    assert problem in shown and ".str:" not in shown, shown


def test_the_example_escalation_and_pager_validate_once_uncommented() -> None:
    """The commented [pager], [jobs.dflash.escalation] and [escalation.standard] of the example config validate."""
    wanted = (
        "# hours = ",
        "# sync_acks = ",
        "# sync_every = ",
        "# api_url = ",
        "# [pager]",
        '# kind = "alertmanager"',
        '# url = "http://alertmanager',
        "# [jobs.dflash.escalation]",
        "# steps = ",
    )
    wanted += ("# [escalation.standard]",)
    lines = [
        ln[2:] if ln.startswith(wanted) else ln
        for ln in Path("pitstop.example.toml").read_text().splitlines()
    ]
    config = parse_config(tomllib.loads("\n".join(lines)), "example", Path.cwd())
    policy = config.escalation_for("dflash")
    assert policy is not None and [s.notify for s in policy.steps] == [["owners"], ["S0MLLEADS01", "pager"]]
    assert policy.hours is not None and policy.hours.text == "mon-fri 09:00-19:00 Europe/Berlin"
    assert config.pager is not None and config.pager.kind == "alertmanager" and config.pager.sync_every == 30
    assert [s.after for s in config.escalation["standard"].steps] == [900, 2700]


# --- the chain -----------------------------------------------------------------------------------


async def test_each_step_is_taken_once_at_its_time(ctx: Context, pagerduty: PagerDutyStandIn) -> None:
    """Nothing before 10 min; at 10 min the owners (mentioned in the thread and DMed); at 30 min the
    leads, @here and the pager (one PagerDuty alert); never twice; the headline shows the next step."""
    await _open(ctx)
    assert await escalate_due(ctx, now=T0 + 599) == 0 and _notes(ctx) == []
    assert await escalate_due(ctx, now=T0 + 600) == 1
    assert await escalate_due(ctx, now=T0 + 900) == 0
    [first] = _notes(ctx)
    assert first.startswith("escalated (1/2): train not acknowledged after 10 min - telling <@U0OWNER01>")
    [dm] = _box(ctx).of("tell")
    assert dm.channel == OWNER and dm.reply.title == first
    head = [p for p in _box(ctx).of("announce") if p.key == "incident:train:1"][-1].reply
    assert any(
        line.startswith("escalates to <!subteam^S0LEADS>, the channel, the pager at ") for line in head.lines
    )
    assert await escalate_due(ctx, now=T0 + 1800) == 1
    second = _notes(ctx)[1]
    assert second.startswith(
        "escalated (2/2): train not acknowledged after 30 min - telling <!here>, <!subteam^S0LEADS>, the pager"
    )
    note = next(p for p in _box(ctx).of("thread") if p.reply.title == second)
    assert note.reply.page == "here" and note.channel == "CTRAIN"
    assert await escalate_due(ctx, now=T0 + 7200) == 0 and len(_notes(ctx)) == 2
    await pagerduty.wait(lambda: pagerduty.pages == 1)
    assert [e["dedup_key"] for e in pagerduty.accepted] == ["incident:train:1"]
    assert [e["step"] for e in await _escalations(ctx)] == [1, 2]
    stored = await ctx.redis.open_store(IncidentStore).incident(JOB)
    assert stored is not None and stored.escalated == 2
    assert not any(
        line.startswith("escalates") for line in alert_reply(stored, ctx.config, now=T0 + 7200).lines
    )


async def test_steps_due_during_a_gap_are_taken_on_return_once_each(ctx: Context) -> None:
    """Nobody led for 40 min: the first call takes both steps, in order, once."""
    await _open(ctx)
    assert await escalate_due(ctx, now=T0 + 2400) == 2
    assert [n[:16] for n in _notes(ctx)] == ["escalated (1/2):", "escalated (2/2):"]
    assert await escalate_due(ctx, now=T0 + 2401) == 0


async def test_next_step_in_the_alert_and_in_status(ctx: Context) -> None:
    """The alert and ``status`` say when it escalates next and to whom, in the scheduler's timezone."""
    now = time.time()
    inc = await _open(ctx, opened_at=now - 60)
    due = fmt.clock(now + 540, "UTC", now=now)
    lines = alert_reply(inc, ctx.config, now=now).lines
    assert f"escalates to the owners at {due} (in 9 min) unless acknowledged" in lines
    status = await status_command(ctx, JOB)
    assert any(line.startswith(f"train: escalates to the owners at {due[:5]}") for line in status.lines), (
        status.lines
    )


@pytest.mark.parametrize(
    ("hours", "pages"), [("fri 09:00-10:00 Europe/Berlin", True), ("sat,sun 00:00-24:00 UTC", False)]
)
async def test_a_step_pages_only_within_the_policy_hours(
    ctx: Context, pagerduty: PagerDutyStandIn, hours: str, pages: bool
) -> None:
    """The step due Friday 09:30 Berlin pages within "fri 09:00-10:00 Europe/Berlin"; outside
    "sat,sun …" it is told in Slack only, saying so, and nothing reaches PagerDuty."""
    ctx.config = _config(ctx.config, pagerduty.url, hours)
    await _open(ctx)
    assert await escalate_due(ctx, now=T0 + 1800) == 2
    stored = await ctx.redis.open_store(IncidentStore).incident(JOB)
    assert stored is not None and stored.paged is pages
    second = _notes(ctx)[1]
    if pages:
        assert second.endswith("the pager; `ack train` stops it")
        await pagerduty.wait(lambda: pagerduty.pages == 1)
    else:
        assert "not the pager (it pages sat,sun 00:00-24:00 UTC only)" in second
        assert ctx.pager is not None
        await ctx.pager.drain(5)
        assert pagerduty.requests == []


def test_hours_that_do_not_read_are_refused() -> None:
    """A malformed ``hours`` (no timezone, an unknown day or zone, an empty range) is a config error naming the example."""
    for bad in (
        "mon-fri 09:00-19:00",
        "mon-fry 09:00-19:00 UTC",
        "mon 09:00-19:00 Mars/Base",
        "mon 10:00-10:00 UTC",
    ):
        with pytest.raises(ConfigError, match=re.escape("e.g. 'mon-fri 09:00-19:00 Europe/Berlin'")):
            _parse({"steps": STEPS[:1], "hours": bad})


@pytest.mark.parametrize("how", ["ack", "watch off", "resolved"])
async def test_ack_watch_off_or_a_resolution_ends_the_chain(ctx: Context, how: str) -> None:
    """After step 1, ``ack``, ``watch JOB off`` or the incident's resolution: step 2 never comes."""
    inc = await _open(ctx)
    assert await escalate_due(ctx, now=T0 + 600) == 1
    store = ctx.redis.open_store(IncidentStore)
    if how == "ack":
        await ack_command(ctx, JOB, "U0ACKER01")
    elif how == "watch off":
        await watch_command(ctx, JOB, "off", 3600, "U0ACKER01")
        stopped = [p.reply.title for p in _box(ctx).of("thread")]
        assert "escalation of the train incident stopped (watching paused)" in stopped
    else:
        current = await store.incident(JOB)
        assert current is not None and await store.close(current)
    assert await escalate_due(ctx, now=T0 + 3600) == 0
    assert len(_notes(ctx)) == 1 and inc.n == 1
    if how != "resolved":
        left = await store.incident(JOB)
        assert left is not None and not any(
            line.startswith("escalates") for line in alert_reply(left, ctx.config, now=T0 + 3600).lines
        )


async def test_oncall_lists_what_is_open_and_when_it_escalates(ctx: Context) -> None:
    """``oncall`` (any viewer): nothing open says so; an open incident shows its kind, age and next
    step; acknowledged, it shows who and nothing next."""
    ctx.config = ctx.config.model_copy(update={"auth": AuthSettings(viewers=["*"])})
    dispatcher = Dispatcher(ctx)

    async def oncall() -> Reply:
        return await dispatcher.handle(
            Request(text="oncall", user="U0VIEWER01", delivery_id=uuid.uuid4().hex)
        )

    quiet = await oncall()
    assert quiet.title == "nothing open: no incident on any job" and quiet.status is Status.OK
    now = time.time()
    await _open(ctx, opened_at=now - 120)
    due = fmt.clock(now + 480, "UTC", now=now)
    answer = await oncall()
    assert answer.title == "on call: 1 open incident, 1 not acknowledged" and answer.status is Status.WARNING
    [row] = answer.tables[0].rows
    assert row[:5] == ("train", "dead", "gpu1", "2 min", "no")
    assert row[5].startswith(f"escalates to the owners at {due[:5]}")
    await ack_command(ctx, JOB, "U0ACKER01")
    [row] = (await oncall()).tables[0].rows
    assert row[4:] == ("<@U0ACKER01>", "-")


async def test_maintenance_silences_alerts_and_escalation_announced_and_recorded(ctx: Context) -> None:
    """``maintenance train 2h "driver upgrade"`` (an operator): watching paused, the open incident's
    escalation ended, the window announced in the job's channel with who and why, audited."""
    ctx.config = ctx.config.model_copy(update={"auth": AuthSettings(operators=["U0OPS0001"])})
    dispatcher = Dispatcher(ctx)
    await _open(ctx)
    assert await escalate_due(ctx, now=T0 + 600) == 1
    text = 'maintenance train 2h "driver upgrade"'
    answer = await dispatcher.handle(Request(text=text, user="U0OPS0001", delivery_id=uuid.uuid4().hex))
    assert answer.title.startswith("maintenance of train for 2 h (until ")
    assert answer.title.endswith("by <@U0OPS0001>: driver upgrade - no alerts, no escalation")
    [announced] = _box(ctx).of("post")
    assert announced.channel == "CTRAIN" and announced.reply.title == answer.title
    [view] = await ctx.service.jobs.read_many([JOB])
    assert view.paused
    assert await escalate_due(ctx, now=T0 + 3600) == 0 and len(_notes(ctx)) == 1
    [entry] = await dispatcher.audit.recent(job=JOB, count=1)
    assert entry.verb == "maintenance" and entry.user == "U0OPS0001" and "driver upgrade" in entry.text
    refused = await dispatcher.handle(Request(text="maintenance train", user="U0OPS0001", delivery_id="x1"))
    assert refused.title.startswith("usage: maintenance JOB [for] DURATION")


async def test_an_ack_made_in_pagerduty_acknowledges_in_slack(
    ctx: Context, pagerduty: PagerDutyStandIn
) -> None:
    """``sync_acks``: someone acks the page in PagerDuty; the next poll (REST API, paged) acknowledges
    the incident in Slack naming them, and nothing is sent back to PagerDuty; a wrong API key reads nothing."""
    settings = PagerSettings(
        kind="pagerduty", url=pagerduty.url, sync_acks=True, sync_every=0.001, api_url=pagerduty.api_url
    )
    ctx.config = ctx.config.model_copy(update={"pager": settings})
    assert ctx.pager is not None
    await ctx.pager.aclose()
    ctx.pager = open_pager(settings, ROUTING_KEY, api_token="wrong")
    await _open(ctx)
    assert await escalate_due(ctx, now=T0 + 1800) == 2
    await pagerduty.wait(lambda: pagerduty.pages == 1)
    pagerduty.ack("incident:train:1", "Jane Doe")
    await escalate_due(ctx, now=T0 + 1801)
    stored = await ctx.redis.open_store(IncidentStore).incident(JOB)
    assert stored is not None and stored.acked_by is None and pagerduty.reads == 0  # 401: nothing read
    await ctx.pager.aclose()
    ctx.pager = open_pager(settings, ROUTING_KEY, api_token=API_TOKEN)
    await escalate_due(ctx, now=T0 + 1802)
    stored = await ctx.redis.open_store(IncidentStore).incident(JOB)
    assert stored is not None and stored.acked_by == "Jane Doe (in PagerDuty)"
    said = [p.reply.title for p in _box(ctx).of("thread")]
    assert "acknowledged by Jane Doe (in PagerDuty) - no more reminders for train until it resolves" in said
    await ctx.pager.drain(5)
    assert [e["event_action"] for e in pagerduty.accepted] == ["trigger"]


def test_sync_acks_needs_its_api_token() -> None:
    """``sync_acks`` without PAGERDUTY_API_TOKEN is a config error saying so; Alertmanager has none to sync."""
    settings = PagerSettings(kind="pagerduty", sync_acks=True)
    with pytest.raises(
        ConfigError, match=re.escape("pager.sync_acks: needs PAGERDUTY_API_TOKEN in the environment")
    ):
        open_pager(settings, ROUTING_KEY)
    with pytest.raises(ConfigError, match="sync_acks: PagerDuty only"):
        parse_config(
            {"pager": {"kind": "alertmanager", "url": "http://am:9093/api/v2/alerts", "sync_acks": True}}
        )


# --- replicas and a SIGKILLed leader -------------------------------------------------------------

_REPLICA = """
import asyncio, sys
from pathlib import Path
from bot.runtime.assembly import build_context
from bot.runtime.scheduler import PitstopScheduler
from handlers.outbox import MemoryOutbox
from handlers.reply import Reply, Status
from handlers.request.dispatch import Dispatcher, Request
from pipeline import fmt
from pipeline.config import AuthSettings, Config

async def main() -> None:
    config = Config.model_validate_json(Path(sys.argv[1]).read_text())
    clock = Path(sys.argv[2])
    ctx = await build_context(config, MemoryOutbox(), instance="A")
    sched = PitstopScheduler(ctx, leader_ttl=1.0, poll_interval=0.1, now=lambda: float(clock.read_text()))
    await sched.start()
    print("leader" if sched.is_leader else "follower", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_two_replicas_and_a_sigkilled_leader_take_each_step_once(
    ctx: Context, redis_config: Config, tmp_path: Path, pagerduty: PagerDutyStandIn
) -> None:
    """Leader A (its own process) takes step 1; it is SIGKILLed; step 2 comes due while nobody
    leads; replica B takes the lease and step 2 (its page too), once; step 1 is never taken again."""
    clock = tmp_path / "clock"
    clock.write_text(repr(T0))
    target = redis_config.redis.url or f"unix://{ctx.redis.embedded.socket_file}"  # type: ignore[union-attr]
    a_config = ctx.config.model_copy(update={"redis": ctx.config.redis.model_copy(update={"url": target})})
    (tmp_path / "a.json").write_text(a_config.model_dump_json())
    await _open(ctx)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _REPLICA,
        str(tmp_path / "a.json"),
        str(clock),
        stdout=asyncio.subprocess.PIPE,
        cwd=os.getcwd(),
    )
    b_box = MemoryOutbox()
    b = await build_context(ctx.config, b_box, instance="B")
    sb = PitstopScheduler(b, leader_ttl=1.0, poll_interval=0.1, now=lambda: float(clock.read_text()))
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"leader"
        await sb.start()
        assert not sb.is_leader
        after = await ctx.events.last_id()
        clock.write_text(repr(T0 + 601))
        first = await ctx.events.wait_for(EventKind.ESCALATED, JOB, after=after, timeout=10)
        assert first is not None and first.data["step"] == 1 and first.data["instance"] == "A"
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        clock.write_text(repr(T0 + 1801))  # due while nobody leads
        second = await ctx.events.wait_for(EventKind.ESCALATED, JOB, after=first.id, timeout=10)
        assert second is not None and second.data["step"] == 2 and second.data["instance"] == "B"
        assert sb.is_leader
        assert await escalate_due(b, now=T0 + 7200) == 0
        assert [(e["step"], e["instance"]) for e in await _escalations(ctx)] == [(1, "A"), (2, "B")]
        assert [n[:16] for n in _notes(b)] == ["escalated (2/2):"]
        await pagerduty.wait(lambda: pagerduty.pages == 1)
        assert len(pagerduty.accepted) == 1
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await sb.stop()
        await close_context(b)
