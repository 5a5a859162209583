"""Runs whose owner died: found by any Pitstop process, told as they are on the host.

A run is owned by the process executing it, which keeps a heartbeat in Redis
(:class:`~pipeline.state.runs.RunStore`).  When that process dies (SIGKILL, OOM, a lost VM), the
heartbeat lapses within its TTL and :func:`reconcile` — run by the scheduler leader on every
lease tick and by every CLI, console and serve process when it starts — takes the run over:

- it claims the run first (``SET NX`` on the lapsed heartbeat key), so two processes never
  both report the same run;
- it **probes the job's real state** on its host (a Slurm job: its state from the cluster and
  its tasks on every node), so the record says what is true, not only where the sequence stopped;
- a run cut off before its launch is finished as ``INTERRUPTED`` with the step it was in and
  what the probe found: ``INTERRUPTED during stop: the old run (pid 4242) is still alive, 8/8
  processes``;
- a run cut off after its launch keeps its verdict open: the line ``INTERRUPTED after launch:
  pid 5151 running 8/8 (unverified)`` (``job 42 pending``…) is recorded in ``interrupted`` and the run is (re)queued
  in ``keys.runs_unverified``, so its verification still runs, once, from the recorded launch
  identity.

It releases nothing it does not own: a dead holder's restart lock expires by itself (its TTL
is the heartbeat's).  Runs without an owner that never launched (written by a store without
one) are taken only when no restart lock of their job is held, as before heartbeats existed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pipeline import verdict
from pipeline.config import JobConfig
from pipeline.engines.base import RestartService
from pipeline.errors import RemoteError
from pipeline.host.probe import probe_host, recorded_identity
from pipeline.host.slurm import SlurmClient
from pipeline.state import keys
from pipeline.state.jobstate import JobStore
from pipeline.state.runs import RunRecord, identity
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


@dataclass(frozen=True)
class Observed:
    """A run's job as its host or cluster shows it at the take-over.

    :ivar state: ``alive``, ``pending`` (a Slurm job still queued), ``gone``, ``stale`` (its pid
        was reused), ``unknown`` (it could not be asked: ``error``) or ``none`` (nothing recorded).
    :ivar count: the job's processes found (on every node of a Slurm job).
    :ivar pid: the pid observed (ssh), or None.
    :ivar job_id: the Slurm job id observed, or None.
    :ivar error: why the job could not be observed, else None.
    """

    state: str
    count: int = 0
    pid: int | None = None
    job_id: int | None = None
    error: str | None = None

    @property
    def who(self) -> str | None:
        """``pid 4242`` / ``Slurm job 41``, or None when nothing was recorded."""
        return identity(self.pid, self.job_id)


async def reconcile(restarter: RestartService, *, instance: str) -> list[Interruption]:
    """Take over every open run whose owner is gone; probe each job and record what is true.

    :param restarter: the process's Restarter (config, SSH pool and run store).
    :param instance: this process's id, written in the claim it takes on each run.
    :returns: the runs taken over, oldest first; a run another process claimed is skipped.
    """
    runs, client, prefix = restarter.runs, restarter.runs.client, restarter.runs.prefix
    out: list[Interruption] = []
    for run in await runs.unowned():
        if run.owner is None:
            if run.launched:  # handed over on purpose: make sure the queue has it
                await _queue_verification(restarter, run)
                continue
            if await _lock_held(restarter, run.job):
                continue
        claim = keys.run_owner(prefix, run.id)
        ttl_ms = max(1, int(runs.heartbeat_ttl * 1000))
        if not await client.set(claim, f"recovering:{instance}", nx=True, px=ttl_ms):
            continue  # its owner came back, or another process is taking it over
        try:
            fresh = await runs.get(run.id)
            if fresh.finished_at is not None:
                continue
            out.append(await _take_over(restarter, fresh))
        finally:
            await client.delete(claim)
    return out


async def _take_over(restarter: RestartService, run: RunRecord) -> Interruption:
    name = _job_key(restarter, run.job)
    spec = restarter.config.jobs.get(name)
    if spec is None:
        seen = Observed("unknown", pid=run.pid, job_id=run.slurm_job, error=unknown_job_now(name))
    else:
        seen = await _OBSERVE[spec.engine](restarter, run, name, spec)
    expected = spec.expected_processes if spec is not None else 0
    now = time.time()
    run.owner = None
    if run.launched:
        line = verdict.interrupted_after_launch(
            seen.state, seen.count, expected, pid=seen.pid, job_id=seen.job_id
        )
        run.interrupted = line
        await restarter.runs.save(run)
        await _queue_verification(restarter, run)
        return Interruption(run, line, True)
    step = run.current_step
    found = interrupted_found(step.value if step else None, seen.who, seen.state, seen.count, expected)
    if seen.error:
        found = interrupted_unknown(seen.error)
    for rec in run.steps:
        if rec.ended_at is None or rec.outcome is Outcome.RUNNING:
            rec.ended_at = now
            rec.outcome = Outcome.FAILED
            rec.detail = interrupted_step()
    run.verdict = Verdict.INTERRUPTED
    run.verdict_line = verdict.interrupted(step.value if step else None, found)
    run.evidence = run.evidence or run.verdict_line
    run.finished_at = now
    await restarter.runs.save(run)
    return Interruption(run, run.verdict_line, False)


async def _observe_ssh(restarter: RestartService, run: RunRecord, name: str, spec: JobConfig) -> Observed:
    """The recorded process on its host (``keys.job_current``: the launched run's, or the old one's)."""
    snap = await JobStore(restarter.runs.client, restarter.runs.prefix, restarter.config).read(name)
    current = dict(snap.current)
    probe = (await probe_host(restarter.ssh, spec.host, [(name, spec, current)]))[name]
    pid = run.pid if run.launched else recorded_identity(current)["pid"] or run.old_pid
    state = "unknown" if probe.error else probe.state or "none"
    return Observed(state, probe.count, pid=pid, error=probe.error)


async def _observe_slurm(restarter: RestartService, run: RunRecord, name: str, spec: JobConfig) -> Observed:
    """The launched (or old) Slurm job as the cluster reports it, its tasks counted on every node."""
    job_id = run.slurm_job if run.launched else run.old_slurm_job
    if job_id is None:
        return Observed("none")
    cluster = SlurmClient(restarter.ssh)
    try:
        j = await cluster.one(name, job_id)
        tasks = (
            await cluster.node_tasks(name, job_id, j.nodes, spec.match) if j and j.state == "RUNNING" else []
        )
    except RemoteError as exc:
        return Observed("unknown", job_id=job_id, error=exc.message)
    state = "gone" if j is None or not j.active else "pending" if j.state == "PENDING" else "alive"
    return Observed(state, sum(t.count for t in tasks), job_id=job_id)


#: how each engine's jobs are observed at a take-over, by ``[jobs.NAME] engine``
_OBSERVE: dict[str, Callable[[RestartService, RunRecord, str, JobConfig], Awaitable[Observed]]] = {
    "ssh": _observe_ssh,
    "slurm": _observe_slurm,
}


async def _queue_verification(restarter: RestartService, run: RunRecord) -> None:
    spec = restarter.config.jobs.get(_job_key(restarter, run.job))
    window = spec.start_window if spec is not None else 0.0
    due = (run.launched_at or time.time()) + window
    await restarter.runs.client.zadd(keys.runs_unverified(restarter.runs.prefix), {run.id: due}, nx=True)


async def _lock_held(restarter: RestartService, job: str) -> bool:
    name = _job_key(restarter, job)
    scopes = [f"job:{name}"]
    spec = restarter.config.jobs.get(name)
    if spec is not None:
        scopes.append(f"host:{spec.host}")
    client, prefix = restarter.runs.client, restarter.runs.prefix
    return any([bool(await client.exists(keys.lock(prefix, s))) for s in scopes])


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
