"""The runner: restart, start, stop and verify written once, for every engine.

:class:`Runner` owns the order of the steps (pre-flight → stop → clear cache → patch → launch →
at ``start_window`` verify; nothing is stopped before pre-flight passed), the cancellation checks
between them, the verification loop and a step that aborts the run
(:class:`~pipeline.errors.SequenceAborted` → verdict).  What differs between engines is behind
:class:`~pipeline.engines.base.Engine`; the verdict is :func:`pipeline.observe.evidence.decide`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from pipeline.config import Config, JobConfig
from pipeline.engines import ENGINES
from pipeline.engines.base import (
    Engine,
    EngineKind,
    Entry,
    Plan,
    Reads,
    Sighting,
    Target,
    check_engines,
)
from pipeline.engines.steplog import CancelCheck, StepListener, StepLog
from pipeline.engines.workdir import patch_plan
from pipeline.errors import PitstopError, RemoteError, SequenceAborted
from pipeline.host.probe import LogChunk
from pipeline.host.remote import RemoteHosts
from pipeline.observe.attempts import (
    Previous,
    account_previous,
    crash_words,
    lost_warning,
    metrics_offset,
    over_max_lost,
)
from pipeline.observe.checkpoints import Checkpoint, list_checkpoints
from pipeline.observe.crashes import from_fields
from pipeline.observe.evidence import Observation, decide
from pipeline.observe.resume import check_resume, resume_warning
from pipeline.state.events import Events
from pipeline.state.incidents import IncidentStore
from pipeline.state.runs import RunRecord, RunStore
from pipeline.verdict import Outcome, Step, Verdict

log = logging.getLogger(__name__)
BETWEEN_RUNS = 20  #: the job's recent runs searched for the one that stopped the previous attempt

T = TypeVar("T")
VERIFY_GRACE = 30.0  #: seconds past the deadline an unobservable job is retried before giving up


class Runner:
    """The restart / start / stop sequences and verification for configured jobs, any engine.

    :param engines: the registry, engine name → kind (:data:`pipeline.engines.ENGINES`).
    :raises ConfigError: if a job's ``engine`` is not in ``engines`` or its config does not suit
        it (:func:`~pipeline.engines.base.check_engines`).
    """

    verify_poll = 0.5  #: seconds between observations in :meth:`verify`
    pending_recheck = 15.0  #: seconds between verifications of a run posted as PENDING

    def __init__(
        self,
        config: Config,
        ssh: RemoteHosts,
        runs: RunStore,
        events: Events,
        *,
        engines: Mapping[str, EngineKind] = ENGINES,
    ) -> None:
        check_engines(config, engines)
        self.config = config
        self.ssh = ssh
        self.runs = runs
        self.steps = StepLog(runs, events)  #: records each step of every run
        #: engine name → engine, one of each in ``engines``
        self.engines: dict[str, Engine] = {name: make(ssh, self.steps) for name, make in engines.items()}

    def subscribe(self, listener: StepListener) -> Callable[[], None]:
        """:meth:`StepLog.subscribe <pipeline.engines.steplog.StepLog.subscribe>`."""
        return self.steps.subscribe(listener)

    async def _target(self, job: str) -> tuple[Engine, Target]:
        """The job's engine (checked when the runner was built), and the job as it acts on it (its
        configured name, config and ``current`` record).

        :raises KeyError: if the job is not configured.
        """
        name = self.config.job_name(job)
        spec = self.config.jobs[name]
        return self.engines[spec.engine], Target(name, spec, await self.steps.records.current(name))

    async def restart(
        self,
        run: RunRecord,
        *,
        add: Sequence[str] = (),
        remove: Sequence[str] = (),
        fresh_cache: bool = False,
        cancelled: CancelCheck | None = None,
    ) -> RunRecord:
        """Pre-flight, stop, clear cache, patch, launch; leave ``verify`` WAITING.

        The launched run is queued in ``keys.runs_unverified`` (due at launch + ``start_window``).
        A failed step (or a cancel between two steps) sets the verdict, ``finished_at`` and the
        step's detail, and the run is returned: the failure is not raised.

        :param run: a fresh run from :meth:`RunStore.create` for a configured job.
        :param add: patch names to apply (kept applied by later restarts); ``remove``: to revert.
        :param cancelled: awaited at each step boundary; True cancels the run (as does
            ``keys.cancel_request``).
        """
        engine, t = await self._target(run.job)
        steps = self.steps
        run.fresh_cache = fresh_cache
        try:
            plan = await patch_plan(steps, run, t, add, remove)
            applied = await engine.preflight(run, t, plan)
            await steps.boundary(run, None, cancelled)
            await engine.stop(run, t)
            await steps.boundary(run, Step.STOP, cancelled)
            await engine.clear_cache(run, t)
            await steps.boundary(run, Step.CLEAR_CACHE, cancelled)
            await engine.patch(run, t, plan, applied)
            await steps.boundary(run, Step.PATCH, cancelled)
            return await self._launch(run, engine, t)
        except SequenceAborted as stop:
            return await steps.finish(run, stop)

    async def start(self, run: RunRecord, *, cancelled: CancelCheck | None = None) -> RunRecord:
        """Pre-flight (check ``running`` refuses a job that runs), launch; leave ``verify`` WAITING."""
        engine, t = await self._target(run.job)
        try:
            await engine.preflight(run, t, Plan(start=True))
            await self.steps.boundary(run, None, cancelled)
            run.patches = sorted(await self.steps.records.stored_patches(t.name))
            return await self._launch(run, engine, t)
        except SequenceAborted as stop:
            return await self.steps.finish(run, stop)

    async def requeued(self, run: RunRecord) -> RunRecord:
        """Record a relaunch the scheduler made itself (``run.action`` ``requeue``: Slurm requeued the
        job, ``run.requeued`` its post): no step of Pitstop's runs but the launch, which records the
        job as the scheduler relaunched it; leaves ``verify`` WAITING, verified like a restart.
        A failed launch step sets the verdict (not raised)."""
        engine, t = await self._target(run.job)
        try:
            return await self._launch(run, engine, t)
        except SequenceAborted as stop:
            return await self.steps.finish(run, stop)

    async def _launch(self, run: RunRecord, engine: Engine, t: Target) -> RunRecord:
        """The launch step, after the metric log's size is taken; leaves ``verify`` WAITING."""
        run.metrics_size_at_launch = await metrics_offset(engine.read_chunk, t.name, t.job)
        await engine.launch(run, t)
        await self.steps.await_verify(run, t.job.start_window)
        return run

    async def stop(self, run: RunRecord) -> RunRecord:
        """Stop the job (by its recorded identity) and nothing else; the run finishes with verdict
        None on success, ``STOP_FAILED`` when something survived."""
        engine, t = await self._target(run.job)
        try:
            await engine.stop(run, t)
        except SequenceAborted as stop:
            return await self.steps.finish(run, stop)
        return await self.runs.finish(run)

    async def verify(self, run: RunRecord) -> RunRecord:
        """Decide the verdict of a launched run from observations up to launch + ``start_window``.

        Observes the job every ``verify_poll`` s; ends early when the run has ended.  A run that
        runs is judged ``start_window`` s after it started; one still queued at the deadline is
        ``PENDING``, due again in ``pending_recheck`` s.  Re-runnable.  A run that launched
        nothing is returned unchanged.

        :raises RemoteError: if the job cannot be observed until well past the deadline (the run
            stays unverified for a later attempt).
        """
        if run.launched_as is None or run.launched_at is None:
            return run
        engine, t = await self._target(run.job)
        rec = self.steps.verify_step(run)
        deadline = run.launched_at + t.job.start_window
        while True:
            try:
                obs = await engine.observe(run, t, complete=False)
            except RemoteError as exc:
                if time.time() >= deadline + VERIFY_GRACE:
                    await self.steps.verify_unreachable(run, rec, exc.message)
                    raise
            else:
                if _decided(obs, time.time(), deadline, t.job.start_window):
                    break
            now = time.time()
            delay = self.verify_poll if now >= deadline else min(self.verify_poll, deadline - now)
            await asyncio.sleep(max(0.05, delay))
        if not obs.complete:
            obs = await engine.observe(run, t, complete=True)
        previous = await self._previous(run, engine, t, obs)
        decided = decide(run, obs, lost=previous.lost if previous is not None else None)
        ignored = check_resume(obs.start_step, obs.checkpoint, obs.sampled_at - run.launched_at)
        if decided[0] is Verdict.RUNNING and ignored is not None and obs.checkpoint is not None:
            run.warning = resume_warning(t.name, ignored, obs.checkpoint.path)
        if obs.start_step is not None:
            run.resumed_at = obs.start_step
        if obs.started_at is not None and decided[0] is not Verdict.PENDING:
            run.running_at = obs.started_at
        if previous is not None and decided[0] is Verdict.RUNNING:
            self._note_lost(t, run, previous)
        recheck = time.time() + self.pending_recheck if decided[0] is Verdict.PENDING else None
        await self.steps.verified(run, rec, decided, recheck_at=recheck)
        reach = previous.run.reach if previous is not None else None
        if decided[0] is Verdict.RUNNING and reach is not None and reach.tokens_per_s is not None:
            await self.runs.schedule_recovery(run.id, time.time() + t.job.watch.recovery_window)
        return run

    async def _previous(self, run: RunRecord, engine: Engine, t: Target, obs: Observation) -> Previous | None:
        """The attempt before ``run`` (its reach recorded) and what resuming lost of it; None when unknown."""
        if obs.state != "alive":
            return None
        try:
            crash = await IncidentStore(self.runs.client, self.runs.prefix).last_crash(t.name)
            previous = await account_previous(
                engine.read_chunk,
                self.runs,
                t.name,
                t.job,
                run,
                resumed_at=obs.start_step,
                checkpoint=obs.checkpoint,
                sampled_at=obs.sampled_at,
                timezone=self.config.scheduler.timezone,
            )
        except PitstopError as exc:
            log.info("%s: what the previous run reached is unknown: %s", run.id, exc.message)
            return None
        if previous is not None and previous.run.reach is not None and previous.run.reach.ended is None:
            found = from_fields(crash) if crash.get("run_id") == previous.run.id else None
            recent = await self.runs.recent(t.name, BETWEEN_RUNS) if found is None else []
            between = [r for r in recent if previous.run.created_at < r.created_at < run.created_at]
            ended = crash_words(found) if found is not None else ended_by(run, between)
            reach = previous.run.reach.model_copy(update={"ended": ended})
            saved = await self.runs.amend(previous.run.id, reach=reach)
            previous = Previous(saved or previous.run, previous.lost)
        return previous

    @staticmethod
    def _note_lost(t: Target, run: RunRecord, previous: Previous) -> None:
        """Keep what the restart lost on ``run``, with a thread warning over ``max_lost``."""
        run.previous_run, lost, most = previous.run.id, previous.lost, t.job.max_lost
        if lost is None:
            return
        run.lost, run.lost_s = lost.steps, lost.seconds
        if most is not None and over_max_lost(lost, most) and run.warning is None:
            rate = previous.run.reach.steps_per_s if previous.run.reach is not None else None
            run.warning = lost_warning(t.name, lost, most, rate)

    async def on_job(self, job: str, call: Callable[[Engine, Target], Awaitable[T]]) -> T:
        """``call`` given the job's engine and the job as it acts on it: one of the engine's looks
        (:meth:`~pipeline.engines.base.Engine.log_tail`, ``node_outputs``, ``crash_evidence``,
        ``hang_evidence``), as ``await runner.on_job(name, lambda e, t: e.log_tail(t, 30))``.

        :raises KeyError: if the job is not configured; else what ``call`` raises.
        """
        engine, t = await self._target(job)
        return await call(engine, t)

    async def sightings(self, entries: Sequence[Entry], reads: Reads | None = None) -> dict[str, Sighting]:
        """Every job of ``entries``, by name (:func:`look`)."""
        return await look(self.engines, entries, reads)

    async def read_chunk(self, name: str, job: JobConfig, offset: int, length: int, *, path: str) -> LogChunk:
        """:meth:`~pipeline.engines.base.Engine.read_chunk` of the job's engine."""
        return await self.engines[job.engine].read_chunk(name, job, offset, length, path=path)

    async def checkpoints(self, job: str) -> list[Checkpoint]:
        """The job's ``step-NNNNNN`` checkpoints, newest first, each checked against its manifest
        (:func:`~pipeline.observe.checkpoints.list_checkpoints`; empty without ``checkpoint_dir``).

        :raises KeyError: if the job is not configured.
        :raises RemoteError: if the host cannot be asked.
        """
        name = self.config.job_name(job)
        return await list_checkpoints(self.ssh, name, self.config.jobs[name])

    async def patches_in_effect(self, job: str) -> list[str]:
        """Patch names applied in the job's workdir now (:meth:`Engine.patches_applied
        <pipeline.engines.base.Engine.patches_applied>`), stored in ``keys.job_patches``.

        :raises RemoteError: if the workdir cannot be looked at.
        """
        engine, t = await self._target(job)
        if not t.job.patches:
            return []
        texts = {p: await asyncio.to_thread(Path(path).read_text) for p, path in t.job.patches.items()}
        applied = await engine.patches_applied(t.name, t.job, texts)
        await self.steps.records.store_patches(t.name, applied)
        return applied


