"""Runs whose owner died: found by any Pitstop process, told as they are on the host.

A run's owner keeps a heartbeat in Redis (:class:`~pipeline.state.runs.RunStore`).  When it dies
the heartbeat lapses and :func:`reconcile` (the scheduler leader on every lease tick, every
process at start) claims the run (``SET NX``, so two processes never both report it), observes
the job through its engine, and records what is true: a run cut off before its launch finishes
``INTERRUPTED`` with its step and what was found; one cut off after its launch gets an
``interrupted`` line and its verification (re)queued.  A dead holder's restart lock expires by
itself (its TTL is the heartbeat's).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from pipeline import verdict
from pipeline.engines.base import Sighting
from pipeline.engines.runner import Runner
from pipeline.errors import IllegalTransition
from pipeline.host.probe import JobProbe
from pipeline.state.jobstate import JobRecords
from pipeline.state.locks import Locks
from pipeline.state.runs import RunRecord, VerifyQueue, identity
from pipeline.verdict import Outcome, Verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Interruption:
    """A run taken over from a dead owner."""

    run: RunRecord  #: as saved after the take-over
    line: str  #: for the run's thread: the verdict line, or ``run.interrupted``
    launched: bool  #: the run had launched: its verification is queued and still to come


async def reconcile(restarter: Runner, *, instance: str) -> list[Interruption]:
    """Take over every open run whose owner is gone; probe each job and record what is true.

    :param instance: this process's id, written in the claim it takes on each run.
    :returns: the runs taken over, oldest first; a run another process claimed, or that changed
        while it was looked at (verified, ended: :class:`~pipeline.errors.IllegalTransition`), is skipped.
    """
    runs, config = restarter.runs, restarter.config
    locks, queue = Locks(runs.client, runs.prefix), VerifyQueue(runs.client, runs.prefix)
    out: list[Interruption] = []
    for run in await runs.unowned():
        name = next((k for k in config.jobs if k.lower() == run.job.lower()), run.job)
        spec = config.jobs.get(name)
        if run.owner is None and not run.launched and await locks.any_held(config, name):
            continue
        # a launched run with no owner was handed over on purpose: make sure the queue has it
        if run.owner is not None or not run.launched:
            if not await runs.claim_orphan(run.id, instance):
                continue  # its owner came back, or another process is taking it over
            try:
                out.append(await _take_over(restarter, run, name))
            except IllegalTransition as exc:  # written since read (verified, ended, owner back)
                log.info("%s: not taken over: %s", run.id, exc.message)
                continue
            finally:
                await runs.unclaim(run.id)
        # read again: a verifier may have decided it (and left the queue) while it was taken over
        if run.launched and (fresh := await runs.find(run.id)) is not None and fresh.finished_at is None:
            due = (run.launched_at or time.time()) + (spec.start_window if spec is not None else 0.0)
            await queue.enqueue(run.id, due, keep=True)
    return out


async def _take_over(restarter: Runner, run: RunRecord, name: str) -> Interruption:
    """Record what is true of ``run`` (of configured job ``name``, if it still is) on its host."""
    spec = restarter.config.jobs.get(name)
    if spec is None:
        seen = Sighting(JobProbe(job=name, error=f"job {name} is no longer configured"), 0)
    else:
        current = await JobRecords(restarter.runs.client, restarter.runs.prefix).current(name)
        seen = (await restarter.sightings([(name, spec, current)]))[name]
    state = "unknown" if seen.probe.error else seen.state
    if run.launched:
        line = verdict.interrupted_after_launch(
            state, seen.probe.count, seen.expected, pid=run.pid, job_id=run.slurm_job
        )
        await restarter.runs.interrupt_after_launch(run, line)
        return Interruption(run, line, True)
    step = run.current_step.value if run.current_step else None
    who = identity(seen.pid or run.old_pid, seen.job_id or run.old_slurm_job)
    found = interrupted_found(step, who, state, seen.probe.count, seen.expected)
    if seen.probe.error:
        found = f"the job's state on its host is unknown ({seen.probe.error})"
    now = time.time()
    for rec in run.steps:
        if rec.ended_at is None or rec.outcome is Outcome.RUNNING:
            rec.ended_at, rec.outcome, rec.detail = now, Outcome.FAILED, "Pitstop stopped during this step"
    line = verdict.interrupted(step, found)
    await restarter.runs.finish(run, Verdict.INTERRUPTED, line, run.evidence or line)
    return Interruption(run, line, False)


def interrupted_found(step: str | None, who: str | None, state: str, count: int, expected: int) -> str:
    """What the host or cluster showed when a run cut off before its launch was taken over.

    :param who: the recorded run, ``pid 4242`` or ``Slurm job 41`` (None: no record); in ``step``
        ``stop`` (or before), the run being stopped.
    :param state: ``alive``, ``pending``, ``gone``, ``stale`` or ``none`` (no record).
    """
    procs = f"{count}/{expected} processes"
    if who is None or state == "none":
        return f"no recorded run is up, {procs} match the job"
    run = "the old run" if step in (None, "preflight", "stop") else "the recorded run"
    how = {"alive": "is still alive", "pending": "is still pending", "stale": "is gone (its pid was reused)"}
    return f"{run} ({who}) {how.get(state, 'is gone')}, {procs}"
