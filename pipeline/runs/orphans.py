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
from pipeline.engines.base import RestartService, Sighting
from pipeline.errors import IllegalTransition
from pipeline.host.probe import JobProbe
from pipeline.state.jobstate import JobStore
from pipeline.state.locks import Locks
from pipeline.state.runs import RunRecord, identity
from pipeline.state.verifications import VerifyQueue
from pipeline.verdict import Outcome, Verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Interruption:
    """A run taken over from a dead owner."""

    run: RunRecord  #: as saved after the take-over
    line: str  #: for the run's thread: the verdict line, or ``run.interrupted``
    launched: bool  #: the run had launched: its verification is queued and still to come


async def reconcile(restarter: RestartService, *, instance: str) -> list[Interruption]:
    """Take over every open run whose owner is gone; probe each job and record what is true.

    :param instance: this process's id, written in the claim it takes on each run.
    :returns: the runs taken over, oldest first; a run another process claimed, or that changed
        while it was looked at (verified, ended: :class:`~pipeline.errors.IllegalTransition`), is skipped.
    """
    runs = restarter.runs
    out: list[Interruption] = []
    for run in await runs.unowned():
        if run.owner is None:
            if run.launched:  # handed over on purpose: make sure the queue has it
                await _queue_verification(restarter, run)
                continue
            if await _lock_held(restarter, run.job):
                continue
        if not await runs.claim_orphan(run.id, instance):
            continue  # its owner came back, or another process is taking it over
        try:
            out.append(await _take_over(restarter, run))
        except IllegalTransition as exc:  # written since read (verified, ended, owner back): theirs to tell
            log.info("%s: not taken over: %s", run.id, exc.message)
        finally:
            await runs.unclaim(run.id)
    return out


async def _take_over(restarter: RestartService, run: RunRecord) -> Interruption:
    name = _job_key(restarter, run.job)
    spec = restarter.config.jobs.get(name)
    if spec is None:
        seen = Sighting(JobProbe(job=name, error=f"job {name} is no longer configured"), 0)
    else:
        jobs = JobStore(restarter.runs.client, restarter.runs.prefix, restarter.config)
        current = dict((await jobs.read(name)).current)
        seen = (await restarter.sightings([(name, spec, current)]))[name]
    state = "unknown" if seen.probe.error else seen.state
    pid = run.pid if run.launched else seen.pid or run.old_pid
    job_id = run.slurm_job if run.launched else seen.job_id or run.old_slurm_job
    expected = seen.expected
    now = time.time()
    if run.launched:
        line = verdict.interrupted_after_launch(state, seen.probe.count, expected, pid=pid, job_id=job_id)
        await restarter.runs.interrupt_after_launch(run, line)
        await _queue_verification(restarter, run)
        return Interruption(run, line, True)
    step = run.current_step
    who = identity(pid, job_id)
    found = interrupted_found(step.value if step else None, who, state, seen.probe.count, expected)
    if seen.probe.error:
        found = f"the job's state on its host is unknown ({seen.probe.error})"
    for rec in run.steps:
        if rec.ended_at is None or rec.outcome is Outcome.RUNNING:
            rec.ended_at, rec.outcome, rec.detail = now, Outcome.FAILED, "Pitstop stopped during this step"
    line = verdict.interrupted(step.value if step else None, found)
    await restarter.runs.finish(run, Verdict.INTERRUPTED, line, run.evidence or line)
    return Interruption(run, line, False)


async def _queue_verification(restarter: RestartService, run: RunRecord) -> None:
    spec = restarter.config.jobs.get(_job_key(restarter, run.job))
    window = spec.start_window if spec is not None else 0.0
    due = (run.launched_at or time.time()) + window
    await VerifyQueue(restarter.runs.client, restarter.runs.prefix).enqueue(run.id, due, keep=True)


async def _lock_held(restarter: RestartService, job: str) -> bool:
    locks = Locks(restarter.runs.client, restarter.runs.prefix)
    return await locks.any_held(restarter.config, _job_key(restarter, job))


def _job_key(restarter: RestartService, job: str) -> str:
    try:
        return restarter.config.job_name(job)
    except KeyError:
        return job


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
