"""Pagers: PagerDuty's Events API v2 (a strict stand-in) and the real Alertmanager — one alert per
incident whatever the retries and replicas, resolved with it, acknowledged from Slack, retried as
each API says, and a pager that keeps refusing told to the team."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from handlers.context import Context
from handlers.watch.acks import ack_command
from handlers.watch.cycle import Watcher
from handlers.watch.escalate import escalate_due
from pipeline.config import Config, EscalationPolicy, PagerSettings
from pipeline.errors import ConfigError
from pipeline.pager import Pager, PagerAlert, open_pager
from pipeline.pager.alertmanager import Alertmanager
from pipeline.pager.pagerduty import PagerDuty
from pipeline.state.incidents import IncidentStore
from tests.fixtures.pagers import ROUTING_KEY, PagerDutyStandIn, RunningAlertmanager
from tests.test_watch import Harness, open_harness, until

ALERT = PagerAlert("incident:train:1", "train", "dead", "critical", "train is down", "gpu1", 1_800_000_000.0)


def _pd(stand_in: PagerDutyStandIn, trouble: list[str] | None = None, tries: int = 6) -> Pager:
    async def told(line: str) -> None:
        if trouble is not None:
            trouble.append(line)

    return Pager(PagerDuty(stand_in.url, ROUTING_KEY), on_trouble=told, backoff=0.01, tries=tries)


async def test_pagerduty_429_and_5xx_are_retried_into_one_alert(pagerduty: PagerDutyStandIn) -> None:
    """Answers 429 then 500 then 202: the trigger is sent three times and PagerDuty holds one alert."""
    pagerduty.answers = [429, 500]
    pager = _pd(pagerduty)
    pager.trigger(ALERT)
    await pager.drain(10)
    assert len(pagerduty.requests) == 3 and pagerduty.pages == 1
    [event] = pagerduty.accepted
    assert event["dedup_key"] == "incident:train:1" and event["payload"]["severity"] == "critical"
    assert event["payload"]["summary"] == "train is down" and event["payload"]["source"] == "gpu1"
    assert pager.refusing is None
    await pager.aclose()


async def test_two_replicas_triggering_one_incident_page_once(pagerduty: PagerDutyStandIn) -> None:
    """Two processes trigger the same incident: same dedup key, one PagerDuty alert; ack and resolve follow it."""
    a, b = _pd(pagerduty), _pd(pagerduty)
    a.trigger(ALERT)
    b.trigger(ALERT)
    await asyncio.gather(a.drain(10), b.drain(10))
    assert {e["dedup_key"] for e in pagerduty.accepted} == {"incident:train:1"} and pagerduty.pages == 1
    b.acknowledge(ALERT)
    await b.drain(10)
    assert pagerduty.alerts["incident:train:1"] == "acknowledged"
    a.resolve(ALERT)
    await a.drain(10)
    assert pagerduty.alerts["incident:train:1"] == "resolved"
    assert [e["event_action"] for e in pagerduty.accepted] == ["trigger", "trigger", "acknowledge", "resolve"]
    await a.aclose()
    await b.aclose()


async def test_a_400_is_not_retried_and_a_refusing_pager_is_told_once(pagerduty: PagerDutyStandIn) -> None:
    """A 400 is sent once, told once (what PagerDuty said, what to check); a later success clears it."""
    trouble: list[str] = []
    pagerduty.answers = [400]
    pager = _pd(pagerduty, trouble)
    pager.trigger(ALERT)
    await pager.drain(10)
    assert len(pagerduty.requests) == 1 and pagerduty.pages == 0
    [line] = trouble
    assert line.startswith("the pager (pagerduty) refuses incidents: trigger of incident:train:1: HTTP 400")
    assert "check [pager] and its key" in line and pager.refusing == line
    pagerduty.answers = [503] * 6
    pager.trigger(ALERT)
    await pager.drain(10)
    assert len(trouble) == 1 and len(pagerduty.requests) == 7  # still refusing: told once
    pager.trigger(ALERT)
    await pager.drain(10)
    assert pager.refusing is None and pagerduty.pages == 1
    await pager.aclose()


async def test_the_stand_in_refuses_what_pagerduty_refuses(pagerduty: PagerDutyStandIn) -> None:
    """The stand-in is strict: a wrong routing key or a bad severity is a 400, so Pitstop's events are checked."""
    trouble: list[str] = []
    bad = Pager(
        PagerDuty(pagerduty.url, "wrong"), on_trouble=lambda line: _append(trouble, line), backoff=0.01
    )
    bad.trigger(ALERT)
    await bad.drain(10)
    assert "Invalid routing key" in trouble[0]
    good = _pd(pagerduty, trouble)
    good.trigger(PagerAlert(**{**ALERT.__dict__, "severity": "sev1"}))
    await good.drain(10)
    assert pagerduty.problems(pagerduty.requests[-1]) == ["'payload.severity' is invalid"]
    await bad.aclose()
    await good.aclose()


async def _append(out: list[str], line: str) -> None:
    out.append(line)


def test_pagerduty_needs_its_routing_key_from_the_environment() -> None:
    """``kind = "pagerduty"`` without PAGERDUTY_ROUTING_KEY is a config error saying so."""
    with pytest.raises(ConfigError, match="needs PAGERDUTY_ROUTING_KEY in the environment"):
        open_pager(PagerSettings(kind="pagerduty"), None)


