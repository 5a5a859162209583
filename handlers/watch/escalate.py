"""Escalation: an incident nobody acknowledges is told to more people, step by step.

A job's policy (``[jobs.NAME.escalation]`` or the ``[escalation.NAME]`` it names) lists steps, each
``after`` seconds from the incident's start.  The scheduler's leader calls :func:`escalate_due` with
its clock; a step that came due is recorded on the incident (``escalated``: the steps taken) by the
incident's compare-and-set *before* it is told, so across replicas and leader changes each step is
taken once, and one that came due while nobody led is taken on return.  Each step is a note in the
incident's thread mentioning whom it names, a DM to each user it names, and the page it asks for
(within the policy's ``hours`` only: outside them the step is told in Slack alone).
``ack`` (``acked_by``; in PagerDuty too with ``[pager] sync_acks``), a resolution (the incident is
gone), ``watch JOB off`` and ``maintenance`` (which mark every step taken, :func:`stop`) end the
chain.  ``oncall`` (:func:`oncall_command`) lists what is open and when each escalates next.
"""

from __future__ import annotations

import asyncio
import logging
import time

from handlers import text as words
from handlers.context import Context
from handlers.reply import Reply, Status, Table
from handlers.watch.alerts import (
    about,
    acked_reply,
    alert_reply,
    job_owners,
    next_step,
    next_step_line,
    pager_alert,
)
from pipeline import fmt
from pipeline.config import Config, EscalationStep
from pipeline.state.events import EventKind
from pipeline.state.incidents import Incident, IncidentStore

log = logging.getLogger(__name__)

TRIES = 3  #: compare-and-set attempts per job and call before the next call tries again


async def escalate_due(ctx: Context, *, now: float) -> int:
    """Take every escalation step that came due by ``now`` on every open, unacknowledged incident
    (the scheduler's leader calls it; a step is recorded before it is told, so it is told once).

    :param now: unix s, from the scheduler's clock.
    :returns: the number of steps taken by this call.
    """
    store = ctx.redis.open_store(IncidentStore)
    acked = await ctx.pager.acknowledged() if ctx.pager is not None else {}  # ``sync_acks``
    taken = 0
    for name in ctx.config.jobs:
        if ctx.config.escalation_for(name) is not None:
            try:
                taken += await _escalate(ctx, store, name, now, acked)
            except Exception:  # one job's trouble never holds another's escalation
                log.exception("escalating the %s incident failed", name)
    return taken


async def _escalate(ctx: Context, store: IncidentStore, job: str, now: float, acked: dict[str, str]) -> int:
    policy = ctx.config.escalation_for(job)
    assert policy is not None
    for _ in range(TRIES):
        inc = await store.incident(job)
        if inc is not None and inc.paged and ctx.pager is not None:
            ctx.pager.keep(pager_alert(inc, ctx.config))  # an open alert its pager expects again
        if inc is None or inc.acked_by is not None:
            return 0
        if inc.paged and (who := acked.get(inc.thread_key)) is not None:
            await _acked_at_pager(ctx, store, inc, who, now)
            return 0
        due = sum(1 for step in policy.steps if inc.opened_at + step.after <= now)
        if due <= inc.escalated:
            return 0
        pages = any("pager" in step.notify for step in policy.steps[inc.escalated : due])
        pages = inc.paged or (pages and policy.may_page(now))
        stored = await store.update(inc, inc.model_copy(update={"escalated": due, "paged": pages}))
        if stored is None:
            continue  # changed meanwhile (a cycle, an ack, another replica): read it again
        for index in range(inc.escalated, due):
            await _tell(ctx, stored, index, policy.steps[index], now)
        return due - inc.escalated
    return 0


