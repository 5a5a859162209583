"""A person's attention to a job's incidents: ``ack JOB`` (no more reminders until it resolves) and
``watch JOB on|off [for DURATION]`` (pause the watcher, which resumes by itself).  The watch cycle
that opens the incidents is :mod:`handlers.watching`."""

from __future__ import annotations

import difflib
import time

from handlers.alerts import acked_reply, alert_reply
from handlers.context import Context
from handlers.reply import Reply, Status, mention, refused
from handlers.storm import line_first
from pipeline import fmt
from pipeline.state.incidents import IncidentStore

DEFAULT_OFF_S = 24 * 3600  #: ``watch JOB off`` without ``for``: paused this long (s), then on again


def _job_or_error(ctx: Context, job: str) -> str | Reply:
    """The job's configured name, or the USAGE reply for a job that is not configured."""
    try:
        return ctx.config.job_name(job)
    except KeyError:
        close = difflib.get_close_matches(job, list(ctx.config.jobs), n=1)
        return refused(watch_unknown_job(job, close[0] if close else None))


async def ack_command(ctx: Context, job: str, user: str) -> Reply:
    """``ack JOB``: acknowledge the job's open incident — no more reminders until it resolves.

    Notes who acknowledged in the incident's thread and on its headline.

    :param job: a job name (any case).
    :param user: the requester's id.
    :returns: the answer (INFO when nothing is open or it was already acknowledged).
    """
    name = _job_or_error(ctx, job)
    if isinstance(name, Reply):
        return name
    store = ctx.redis.open_store(IncidentStore)
    for _ in range(5):
        incident = await store.incident(name)
        if incident is None:
            return Reply(title=incident_none_open(name), status=Status.INFO)
        if incident.acked_by:
            return Reply(
                title=incident_already_acked(name, incident.acked_by),
                status=Status.INFO,
                thread_key=incident.thread_key,
            )
        acked = await store.update(
            incident, incident.model_copy(update={"acked_by": user, "acked_at": time.time()})
        )
        if acked is None:
            continue  # changed meanwhile (a reminder, a resolve): read it again
        channel = ctx.config.channel_for(name)
        reply = acked_reply(acked, user)
        await line_first(ctx, acked, channel)
        await ctx.outbox.thread(acked.thread_key, reply, channel)
        await ctx.outbox.announce(acked.thread_key, alert_reply(acked, ctx.config, mention=False), channel)
        return reply
    return Reply(title=incident_none_open(name), status=Status.INFO)


async def watch_command(ctx: Context, job: str, state: str, for_s: int | None, user: str) -> Reply:
    """``watch JOB on|off [for DURATION]``: pause watching (expires by itself) or resume it.

    ``off`` without a duration pauses for :data:`DEFAULT_OFF_S`.  ``on`` also resets the
    watcher's stall and degradation clocks, so a pause is not mistaken for a stall.

    :param state: ``on`` or ``off``.
    :param for_s: seconds to stay off.
    :param user: the requester's id (recorded as the pause's value).
    :returns: the answer; USAGE error for another state or unknown job.
    """
    name = _job_or_error(ctx, job)
    if isinstance(name, Reply):
        return name
    store = ctx.redis.open_store(IncidentStore)
    if state == "off":
        seconds = int(for_s or DEFAULT_OFF_S)
        await store.pause(name, user, seconds)
        until = fmt.clock(time.time() + seconds, ctx.config.scheduler.timezone)
        return Reply(title=watch_paused(name, until, seconds), status=Status.OK)
    if state == "on":
        return Reply(title=watch_resumed(name, await store.resume(name)), status=Status.OK)
    return refused(watch_bad_state(state))


# --- text ---------------------------------------------------------------------------------------


def incident_already_acked(job: str, user: str) -> str:
    """``ack JOB`` on an incident someone already acknowledged."""
    return f"the {job} incident was already acknowledged by {mention(user)}"


def incident_none_open(job: str) -> str:
    """``ack JOB`` when nothing is open."""
    return f"no open incident for {job} - nothing to acknowledge"


def watch_paused(job: str, until: str, seconds: float) -> str:
    """Reply of ``watch JOB off [for D]``."""
    return f"watching {job} paused for {fmt.duration(seconds)} (until {until}) - `watch {job} on` resumes it"


def watch_resumed(job: str, was_off: bool) -> str:
    """Reply of ``watch JOB on``."""
    if was_off:
        return f"watching {job} again"
    return f"watching {job} (it was not paused)"


def watch_bad_state(state: str) -> str:
    """``watch JOB`` with something other than on/off."""
    return f"watch takes `on` or `off`, not {state!r}"


def watch_unknown_job(job: str, suggestion: str | None) -> str:
    """A watch/ack command naming a job that is not configured."""
    hint = f" - did you mean {suggestion}?" if suggestion else ""
    return f"no job called {job!r}{hint}"
