"""No-progress loops: attempts that keep dying where they resumed stop the automatic restarts.

Before an automatic restart fires, :meth:`Policy.no_progress_refusal` records how far the attempt
that just died got (its :class:`~pipeline.state.runs.Reach`, read once from its log) and refuses
when the last ``[jobs.NAME.watch] no_progress_after`` attempts in a row died before advancing
``min_progress`` steps past where they resumed
(:func:`pipeline.observe.attempts.no_progress_streak`).  A person's restart is never blocked, only
warned (:meth:`Policy.no_progress_warning`).
"""

from __future__ import annotations

import logging

from pipeline.errors import PitstopError, UnknownRun
from pipeline.observe.attempts import no_progress_streak, record_dead
from pipeline.runs.base import RunServiceBase
from pipeline.state.runs import RunRecord

log = logging.getLogger(__name__)


class Policy(RunServiceBase):
    """The no-progress rule (part of :class:`~pipeline.runs.service.RunService`)."""

    async def record_dead_attempt(self, name: str, ended: str | None) -> RunRecord | None:
        """Record how far the job's current (dead) attempt got and how it ended, once.

        :param ended: how it ended, as :func:`~pipeline.observe.attempts.crash_words` says (None: unknown).
        :returns: the attempt as saved, or None when the job has no recorded run or its log is unreadable.
        """
        run_id = (await self.jobs.read(name)).run_id
        if not run_id:
            return None
        try:
            run = await self.runs.get(run_id)
        except UnknownRun:
            return None
        try:
            return await record_dead(self.ssh, self.runs, name, self.config.jobs[name], run, ended=ended)
        except PitstopError as exc:
            log.info("%s: how far %s got is unknown: %s", name, run.id, exc.message)
            return None

    async def stuck_attempts(self, name: str) -> list[RunRecord]:
        """The job's newest attempts that in a row made no progress (newest first), if there are at
        least ``no_progress_after`` of them; else an empty list."""
        watch = self.config.jobs[name].watch
        attempts = await self.runs.attempts(name, watch.no_progress_after)
        streak = no_progress_streak(attempts, watch.min_progress)
        return streak if len(streak) >= watch.no_progress_after else []

    async def no_progress_refusal(self, name: str, ended: str | None) -> str | None:
        """Why automatic restarts must stop (the give-up text), or None when they may go on; records
        the dead attempt first (:meth:`record_dead_attempt`, ``ended`` as there)."""
        await self.record_dead_attempt(name, ended)
        stuck = await self.stuck_attempts(name)
        return (
            auto_restart_no_progress(name, stuck, self.config.jobs[name].watch.min_progress)
            if stuck
            else None
        )

    async def no_progress_warning(self, name: str) -> str | None:
        """The warning a person's restart carries when the last attempts made no progress (never a block)."""
        try:
            stuck = await self.stuck_attempts(name)
        except PitstopError:
            return None
        if not stuck:
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
