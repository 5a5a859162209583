"""No-progress loops: attempts that keep dying where they resumed stop the automatic restarts.

Before an automatic restart fires, :func:`no_progress_refusal` records how far the attempt that
just died got (its :class:`~pipeline.state.runs.Reach`, read once from its log) and refuses when
the last ``[jobs.NAME.watch] no_progress_after`` attempts in a row died before advancing
``min_progress`` steps past where they resumed
(:func:`pipeline.observe.attempts.no_progress_streak`).  A person's restart is never blocked, only
warned (:func:`no_progress_warning`).  ``history JOB --attempts`` is :func:`attempts_command`.
"""

from __future__ import annotations

import logging

from handlers.context import Context
from handlers.reply import Reply, Table, refused
from handlers.text import ATTEMPTS_NEED_JOB
from handlers.watch.crashcheck import CrashCheck
from pipeline import fmt
from pipeline.errors import PitstopError, UnknownRun
from pipeline.observe.attempts import crash_words, no_progress_streak, record_dead
from pipeline.state.runs import RunRecord

log = logging.getLogger(__name__)


async def record_dead_attempt(ctx: Context, name: str, check: CrashCheck | None) -> RunRecord | None:
    """Record how far the job's current (dead) attempt got and how it ended, once.

    :param check: its classified crash, if any (how it ended).
    :returns: the attempt as saved, or None when the job has no recorded run or its log is unreadable.
    """
    run_id = (await ctx.jobs.read(name)).run_id
    if not run_id:
        return None
    try:
        run = await ctx.runs.get(run_id)
    except UnknownRun:
        return None
    ended = crash_words(check.crash) if check is not None else None
    try:
        return await record_dead(
            ctx.restarter.read_chunk, ctx.runs, name, ctx.config.jobs[name], run, ended=ended
        )
    except PitstopError as exc:
        log.info("%s: how far %s got is unknown: %s", name, run.id, exc.message)
        return None


async def stuck_attempts(ctx: Context, name: str) -> list[RunRecord]:
    """The job's newest attempts that in a row made no progress (newest first), if there are at
    least ``no_progress_after`` of them; else an empty list."""
    watch = ctx.config.jobs[name].watch
    attempts = await ctx.runs.attempts(name, watch.no_progress_after)
    streak = no_progress_streak(attempts, watch.min_progress)
    return streak if len(streak) >= watch.no_progress_after else []


async def no_progress_refusal(ctx: Context, name: str, check: CrashCheck | None) -> str | None:
    """Why automatic restarts must stop (the give-up text), or None when they may go on; records
    the dead attempt first (:func:`record_dead_attempt`)."""
    await record_dead_attempt(ctx, name, check)
    stuck = await stuck_attempts(ctx, name)
    return auto_restart_no_progress(name, stuck, ctx.config.jobs[name].watch.min_progress) if stuck else None


async def no_progress_warning(ctx: Context, name: str) -> str | None:
    """The warning a person's restart carries when the last attempts made no progress (never a block)."""
    try:
        stuck = await stuck_attempts(ctx, name)
    except PitstopError:
        return None
    if not stuck:
        return None
    return (
        f"⚠ the last {len(stuck)} attempts of {name} made no progress ({_where(stuck)}); "
        "restarting as asked - unless something changed, this one will die the same way"
    )


# --- history JOB --attempts ---------------------------------------------------------------------


def attempt_rows(
    attempts: list[RunRecord], timezone: str, *, live: str | None = None
) -> tuple[tuple[str, ...], ...]:
    """One row per attempt, newest first: run, started, resumed at, reached, steps/s, how it ended,
    steps lost (what the restart after it lost of its work: the next attempt's ``lost``).

    :param attempts: the job's attempts, newest first.
    :param live: the id of the attempt running now (``running`` in its "ended" column).
    """
    rows = []
    for i, run in enumerate(attempts):
        reach = run.reach
        newer = attempts[i - 1] if i > 0 else None
        lost = newer.lost if newer is not None and newer.previous_run == run.id else None
        ended = (
            "running" if run.id == live and reach is None else (reach.ended if reach and reach.ended else NA)
        )
        rows.append(
            (
                run.id,
                fmt.clock(run.launched_at, timezone) if run.launched_at is not None else NA,
                fmt.number(run.resumed_at, "{:,}"),
                fmt.number(reach.step if reach else None, "{:,}"),
                fmt.number(reach.steps_per_s if reach else None, "{:.2f}"),
                ended,
                fmt.number(lost, "{:,}"),
            )
        )
    return tuple(rows)


async def attempts_command(ctx: Context, job: str | None, count: int) -> Reply:
    """``history JOB --attempts``: the job's last ``count`` attempts, one row each (:func:`attempt_rows`).

    :param job: a configured job (the verb needs one with ``--attempts``).
    :returns: the table, or an ERROR reply (usage) without a job.
    """
    if job is None:
        return refused(ATTEMPTS_NEED_JOB)
    attempts = await ctx.runs.attempts(job, count)
    live = (await ctx.jobs.read(job)).run_id
    title = f"history of {job}: last {len(attempts)} attempt{'s' if len(attempts) != 1 else ''}"
    if not attempts:
        return Reply(title=title, lines=(f"{job} has not been launched by Pitstop yet",))
    rows = attempt_rows(attempts, ctx.config.scheduler.timezone, live=live)
    return Reply(title=title, tables=(Table(ATTEMPT_HEADERS, rows),))


# --- text ---------------------------------------------------------------------------------------

NA = fmt.UNKNOWN
#: the columns of ``history JOB --attempts``
ATTEMPT_HEADERS = ("run", "started", "resumed at", "reached", "steps/s", "ended", "steps lost")


def _where(stuck: list[RunRecord]) -> str:
    """``every attempt died at step 1,210: CUDA out of memory on rank 6`` (or each attempt's step)."""
    steps = [r.reach.step if r.reach and r.reach.step is not None else r.resumed_at or 0 for r in stuck]
    causes = {r.reach.ended for r in stuck if r.reach is not None}
    cause = next(iter(causes)) if len(causes) == 1 else None
    if len(set(steps)) == 1:
        text = f"every attempt died at step {steps[0]:,}"
    else:
        text = "the attempts died at steps " + ", ".join(f"{s:,}" for s in reversed(steps))
    return f"{text}: {cause}" if cause else text


def auto_restart_no_progress(job: str, stuck: list[RunRecord], min_progress: int) -> str:
    """The give-up alert when the last attempts died without progress."""
    ids = ", ".join(r.id for r in reversed(stuck))
    return (
        f"{job}: automatic restarts stopped - the last {len(stuck)} attempts ({ids}) died before advancing "
        f"{min_progress} step{'' if min_progress == 1 else 's'} past where they resumed; {_where(stuck)}. "
        "Another restart will die the same way: fix the cause, then restart by hand"
    )