# --- the real Alertmanager --------------------------------------------------------------------------


async def test_alertmanager_holds_one_alert_per_incident_until_it_resolves(
    alertmanager: RunningAlertmanager,
) -> None:
    """Sent twice (a re-send, a replica): one alert with the incident's labels; re-sent while open
    as its API expects; resolved with endsAt, gone.  (Alertmanager reads its own clock: times here are real.)"""
    started = time.time() - 60
    alert = PagerAlert(**{**ALERT.__dict__, "started_at": started})
    now = [started + 60]
    am = Alertmanager(f"{alertmanager.url}/api/v2/alerts")
    pager, other = (Pager(am, backoff=0.01, clock=lambda: now[0]) for _ in range(2))
    pager.trigger(alert)
    other.trigger(alert)
    await asyncio.gather(pager.drain(10), other.drain(10))
    [held] = await alertmanager.alerts()
    assert held["labels"] == {
        "alertname": "PitstopIncident",
        "job": "train",
        "kind": "dead",
        "severity": "critical",
        "incident": "incident:train:1",
    }
    assert held["annotations"]["summary"] == "train is down" and held["status"]["state"] == "active"
    pager.keep(alert)  # just sent: not yet again
    assert not pager._tasks
    now[0] += 61
    pager.keep(alert)  # its API expects open alerts again: re-sent
    assert pager._tasks
    await pager.drain(10)
    assert len(await alertmanager.alerts()) == 1
    pager.acknowledge(alert)  # Alertmanager has no acknowledgement: nothing sent
    now[0] = time.time()
    pager.resolve(alert)
    await pager.drain(10)
    assert await alertmanager.alerts() == []
    await pager.aclose()
    await other.aclose()


async def test_alertmanager_refusal_is_not_retried(alertmanager: RunningAlertmanager) -> None:
    """A url that is not the alerts endpoint (Alertmanager answers 404) is sent once and told."""
    trouble: list[str] = []
    pager = Pager(Alertmanager(f"{alertmanager.url}/api/v2/alert"), on_trouble=lambda x: _append(trouble, x))
    pager.trigger(ALERT)
    await pager.drain(10)
    assert len(trouble) == 1 and "trigger of incident:train:1: HTTP 404" in trouble[0], trouble
    await pager.aclose()


# --- end to end: escalation pages, ack acknowledges, the resolution resolves -------------------


@pytest.fixture
async def paged(tmp_path: Path, redis_config: Config, pagerduty: PagerDutyStandIn) -> AsyncIterator[Harness]:
    """Job ``train`` whose policy pages at its first step, PagerDuty the stand-in."""
    async with open_harness(tmp_path, redis_config, {"train": {}}) as h:
        policy = EscalationPolicy.model_validate({"steps": [{"after": 1, "notify": ["owners", "pager"]}]})
        job = h.config.jobs["train"].model_copy(update={"escalation": policy, "owners": ["U0OWNER01"]})
        settings = PagerSettings(kind="pagerduty", url=pagerduty.url)
        h.ctx.config = h.config.model_copy(update={"jobs": {"train": job}, "pager": settings})
        h.ctx.pager = open_pager(settings, ROUTING_KEY)
        try:
            yield h
        finally:
            await h.ctx.pager.aclose()


async def _incident_paged(h: Harness, pagerduty: PagerDutyStandIn) -> Watcher:
    ctx: Context = h.ctx
    watcher = Watcher(ctx)
    await h.launch("train")
    await watcher.cycle("local", ["train"])
    await h.kill("train")
    assert await until(lambda: _open(ctx), 10, lambda: watcher.cycle("local", ["train"]))
    assert await escalate_due(ctx, now=time.time() + 2) == 1
    await pagerduty.wait(lambda: pagerduty.pages == 1)
    return watcher


async def _open(ctx: Context) -> bool:
    return await ctx.redis.open_store(IncidentStore).incident("train") is not None


async def test_an_escalation_pages_and_an_ack_in_slack_acknowledges(
    paged: Harness, pagerduty: PagerDutyStandIn
) -> None:
    """The step naming "pager" triggers one PagerDuty alert keyed by the incident; `ack` acknowledges it there."""
    await _incident_paged(paged, pagerduty)
    [trigger] = pagerduty.accepted
    assert trigger["dedup_key"] == "incident:train:1" and trigger["payload"]["component"] == "train"
    note = paged.thread("escalated (1/1)")[0].reply.title
    assert "<@U0OWNER01>, the pager" in note
    await ack_command(paged.ctx, "train", "U0ACKER01")
    await pagerduty.wait(lambda: pagerduty.alerts["incident:train:1"] == "acknowledged")


async def test_the_incident_resolving_resolves_its_page(paged: Harness, pagerduty: PagerDutyStandIn) -> None:
    """The job back up: the watcher resolves the incident and its PagerDuty alert."""
    watcher = await _incident_paged(paged, pagerduty)
    await paged.launch("train")
    assert await until(lambda: _closed(paged.ctx), 15, lambda: watcher.cycle("local", ["train"]))
    await pagerduty.wait(lambda: pagerduty.alerts["incident:train:1"] == "resolved")


async def _closed(ctx: Context) -> bool:
    return not await _open(ctx)