async def _tell(ctx: Context, inc: Incident, index: int, step: EscalationStep, now: float) -> None:
    """One step: its note in the incident's thread, a DM to each user it names, its page."""
    config = ctx.config
    policy = config.escalation_for(inc.job)
    assert policy is not None
    paging = "pager" in step.notify and policy.may_page(now)
    people: list[str] = []
    for entry in step.notify:
        if entry == "owners":
            people += job_owners(config, inc.job, inc.last_actor)
        elif entry not in ("channel", "pager"):
            people.append(entry)
    people = list(dict.fromkeys(people))
    told = [words.mention(p) for p in people]
    if "pager" in step.notify:  # outside its hours, Slack only
        told.append(
            words.NOTIFY_WORDS["pager"]
            if paging or policy.hours is None
            else words.not_paged(policy.hours.text)
        )
    here = "channel" in step.notify
    if here:
        told.insert(0, words.mention("here"))
    title = words.escalated(
        inc.job, index + 1, len(policy.steps), now - inc.opened_at, ", ".join(told) or "nobody"
    )
    lines = (line,) if (line := next_step_line(inc, config, now)) else ()
    note = Reply(title, Status.WARNING, lines, page="here" if here else None, thread_key=inc.thread_key)
    channel = config.channel_for(inc.job)
    if paging and ctx.pager is not None:  # sent in the background: never holds Slack
        ctx.pager.trigger(pager_alert(inc, config))
    await about(ctx, inc, channel, note, alert_reply(inc, config, now=now, mention=False))  # its next step
    for user in people:
        if user.startswith(("U", "W")):
            await ctx.outbox.tell(user, note)
    await ctx.events.publish(
        EventKind.ESCALATED,
        inc.job,
        n=inc.n,
        step=index + 1,
        notify=",".join(step.notify),
        instance=ctx.instance,
    )


async def _acked_at_pager(ctx: Context, store: IncidentStore, inc: Incident, who: str, now: float) -> None:
    """Acknowledge ``inc`` as acknowledged in PagerDuty by ``who`` (a name there): no more reminders
    or escalation, said in its thread and on its headline (compare-and-set: a Slack ack meanwhile wins)."""
    by = words.pager_acker(who)
    acked = await store.update(inc, inc.model_copy(update={"acked_by": by, "acked_at": now}))
    if acked is not None:
        reply = acked_reply(acked, by)
        head = alert_reply(acked, ctx.config, now=now, mention=False)
        await about(ctx, acked, ctx.config.channel_for(inc.job), reply, head)


async def oncall_command(ctx: Context, *, now: float | None = None) -> Reply:
    """``oncall``: every open incident — its job, kind, host, how long it has been open, who
    acknowledged it — and when and to whom it escalates next; unacknowledged ones first, oldest first.

    :param now: unix s (default: the current time).
    :returns: OK when nothing is open, WARNING while one is not acknowledged, else INFO.
    """
    now = time.time() if now is None else now
    config, store = ctx.config, ctx.redis.open_store(IncidentStore)
    names = list(config.jobs)
    found = [i for i in await asyncio.gather(*(store.incident(n) for n in names)) if i is not None]
    if not found:
        return Reply(title=words.ONCALL_NONE, status=Status.OK)
    found.sort(key=lambda i: (i.acked_by is not None, i.opened_at))
    rows = []
    for inc in found:
        due = next_step(inc, config)
        when = words.escalation_next(due[1].notify, due[0], now, config.scheduler.timezone) if due else "-"
        acked = words.mention(inc.acked_by) if inc.acked_by else "no"
        since = fmt.duration(now - inc.opened_at)
        rows.append((inc.job, inc.kind.value.replace("_", " "), inc.host, since, acked, when))
    unacked = sum(1 for i in found if i.acked_by is None)
    return Reply(
        title=words.oncall_title(len(found), unacked),
        status=Status.WARNING if unacked else Status.INFO,
        tables=(Table(words.ONCALL_HEADERS, tuple(rows)),),
    )


async def stop(store: IncidentStore, config: Config, job: str) -> Incident | None:
    """End the escalation of ``job``'s open incident (``watch JOB off``): every step marked taken.

    :returns: the incident as stored after, or None when none was open or nothing was left to take.
    """
    policy = config.escalation_for(job)
    for _ in range(TRIES):
        inc = await store.incident(job)
        if inc is None or policy is None or inc.escalated >= len(policy.steps):
            return None
        stopped = await store.update(inc, inc.model_copy(update={"escalated": len(policy.steps)}))
        if stopped is not None:
            return stopped
    return None
