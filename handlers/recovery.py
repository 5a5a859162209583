"""Throughput recovered (or not): the follow-up ``recovery_window`` after a RUNNING verdict.

A restart that reached RUNNING after an earlier attempt whose throughput is known is queued for a
follow-up (:meth:`pipeline.state.runs.RunStore.schedule_recovery`, by the runner's verify), due
``[jobs.NAME.watch] recovery_window`` s after its verdict.  The scheduler leader delivers the due
ones (:func:`deliver_recoveries`, on its ``verify`` tick): each is claimed with a lease
(:meth:`~pipeline.state.runs.RunStore.claim_recovery`), posted, then done; one whose claimant died
in between is claimed again after the lease by the next process to look — at least once, and
exactly once when nothing dies.  The follow-up compares the pipeline's median throughput since the restart
(:func:`pipeline.observe.attempts.median_throughput`) with the previous attempt's before it
stopped (its :class:`~pipeline.state.runs.Reach`), and posts in the run's thread:

- ``throughput back: 5,905 tokens/s, 99 % of before``; or, under ``slow_after_restart`` of before,
- an alert, also posted in the job's channel paging ``[slack] alert_mention``:
  ``dflash is slower since r-7: 2,516 tokens/s, 43 % of the 5,905 before (patches now: topk)`` —
  what a bad patch or a degraded GPU looks like while every process count says healthy.

A run the job has moved on from (another restart, a stop) gets no follow-up.
"""

from __future__ import annotations

import logging
import time

from handlers.context import Context
from handlers.reply import Reply, Status, mention
from handlers.runview import thread_key
from pipeline.errors import PitstopError, UnknownRun
from pipeline.observe.attempts import Recovery, attempt_start, median_throughput, read_attempt, recovery

log = logging.getLogger(__name__)


async def deliver_recoveries(ctx: Context, *, now: float | None = None) -> list[Reply]:
    """Post every throughput follow-up that is due, each under a claim only one process holds.

    A follow-up whose reading fails (the host) is dropped, as one with nothing to compare is;
    any other error leaves its claim to lapse, and it is delivered again after the lease.

    :param now: unix s (default: the clock).
    :returns: the replies posted.
    """
    now = time.time() if now is None else now
    began = time.time()
    posted: list[Reply] = []
    for run_id in await ctx.runs.due_recoveries(now):
        # the pass's clock moves on while earlier posts wait for Slack's pace: a lease taken
        # minutes into the pass must not start already expired
        claim = await ctx.runs.claim_recovery(run_id, now=now + (time.time() - began))
        if claim is None:
            continue  # another process holds it
        try:
            reply = await recovery_reply(ctx, run_id)
        except PitstopError as exc:
            log.warning("throughput follow-up of %s not made: %s", run_id, exc.message)
            reply = None
        if reply is not None:
            run = await ctx.runs.get(run_id)
            channel = ctx.config.channel_for(run.job) if run.job in ctx.config.jobs else None
            await ctx.runs.record_recovery(run_id, reply.title)
            await ctx.outbox.thread(thread_key(run_id), reply, channel)
            if reply.status is Status.WARNING:
                await ctx.outbox.post(alert_copy(reply, ctx.config.slack.alert_mention), channel)
            posted.append(reply)
        if not await ctx.runs.recovery_done(run_id, claim):
            log.warning(
                "throughput follow-up of %s: its claim lapsed; another process may post it too", run_id
            )
    return posted


async def recovery_reply(ctx: Context, run_id: str) -> Reply | None:
    """The follow-up of ``run_id``: throughput since its launch against its previous attempt's.

    :returns: the reply, or None when there is nothing to compare (the job moved on to another run,
        the previous attempt's throughput or the new one is unknown).
    :raises PitstopError: if the job's log cannot be read.
    """
    try:
        run = await ctx.runs.get(run_id)
    except UnknownRun:
        return None
    job = ctx.config.jobs.get(run.job)
    start = attempt_start(run, job) if job is not None else None
    if job is None or run.previous_run is None or start is None:
        return None
    if (await ctx.jobs.read(run.job)).run_id != run.id:
        return None  # restarted or stopped since: this run's throughput is no longer the job's
    try:
        before = (await ctx.runs.get(run.previous_run)).reach
    except UnknownRun:
        return None
    lines = await read_attempt(ctx.ssh, run.job, job, start)
    found = recovery(
        median_throughput(lines), before.tokens_per_s if before else None, job.watch.slow_after_restart
    )
    if found is None:
        return None
    key = thread_key(run.id)
    if found.slow:
        return Reply(
            title=slower_since(run.job, run.id, found, run.patches),
            status=Status.WARNING,
            thread_key=key,
            run_id=run.id,
        )
    return Reply(title=throughput_back(found), status=Status.OK, thread_key=key, run_id=run.id)


def alert_copy(reply: Reply, page: str | None) -> Reply:
    """The slower-since alert as a channel post of its own, paging ``page`` (``[slack] alert_mention``)."""
    lines = (slower_see_thread(mention(page), reply.run_id or "?"),) if page else ()
    return Reply(title=reply.title, status=reply.status, run_id=reply.run_id, page=page, lines=lines)


# --- text ---------------------------------------------------------------------------------------


def _pct(found: Recovery) -> str:
    return f"{found.ratio * 100:.0f} %"


def slower_see_thread(who: str, run_id: str) -> str:
    """The alert's line naming who it pages and where the details are."""
    return f"{who} the restart's thread ({run_id}) has its verdict and patches"


def throughput_back(found: Recovery) -> str:
    """``throughput back: 5,905 tokens/s, 99 % of before``."""
    return f"throughput back: {found.now:,.0f} tokens/s, {_pct(found)} of before"


def slower_since(job: str, run_id: str, found: Recovery, patches: list[str]) -> str:
    """``dflash is slower since r-7: 2,516 tokens/s, 43 % of the 5,905 before (patches now: topk)``."""
    now = ", ".join(patches) if patches else "none"
    return (
        f"{job} is slower since {run_id}: {found.now:,.0f} tokens/s, {_pct(found)} of the "
        f"{found.before:,.0f} before (patches now: {now})"
    )
