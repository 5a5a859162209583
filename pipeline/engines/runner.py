"""The runner: restart, start, stop and verify written once, for every engine.

:class:`Runner` owns the order of the steps (pre-flight → stop → clear cache → patch → launch →
at ``start_window`` verify; nothing is stopped before pre-flight passed), the cancellation checks
between them, the verification loop and a step that aborts the run
(:class:`~pipeline.errors.SequenceAborted` → verdict).  What differs between engines is behind
:class:`~pipeline.engines.base.Engine`; the verdict is :func:`pipeline.observe.evidence.decide`'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

# the engines shipped with Pitstop register themselves on import
import pipeline.engines.slurm
import pipeline.engines.ssh  # noqa: F401
from pipeline.config import Config, JobConfig
from pipeline.engines.base import ENGINES, Engine, Entry, NodeOutputs, Observation, Reads, Sighting
from pipeline.engines.steplog import CancelCheck, StepListener, StepLog
from pipeline.engines.workdir import CALL_TIMEOUT, clear_cache, patch, patch_texts
from pipeline.errors import PitstopError, RemoteError, SequenceAborted
from pipeline.host.contract import HangAnswer
from pipeline.host.probe import JobProbe, Ops, call_helper
from pipeline.host.remote import RemoteHosts
from pipeline.observe.attempts import (
    Previous,
    account_previous,
    crash_words,
    lost_warning,
    metrics_offset,
    over_max_lost,
)
from pipeline.observe.crashes import from_fields
from pipeline.observe.evidence import decide
from pipeline.observe.resume import check_resume, resume_warning
from pipeline.state.events import Events
from pipeline.state.incidents import IncidentStore
from pipeline.state.runs import RunRecord, RunStore
from pipeline.verdict import Outcome, Step, Verdict

log = logging.getLogger(__name__)

VERIFY_POLL = 0.5  #: seconds between observations while verifying
VERIFY_GRACE = 30.0  #: seconds past the deadline an unobservable job is retried before giving up
PENDING_RECHECK = 15.0  #: seconds between checks of a run still PENDING after its verdict was posted


class Runner:
    """The restart / start / stop sequences and verification for configured jobs, any engine.

    :param verify_poll: seconds between observations in :meth:`verify`.
    :param pending_recheck: seconds between verifications of a run posted as PENDING.
    """

    def __init__(
        self,
        config: Config,
        ssh: RemoteHosts,
        runs: RunStore,
        events: Events,
        *,
        verify_poll: float = VERIFY_POLL,
        pending_recheck: float = PENDING_RECHECK,
    ) -> None:
        self.config = config
        self.ssh = ssh
        self.runs = runs
        self.verify_poll = verify_poll
        self.pending_recheck = pending_recheck
        self.steps = StepLog(runs, events)  #: records each step of every run
        #: engine name → engine, one of each registered engine
        self.engines: dict[str, Engine] = {name: make(ssh, self.steps) for name, make in ENGINES.items()}

    def subscribe(self, listener: StepListener) -> Callable[[], None]:
        """:meth:`StepLog.subscribe <pipeline.engines.steplog.StepLog.subscribe>`."""
        return self.steps.subscribe(listener)

    def _job(self, job: str) -> tuple[str, JobConfig, Engine]:
        """The job's configured name, config and engine.  :raises KeyError: if not configured."""
        name = self.config.job_name(job)
        spec = self.config.jobs[name]
        engine = self.engines.get(spec.engine)
        if engine is None:
            raise PitstopError(engine_missing(spec.engine))
        return name, spec, engine

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
        name, job, engine = self._job(run.job)
        steps = self.steps
        run.fresh_cache = fresh_cache
        try:
            current = await steps.current(name)
            engine.remember_old(run, current)
            texts = await patch_texts(steps, run, name, job, [*add, *remove])
            wants = dict.fromkeys(job.patches, "state") | dict.fromkeys(remove, "revert")
            wants |= dict.fromkeys(add, "apply")
            applied = await engine.preflight(run, name, job, wants, texts)
            await steps.boundary(run, None, cancelled)
            await engine.stop(run, name, job, current)
            await steps.boundary(run, Step.STOP, cancelled)
            await clear_cache(self.ssh, steps, run, name, job, fresh_cache)
            await steps.boundary(run, Step.CLEAR_CACHE, cancelled)
            await patch(self.ssh, steps, run, name, job, texts, applied, add, remove)
            await steps.boundary(run, Step.PATCH, cancelled)
            run.metrics_size_at_launch = await metrics_offset(self.ssh, name, job)
            await engine.launch(run, name, job, current)
            await steps.await_verify(run, job.start_window)
            return run
        except SequenceAborted as stop:
            return await steps.finish(run, stop)

    async def start(self, run: RunRecord, *, cancelled: CancelCheck | None = None) -> RunRecord:
        """Pre-flight (check ``running`` refuses a job that runs), launch; leave ``verify`` WAITING."""
        name, job, engine = self._job(run.job)
        try:
            current = await self.steps.current(name)
            await engine.preflight(run, name, job, {}, {}, running=current)
            await self.steps.boundary(run, None, cancelled)
            run.patches = sorted(await self.steps.records.stored_patches(name))
            run.metrics_size_at_launch = await metrics_offset(self.ssh, name, job)
            await engine.launch(run, name, job, current)
            await self.steps.await_verify(run, job.start_window)
            return run
        except SequenceAborted as stop:
            return await self.steps.finish(run, stop)

    async def stop(self, run: RunRecord) -> RunRecord:
        """Stop the job (by its recorded identity) and nothing else; the run finishes with verdict
        None on success, ``STOP_FAILED`` when something survived."""
        name, job, engine = self._job(run.job)
        try:
            current = await self.steps.current(name)
            engine.remember_old(run, current)
            await engine.stop(run, name, job, current)
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
        name, job, engine = self._job(run.job)
        rec = self.steps.verify_step(run)
        deadline = run.launched_at + job.start_window
        while True:
            try:
                obs = await engine.observe(run, name, job, complete=False)
            except RemoteError as exc:
                if time.time() >= deadline + VERIFY_GRACE:
                    await self.steps.verify_unreachable(run, rec, exc.message)
                    raise
            else:
                if _decided(obs, time.time(), deadline, job.start_window):
                    break
            now = time.time()
            delay = self.verify_poll if now >= deadline else min(self.verify_poll, deadline - now)
            await asyncio.sleep(max(0.05, delay))
        if not obs.complete:
            obs = await engine.observe(run, name, job, complete=True)
        previous = await self._previous(name, job, run, obs)
        decided = decide(run, obs, lost=previous.lost if previous is not None else None)
        ignored = check_resume(obs.start_step, obs.checkpoint, obs.sampled_at - run.launched_at).ignored
        if decided[0] is Verdict.RUNNING and ignored is not None and obs.checkpoint is not None:
            run.warning = resume_warning(name, ignored, obs.checkpoint.path)
        if obs.start_step is not None:
            run.resumed_at = obs.start_step
        if previous is not None and decided[0] is Verdict.RUNNING:
            self._note_lost(name, job, run, previous)
        recheck = time.time() + self.pending_recheck if decided[0] is Verdict.PENDING else None
        await self.steps.verified(run, rec, decided, recheck_at=recheck)
        reach = previous.run.reach if previous is not None else None
        if decided[0] is Verdict.RUNNING and reach is not None and reach.tokens_per_s is not None:
            await self.runs.schedule_recovery(run.id, time.time() + job.watch.recovery_window)
        return run

    async def _previous(self, name: str, job: JobConfig, run: RunRecord, obs: Observation) -> Previous | None:
        """The attempt before ``run`` (its reach recorded) and what resuming lost of it; None when unknown."""
        if obs.state != "alive":
            return None
        try:
            crash = await IncidentStore(self.runs.client, self.runs.prefix).last_crash(name)
            previous = await account_previous(
                self.ssh,
                self.runs,
                name,
                job,
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
            ended = crash_words(found) if found is not None else ended_by(run)
            reach = previous.run.reach.model_copy(update={"ended": ended})
            saved = await self.runs.record_reach(previous.run.id, reach)
            previous = Previous(saved or previous.run, previous.lost)
        return previous

    @staticmethod
    def _note_lost(name: str, job: JobConfig, run: RunRecord, previous: Previous) -> None:
        """Keep what the restart lost on ``run``, with a thread warning over ``max_lost``."""
        run.previous_run = previous.run.id
        lost = previous.lost
        if lost is None:
            return
        run.lost, run.lost_s = lost.steps, lost.seconds
        if job.max_lost is not None and over_max_lost(lost, job.max_lost) and run.warning is None:
            rate = previous.run.reach.steps_per_s if previous.run.reach is not None else None
            run.warning = lost_warning(name, lost, job.max_lost, rate)

    async def log_tail(self, job: str, lines: int) -> str:
        """The last ``lines`` lines of the job's output.  :raises RemoteError: if unreadable."""
        name, spec, engine = self._job(job)
        return await engine.log_tail(name, spec, await self.steps.current(name), lines)

    async def node_outputs(self, job: str, argv: Sequence[str]) -> NodeOutputs | None:
        """:meth:`~pipeline.engines.base.Engine.node_outputs` for the job."""
        name, spec, engine = self._job(job)
        return await engine.node_outputs(name, spec, await self.steps.current(name), argv)

    async def crash_evidence(self, job: str, offset: int, seen: JobProbe | None) -> JobProbe:
        """:meth:`~pipeline.engines.base.Engine.crash_evidence` for the job."""
        name, spec, engine = self._job(job)
        return await engine.crash_evidence(name, spec, await self.steps.current(name), offset, seen)

    async def hang_evidence(self, job: str, pids: Sequence[int]) -> HangAnswer:
        """:meth:`~pipeline.engines.base.Engine.hang_evidence` for the job."""
        name, spec, engine = self._job(job)
        return await engine.hang_evidence(name, spec, await self.steps.current(name), pids)

    async def sightings(self, entries: Sequence[Entry], reads: Reads | None = None) -> dict[str, Sighting]:
        """Every job of ``entries``, by name (:func:`look`)."""
        return await look(self.engines, entries, reads)

    async def patches_in_effect(self, job: str) -> list[str]:
        """Patch names applied in the job's workdir now (``git apply --reverse --check``), stored in
        ``keys.job_patches``.  :raises RemoteError: if the host cannot be reached or git fails."""
        name = self.config.job_name(job)
        spec = self.config.jobs[name]
        if not spec.patches:
            return []
        texts = {p: await asyncio.to_thread(Path(path).read_text) for p, path in spec.patches.items()}
        answer = await call_helper(
            self.ssh,
            Ops.patches({"workdir": spec.workdir}),
            job=name,
            stdin=json.dumps(texts),
            timeout=CALL_TIMEOUT,
        )
        applied = sorted(n for n, on in (answer.get("applied") or {}).items() if on)
        await self.steps.records.store_patches(name, applied)
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
    """Sightings of ``entries`` from ``engines`` (name → engine): one ``observe_many`` per engine
    and host, concurrently, each given its jobs' ``reads``; a job whose engine is missing is
    reported with ``probe.error``."""
    groups: dict[tuple[str, str], list[Entry]] = {}
    for entry in entries:
        groups.setdefault((entry[1].engine, entry[1].host), []).append(entry)
    out: dict[str, Sighting] = {}
    looks = []
    for (engine, _), members in groups.items():
        if engine in engines:
            mine = {n: reads[n] for n, _, _ in members if reads and n in reads}
            looks.append(engines[engine].observe_many(members, mine))
            continue
        for name, spec, _ in members:
            out[name] = Sighting(JobProbe(job=name, error=engine_missing(engine)), spec.expected_processes)
    for part in await asyncio.gather(*looks):
        out.update(part)
    return out


def ended_by(run: RunRecord) -> str:
    """How the attempt before ``run`` ended, as ``run``'s stop step saw it."""
    stop = run.step(Step.STOP)
    if stop is None:
        return "ended before " + run.id
    if stop.outcome is Outcome.OK and stop.detail.startswith("stopped"):
        return f"stopped by {run.id} ({stop.detail})"
    return f"had ended when {run.id} began"


def engine_missing(engine: str) -> str:
    """A job's engine has no implementation registered (a wiring error)."""
    return f'no "{engine}" engine is registered with this Pitstop; restart Pitstop after an upgrade'
