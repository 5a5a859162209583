"""Throughput recovered (or not): the follow-up ``[jobs.NAME.watch] recovery_window`` s after a
restart's RUNNING verdict, when its previous attempt's throughput is known.

The scheduler leader delivers the due ones (:func:`deliver_recoveries`), each under a lease
(:meth:`~pipeline.state.runs.RunStore.claim_recovery`): at least once, exactly once when nothing
dies.  It compares the median throughput since the restart with the previous attempt's
(:class:`~pipeline.state.runs.Reach`) and posts in the run's thread either
``throughput back: 5,905 tokens/s, 99 % of before`` or, under ``slow_after_restart`` of before,
an alert also posted in the job's channel paging ``[slack] alert_mention``.  A run the job has
moved on from (another restart, a stop) gets no follow-up.
"""

from __future__ import annotations

import logging
import time

from handlers.context import Context
from handlers.reply import Reply, Status, mention
from handlers.runs.view import thread_key
from pipeline.errors import PitstopError, UnknownRun
from pipeline.observe.attempts import attempt_start, median_throughput, read_attempt, recovery

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
    lines = await read_attempt(ctx.restarter.read_chunk, run.job, job, start)
    found = recovery(
        median_throughput(lines), before.tokens_per_s if before else None, job.watch.slow_after_restart
    )
    if found is None:
        return None
    pct = f"{found.ratio * 100:.0f} %"
    if found.slow:  # dflash is slower since r-7: 2,516 tokens/s, 43 % of the 5,905 before (patches now: topk)
        patches = ", ".join(run.patches) if run.patches else "none"
        title = (
            f"{run.job} is slower since {run.id}: {found.now:,.0f} tokens/s, {pct} of the "
            f"{found.before:,.0f} before (patches now: {patches})"
        )
    else:
        title = f"throughput back: {found.now:,.0f} tokens/s, {pct} of before"
    status = Status.WARNING if found.slow else Status.OK
    return Reply(title=title, status=status, thread_key=thread_key(run.id), run_id=run.id)


def alert_copy(reply: Reply, page: str | None) -> Reply:
    """The slower-since alert as a channel post of its own, paging ``page`` (``[slack] alert_mention``)."""
    see = f"the restart's thread ({reply.run_id or '?'}) has its verdict and patches"
    lines = (f"{mention(page)} {see}",) if page else ()
    return Reply(title=reply.title, status=reply.status, run_id=reply.run_id, page=page, lines=lines)
