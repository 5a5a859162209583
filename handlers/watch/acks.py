"""A person's attention to a job's incidents: ``ack JOB`` (no more reminders or escalation until it
resolves) and ``watch JOB on|off [for DURATION]`` (pause the watcher, which resumes by itself; ``off``
ends the open incident's escalation) and ``maintenance JOB DURATION ["REASON"]`` (the same pause,
announced)."""

from __future__ import annotations

import difflib
import time

from handlers import text as words
from handlers.context import Context
from handlers.reply import Reply, Status, refused
from handlers.text import mention
from handlers.watch.alerts import about, acked_reply, alert_reply, pager_alert
from handlers.watch.escalate import stop
from pipeline import fmt
from pipeline.state.incidents import IncidentStore

DEFAULT_OFF_S = 24 * 3600  #: ``watch JOB off`` without ``for``: paused this long (s), then on again


def _job_or_error(ctx: Context, job: str) -> str | Reply:
    """The job's configured name, or the USAGE reply for a job that is not configured."""
    try:
        return ctx.config.job_name(job)
    except KeyError:
        close = difflib.get_close_matches(job, list(ctx.config.jobs), n=1)
        hint = f" - did you mean {close[0]}?" if close else ""
        return refused(f"no job called {job!r}{hint}")


async def ack_command(ctx: Context, job: str, user: str) -> Reply:
    """``ack JOB`` (any case): acknowledge the job's open incident — no more reminders until it
    resolves — noting who in its thread and on its headline.  INFO when nothing is open or it
    was already acknowledged."""
    name = _job_or_error(ctx, job)
    if isinstance(name, Reply):
        return name
    store = ctx.redis.open_store(IncidentStore)
    for _ in range(5):
        incident = await store.incident(name)
        if incident is None:
            break
        if incident.acked_by:
            text = f"the {name} incident was already acknowledged by {mention(incident.acked_by)}"
            return Reply(title=text, status=Status.INFO, thread_key=incident.thread_key)
        acked = await store.update(
            incident, incident.model_copy(update={"acked_by": user, "acked_at": time.time()})
        )
        if acked is None:
            continue  # changed meanwhile (a reminder, a resolve): read it again
        reply = acked_reply(acked, user)
        if acked.paged and ctx.pager is not None:  # acknowledged at the pager too
            ctx.pager.acknowledge(pager_alert(acked, ctx.config))
        channel = ctx.config.channel_for(name)
        await about(ctx, acked, channel, reply, alert_reply(acked, ctx.config, mention=False))
        return reply
    return Reply(title=f"no open incident for {name} - nothing to acknowledge", status=Status.INFO)


async def watch_command(ctx: Context, job: str, state: str, for_s: int | None, user: str) -> Reply:
    """``watch JOB on|off [for DURATION]``: pause watching (expires by itself) or resume it.

    ``off`` without a duration pauses for :data:`DEFAULT_OFF_S`.  ``on`` also resets the
    watcher's stall and degradation clocks, so a pause is not mistaken for a stall.

    :param user: the requester's id (recorded as the pause's value).
    :returns: the answer; USAGE error for another state or unknown job.
    """
    name = _job_or_error(ctx, job)
    if isinstance(name, Reply):
        return name
    store = ctx.redis.open_store(IncidentStore)
    if state == "off":
        seconds = int(for_s or DEFAULT_OFF_S)
        until = await _pause(ctx, store, name, user, seconds)
        paused = f"paused for {fmt.duration(seconds)} (until {until}) - `watch {name} on` resumes it"
        return Reply(title=f"watching {name} {paused}", status=Status.OK)
    if state == "on":
        again = "again" if await store.resume(name) else "(it was not paused)"
        return Reply(title=f"watching {name} {again}", status=Status.OK)
    return refused(f"watch takes `on` or `off`, not {state!r}")


async def maintenance_command(ctx: Context, job: str, for_s: int, reason: str | None, user: str) -> Reply:
    """``maintenance JOB DURATION ["REASON"]``: a planned window — watching paused (no alerts) and the
    open incident's escalation ended — announced in the job's channel with who and why; the
    dispatcher's audit trail records it.

    :param for_s: the window's length (s).
    :returns: the announcement, also the requester's answer; USAGE error for an unknown job.
    """
    name = _job_or_error(ctx, job)
    if isinstance(name, Reply):
        return name
    until = await _pause(ctx, ctx.redis.open_store(IncidentStore), name, user, for_s)
    title = words.maintenance_announced(name, fmt.duration(for_s), until, mention(user), reason)
    reply = Reply(title=title, status=Status.INFO, lines=(words.maintenance_ends(name),))
    await ctx.outbox.post(reply, ctx.config.channel_for(name))
    return reply


async def _pause(ctx: Context, store: IncidentStore, name: str, user: str, seconds: int) -> str:
    """Pause watching ``name`` for ``seconds`` and end its open incident's escalation (noted in its
    thread); returns when the pause ends, as a clock."""
    await store.pause(name, user, seconds)
    if (stopped := await stop(store, ctx.config, name)) is not None:
        note = Reply(title=words.escalation_stopped(name), status=Status.INFO, thread_key=stopped.thread_key)
        head = alert_reply(stopped, ctx.config, mention=False)
        await about(ctx, stopped, ctx.config.channel_for(name), note, head)
    return fmt.clock(time.time() + seconds, ctx.config.scheduler.timezone)
