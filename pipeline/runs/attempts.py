"""What the run service knows of a job's attempts (each launch): the throughput follow-up after a
restart, and the no-progress rule that stops automatic restarts.

**The follow-up**, ``[jobs.NAME.watch] recovery_window`` s after a restart's RUNNING verdict, when
its previous attempt's throughput is known.  The scheduler leader makes the due ones
(:meth:`Attempts.followups_due`), each under a lease
(:meth:`~pipeline.state.runs.RunStore.claim_recovery`): at least once, exactly once when nothing
dies.  It compares the median throughput since the restart with the previous attempt's
(:class:`~pipeline.state.runs.Reach`), records the line on the run and tells it (FOLLOWUP):
``throughput back: 5,905 tokens/s, 99 % of before`` or, under ``slow_after_restart`` of before,
``dflash is slower since r-7: …`` (``slow``: the surfaces raise an alert).  A run the job has moved
on from (another restart, a stop) gets no follow-up.

**No-progress loops**: attempts that keep dying where they resumed stop the automatic restarts.
Before an automatic restart fires, :meth:`Attempts.no_progress_refusal` records how far the
attempt that just died got (its :class:`~pipeline.state.runs.Reach`, read once from its log) and
refuses when the last ``[jobs.NAME.watch] no_progress_after`` attempts in a row died before
advancing ``min_progress`` steps past where they resumed
(:func:`pipeline.observe.attempts.no_progress_streak`).  A person's restart is never blocked, only
warned (:meth:`Attempts.no_progress_warning`).
"""

from __future__ import annotations

import logging
import re
import time

from pipeline.errors import PitstopError
from pipeline.observe.attempts import (
    attempt_start,
    median_throughput,
    no_progress_streak,
    read_attempt,
    record_dead,
    recovery,
)
from pipeline.runs.base import RunEvent, RunServiceBase, Told
from pipeline.state.runs import RunRecord

log = logging.getLogger(__name__)


