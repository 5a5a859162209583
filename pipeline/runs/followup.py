"""Throughput back (or not): the follow-up ``[jobs.NAME.watch] recovery_window`` s after a
restart's RUNNING verdict, when its previous attempt's throughput is known.

The scheduler leader makes the due ones (:meth:`FollowUps.followups_due`), each under a lease
(:meth:`~pipeline.state.runs.RunStore.claim_recovery`): at least once, exactly once when nothing
dies.  It compares the median throughput since the restart with the previous attempt's
(:class:`~pipeline.state.runs.Reach`), records the line on the run and tells it (FOLLOWUP):
``throughput back: 5,905 tokens/s, 99 % of before`` or, under ``slow_after_restart`` of before,
``dflash is slower since r-7: …`` (``slow``: the surfaces raise an alert).  A run the job has moved
on from (another restart, a stop) gets no follow-up.
"""

from __future__ import annotations

import logging
import time

from pipeline.errors import PitstopError, UnknownRun
from pipeline.observe.attempts import attempt_start, median_throughput, read_attempt, recovery
from pipeline.runs.base import RunEvent, RunServiceBase, Told

log = logging.getLogger(__name__)


class FollowUps(RunServiceBase):
    """The throughput follow-up (part of :class:`~pipeline.runs.service.RunService`)."""

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
                await self.runs.record_recovery(run_id, event.line or "")
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
        try:
            run = await self.runs.get(run_id)
        except UnknownRun:
            return None
        job = self.config.jobs.get(run.job)
        start = attempt_start(run, job) if job is not None else None
        if job is None or run.previous_run is None or start is None:
            return None
        if (await self.jobs.read(run.job)).run_id != run.id:
            return None  # restarted or stopped since: this run's throughput is no longer the job's
        try:
            before = (await self.runs.get(run.previous_run)).reach
        except UnknownRun:
            return None
        lines = await read_attempt(self.ssh, run.job, job, start)
        found = recovery(
            median_throughput(lines), before.tokens_per_s if before else None, job.watch.slow_after_restart
        )
        if found is None:
            return None
        pct = f"{found.ratio * 100:.0f} %"
        if (
            found.slow
        ):  # dflash is slower since r-7: 2,516 tokens/s, 43 % of the 5,905 before (patches now: topk)
            patches = ", ".join(run.patches) if run.patches else "none"
            line = (
                f"{run.job} is slower since {run.id}: {found.now:,.0f} tokens/s, {pct} of the "
                f"{found.before:,.0f} before (patches now: {patches})"
            )
        else:
            line = f"throughput back: {found.now:,.0f} tokens/s, {pct} of before"
        return RunEvent(Told.FOLLOWUP, run, line=line, slow=found.slow)
