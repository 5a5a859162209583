"""Delivering a run's verdict: verify once, post once, whichever process gets there first.

After a launch the Restarter leaves the run's verify step WAITING and queues the run
(:mod:`pipeline.state.verifications`) due at launch + ``start_window``.  Whoever comes
first — the scheduler leader polling the queue, or ``pitstop say --wait`` — calls
:func:`deliver_verdict`; the queue's claim makes exactly one of them verify and post.  The claim is taken with a short TTL that its holder renews while it
works, and made permanent only once the posts are out, so a process that dies half-way leaves
the run to be delivered again within the TTL (never zero times); a run whose verdict is
already recorded is posted without verifying again.

A verification that came due while Pitstop was down is simply overdue in the sorted set: the
first poll after start delivers it, once.

A run verified as ``PENDING`` (a Slurm job still queued at its deadline) is posted once and
stays queued (the engine sets the next due time); later deliveries verify
it again and post only the real verdict, in the same thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from handlers.context import Context
from handlers.reply import Reply, Status
from handlers.runview import run_reply, thread_key, verdict_reply
from pipeline.engines.recovery import Interruption, reconcile
from pipeline.errors import IllegalTransition, PitstopError, UnknownRun
from pipeline.state.events import EventKind
from pipeline.state.runs import RunRecord
from pipeline.state.verifications import Claim
from pipeline.verdict import Verdict

log = logging.getLogger(__name__)

CLAIM_TTL = 30.0  #: seconds a claim lives without renewal while its holder verifies and posts
RETRY_AFTER = 15.0  #: seconds before a verification that failed to run is tried again


async def deliver_verdict(ctx: Context, run_id: str) -> RunRecord | None:
    """Verify a launched run and post its verdict, unless another process claimed it.

    Claims the run (:meth:`~pipeline.state.verifications.VerifyQueue.claim`), runs
    ``ctx.restarter.verify`` (not again if the record already has a verdict), posts the verdict
    line in the run's thread, updates the run's headline, publishes a VERDICT event and marks
    the claim done (the run leaves the queue).

    :param run_id: the run (``r-42``).
    :returns: the verified run, or None if someone else claimed it, the run is unknown, or
        verification could not run (it is retried after :data:`RETRY_AFTER` s).
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
        run = await ctx.runs.get(run_id)
    except UnknownRun:
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
    except Exception as exc:
        text = exc.message if isinstance(exc, PitstopError) else f"{type(exc).__name__}: {exc}"
        log.warning(verdict_not_delivered(run_id, text), exc_info=not isinstance(exc, PitstopError))
        await ctx.queue.requeue(run_id, time.time() + RETRY_AFTER)
        await ctx.queue.release(claim)
        return None
    if run.verdict is Verdict.PENDING:
        # still queued (Slurm): the engine re-queued the check; post PENDING once, then only
        # the real verdict, in the same thread
        if before is not Verdict.PENDING:
            await _post(ctx, run)
        await ctx.queue.release(claim)
        return run
    # the run stays queued while the claim is held, so a process that dies while posting leaves
    # it to be delivered again when its claim expires
    await _post(ctx, run)
    try:
        await ctx.queue.done(claim)
    except IllegalTransition as exc:  # the claim expired mid-post: its new holder finishes it
        log.warning("%s: %s", run_id, exc.message)
    return run


async def _post(ctx: Context, run: RunRecord) -> None:
    """The verdict in the run's thread, the run's headline updated, a VERDICT event."""
    channel = ctx.config.channel_for(run.job) if run.job in ctx.config.jobs else None
    await ctx.outbox.thread(thread_key(run.id), verdict_reply(run), channel)
    if run.warning:  # flagged beside the verdict, which stays as it is
        flag = Reply(title=run.warning, status=Status.WARNING, thread_key=thread_key(run.id), run_id=run.id)
        await ctx.outbox.thread(thread_key(run.id), flag, channel)
    await ctx.outbox.announce(thread_key(run.id), run_reply(run, ctx.config), channel)
    await _publish_verdict(ctx, run)


async def due_run_ids(ctx: Context) -> list[str]:
    """Ids of launched runs whose verification is due now, oldest first (at most 100)."""
    return await ctx.queue.due()


async def deliver_due(ctx: Context) -> list[RunRecord]:
    """Deliver every verification that is due (concurrently); others' claims are skipped.

    :returns: the runs this process delivered.
    """
    ids = await due_run_ids(ctx)
    if not ids:
        return []
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

    Each taken-over run gets its line in its thread (``INTERRUPTED during stop: the old run
    (pid 4242) is still alive, 8/8 processes``) and its headline updated; one that ended before
    its launch also publishes its VERDICT event.  One that had launched is queued for
    verification, which the scheduler leader delivers — or this process at once with ``deliver``.

    :param deliver: verify and post the launched ones here (a process without a scheduler).
    :returns: the runs taken over.
    """
    found = await reconcile(ctx.restarter, instance=ctx.instance)
    for item in found:
        run, key = item.run, thread_key(item.run.id)
        channel = ctx.config.channel_for(run.job) if run.job in ctx.config.jobs else None
        line = Reply(title=item.line, status=Status.WARNING, thread_key=key, run_id=run.id)
        try:
            await ctx.outbox.thread(key, line, channel)
            await ctx.outbox.announce(key, run_reply(run, ctx.config), channel)
        except Exception:
            log.warning("could not post the take-over of %s", run.id, exc_info=True)
        log.warning("%s: %s", run.id, item.line)
        if not item.launched:
            await _publish_verdict(ctx, run)
        elif deliver:
            await deliver_verdict(ctx, run.id)
    return found


async def _publish_verdict(ctx: Context, run: RunRecord) -> None:
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
