"""Delivering a run's verdict: verify once, post once, whichever process gets there first.

A launched run waits in the verification queue (:mod:`pipeline.state.verifications`), due at
launch + ``start_window`` (overdue after a restart of Pitstop: the first poll delivers it).  The
scheduler leader or ``pitstop say --wait`` calls :func:`deliver_verdict`; the queue's claim makes
one of them verify and post.  The claim lives ``CLAIM_TTL`` s unless renewed and is made
permanent only once the posts are out, so a process that dies half-way leaves the run to be
delivered again (never zero times).  A ``PENDING`` run (a Slurm job still queued at its deadline)
is posted once and stays queued; later deliveries post only the real verdict, in the same thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from handlers.context import Context
from handlers.reply import Reply, Status
from handlers.runs.view import run_reply, thread_key, verdict_reply
from pipeline.engines.recovery import Interruption, reconcile
from pipeline.errors import IllegalTransition, PitstopError, UnknownRun
from pipeline.state.events import EventKind
from pipeline.state.runs import RunRecord, RunState
from pipeline.state.verifications import Claim
from pipeline.verdict import Verdict

log = logging.getLogger(__name__)

CLAIM_TTL = 30.0  #: seconds a claim lives without renewal while its holder verifies and posts
RETRY_AFTER = 15.0  #: seconds before a verification that failed to run is tried again


async def deliver_verdict(ctx: Context, run_id: str) -> RunRecord | None:
    """Verify a launched run (not again if it has a verdict) and post its verdict in its thread,
    update its headline and publish a VERDICT event, unless another process claimed it.

    :returns: the verified run, or None if someone else claimed it, the run is unknown or was ended
        by its sequence (or a take-over, which told it), or verification could not run (it is retried
        after :data:`RETRY_AFTER` s; at the next poll when the run changed under it).
    """
    claim = await ctx.queue.claim(run_id, f"{ctx.instance}:{time.time():.3f}", CLAIM_TTL)
    if claim is None:
        return None
    renewal = asyncio.get_running_loop().create_task(_renew_claim(ctx, claim))
    try:
        return await _deliver_claimed(ctx, claim)
    finally:
        renewal.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewal


async def _renew_claim(ctx: Context, claim: Claim) -> None:
    """Extend a held claim every ``ttl / 3`` s: a live verifier keeps it, a dead one loses it in ``ttl``."""
    while True:
        await asyncio.sleep(claim.ttl / 3)
        try:
            await ctx.queue.extend(claim)
        except Exception:
            log.warning("could not extend the verification claim of %s", claim.run_id, exc_info=True)


async def _deliver_claimed(ctx: Context, claim: Claim) -> RunRecord | None:
    run_id = claim.run_id
    try:
        run: RunRecord | None = await ctx.runs.get(run_id)
    except UnknownRun:
        run = None
    if run is None or RunState.of(run) is RunState.ENDED:  # ended (and told) by its sequence or a take-over
        await ctx.queue.drop(run_id)
        await ctx.queue.release(claim)
        return None
    before = run.verdict
    try:
        if run.verdict is None or run.verdict is Verdict.PENDING:
            run = await ctx.restarter.verify(run)
    except asyncio.CancelledError:
        await asyncio.shield(ctx.queue.release(claim))
        raise
    except IllegalTransition as exc:  # another writer won: nothing posted; the next poll drops or re-verifies
        log.info("%s: verdict not recorded: %s", run_id, exc.message)
        await ctx.queue.requeue(run_id, time.time())
        await ctx.queue.release(claim)
        return None
    except Exception as exc:
        text = exc.message if isinstance(exc, PitstopError) else f"{type(exc).__name__}: {exc}"
        log.warning(verdict_not_delivered(run_id, text), exc_info=not isinstance(exc, PitstopError))
        await ctx.queue.requeue(run_id, time.time() + RETRY_AFTER)
        await ctx.queue.release(claim)
        return None
    if run.verdict is Verdict.PENDING:  # still queued (Slurm): the engine re-queued the check
        if before is not Verdict.PENDING:
            await _post(ctx, run)
        await ctx.queue.release(claim)
        return run
    await _post(ctx, run)  # still queued while the claim is held: delivered again if we die
    try:
        await ctx.queue.done(claim)
    except IllegalTransition as exc:  # the claim expired mid-post: its new holder finishes it
        log.warning("%s: %s", run_id, exc.message)
    return run


async def _post(ctx: Context, run: RunRecord) -> None:
    """The verdict in the run's thread, the run's headline updated, a VERDICT event."""
    channel, key = _channel(ctx, run.job), thread_key(run.id)
    await ctx.outbox.thread(key, verdict_reply(run), channel)
    if run.warning:  # flagged beside the verdict, which stays as it is
        flag = Reply(title=run.warning, status=Status.WARNING, thread_key=key, run_id=run.id)
        await ctx.outbox.thread(key, flag, channel)
    await ctx.outbox.announce(key, run_reply(run, ctx.config), channel)
    await publish_verdict(ctx, run)


def _channel(ctx: Context, job: str) -> str | None:
    return ctx.config.channel_for(job) if job in ctx.config.jobs else None


async def due_run_ids(ctx: Context) -> list[str]:
    """Ids of launched runs whose verification is due now, oldest first (at most 100)."""
    return await ctx.queue.due()


async def deliver_due(ctx: Context) -> list[RunRecord]:
    """Deliver every verification that is due (concurrently); others' claims are skipped.

    :returns: the runs this process delivered.
    """
    ids = await due_run_ids(ctx)
    results = await asyncio.gather(*(deliver_verdict(ctx, i) for i in ids), return_exceptions=True)
    delivered: list[RunRecord] = []
    for run_id, result in zip(ids, results, strict=True):
        if isinstance(result, RunRecord):
            delivered.append(result)
        elif isinstance(result, BaseException):
            if isinstance(result, asyncio.CancelledError):
                raise result
            log.error(verdict_not_delivered(run_id, repr(result)), exc_info=result)
    return delivered


async def recover_runs(ctx: Context, *, deliver: bool = False) -> list[Interruption]:
    """Take over runs whose owner died (:func:`pipeline.engines.recovery.reconcile`) and tell their threads.

    Each gets its line in its thread (``INTERRUPTED during stop: the old run (pid 4242) is still
    alive, 8/8 processes``) and its headline updated; one that ended before its launch also
    publishes its VERDICT event; one that launched is queued for verification.

    :param deliver: verify and post the launched ones here (a process without a scheduler).
    :returns: the runs taken over.
    """
    found = await reconcile(ctx.restarter, instance=ctx.instance)
    for item in found:
        run, key = item.run, thread_key(item.run.id)
        channel = _channel(ctx, run.job)
        line = Reply(title=item.line, status=Status.WARNING, thread_key=key, run_id=run.id)
        try:
            await ctx.outbox.thread(key, line, channel)
            await ctx.outbox.announce(key, run_reply(run, ctx.config), channel)
        except Exception:
            log.warning("could not post the take-over of %s", run.id, exc_info=True)
        log.warning("%s: %s", run.id, item.line)
        if not item.launched:
            await publish_verdict(ctx, run)
        elif deliver:
            await deliver_verdict(ctx, run.id)
    return found


async def publish_verdict(ctx: Context, run: RunRecord) -> None:
    """The ``verdict`` event of ``run``, for ``pitstop say --wait`` and any other waiter."""
    await ctx.events.publish(
        EventKind.VERDICT,
        run.job,
        run_id=run.id,
        verdict=run.verdict.value if run.verdict else None,
        line=run.verdict_line,
        instance=ctx.instance,
    )


# --- text ---------------------------------------------------------------------------------------


def verdict_not_delivered(run_id: str, error: str) -> str:
    """A verification that failed to run (logged; retried later)."""
    return f"verification of {run_id} failed: {error} - retrying"