def _decided(obs: Observation, now: float, deadline: float, window: float) -> bool:
    """Whether the verdict can be decided from ``obs`` at ``now`` (unix s)."""
    if obs.state == "alive":
        return now >= max(deadline, (obs.started_at or deadline) + window)
    if obs.state == "pending":
        return now >= deadline + (VERIFY_GRACE if obs.settling else 0.0)
    return True  # ended


async def look(
    engines: Mapping[str, Engine], entries: Sequence[Entry], reads: Reads | None = None
) -> dict[str, Sighting]:
    """Sightings of ``entries`` from ``engines`` (name → engine, every entry's among them): one
    ``observe_many`` per engine and host, concurrently, each given its jobs' ``reads``."""
    groups: dict[tuple[str, str], list[Entry]] = {}
    for entry in entries:
        groups.setdefault((entry[1].engine, entry[1].host), []).append(entry)
    looks = []
    for (engine, _), members in groups.items():
        mine = {n: reads[n] for n, _, _ in members if reads and n in reads}
        looks.append(engines[engine].observe_many(members, mine))
    return {name: sight for part in await asyncio.gather(*looks) for name, sight in part.items()}


def ended_by(run: RunRecord, between: Sequence[RunRecord] = ()) -> str:
    """How the attempt before ``run`` ended: ``stopped by r-8 (…)`` when a run created between the
    two (``between``: a plain ``stop``, or a restart whose launch failed) or ``run`` itself stopped
    it, else as ``run``'s stop step saw it; before a requeue by the scheduler, why it was requeued."""
    if run.action == "requeue":
        return f"{run.requeue_cause or 'requeued'} (requeued by the scheduler: {run.id})"
    for stopper in [*sorted(between, key=lambda r: r.created_at), run]:
        stop = stopper.step(Step.STOP)
        if stop is not None and stop.outcome is Outcome.OK and stop.detail.startswith("stopped"):
            return f"stopped by {stopper.id} ({stop.detail})"
    if run.step(Step.STOP) is None:
        return "ended before " + run.id
    return f"had ended when {run.id} began"
