"""The ssh engine (:class:`Restarter`): a job's restart on one host over SSH, step by step.

The order of the steps is :func:`pipeline.engines.sequence.restart_sequence`'s (pre-flight → stop →
clear cache → patch → launch → (later) verify); this module does each of them on one host,
through the host helper, and verifies the launch.

Every restart ends in one of two honest outcomes: *verified running* (pid, process count,
log growth) or *a named failure with evidence* (which step, exit status or signal, log tail).
The sequence is built so the two classic failures cannot happen:

- stopping never uses a pattern a shell can match in its own command line: the old run is
  stopped by its recorded identity — pid + start time (field 22 of ``/proc/PID/stat``) and its
  session (launched with ``setsid``: pid = pgid = sid) — by a helper that reads ``/proc``
  and excludes its own ancestry (:mod:`pipeline.host.helper`);
- the launch is fully detached (new session, stdin ``/dev/null``, output appended to the
  log, no descriptor of the SSH channel kept), so the SSH call returns at once, also through
  wrappers such as ``pct exec`` that wait for every holder of their output.

Nothing is stopped before pre-flight passed (host, workdir, launch program, patches, log
directory, free space — one SSH call).  Each step is recorded in the run (:mod:`pipeline.state.runs`)
with start, end, outcome and detail, published as a ``step`` event and told to the step log's
listeners as it happens; a failed step raises one of the :class:`~pipeline.errors.SequenceAborted`
errors (``PreflightFailed``, ``StopFailed``, ``LaunchFailed``, ``RunCancelled``), each carrying
its verdict and verdict line, which the sequence catches: it sets the verdict and returns the
run (the failure is not raised to the caller).  A stop that found the recorded pid reused marks
its step ``stale`` (:class:`~pipeline.state.runs.StepRecord`), which makes the verdict
``STALE_RECORD``.  The verdict is decided by :meth:`Restarter.verify` from evidence gathered
from the launch until ``launch + start_window``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pipeline import verdict
from pipeline.config import Config, JobConfig
from pipeline.engines.base import Engine
from pipeline.engines.sequence import restart_sequence
from pipeline.engines.steplog import (
    CancelCheck,
    StepListener,
    StepLog,
    already_running,
    gpu_memory_freed,
    gpu_memory_held,
    launch_hung,
    stale_record,
    step_launched,
    step_preflight_ok,
    step_stop_nothing,
    step_stopped,
)
from pipeline.engines.workdir import CALL_TIMEOUT
from pipeline.errors import (
    HostKeyRejected,
    HostUnreachable,
    LaunchFailed,
    PitstopError,
    PreflightFailed,
    RemoteError,
    RemoteTimeout,
    SequenceAborted,
    StopFailed,
)
from pipeline.host.contract import LaunchArgs, PreflightAnswer, PreflightArgs, StopArgs
from pipeline.host.probe import (
    ProcessCount,
    call_helper,
    log_tail,
    probe_host,
    recorded_identity,
)
from pipeline.host.remote import RemoteHosts
from pipeline.observe.evidence import Evidence, decide, gather, settle_exit
from pipeline.observe.resume import check_resume, resume_warning
from pipeline.state.events import Events
from pipeline.state.runs import RunRecord, RunStore
from pipeline.verdict import Outcome, Step, Verdict

log = logging.getLogger(__name__)

MIN_FREE_BYTES = 100 * 10**6  #: pre-flight: free bytes needed where the log is written
GPU_WAIT_TIMEOUT = 60.0  #: seconds to wait for old processes to release GPU memory
KILL_TIMEOUT = 10.0  #: seconds to wait for processes to vanish after SIGKILL
LAUNCH_TIMEOUT = 15.0  #: seconds for the launch call (it returns in well under one)
VERIFY_POLL = 0.5  #: seconds between evidence samples while verifying
VERIFY_GRACE = 30.0  #: seconds past the deadline an unreachable host is retried before giving up


class Restarter:
    """The restart / start / stop sequences and verification for configured jobs.

    :param config: the validated configuration.
    :param ssh: the SSH pool.
    :param runs: run records.
    :param events: the event stream (``step`` events are published as steps change).
    :param gpu_wait_timeout: seconds to wait for GPU memory of a stopped run to be released.
    :param min_free_bytes: pre-flight free-space threshold for the log's filesystem.
    :param verify_poll: seconds between evidence samples in :meth:`verify`.
    """

    def __init__(
        self,
        config: Config,
        ssh: RemoteHosts,
        runs: RunStore,
        events: Events,
        *,
        gpu_wait_timeout: float = GPU_WAIT_TIMEOUT,
        min_free_bytes: int = MIN_FREE_BYTES,
        verify_poll: float = VERIFY_POLL,
    ) -> None:
        self.config = config
        self.ssh = ssh
        self.runs = runs
        self.events = events
        self.gpu_wait_timeout = gpu_wait_timeout
        self.min_free_bytes = min_free_bytes
        self.verify_poll = verify_poll
        self.steps = StepLog(runs, events)  #: records each step of a run (shared with other engines)
        self.engines: dict[str, Engine] = {}  #: engine name → engine, for jobs not on "ssh"

    def subscribe(self, listener: StepListener) -> Callable[[], None]:
        """Tell ``listener`` of every step change of every run, whatever its engine.

        :returns: a function that unsubscribes it.
        """
        return self.steps.subscribe(listener)

    def engine_for(self, job: JobConfig) -> Engine | None:
        """The engine running ``job``, or None for the ssh engine (this class).

        :raises PitstopError: if the job's engine was not registered in :attr:`engines`.
        """
        if job.engine == "ssh":
            return None
        engine = self.engines.get(job.engine)
        if engine is None:
            raise PitstopError(engine_missing(job.engine))
        return engine

    # --- the sequences ------------------------------------------------------------------------

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

        The launched run is saved and put in ``keys.runs_unverified`` (due at launch +
        ``start_window``) for :meth:`verify`.  A failure sets the verdict (precedence of
        :class:`~pipeline.verdict.Verdict`), ``finished_at`` and the failing step's detail, saves
        the run and returns it.

        :param run: a fresh run from :meth:`RunStore.create` for a configured job.
        :param add: patch names to apply (kept applied by later restarts).
        :param remove: patch names to revert.
        :param fresh_cache: clear the job's ``clear_cache`` paths before the launch.
        :param cancelled: awaited at each step boundary; True cancels the run (so does the
            ``keys.cancel_request`` key).
        :returns: the run as saved.
        """
        name = self.config.job_name(run.job)
        job = self.config.jobs[name]
        if (other := self.engine_for(job)) is not None:
            return await other.restart(
                run, add=add, remove=remove, fresh_cache=fresh_cache, cancelled=cancelled
            )
        return await restart_sequence(
            self,
            self.steps,
            self.ssh,
            run,
            name,
            job,
            add=add,
            remove=remove,
            fresh_cache=fresh_cache,
            cancelled=cancelled,
        )

    # --- the ssh engine's own steps (pipeline.engines.sequence.EngineSteps) ---------------------------------

    def remember_old(self, run: RunRecord, current: Mapping[str, str]) -> None:
        """The old run's pid, from the job's current record."""
        run.old_pid = recorded_identity(current)["pid"]

    async def preflight_step(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        wants: Mapping[str, str],
        texts: Mapping[str, str],
    ) -> Mapping[str, bool]:
        """One helper call checks host, workdir, program, patches, log directory and free space."""
        return (await self._preflight(run, name, job, wants, texts)).get("applied") or {}

    async def stop_step(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        current: Mapping[str, str],
    ) -> None:
        """Stop the recorded process group (SIGTERM, ``stop_timeout``, SIGKILL), never by pattern."""
        if stale := await self._stop(run, name, job, current):
            log.info("%s: %s", run.id, stale)

    async def launch_step(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        current: Mapping[str, str],
    ) -> None:
        """Launch fully detached (new session); the SSH call returns at once."""
        await self._launch(run, name, job)

    async def start(self, run: RunRecord, *, cancelled: CancelCheck | None = None) -> RunRecord:
        """Pre-flight (refusing if the job already runs), launch; leave ``verify`` WAITING.

        :returns: the run as saved (verdict ``PREFLIGHT_FAILED`` with check ``running`` if the
            job's processes are already there).
        """
        name = self.config.job_name(run.job)
        job = self.config.jobs[name]
        if (other := self.engine_for(job)) is not None:
            return await other.start(run, cancelled=cancelled)
        try:
            current = await self.steps.current(name)
            await self._preflight(run, name, job, {}, {}, running=current)
            await self.steps.boundary(run, None, cancelled)
            run.patches = sorted(await self.steps.stored_patches(name))
            await self._launch(run, name, job)
            await self.steps.await_verify(run, job.start_window)
            return run
        except SequenceAborted as stop:
            return await self.steps.finish(run, stop)

    async def stop(self, run: RunRecord) -> RunRecord:
        """Stop the job (by its recorded identity) and nothing else.

        :returns: the run, finished; verdict None when the stop succeeded (the detail is in the
            ``stop`` step), ``STOP_FAILED`` when something survived.
        """
        name = self.config.job_name(run.job)
        job = self.config.jobs[name]
        if (other := self.engine_for(job)) is not None:
            return await other.stop(run)
        try:
            current = await self.steps.current(name)
            run.old_pid = recorded_identity(current)["pid"]
            await self._stop(run, name, job, current)
        except SequenceAborted as stop:
            return await self.steps.finish(run, stop)
        return await self.runs.finish(run)

    # --- verification ---------------------------------------------------------------------------

    async def verify(self, run: RunRecord) -> RunRecord:
        """Decide the verdict of a launched run from evidence up to launch + ``start_window``.

        Polls the host every ``verify_poll`` s; ends early when the process has exited.  At the
        deadline, in precedence order: ``EXITED`` (exit code or signal when known, last log
        lines), ``ERROR_IN_LOG``, ``WRONG_COUNT`` (expected vs seen), ``NO_PROGRESS`` (log
        silent), else ``RUNNING``; a run whose stop found a stale record is ``STALE_RECORD``.
        Re-runnable: a second call samples again.  Sets ``verdict``, ``verdict_line``,
        ``evidence``, ``finished_at``; saves; takes the run off the verification queue.

        :returns: the run as saved; unchanged if it launched nothing.
        :raises RemoteError: if the host cannot be reached until well past the deadline (the
            verify step records the failure; the run stays unverified for a later attempt).
        """
        spec = self.config.jobs.get(self._job_key(run.job))
        if spec is not None and (other := self.engine_for(spec)) is not None:
            return await other.verify(run)
        if run.pid is None or run.launched_at is None:
            return run
        name = self.config.job_name(run.job)
        job = self.config.jobs[name]
        rec = self.steps.verify_step(run)
        deadline = run.launched_at + job.start_window
        ev: Evidence | None = None
        failure: RemoteError | None = None
        while True:
            try:
                ev = await gather(self.ssh, run, job)
                failure = None
            except RemoteError as exc:
                failure = exc
            now = time.time()
            if ev is not None and failure is None and ev.state != "alive":
                ev = await settle_exit(self.ssh, run, job, ev)
                break
            if now >= deadline and failure is None:
                break
            if failure is not None and now >= deadline + VERIFY_GRACE:
                await self.steps.verify_unreachable(run, rec, failure.message)
                raise failure
            delay = self.verify_poll if now >= deadline else min(self.verify_poll, deadline - now)
            await asyncio.sleep(max(0.05, delay))
        assert ev is not None
        verdict, line, evidence = decide(run, job, ev)
        ignored = check_resume(ev.start_step, ev.checkpoint, ev.sampled_at - run.launched_at).ignored
        if verdict is Verdict.RUNNING and ignored is not None and ev.checkpoint is not None:
            run.warning = resume_warning(name, ignored, ev.checkpoint.path)
        await self.steps.verified(run, rec, (verdict, line, evidence))
        return run

    # --- queries ---------------------------------------------------------------------------------

    async def job_processes(self, job: str) -> ProcessCount:
        """The job's processes now: members of its recorded session matching ``match``.

        :raises RemoteError: if the host cannot be probed.
        """
        name = self.config.job_name(job)
        spec = self.config.jobs[name]
        if (other := self.engine_for(spec)) is not None:
            return await other.job_processes(name)
        current = await self.steps.current(name)
        probes = await probe_host(self.ssh, spec.host, [(name, spec, current)])
        probe = probes[name]
        if probe.error is not None:
            raise HostUnreachable(spec.host, probe.error)
        return ProcessCount(
            job=name,
            pids=probe.pids,
            count=probe.count,
            expected=spec.processes,
            alive=probe.alive,
            pid=recorded_identity(current)["pid"],
        )

    async def log_tail(self, job: str, lines: int) -> str:
        """The last ``lines`` lines of the job's log.

        :raises RemoteError: if the log cannot be read.
        """
        name = self.config.job_name(job)
        if (other := self.engine_for(self.config.jobs[name])) is not None:
            return await other.log_tail(name, lines)
        return await log_tail(self.ssh, name, self.config.jobs[name], lines)

    async def patches_in_effect(self, job: str) -> list[str]:
        """Patch names applied in the job's workdir now (``git apply --reverse --check``);
        ``keys.job_patches`` is brought in step.

        :raises RemoteError: if the host cannot be reached or git fails.
        """
        name = self.config.job_name(job)
        spec = self.config.jobs[name]
        if not spec.patches:
            return []
        texts = {p: await asyncio.to_thread(Path(path).read_text) for p, path in spec.patches.items()}
        answer = await call_helper(
            self.ssh,
            "patches",
            {"workdir": spec.workdir},
            job=name,
            stdin=json.dumps(texts),
            timeout=CALL_TIMEOUT,
        )
        applied = sorted(n for n, on in (answer.get("applied") or {}).items() if on)
        await self.steps.store_patches(name, applied)
        return applied

    # --- steps ------------------------------------------------------------------------------------

    async def _preflight(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        wants: Mapping[str, str],
        texts: Mapping[str, str],
        *,
        running: Mapping[str, str] | None = None,
    ) -> PreflightAnswer:
        rec = await self.steps.begin(run, Step.PREFLIGHT)
        args: PreflightArgs = {
            "workdir": job.workdir,
            "program": job.launch[0],
            "log": job.log,
            "min_free": self.min_free_bytes,
            "patches": dict(wants) if texts else {},
            "running": None,
        }
        if running is not None:
            args["running"] = {
                "name": name,
                "match": job.match,
                "workdir": job.workdir,
                "log": None,
                **recorded_identity(running),
            }
        try:
            answer = await call_helper(
                self.ssh,
                "preflight",
                args,
                job=name,
                stdin=json.dumps(dict(texts)) if texts else None,
                timeout=CALL_TIMEOUT,
            )
        except RemoteError as exc:
            check = "host_key" if isinstance(exc, HostKeyRejected) else "host"
            await self.steps.fail(run, rec, exc.message)
            raise PreflightFailed(
                name, check, exc.message, line=verdict.preflight_failed(check, exc.message)
            ) from None
        failed = [c for c in answer.get("checks", []) if not c.get("ok")]
        if failed:
            first = failed[0]
            detail = "; ".join(f"{c['check']}: {c['detail']}" for c in failed)
            await self.steps.fail(run, rec, detail)
            raise PreflightFailed(
                name,
                first["check"],
                detail,
                line=verdict.preflight_failed(first["check"], first["detail"]),
            )
        seen = answer.get("running")
        if seen and (seen.get("alive") or seen.get("count")):
            pids = list(seen.get("pids") or []) or [int(recorded_identity(running)["pid"] or 0)]
            detail = already_running(name, pids)
            await self.steps.fail(run, rec, detail)
            raise PreflightFailed(name, "running", detail, line=verdict.preflight_failed("running", detail))
        names = [c["check"] for c in answer.get("checks", [])]
        await self.steps.end(run, rec, Outcome.OK, step_preflight_ok(list(dict.fromkeys(names))))
        return answer

    async def _stop(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        current: Mapping[str, str] | None,
    ) -> str | None:
        """Stop the old run; returns the stale-record note if the record was stale."""
        rec = await self.steps.begin(run, Step.STOP)
        ident = recorded_identity(current)
        args: StopArgs = {
            **ident,
            "match": job.match,
            "workdir": job.workdir,
            "term_timeout": job.stop_timeout,
            "kill_timeout": KILL_TIMEOUT,
        }
        try:
            answer = await call_helper(
                self.ssh, "stop", args, job=name, timeout=job.stop_timeout + 2 * KILL_TIMEOUT + CALL_TIMEOUT
            )
        except RemoteError as exc:
            await self.steps.fail(run, rec, exc.message)
            raise StopFailed(name, [], exc.message, line=verdict.stop_failed([], exc.message)) from None
        stale = answer.get("stale")
        rec.stale = bool(stale)
        note = stale_record(stale["pid"], stale.get("recorded"), stale.get("found")) if stale else None
        targets = answer.get("targets") or []
        survivors = [int(p) for p in answer.get("survivors") or []]
        if targets:
            detail = step_stopped(
                len(targets), float(answer.get("seconds") or 0), answer.get("killed") or [], job.stop_timeout
            )
        else:
            detail = step_stop_nothing()
        if note:
            detail = f"{note}; {detail}"
        if survivors:
            failure = StopFailed(name, survivors, line=verdict.stop_failed(survivors, "survived SIGKILL"))
            await self.steps.fail(run, rec, f"{detail}; {failure.message}")
            raise failure
        if job.gpus is not None and job.gpus.all and targets:
            pairs: list[tuple[int, int | None]] = [(t["pid"], t["start_time"]) for t in targets]
            try:
                gpu = await call_helper(
                    self.ssh,
                    "gpu_wait",
                    {"targets": pairs, "timeout": self.gpu_wait_timeout},
                    host=job.host,
                    timeout=self.gpu_wait_timeout + CALL_TIMEOUT,
                )
            except RemoteError as exc:
                await self.steps.fail(run, rec, f"{detail}; {exc.message}")
                raise StopFailed(name, [], exc.message, line=verdict.stop_failed([], exc.message)) from None
            holders = sorted({int(h["pid"]) for h in gpu.get("holders") or []})
            if holders:
                held = gpu_memory_held(holders, float(gpu.get("seconds") or self.gpu_wait_timeout))
                await self.steps.fail(run, rec, f"{detail}; {held}")
                raise StopFailed(name, holders, held, line=verdict.stop_failed(holders, held))
            detail += "; " + gpu_memory_freed(float(gpu.get("seconds") or 0))
        await self.steps.mark_stopped(name, run)
        await self.steps.end(run, rec, Outcome.OK, detail)
        return note

    async def _launch(self, run: RunRecord, name: str, job: JobConfig) -> None:
        rec = await self.steps.begin(run, Step.LAUNCH)
        args: LaunchArgs = {
            "workdir": job.workdir,
            "argv": list(job.launch),
            "log": job.log,
            "name": name,
            "run_id": run.id,
        }
        try:
            answer = await call_helper(self.ssh, "launch", args, job=name, timeout=LAUNCH_TIMEOUT)
        except RemoteTimeout as exc:
            detail = launch_hung(exc.timeout, await self._state_text(name, job))
            await self.steps.fail(run, rec, detail)
            raise LaunchFailed(name, detail, line=verdict.launch_failed(detail)) from None
        except RemoteError as exc:
            detail = exc.message
            if not isinstance(exc, HostKeyRejected):
                detail += f"; process state: {await self._state_text(name, job)}"
            await self.steps.fail(run, rec, detail)
            raise LaunchFailed(name, detail, line=verdict.launch_failed(detail)) from None
        run.pid = int(answer["pid"])
        run.pgid = int(answer.get("pgid") or run.pid)
        run.sid = int(answer.get("sid") or run.pid)
        run.start_time = answer.get("start_time")
        run.log_size_at_launch = int(answer.get("log_size") or 0)
        run.launched_at = time.time()
        current = {
            "run_id": run.id,
            "pid": str(run.pid),
            "start_time": str(run.start_time if run.start_time is not None else ""),
            "sid": str(run.sid),
            "pgid": str(run.pgid),
            "launched_at": repr(run.launched_at),
            "log": job.log,
            "state": "running",
            "patches": ",".join(run.patches),
        }
        await self.steps.record_launch(run, name, current, run.launched_at + job.start_window)
        await self.steps.end(run, rec, Outcome.OK, step_launched(run.pid, job.log, run.log_size_at_launch))

    # --- helpers ------------------------------------------------------------------------------------

    async def _state_text(self, name: str, job: JobConfig) -> str:
        """What runs for the job now, in words (for a launch that hung or lost its channel)."""
        try:
            probes = await probe_host(self.ssh, job.host, [(name, job, None)])
        except Exception as exc:  # evidence gathering must not hide the original failure
            return f"unknown ({type(exc).__name__})"
        p = probes[name]
        if p.error:
            return f"unknown ({p.error})"
        if not p.pids:
            return f"no process matching {job.match!r}"
        return f"{p.count} process(es) matching {job.match!r}: pid {', '.join(str(x) for x in p.pids[:10])}"

    def _job_key(self, job: str) -> str:
        try:
            return self.config.job_name(job)
        except KeyError:
            return job


# --- text ---------------------------------------------------------------------------------------


def engine_missing(engine: str) -> str:
    """A job's engine has no implementation registered (a wiring error)."""
    return f'no "{engine}" engine is registered with this Pitstop; restart Pitstop after an upgrade'
