"""Restart, start and stop as people see them: lock, run record, live message, background sequence.

:func:`begin_sequence` is the fast part before the requester's answer (take the job's lock or
raise :class:`~handlers.runs.lock.InFlight`, create the run); :func:`run_sequence` the slow part, in a
background task: the Restarter's steps update the run's live message at the surface's own pace
(:class:`~handlers.latest.Latest`), the lock is released as soon as the launch step ends, and the
launch summary (or the verdict of a run that ended before verification) goes in its thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable

from handlers.context import Context
from handlers.grammar.commands import Command
from handlers.latest import Latest
from handlers.reply import Reply, Status
from handlers.runs.lock import JobLock
from handlers.runs.verdicts import publish_verdict
from handlers.runs.view import run_reply, thread_key, verdict_reply
from pipeline.errors import ExitCode, PitstopError, internal_error, new_incident_id
from pipeline.state.approvals import ApprovalRequest
from pipeline.state.jobstate import scope_of
from pipeline.state.runs import RunRecord, StepRecord
from pipeline.verdict import Outcome, Step, Verdict

log = logging.getLogger(__name__)

CANCEL_TTL = 3600  #: seconds a cancel request is kept


async def _safe(what: str, aw: Awaitable[object]) -> None:
    """Await a team-visible post; a surface failure is logged, never allowed to stop a sequence."""
    try:
        await aw
    except asyncio.CancelledError:
        raise
    except Exception:
        log.warning("could not post %s", what, exc_info=True)


async def begin_sequence(
    ctx: Context,
    command: Command,
    user: str,
    channel: str | None,
    *,
    lock_ttl: float,
    approval: ApprovalRequest | None = None,
    break_glass: str | None = None,
) -> tuple[RunRecord, JobLock, str | None]:
    """Take the lock and create the run (no remote command, no surface waited for).

    :param command: a validated restart/start/stop command.
    :param channel: where the request came from (used when the job has no channel).
    :param lock_ttl: seconds the lock lives without renewal.
    :param approval: the approved request (the two-person rule): the run takes its id, approver
        and patch hashes (re-checked at pre-flight).
    :param break_glass: an admin's reason for acting without approval, marked on the run.
    :returns: the new run, the held lock (renewing), and the channel the run is posted in.
    :raises InFlight: if another restart of the job (or on its host) holds the lock.
    """
    assert command.job is not None
    job = command.job
    lock = ctx.redis.open_store(JobLock, scope_of(ctx.config, job), ttl=lock_ttl)
    await lock.acquire(job=job, action=command.verb, user=user)
    try:
        lock.start_renewal()
        run = await ctx.runs.create(
            job,
            user,
            action=command.verb,
            patches=list(command.patches),
            fresh_cache=command.fresh_cache,
            run_id=approval.id if approval is not None else None,
            approved_by=approval.decided_by if approval is not None else None,
            approved_patches=approval.hashes if approval is not None else None,
            break_glass=break_glass,
        )
        await lock.update(run_id=run.id)
    except BaseException:
        await asyncio.shield(lock.release())
        raise
    return run, lock, ctx.config.channel_for(job) or channel


async def run_sequence(
    ctx: Context, run: RunRecord, command: Command, lock: JobLock, channel: str | None
) -> RunRecord:
    """The background part of a restart/start/stop; returns the run as the sequence left it."""
    config = ctx.config
    key = thread_key(run.id)

    def notes() -> tuple[str, ...]:
        return (run_lock_lost(run.job),) if lock.lost else ()

    async def show(current: RunRecord) -> None:
        await ctx.outbox.announce(key, run_reply(current, config, notes=notes()), channel)

    async def hold(rec: StepRecord) -> None:
        await lock.update(step=rec.step.value)
        if rec.step is Step.LAUNCH and rec.outcome is not Outcome.RUNNING:
            await lock.release()  # the launch ended: verification must not hold the lock

    message = Latest(show, f"run {run.id}")  # the live message, at the surface's pace

    def on_step(current: RunRecord, rec: StepRecord) -> Awaitable[None] | None:
        if current.id != run.id:
            return None
        message.put(current)  # queued: the sequence does not wait for the surface
        return hold(rec)  # the lock is run state: kept in step with the sequence

    error: str | None = None
    final = run
    message.put(run)
    unsubscribe = ctx.restarter.subscribe(on_step)
    try:
        if command.verb == "restart":
            final = await ctx.restarter.restart(
                run, add=command.patches, remove=command.without, fresh_cache=command.fresh_cache
            )
        elif command.verb == "start":
            final = await ctx.restarter.start(run)
        else:
            final = await ctx.restarter.stop(run)
    except PitstopError as exc:
        error = exc.message
    except Exception:
        incident = new_incident_id()
        log.exception("incident %s: %s of %s (%s)", incident, command.verb, run.job, run.id)
        error = internal_error(incident)
    finally:
        unsubscribe()
        await asyncio.shield(lock.release())
    try:
        await ctx.runs.clear_cancel(run.id)
    except Exception:
        log.debug("could not clear the cancel request of %s", run.id, exc_info=True)
    if error is not None:
        final = await _record_failure(ctx, run, error)
    message.put(final)
    if final.verdict is not None:  # ended before verification: published now, not once Slack took it
        await _safe("verdict event", publish_verdict(ctx, final))
    await message.flush()  # the headline exists before anything is posted in its thread
    if final.verdict is not None:  # nobody else will post its verdict
        await _safe(f"verdict of {run.id}", ctx.outbox.thread(key, verdict_reply(final), channel))
    elif final.launched:
        window = config.jobs[final.job].start_window if final.job in config.jobs else 0.0
        title = launch_summary(final.id, final.job, final.launched_as, window)
        summary = Reply(title=title, status=Status.INFO, lines=notes(), thread_key=key, run_id=final.id)
        await _safe(f"launch summary of {run.id}", ctx.outbox.thread(key, summary, channel))
    elif command.verb == "stop":
        stop = final.step(Step.STOP)
        lines = (stop.detail,) if stop is not None and stop.detail else ()
        title = stop_summary(final.id, final.job)
        summary = Reply(title=title, status=Status.OK, lines=lines, thread_key=key, run_id=final.id)
        await _safe(f"stop summary of {run.id}", ctx.outbox.thread(key, summary, channel))
    return final


async def _record_failure(ctx: Context, run: RunRecord, error: str) -> RunRecord:
    """A sequence that raised: record the truth on the run (unless it already launched)."""
    try:
        final = await ctx.runs.get(run.id)
    except PitstopError:
        final = run
    if final.verdict is None and not final.launched:
        for rec in final.steps:
            if rec.outcome is Outcome.RUNNING:
                rec.outcome, rec.ended_at, rec.detail = Outcome.FAILED, time.time(), rec.detail or error
        try:
            line = f"{final.id}: {final.job} failed - {error}"
            await ctx.runs.finish(final, Verdict.INTERRUPTED, line, error)
        except Exception:
            log.warning("could not record the failure of %s", run.id, exc_info=True)
    return final


async def cancel_command(ctx: Context, job: str, user: str) -> Reply:
    """``cancel JOB``: ask the job's in-flight sequence to stop at its next step boundary.

    :returns: a reply naming the run, or saying there is nothing to cancel (exit code 1).
    """
    holder = await ctx.locks.holder(scope_of(ctx.config, job))
    run_id = holder.run_id if holder is not None and holder.job == job and holder.run_id else None
    if run_id is None:
        for run in await ctx.runs.recent(job, 5):
            if run.finished_at is None and run.verdict is None and run.step(Step.LAUNCH) is None:
                run_id = run.id
                break
    if run_id is None:
        return Reply(title=cancel_nothing(job), status=Status.WARNING, exit_code=ExitCode.FAILED)
    await ctx.runs.request_cancel(run_id, user, CANCEL_TTL)
    return Reply(
        title=cancel_requested(run_id, job),
        status=Status.INFO,
        run_id=run_id,
        thread_key=thread_key(run_id),
    )


# --- text ---------------------------------------------------------------------------------------


def run_lock_lost(job: str) -> str:
    """The sequence lost its lock (expired or forced) while it ran."""
    return (
        f"warning: the lock on {job} was lost while this run held it (expired or forced by unlock) - "
        "another restart may have started; what follows is still this run's true outcome"
    )


def cancel_requested(run_id: str, job: str) -> str:
    """``cancel JOB``: the run stops at its next step boundary."""
    return f"cancel requested for run {run_id} of {job} - it stops at the next step boundary"


def cancel_nothing(job: str) -> str:
    """``cancel JOB`` with nothing in flight."""
    return f"no restart of {job} in flight - nothing to cancel"


def launch_summary(run_id: str, job: str, launched_as: str | None, window: float) -> str:
    """Posted in the run's thread when the launch step ended well.

    :param launched_as: the run's identity (:attr:`~pipeline.state.runs.RunRecord.launched_as`).
    :param window: seconds until the verdict (the job's ``start_window``).
    """
    proc = f" as {launched_as}" if launched_as is not None else ""
    return f"{run_id}: {job} launched{proc} - the verdict follows in about {window:g} s"


def stop_summary(run_id: str, job: str) -> str:
    """Posted in the run's thread when a stop finished."""
    return f"{run_id}: {job} stopped"