class Attempts(RunServiceBase):
    """The throughput follow-up and the no-progress rule (part of :class:`~pipeline.runs.service.RunService`)."""

    async def followups_due(self, *, now: float | None = None) -> list[RunEvent]:
        """Make, record and tell every throughput follow-up that is due, each under a claim only one
        process holds.

        A follow-up whose reading fails (the host) is dropped, as one with nothing to compare is;
        any other error (a listener's) leaves its claim to lapse, and it is made again after the lease.

        :param now: unix s (default: the clock).
        :returns: the FOLLOWUP events told.
        """
        now = time.time() if now is None else now
        began = time.time()
        told: list[RunEvent] = []
        for run_id in await self.runs.due_recoveries(now):
            # the pass's clock moves on while earlier posts wait for Slack's pace: a lease taken
            # minutes into the pass must not start already expired
            claim = await self.runs.claim_recovery(run_id, now=now + (time.time() - began))
            if claim is None:
                continue  # another process holds it
            try:
                event = await self._followup(run_id)
            except PitstopError as exc:
                log.warning("throughput follow-up of %s not made: %s", run_id, exc.message)
                event = None
            if event is not None:
                await self.runs.amend(run_id, recovery=event.line or "")
                await self.tell(event)
                told.append(event)
            if not await self.runs.recovery_done(run_id, claim):
                log.warning(
                    "throughput follow-up of %s: its claim lapsed; another process may post it too", run_id
                )
        return told

    async def _followup(self, run_id: str) -> RunEvent | None:
        """The follow-up of ``run_id``: throughput since its launch against its previous attempt's;
        None when there is nothing to compare.  :raises PitstopError: if the job's log cannot be read."""
        if (run := await self.runs.find(run_id)) is None:
            return None
        job = self.config.jobs.get(run.job)
        start = attempt_start(run, job) if job is not None else None
        if job is None or run.previous_run is None or start is None:
            return None
        if (await self.jobs.read(run.job)).run_id != run.id:
            return None  # restarted or stopped since: this run's throughput is no longer the job's
        if (previous := await self.runs.find(run.previous_run)) is None:
            return None
        before = previous.reach
        lines = await read_attempt(self.restarter.read_chunk, run.job, job, start)
        found = recovery(
            median_throughput(lines), before.tokens_per_s if before else None, job.watch.slow_after_restart
        )
        if found is None:
            return None
        pct = f"{found.ratio * 100:.0f} %"
        # dflash is slower since r-7: 2,516 tokens/s, 43 % of the 5,905 before (patches now: topk)
        if found.slow:
            patches = ", ".join(run.patches) if run.patches else "none"
            line = (
                f"{run.job} is slower since {run.id}: {found.now:,.0f} tokens/s, {pct} of the "
                f"{found.before:,.0f} before (patches now: {patches})"
            )
        else:
            line = f"throughput back: {found.now:,.0f} tokens/s, {pct} of before"
        return RunEvent(Told.FOLLOWUP, run, line=line, slow=found.slow)

    async def stuck_attempts(self, name: str) -> list[RunRecord]:
        """The job's newest attempts that in a row made no progress (newest first), if there are at
        least ``no_progress_after`` of them; else an empty list."""
        watch = self.config.jobs[name].watch
        attempts = await self.runs.attempts(name, watch.no_progress_after)
        streak = no_progress_streak(attempts, watch.min_progress)
        return streak if len(streak) >= watch.no_progress_after else []

    async def no_progress_refusal(self, name: str, ended: str | None) -> str | None:
        """Why automatic restarts must stop (the give-up text), or None when they may go on.

        Records first, once, how far the job's current (dead) attempt got and how it ended (unless
        the job has no recorded run or its log is unreadable).

        :param ended: how it ended, as :func:`~pipeline.observe.attempts.crash_words` says (None: unknown).
        """
        if (run_id := (await self.jobs.read(name)).run_id) and (run := await self.runs.find(run_id)):
            try:
                await record_dead(
                    self.restarter.read_chunk, self.runs, name, self.config.jobs[name], run, ended=ended
                )
            except PitstopError as exc:
                log.info("%s: how far %s got is unknown: %s", name, run_id, exc.message)
        if not (stuck := await self.stuck_attempts(name)):
            return None
        return auto_restart_no_progress(name, stuck, self.config.jobs[name].watch.min_progress)

    async def no_progress_warning(self, name: str) -> str | None:
        """The warning a person's restart carries when the last attempts made no progress (never a block)."""
        try:
            if not (stuck := await self.stuck_attempts(name)):
                return None
        except PitstopError:
            return None
        return (
            f"⚠ the last {len(stuck)} attempts of {name} made no progress ({_where(stuck)}); "
            "restarting as asked - unless something changed, this one will die the same way"
        )


# --- text ---------------------------------------------------------------------------------------


def _where(stuck: list[RunRecord]) -> str:
    """``every attempt died at step 1,210: CUDA out of memory on rank 6`` (or each attempt's step)."""
    steps = [r.reach.step if r.reach and r.reach.step is not None else r.resumed_at or 0 for r in stuck]
    causes = {r.reach.ended for r in stuck if r.reach is not None}
    cause = next(iter(causes)) if len(causes) == 1 else _common(causes)
    if len(set(steps)) == 1:
        text = f"every attempt died at step {steps[0]:,}"
    else:
        text = "the attempts died at steps " + ", ".join(f"{s:,}" for s in reversed(steps))
    return f"{text}: {cause}" if cause else text


_RANK_CODE = re.compile(r" on rank (\d+)| \(exit code -?\d+\)")


def _common(causes: set[str | None]) -> str | None:
    """The one cause of attempts told apart only by the rank that failed first or the exit code
    (``NCCL timeout on ranks 1, 2``: a peer's watchdog may fire first), else None."""
    if None in causes or len(whats := {_RANK_CODE.sub("", c) for c in causes if c}) != 1:
        return None
    ranks = sorted({int(r) for c in causes if c for r in _RANK_CODE.findall(c) if r})
    where = f" on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}" if ranks else ""
    return next(iter(whats)) + where


def auto_restart_no_progress(job: str, stuck: list[RunRecord], min_progress: int) -> str:
    """The give-up alert when the last attempts died without progress."""
    ids = ", ".join(r.id for r in reversed(stuck))
    return (
        f"{job}: automatic restarts stopped - the last {len(stuck)} attempts ({ids}) died before advancing "
        f"{min_progress} step{'' if min_progress == 1 else 's'} past where they resumed; {_where(stuck)}. "
        "Another restart will die the same way: fix the cause, then restart by hand"
    )
