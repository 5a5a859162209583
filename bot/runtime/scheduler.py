"""The scheduler (APScheduler 3 in the event loop): ``leader`` (the lease; take over runs of dead
owners), ``verify`` (due verifications, expired approvals, recovery follow-ups), ``watch:HOST:INTERVAL``
(one watch cycle; the heartbeat; a post after a gap of :data:`GAP_INTERVALS` intervals),
``escalate`` (due escalation steps, :mod:`handlers.watch.escalate`) and ``digest:JOB``; the
:class:`Heartbeat` of the watch rounds, whose state :func:`heartbeat_state` decides.  Only the lease holder does the work; claims in Redis keep a post from happening
twice.  Every job sets ``misfire_grace_time``, ``coalesce`` and ``max_instances=1``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from bot.text import (
    heartbeat_no_answer,
    heartbeat_slack_refused,
    heartbeat_untold,
    heartbeat_watch_failed,
    not_watching,
    scheduler_leader,
)
from handlers.context import Context
from handlers.reply import Reply, Status
from handlers.request.dispatch import Dispatcher
from handlers.views.reports import digest_command
from handlers.watch.cycle import Watcher
from handlers.watch.escalate import escalate_due
from pipeline.errors import StateUnavailable
from pipeline.observe.watch import Decision
from pipeline.state.deliveries import UndeliveredAlert, UndeliveredAlerts
from pipeline.state.leader import LeaderLease, WatchClock

log = logging.getLogger(__name__)

DIGEST_CRON_GRACE = 3600.0  #: seconds a cron digest may start late and still run
DRAIN_TIMEOUT = 30.0  #: seconds :meth:`PitstopScheduler.stop` waits for automatic restarts
PING_TIMEOUT = 10.0  #: seconds one heartbeat ping may take
UNTOLD_HOLD = 3600.0  #: seconds an alert that reached no one keeps the heartbeat failing
GAP_INTERVALS = 3  #: watch intervals without a cycle after which the returning leader says it was away


def _quiet_overlap(record: logging.LogRecord) -> bool:
    """Drops APScheduler's "maximum number of running instances reached" warning for interval jobs."""
    job = record.args[0] if isinstance(record.args, tuple) and record.args else None
    return not (
        "maximum number of running instances" in str(record.msg)
        and isinstance(getattr(job, "trigger", None), IntervalTrigger)
    )


#: this module's schedulers log here (a child of ``apscheduler.scheduler``: same levels and handlers)
APS_LOG = logging.getLogger("apscheduler.scheduler.pitstop")
APS_LOG.addFilter(_quiet_overlap)


@dataclass(frozen=True)
class Vitals:
    """What the heartbeat's state is decided from (:func:`heartbeat_state`): each field one way a
    job's death could be told to no one.  A surface that learns of another adds a field here."""

    now: float  #: unix s
    watch: str | None = None  #: why a watch cycle of this round failed (Pitstop's own failure), or None
    slack: dict[str, Any] | None = None  #: the last ``auth.test``: ``{"ok", "error"}``; None when not asked
    untold: UndeliveredAlert | None = None  #: the last undelivered alert, or None
    pager: str | None = None  #: why the pager keeps refusing (:attr:`pipeline.pager.Pager.refusing`), or None


def heartbeat_state(vitals: Vitals) -> str | None:
    """The heartbeat's one decision: why a job's death would be told to no one now (the body of a
    ``URL/fail`` ping), or None when someone will be told (the plain ping).

    Fails when a watch cycle failed, when the pager keeps refusing, when Slack's ``auth.test`` is not ok (``token_revoked``,
    ``invalid_auth``…), or while an alert that reached no one after the whole fallback chain is
    younger than :data:`UNTOLD_HOLD` s.  A host that cannot be reached is a job incident, told like
    any other: it never fails the heartbeat.

    :returns: the reasons, one per line, or None.
    """
    reasons: list[str] = []
    if vitals.slack is not None and not vitals.slack.get("ok"):
        reasons.append(heartbeat_slack_refused(str(vitals.slack.get("error"))))
    untold = vitals.untold
    if untold is not None and not untold.told and vitals.now - untold.at < UNTOLD_HOLD:
        reasons.append(heartbeat_untold(untold.title, untold.channel, untold.error, untold.at))
    if vitals.pager:
        reasons.append(vitals.pager)  # the pager's own line says what refuses
    if vitals.watch:
        reasons.append(vitals.watch)
    return "\n".join(reasons) or None


