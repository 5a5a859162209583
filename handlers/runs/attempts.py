"""``history JOB --attempts`` (:func:`attempts_command`): each attempt of a job, how far it got and
how it ended (the no-progress rule that reads them is :mod:`pipeline.runs.attempts`)."""

from __future__ import annotations

from handlers.context import Context
from handlers.reply import Reply, Table, refused
from handlers.text import ATTEMPTS_NEED_JOB
from pipeline import fmt
from pipeline.state.runs import RunRecord


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
    live = (await ctx.service.jobs.read(job)).run_id
    title = f"history of {job}: last {len(attempts)} attempt{'s' if len(attempts) != 1 else ''}"
    if not attempts:
        return Reply(title=title, lines=(f"{job} has not been launched by Pitstop yet",))
    rows = attempt_rows(attempts, ctx.config.scheduler.timezone, live=live)
    return Reply(title=title, tables=(Table(ATTEMPT_HEADERS, rows),))


# --- text ---------------------------------------------------------------------------------------

NA = fmt.UNKNOWN
#: the columns of ``history JOB --attempts``
ATTEMPT_HEADERS = ("run", "started", "resumed at", "reached", "steps/s", "ended", "steps lost")
