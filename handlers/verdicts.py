"""Delivering a run's verdict: verify once, post once, whichever process gets there first.

After a launch the Restarter leaves the run's verify step WAITING and puts the run in
``keys.runs_unverified`` scored by its due time (launch + ``start_window``).  Whoever comes
first — the scheduler leader polling that set, or ``pitstop say --wait`` — calls
:func:`deliver_verdict`; a Redis ``SET NX`` claim (``keys.verify_claim``) makes exactly one
of them verify and post.  The claim is taken with a short TTL that its holder renews while it
works, and made permanent only once the posts are out, so a process that dies half-way leaves
the run to be delivered again within the TTL (never zero times); a run whose verdict is
already recorded is posted without verifying again.

A verification that came due while Pitstop was down is simply overdue in the sorted set: the
first poll after start delivers it, once.

A run verified as ``PENDING`` (a Slurm job still queued at its deadline) is posted once and
stays in ``keys.runs_unverified`` (the engine sets the next due time); later deliveries verify
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
from pipeline.errors import PitstopError, UnknownRun
from pipeline.state import keys
from pipeline.state.events import EventKind
from pipeline.state.runs import RunRecord
from pipeline.verdict import Verdict

log = logging.getLogger(__name__)

CLAIM_TTL = 30.0  #: seconds a claim lives without renewal while its holder verifies and posts
DONE_TTL = 7 * 86400.0  #: seconds a delivered claim is remembered
RETRY_AFTER = 15.0  #: seconds before a verification that failed to run is tried again

# KEYS[1] claim; ARGV[1] holder; ARGV[2] ttl in ms.  Extends the claim only if this holder owns it.
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# KEYS[1] claim; ARGV[1] holder.  Deletes the claim only if this holder still owns it.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


async def deliver_verdict(ctx: Context, run_id: str, *, claim_ttl: float = CLAIM_TTL) -> RunRecord | None:
    """Verify a launched run and post its verdict, unless another process claimed it.

    Claims the run (``SET NX`` on ``keys.verify_claim``), runs ``ctx.restarter.verify`` (not
    again if the record already has a verdict), posts the verdict line in the run's thread,
    updates the run's headline, publishes a VERDICT event and removes the run from
    ``keys.runs_unverified``.

    :param run_id: the run (``r-42``).
    :param claim_ttl: seconds the claim protects an unfinished delivery.
    :returns: the verified run, or None if someone else claimed it, the run is unknown, or
        verification could not run (it is retried after :data:`RETRY_AFTER` s).
    """
    client, prefix = ctx.redis.client, ctx.prefix
    claim = keys.verify_claim(prefix, run_id)
    holder = f"{ctx.instance}:{time.time():.3f}"
    if not await client.set(claim, holder, nx=True, px=max(1, int(claim_ttl * 1000))):
        return None
    renewal = asyncio.get_running_loop().create_task(_renew_claim(ctx, claim, holder, claim_ttl))
    try:
        return await _deliver_claimed(ctx, run_id, claim, holder, claim_ttl)
    finally:
        renewal.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewal


async def _renew_claim(ctx: Context, claim: str, holder: str, ttl: float) -> None:
    """Extend a held claim every ``ttl / 3`` s: a live verifier keeps it, a dead one loses it in ``ttl``."""
    while True:
        await asyncio.sleep(ttl / 3)
        try:
            await ctx.redis.client.eval(_EXTEND, 1, claim, holder, max(1, int(ttl * 1000)))
        except Exception:
            log.warning("could not extend the verification claim %s", claim, exc_info=True)


async def _deliver_claimed(
    ctx: Context, run_id: str, claim: str, holder: str, claim_ttl: float
) -> RunRecord | None:
    client, prefix = ctx.redis.client, ctx.prefix
    try:
        run = await ctx.runs.get(run_id)
    except UnknownRun:
        await client.zrem(keys.runs_unverified(prefix), run_id)
        await _release(ctx, claim, holder)
        return None
    before = run.verdict
    try:
        if run.verdict is None or run.verdict is Verdict.PENDING:
            run = await ctx.restarter.verify(run)
    except asyncio.CancelledError:
        await asyncio.shield(_release(ctx, claim, holder))
        raise
    except Exception as exc:
        text = exc.message if isinstance(exc, PitstopError) else f"{type(exc).__name__}: {exc}"
        log.warning(verdict_not_delivered(run_id, text), exc_info=not isinstance(exc, PitstopError))
        await client.zadd(keys.runs_unverified(prefix), {run_id: time.time() + RETRY_AFTER}, xx=True)
        await _release(ctx, claim, holder)
        return None
    if run.verdict is Verdict.PENDING:
        # still queued (Slurm): the engine re-queued the check; post PENDING once, then only
        # the real verdict, in the same thread
        if before is not Verdict.PENDING:
            await _post(ctx, run)
        await _release(ctx, claim, holder)
        return run
    # verify() takes the run off the unverified set; put it back until the posts are out, so a
    # process that dies while posting leaves it to be delivered again when its claim expires
    await client.zadd(keys.runs_unverified(prefix), {run_id: time.time() + claim_ttl})
    await _post(ctx, run)
    async with client.pipeline(transaction=True) as pipe:
        pipe.set(claim, f"done:{holder}", px=int(DONE_TTL * 1000))
        pipe.zrem(keys.runs_unverified(prefix), run_id)
        await pipe.execute()
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


async def _release(ctx: Context, claim: str, holder: str) -> None:
    await ctx.redis.client.eval(_RELEASE, 1, claim, holder)


async def due_run_ids(ctx: Context, *, now: float | None = None, limit: int = 100) -> list[str]:
    """Ids of launched runs whose verification is due (``ZRANGEBYSCORE -inf now``), oldest first."""
    now = time.time() if now is None else now
    ids = await ctx.redis.client.zrangebyscore(
        keys.runs_unverified(ctx.prefix), "-inf", now, start=0, num=limit
    )
    return [str(i) for i in ids]


async def deliver_due(ctx: Context, *, now: float | None = None) -> list[RunRecord]:
    """Deliver every verification that is due (concurrently); others' claims are skipped.

    :returns: the runs this process delivered.
    """
    ids = await due_run_ids(ctx, now=now)
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
