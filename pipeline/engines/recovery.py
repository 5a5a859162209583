"""Runs whose owner died: found by any Pitstop process, told as they are on the host.

A run is owned by the process executing it, which keeps a heartbeat in Redis
(:class:`~pipeline.state.runs.RunStore`).  When that process dies (SIGKILL, OOM, a lost VM), the
heartbeat lapses within its TTL and :func:`reconcile` — run by the scheduler leader on every
lease tick and by every CLI, console and serve process when it starts — takes the run over:

- it claims the run first (``SET NX`` on the lapsed heartbeat key), so two processes never
  both report the same run;
- it **observes the job's real state** through its engine (one sighting, as watch and status
  see it: a Slurm job's state from the cluster and its tasks on every node), so the record says
  what is true, not only where the sequence stopped;
- a run cut off before its launch is finished as ``INTERRUPTED`` with the step it was in and
  what the probe found: ``INTERRUPTED during stop: the old run (pid 4242) is still alive, 8/8
  processes``;
- a run cut off after its launch keeps its verdict open: the line ``INTERRUPTED after launch:
  pid 5151 running 8/8 (unverified)`` (or ``job 42 pending``, ``job 42 gone, 0/8``) is recorded
  in ``interrupted`` and the run is (re)queued in the verification queue, so its verification
  still runs, once, from the recorded launch identity, and records what the host or cluster says.

It releases nothing it does not own: a dead holder's restart lock expires by itself (its TTL
is the heartbeat's).  Runs without an owner that never launched (written by a store without
one) are taken only when no restart lock of their job is held, as before heartbeats existed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pipeline import verdict
from pipeline.engines.base import RestartService, Sighting
from pipeline.host.probe import JobProbe
from pipeline.state.jobstate import JobStore
from pipeline.state.locks import Locks
from pipeline.state.runs import RunRecord, identity
from pipeline.state.verifications import VerifyQueue
from pipeline.verdict import Outcome, Verdict


@dataclass(frozen=True)
class Interruption:
    """A run taken over from a dead owner.

    :ivar run: the run as saved after the take-over.
    :ivar line: the line for the run's thread (the verdict line, or ``run.interrupted``).
    :ivar launched: the run had launched: its verification is queued and still to come.
    """

    run: RunRecord
    line: str
    launched: bool


async def reconcile(restarter: RestartService, *, instance: str) -> list[Interruption]:
    """Take over every open run whose owner is gone; probe each job and record what is true.

    :param restarter: the process's Restarter (config, SSH pool and run store).
    :param instance: this process's id, written in the claim it takes on each run.
    :returns: the runs taken over, oldest first; a run another process claimed is skipped.
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
            fresh = await runs.get(run.id)
            if fresh.finished_at is not None:
                continue
            out.append(await _take_over(restarter, fresh))
        finally:
            await runs.unclaim(run.id)
    return out


async def _take_over(restarter: RestartService, run: RunRecord) -> Interruption:
    name = _job_key(restarter, run.job)
    spec = restarter.config.jobs.get(name)
    if spec is None:
        seen = Sighting(JobProbe(job=name, error=unknown_job_now(name)), 0)
    else:
        current = dict(
            (
                await JobStore(restarter.runs.client, restarter.runs.prefix, restarter.config).read(name)
            ).current
        )
        seen = (await restarter.sightings([(name, spec, current)]))[name]
    state = "unknown" if seen.probe.error else seen.state
    pid = run.pid if run.launched else seen.pid or run.old_pid
    job_id = run.slurm_job if run.launched else seen.job_id or run.old_slurm_job
    expected = seen.expected
    now = time.time()
    run.owner = None
    if run.launched:
        line = verdict.interrupted_after_launch(state, seen.probe.count, expected, pid=pid, job_id=job_id)
        run.interrupted = line
        await restarter.runs.save(run)
        await _queue_verification(restarter, run)
        return Interruption(run, line, True)
    step = run.current_step
    who = identity(pid, job_id)
    found = interrupted_found(step.value if step else None, who, state, seen.probe.count, expected)
    if seen.probe.error:
        found = interrupted_unknown(seen.probe.error)
    for rec in run.steps:
        if rec.ended_at is None or rec.outcome is Outcome.RUNNING:
            rec.ended_at = now
            rec.outcome = Outcome.FAILED
            rec.detail = interrupted_step()
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


# --- text ---------------------------------------------------------------------------------------


def interrupted_found(step: str | None, who: str | None, state: str, count: int, expected: int) -> str:
    """What the host or cluster showed when a run cut off before its launch was taken over.

    :param step: the step it was in (``stop``: ``who`` is the run being stopped).
    :param who: the recorded run, ``pid 4242`` or ``Slurm job 41`` (None: no record).
    :param state: its state: ``alive``, ``pending``, ``gone``, ``stale`` or ``none`` (no record).
    """
    procs = f"{count}/{expected} processes"
    if who is None or state == "none":
        return f"no recorded run is up, {procs} match the job"
    run = "the old run" if step in (None, "preflight", "stop") else "the recorded run"
    how = {"alive": "is still alive", "pending": "is still pending", "stale": "is gone (its pid was reused)"}
    return f"{run} ({who}) {how.get(state, 'is gone')}, {procs}"


def interrupted_unknown(error: str) -> str:
    """The job's state could not be probed when its run was taken over."""
    return f"the job's state on its host is unknown ({error})"


def unknown_job_now(job: str) -> str:
    """A run's job is no longer in the configuration."""
    return f"job {job} is no longer configured"


def interrupted_step() -> str:
    """Detail of the step that was running when Pitstop stopped."""
    return "Pitstop stopped during this step"