class Heartbeat:
    """``[health] heartbeat_url`` (or ``PITSTOP_HEARTBEAT_URL``): once every group in ``groups``
    (the scheduler's ``watch:…`` job ids) has reported a cycle, ``vitals`` are read and
    :func:`heartbeat_state` decides: a GET of ``url``, or a POST of the reason to ``URL/fail``, as
    Healthchecks.io and Cronitor expect, each within :data:`PING_TIMEOUT` s.  The URL is a secret:
    only its host is ever logged.

    :param vitals: reads :class:`Vitals` given the round's watch failure (None: only that is known).
    """

    def __init__(
        self,
        url: str,
        groups: Iterable[str],
        vitals: Callable[[str | None], Awaitable[Vitals]] | None = None,
    ) -> None:
        self.url = url
        self.groups = frozenset(groups)
        self.vitals = vitals
        self._round: dict[str, str | None] = {}
        self._session: aiohttp.ClientSession | None = None

    async def cycle_done(self, group: str, failure: str | None = None) -> None:
        """Note one group's cycle (``failure``: why it failed, None if it ran); ping when the round
        is complete."""
        self._round[group] = self._round.get(group) or failure
        if self.groups <= set(self._round):
            watch = "\n".join(f for f in self._round.values() if f) or None
            self._round.clear()
            vitals = await self.vitals(watch) if self.vitals is not None else Vitals(time.time(), watch)
            await self.ping(heartbeat_state(vitals))

    async def ping(self, reason: str | None = None) -> None:
        """GET the URL, or with a ``reason`` POST it to ``URL/fail``; a failure is logged (host only)."""
        url = self.url if reason is None else self.url.rstrip("/") + "/fail"
        host = urlsplit(self.url).hostname or "?"
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PING_TIMEOUT))
        try:
            sending = self._session.get(url) if reason is None else self._session.post(url, data=reason)
            async with sending as resp:
                if resp.status >= 400:
                    log.warning(heartbeat_no_answer(host, f"HTTP {resp.status}"))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            detail = (str(exc) or type(exc).__name__).replace(url, host).replace(self.url, host)
            log.warning(heartbeat_no_answer(host, detail))

    async def aclose(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


@dataclass
class _Gap:
    """A time nobody watched, found by one group's cycle; the others' first cycles add what they find."""

    start: float  #: unix s of the last cycle before it
    end: float  #: unix s of the first cycle after it
    waiting: set[str]  #: the watch groups whose first cycle after it has not finished yet
    found: dict[str, str] = field(default_factory=dict)  #: job → the condition its first cycle found


class PitstopScheduler:
    """Scheduled work of one Pitstop process, done only while it holds the leader lease.

    :param leader_ttl: seconds the leader lease lives without renewal (renewed every third).
    :param poll_interval: seconds between polls of due verifications (and escalation steps).
    :param now: the clock escalation steps are due by (unix s).
    :param slack_check: ``auth.test``'s answer (``{"ok", "error"}``) for the heartbeat; None
        without Slack.
    """

    def __init__(
        self,
        ctx: Context,
        *,
        leader_ttl: float = 10.0,
        poll_interval: float = 1.0,
        slack_check: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.ctx = ctx
        self.slack_check = slack_check
        self.now = now  #: the clock escalation steps are due by (unix s; tests pass a faster one)
        self.poll_interval = poll_interval
        self.lease = ctx.redis.open_store(LeaderLease, ctx.instance, leader_ttl)
        self.watcher: Watcher = Watcher(ctx)
        self.heartbeat: Heartbeat | None = None
        self.clock = ctx.redis.open_store(WatchClock)
        #: closes approval requests at their expiry, those of a process that died included
        self.requests = Dispatcher(ctx)
        self._shortest = min((job.watch.interval for job in ctx.config.jobs.values()), default=0.0)
        self._scheduler: AsyncIOScheduler | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._was_leader = False
        self._stopping = False
        self._recovering = False
        self._groups: list[str] = []
        self._gap: _Gap | None = None

    @property
    def is_leader(self) -> bool:
        """True while this process holds a lease it can trust and is not stopping."""
        return not self._stopping and self.lease.is_leader

    async def start(self) -> None:
        """Schedule every job in the running loop, try for the lease (RuntimeError if started)."""
        if self._scheduler is not None:
            raise RuntimeError("scheduler already started")
        self._stopping = False
        config = self.ctx.config
        tz = config.scheduler.timezone
        sched = AsyncIOScheduler(event_loop=asyncio.get_running_loop(), timezone=tz, logger=APS_LOG)

        def add(
            fn: Callable[..., Awaitable[None]], trigger: Any, job_id: str, grace: float, *args: Any
        ) -> None:
            sched.add_job(
                self._guarded,
                trigger,
                args=[fn, *args],
                id=job_id,
                name=job_id,
                coalesce=True,
                misfire_grace_time=max(1, int(grace)),
                max_instances=1,
                replace_existing=True,
            )

        def every(seconds: float) -> IntervalTrigger:
            return IntervalTrigger(seconds=seconds, timezone=tz)

        renew = self.lease.renew_every
        add(self._lease_tick, every(renew), "leader", renew)
        add(self._verify_tick, every(self.poll_interval), "verify", max(5.0, self.poll_interval * 5))
        if any(config.escalation_for(name) for name in config.jobs):
            add(self._escalate_tick, every(self.poll_interval), "escalate", max(5.0, self.poll_interval * 5))
        groups: dict[tuple[str, float], list[str]] = {}
        for name, job in config.jobs.items():
            groups.setdefault((job.host, job.watch.interval), []).append(name)
        self._groups = [f"watch:{h}:{i:g}" for h, i in groups]
        for ((host, interval), names), group in zip(groups.items(), self._groups, strict=True):
            add(self._watch_tick, every(interval), group, interval, host, names, group)
        if config.health.heartbeat_url and groups:
            self.heartbeat = Heartbeat(config.health.heartbeat_url, self._groups, self._vitals)
        for name, job in config.jobs.items():
            if job.digest.every is not None:
                add(self._digest_tick, every(job.digest.every), f"digest:{name}", job.digest.every, name)
            elif job.digest.cron is not None:
                cron = CronTrigger.from_crontab(job.digest.cron, timezone=tz)
                add(self._digest_tick, cron, f"digest:{name}", DIGEST_CRON_GRACE, name)
        self._scheduler = sched
        sched.start()
        await self._lease_tick()

    async def stop(self, *, release: bool = True, drain_timeout: float = DRAIN_TIMEOUT) -> None:
        """Stop scheduling, cancel running jobs, wait ``drain_timeout`` s for automatic restarts, then
        ``release`` the lease (another replica takes over at once), else let it expire."""
        self._stopping = True
        sched, self._scheduler = self._scheduler, None
        if sched is not None and sched.running:
            sched.shutdown(wait=False)
        for _ in range(3):
            await asyncio.sleep(0)  # let the scheduler's shutdown run in the loop
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.watcher.drain(drain_timeout)
        if self.heartbeat is not None:
            await self.heartbeat.aclose()
        self._was_leader = False
        if release:
            try:
                await self.lease.release()
            except StateUnavailable:
                log.warning("could not release the scheduler lease; it expires by itself")
        else:
            self.lease.forget()

    async def _guarded(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run one job tracked (so :meth:`stop` can cancel it), logging instead of raising."""
        if self._stopping:
            return
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await fn(*args)
        except asyncio.CancelledError:
            return  # stop() cancelled it; the job ends here
        except Exception:
            log.exception("scheduled job %s failed", getattr(fn, "__name__", fn))
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def _lease_tick(self) -> None:
        try:
            held = await self.lease.acquire()
        except StateUnavailable as exc:
            log.warning("scheduler lease: Redis unavailable: %s", exc.detail)
            held = False
        if held and not self._was_leader:
            log.info(scheduler_leader(self.ctx.instance, True))
            self._spawn(self._became_leader)
        elif held:
            self._spawn(self._recover)
        elif self._was_leader:
            log.warning(scheduler_leader(self.ctx.instance, False))
        self._was_leader = held

    async def _became_leader(self) -> None:
        """Take over runs a dead process left open, then deliver overdue verifications."""
        await self._recover()
        if self.is_leader:
            await self.ctx.service.deliver_due()

    async def _recover(self) -> None:
        """Take over runs whose owner died (every lease tick while leader; one at a time)."""
        if self._recovering or not self.is_leader:
            return
        self._recovering = True
        try:
            await self.ctx.service.recover()
        except Exception:
            log.exception("taking over the runs of a dead process failed")
        finally:
            self._recovering = False

    async def _verify_tick(self) -> None:
        if self.is_leader:
            await self.ctx.service.deliver_due()
            await self.requests.two_person.expire_due()
        if self.is_leader:  # still, after the deliveries
            await self.ctx.service.followups_due()

    async def _escalate_tick(self) -> None:
        if self.is_leader:
            await escalate_due(self.ctx, now=self.now())

    async def _watch_tick(self, host: str, names: list[str], group: str) -> None:
        if not self.is_leader:
            return
        began = time.time()
        previous = await self.clock.mark(began)  # the end of the last cycle, of any leader
        if previous is not None and began - previous > GAP_INTERVALS * self._shortest:
            self._gap = _Gap(previous, began, set(self._groups))  # told once every group looked
        decisions: dict[str, Decision] = {}
        try:
            decisions = await self.watcher.cycle(host, names)
        except Exception as exc:
            await self._beat(group, heartbeat_watch_failed(host, str(exc) or type(exc).__name__))
            raise
        finally:
            await self._gap_seen(group, {name: d.condition for name, d in decisions.items()})
        await self.clock.mark(time.time())
        await self._beat(group, None)  # an unreachable host is the job's incident, told as such

    async def _gap_seen(self, group: str, found: dict[str, str]) -> None:
        """Add one group's first cycle after a gap; post the return once every group has had one."""
        gap = self._gap
        if gap is None or group not in gap.waiting:
            return
        gap.found.update(found)
        gap.waiting.discard(group)
        if gap.waiting:
            return
        self._gap = None
        if self.is_leader:
            words = not_watching(gap.start, gap.end, gap.found, self.ctx.config.scheduler.timezone)
            await self.ctx.outbox.post(Reply(words, Status.WARNING), self.ctx.config.slack.announce_channel)

    async def _beat(self, group: str, failure: str | None) -> None:
        """Tell the heartbeat of one watch cycle (``[health] heartbeat_url``), while still leader."""
        if self.heartbeat is not None and self.is_leader:
            await self.heartbeat.cycle_done(group, failure)

    async def _vitals(self, watch: str | None) -> Vitals:
        """The heartbeat's :class:`Vitals`: Slack's ``auth.test``, the last undelivered alert."""
        slack = await self.slack_check() if self.slack_check is not None else None
        try:
            untold = await self.ctx.redis.open_store(UndeliveredAlerts).last()
        except StateUnavailable:
            untold = None  # Redis away: the watch cycles fail and say so
        pager = self.ctx.pager.refusing if self.ctx.pager is not None else None
        return Vitals(time.time(), watch, slack, untold, pager)

    async def _digest_tick(self, job: str) -> None:
        if not self.is_leader:
            return
        reply = await digest_command(self.ctx, job, scheduled=True)
        if not self.is_leader:
            return  # lost the lease while building it: the new leader posts the next one
        await self.ctx.outbox.post(reply, self.ctx.config.channel_for(job))

    def _spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        self._tasks.add(asyncio.get_running_loop().create_task(self._guarded(fn)))  # dropped when it ends
