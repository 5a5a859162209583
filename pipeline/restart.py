"""The restart sequence: pre-flight → stop → clear cache → patch → launch → (later) verify.

Every restart ends in one of two honest outcomes: *verified running* (pid, process count,
log growth) or *a named failure with evidence* (which step, exit status or signal, log tail).
The sequence is built so the two classic failures cannot happen:

- stopping never uses a pattern a shell can match in its own command line: the old run is
  stopped by its recorded identity — pid + start time (field 22 of ``/proc/PID/stat``) and its
  session (launched with ``setsid``: pid = pgid = sid) — by a helper that reads ``/proc``
  and excludes its own ancestry (:mod:`pipeline.hosthelper`);
- the launch is fully detached (new session, stdin ``/dev/null``, output appended to the
  log, no descriptor of the SSH channel kept), so the SSH call returns at once, also through
  wrappers such as ``pct exec`` that wait for every holder of their output.

Nothing is stopped before pre-flight passed (host, workdir, launch program, patches, log
directory, free space — one SSH call).  Each step is recorded in the run (:mod:`pipeline.runs`)
with start, end, outcome and detail, reported to ``on_step`` as it happens and published as a
``step`` event; a failure sets the verdict and returns the run (it is not raised).  The
verdict is decided by :meth:`Restarter.verify` from evidence gathered from the launch until
``launch + start_window``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import keys, messages
from pipeline.config import Config, JobConfig
from pipeline.engine import Engine
from pipeline.errors import HostKeyRejected, PitstopError, RemoteError, RemoteTimeout
from pipeline.events import EventKind, Events
from pipeline.hostcontract import EvidenceArgs, LaunchArgs, PreflightAnswer, PreflightArgs, StopArgs
from pipeline.hostprobe import (
    ProcessCount,
    call_helper,
    log_tail,
    probe_host,
    recorded_identity,
)
from pipeline.remote import RemoteHosts
from pipeline.resume import ResumePoint, check_resume
from pipeline.runs import Outcome, RunRecord, RunStore, Step, StepRecord, Verdict

log = logging.getLogger(__name__)

MIN_FREE_BYTES = 100 * 10**6  #: pre-flight: free bytes needed where the log is written
GPU_WAIT_TIMEOUT = 60.0  #: seconds to wait for old processes to release GPU memory
KILL_TIMEOUT = 10.0  #: seconds to wait for processes to vanish after SIGKILL
CALL_TIMEOUT = 30.0  #: seconds for a pre-flight, cache or patch call
LAUNCH_TIMEOUT = 15.0  #: seconds for the launch call (it returns in well under one)
VERIFY_POLL = 0.5  #: seconds between evidence samples while verifying
VERIFY_GRACE = 30.0  #: seconds past the deadline an unreachable host is retried before giving up
RUNNING_TAIL_LINES = 3  #: log lines kept as evidence of a healthy start
TAIL_LINES = 30  #: log lines kept as evidence

StepCallback = Callable[[RunRecord, StepRecord], Awaitable[None]]
CancelCheck = Callable[[], Awaitable[bool]]


class _Abort(Exception):
    """Internal: the sequence ends here with this verdict."""

    def __init__(self, verdict: Verdict, line: str, evidence: str = "") -> None:
        super().__init__(line)
        self.verdict = verdict
        self.line = line
        self.evidence = evidence


@dataclass(frozen=True)
class Evidence:
    """One sample of a launched run, as the helper saw it.

    :ivar state: ``alive``, ``gone`` or ``stale`` (pid reused).
    :ivar count: matching processes in the run's session; ``pids`` lists them.
    :ivar new_bytes: log bytes written since launch (None if the log cannot be read).
    :ivar error_line: the first traceback / ``…Error`` / ``Killed`` line since launch.
    :ivar status: the waiter's record of how the process ended (code/signal/started_at/ended_at).
    :ivar tail: the last lines written since launch.
    :ivar sampled_at: Pitstop's clock when the answer came.
    :ivar start_step: the step the run started from (its ``resume_step=`` line or first metric
        steps; :func:`pipeline.hosthelper.start_step`), None when not seen yet.
    :ivar checkpoint: the newest checkpoint in ``checkpoint_dir`` (when configured and present).
    """

    state: str
    count: int
    pids: tuple[int, ...]
    new_bytes: int | None
    error_line: str | None
    status: Mapping[str, Any] | None
    tail: str
    log_error: str | None
    sampled_at: float
    start_step: int | None = None
    checkpoint: ResumePoint | None = None


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
        self.engines: dict[str, Engine] = {}  #: engine name → engine, for jobs not on "ssh"

    def engine_for(self, job: JobConfig) -> Engine | None:
        """The engine running ``job``, or None for the ssh engine (this class).

        :raises PitstopError: if the job's engine was not registered in :attr:`engines`.
        """
        if job.engine == "ssh":
            return None
        engine = self.engines.get(job.engine)
        if engine is None:
            raise PitstopError(messages.engine_missing(job.engine))
        return engine

    @property
    def _redis(self) -> Any:
        return self.runs.client

    @property
    def _prefix(self) -> str:
        return self.runs.prefix

    # --- the sequences ------------------------------------------------------------------------

    async def restart(
        self,
        run: RunRecord,
        *,
        add: Sequence[str] = (),
        remove: Sequence[str] = (),
        fresh_cache: bool = False,
        on_step: StepCallback | None = None,
        cancelled: CancelCheck | None = None,
    ) -> RunRecord:
        """Pre-flight, stop, clear cache, patch, launch; leave ``verify`` WAITING.

        The launched run is saved and put in ``keys.runs_unverified`` (due at launch +
        ``start_window``) for :meth:`verify`.  A failure sets the verdict (precedence of
        :class:`~pipeline.runs.Verdict`), ``finished_at`` and the failing step's detail, saves
        the run and returns it.

        :param run: a fresh run from :meth:`RunStore.create` for a configured job.
        :param add: patch names to apply (kept applied by later restarts).
        :param remove: patch names to revert.
        :param fresh_cache: clear the job's ``clear_cache`` paths before the launch.
        :param on_step: awaited with the run and step each time a step starts or ends.
        :param cancelled: awaited at each step boundary; True cancels the run (so does the
            ``keys.cancel_request`` key).
        :returns: the run as saved.
        """
        name = self.config.job_name(run.job)
        job = self.config.jobs[name]
        if (other := self.engine_for(job)) is not None:
            return await other.restart(
                run, add=add, remove=remove, fresh_cache=fresh_cache, on_step=on_step, cancelled=cancelled
            )
        run.fresh_cache = fresh_cache
        try:
            current = await self._current(name)
            run.old_pid = recorded_identity(current)["pid"]
            texts = await self._patch_texts(run, name, job, [*add, *remove], on_step)
            wants = {p: "state" for p in job.patches}
            wants.update({p: "revert" for p in remove})
            wants.update({p: "apply" for p in add})
            pre = await self._preflight(run, name, job, wants, texts, on_step)
            await self._boundary(run, None, cancelled, on_step)
            stale = await self._stop(run, name, job, current, on_step)
            await self._boundary(run, Step.STOP, cancelled, on_step)
            await self._clear_cache(run, name, job, fresh_cache, on_step)
            await self._boundary(run, Step.CLEAR_CACHE, cancelled, on_step)
            await self._patch(run, name, job, texts, pre.get("applied") or {}, add, remove, on_step)
            await self._boundary(run, Step.PATCH, cancelled, on_step)
            await self._launch(run, name, job, on_step)
            if stale:
                log.info("%s: %s", run.id, stale)
            await self._await_verify(run, job, on_step)
            return run
        except _Abort as stop:
            return await self._finish(run, stop.verdict, stop.line, stop.evidence)

    async def start(
        self, run: RunRecord, *, on_step: StepCallback | None = None, cancelled: CancelCheck | None = None
    ) -> RunRecord:
        """Pre-flight (refusing if the job already runs), launch; leave ``verify`` WAITING.

        :returns: the run as saved (verdict ``PREFLIGHT_FAILED`` with check ``running`` if the
            job's processes are already there).
        """
        name = self.config.job_name(run.job)
        job = self.config.jobs[name]
        if (other := self.engine_for(job)) is not None:
            return await other.start(run, on_step=on_step, cancelled=cancelled)
        try:
            current = await self._current(name)
            await self._preflight(run, name, job, {}, {}, on_step, running=current)
            await self._boundary(run, None, cancelled, on_step)
            run.patches = sorted(await self._patches_from_redis(name))
            await self._launch(run, name, job, on_step)
            await self._await_verify(run, job, on_step)
            return run
        except _Abort as stop:
            return await self._finish(run, stop.verdict, stop.line, stop.evidence)

    async def stop(self, run: RunRecord, *, on_step: StepCallback | None = None) -> RunRecord:
        """Stop the job (by its recorded identity) and nothing else.

        :returns: the run, finished; verdict None when the stop succeeded (the detail is in the
            ``stop`` step), ``STOP_FAILED`` when something survived.
        """
        name = self.config.job_name(run.job)
        job = self.config.jobs[name]
        if (other := self.engine_for(job)) is not None:
            return await other.stop(run, on_step=on_step)
        try:
            current = await self._current(name)
            run.old_pid = recorded_identity(current)["pid"]
            await self._stop(run, name, job, current, on_step)
        except _Abort as stop:
            return await self._finish(run, stop.verdict, stop.line, stop.evidence)
        run.finished_at = time.time()
        await self.runs.save(run)
        return run

    # --- verification ---------------------------------------------------------------------------

    async def verify(self, run: RunRecord) -> RunRecord:
        """Decide the verdict of a launched run from evidence up to launch + ``start_window``.

        Polls the host every ``verify_poll`` s; ends early when the process has exited.  At the
        deadline, in precedence order: ``EXITED`` (exit code or signal when known, last log
        lines), ``ERROR_IN_LOG``, ``WRONG_COUNT`` (expected vs seen), ``NO_PROGRESS`` (log
        silent), else ``RUNNING``; a run whose stop found a stale record is ``STALE_RECORD``.
        Re-runnable: a second call samples again.  Sets ``verdict``, ``verdict_line``,
        ``evidence``, ``finished_at``; saves; removes the run from ``keys.runs_unverified``.

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
        rec = run.step(Step.VERIFY)
        if rec is None:
            rec = StepRecord(step=Step.VERIFY, started_at=time.time())
            run.steps.append(rec)
        rec.outcome = Outcome.RUNNING
        rec.ended_at = None
        deadline = run.launched_at + job.start_window
        ev: Evidence | None = None
        failure: RemoteError | None = None
        while True:
            try:
                ev = await self._evidence(run, job)
                failure = None
            except RemoteError as exc:
                failure = exc
            now = time.time()
            if ev is not None and failure is None and ev.state != "alive":
                ev = await self._settle_exit(run, job, ev)
                break
            if now >= deadline and failure is None:
                break
            if failure is not None and now >= deadline + VERIFY_GRACE:
                rec.outcome = Outcome.FAILED
                rec.ended_at = now
                rec.detail = failure.message
                await self.runs.save(run)
                await self._publish(run, rec)
                raise failure
            delay = self.verify_poll if now >= deadline else min(self.verify_poll, deadline - now)
            await asyncio.sleep(max(0.05, delay))
        assert ev is not None
        verdict, line, evidence = self._decide(run, job, ev)
        run.verdict = verdict
        run.verdict_line = line
        ignored = check_resume(ev.start_step, ev.checkpoint, ev.sampled_at - run.launched_at).ignored
        if verdict is Verdict.RUNNING and ignored is not None and ev.checkpoint is not None:
            run.warning = messages.resume_warning(name, ignored, ev.checkpoint.path)
        run.evidence = evidence
        run.finished_at = time.time()
        rec.outcome = Outcome.OK if verdict is Verdict.RUNNING else Outcome.FAILED
        rec.ended_at = run.finished_at
        rec.detail = line
        await self.runs.save(run)
        await self._redis.zrem(keys.runs_unverified(self._prefix), run.id)
        await self._publish(run, rec)
        return run

    def _decide(self, run: RunRecord, job: JobConfig, ev: Evidence) -> tuple[Verdict, str, str]:
        pid = run.pid or 0
        tail = ev.tail.strip() or messages.log_since_launch_empty()
        facts = [
            f"pid {pid}: {ev.state}",
            f"processes matching {job.match!r} in session {run.sid}: {ev.count}/{job.processes}"
            + (f" (pids {', '.join(str(p) for p in ev.pids[:20])})" if ev.pids else ""),
            f"log {job.log}: "
            + (f"+{ev.new_bytes} bytes since launch" if ev.new_bytes is not None else f"{ev.log_error}"),
        ]
        if ev.state != "alive":
            st = ev.status or {}
            if st.get("started_at") is not None and st.get("ended_at") is not None:
                after = float(st["ended_at"]) - float(st["started_at"])
            else:
                after = ev.sampled_at - (run.launched_at or ev.sampled_at)
            verdict, line = Verdict.EXITED, messages.verdict_exited(st.get("code"), st.get("signal"), after)
        elif ev.error_line:
            verdict, line = Verdict.ERROR_IN_LOG, messages.verdict_error_in_log(pid, ev.error_line)
        elif ev.count != job.processes:
            verdict, line = Verdict.WRONG_COUNT, messages.verdict_wrong_count(ev.count, job.processes, pid)
        elif not ev.new_bytes or ev.new_bytes <= 0:
            silent = ev.sampled_at - (run.launched_at or ev.sampled_at)
            verdict, line = (
                Verdict.NO_PROGRESS,
                messages.verdict_no_progress(ev.count, job.processes, pid, silent),
            )
        else:
            resume = check_resume(
                ev.start_step, ev.checkpoint, ev.sampled_at - (run.launched_at or ev.sampled_at)
            )
            verdict, line = (
                Verdict.RUNNING,
                messages.verdict_running(
                    ev.count,
                    job.processes,
                    pid,
                    resumed_at=resume.started_at,
                    ignored_checkpoint=resume.ignored,
                ),
            )
        if ev.checkpoint is not None:
            facts.append(
                messages.checkpoint_fact(ev.checkpoint.path, ev.checkpoint.step, ev.checkpoint.age_s)
            )
        stop = run.step(Step.STOP)
        if stop is not None and stop.detail.startswith(messages.STALE_PREFIX):
            facts.insert(0, stop.detail)
            verdict, line = Verdict.STALE_RECORD, messages.verdict_stale_record(run.old_pid or 0, line)
        evidence = "\n".join(facts)
        if verdict is not Verdict.RUNNING:
            evidence += f"\n--- last {TAIL_LINES} log lines since launch ---\n{tail}"
        elif ev.tail.strip():  # healthy: a glimpse of the log is enough
            last = tail.rstrip("\n").splitlines()[-RUNNING_TAIL_LINES:]
            evidence += f"\n--- last {len(last)} log lines ---\n" + "\n".join(last)
        return verdict, line, evidence

    async def _settle_exit(self, run: RunRecord, job: JobConfig, ev: Evidence) -> Evidence:
        """The process is gone: give its waiter a moment to record the exit status."""
        for _ in range(10):
            if ev.status is not None:
                break
            await asyncio.sleep(0.1)
            try:
                ev = await self._evidence(run, job)
            except RemoteError:
                break
        return ev

    async def _evidence(self, run: RunRecord, job: JobConfig) -> Evidence:
        args: EvidenceArgs = {
            "name": run.job,
            "match": job.match,
            "pid": run.pid,
            "start_time": run.start_time,
            "sid": run.sid,
            "log": job.log,
            "offset": run.log_size_at_launch or 0,
            "tail_lines": TAIL_LINES,
            "progress_log": job.log,
            "progress_offset": run.log_size_at_launch or 0,
            "checkpoint_dir": job.checkpoint_dir,
        }
        raw = await call_helper(self.ssh, "evidence", args, job=run.job)
        info = raw.get("log")
        started = raw.get("start_step")
        return Evidence(
            state=str(raw.get("state") or "gone"),
            count=int(raw.get("count") or 0),
            pids=tuple(raw.get("pids") or ()),
            new_bytes=raw.get("new_bytes"),
            error_line=raw.get("error_line"),
            status=raw.get("status"),
            tail=str(raw.get("tail") or ""),
            log_error=info["error"] if info else None,
            sampled_at=time.time(),
            start_step=(started["said"] if started["said"] is not None else started["first"])
            if started
            else None,
            checkpoint=ResumePoint.from_helper(raw.get("checkpoint"), raw.get("time")),
        )

    # --- queries ---------------------------------------------------------------------------------

    async def job_processes(self, job: str) -> ProcessCount:
        """The job's processes now: members of its recorded session matching ``match``.

        :raises RemoteError: if the host cannot be probed.
        """
        name = self.config.job_name(job)
        spec = self.config.jobs[name]
        if (other := self.engine_for(spec)) is not None:
            return await other.job_processes(name)
        current = await self._current(name)
        probes = await probe_host(self.ssh, spec.host, [(name, spec, current)])
        probe = probes[name]
        if probe.error is not None:
            from pipeline.errors import HostUnreachable

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
        await self._store_patches(name, applied)
        return applied

    # --- steps ------------------------------------------------------------------------------------

    async def _preflight(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        wants: Mapping[str, str],
        texts: Mapping[str, str],
        on_step: StepCallback | None,
        *,
        running: Mapping[str, str] | None = None,
    ) -> PreflightAnswer:
        rec = await self._begin(run, Step.PREFLIGHT, on_step)
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
            await self._fail(run, rec, exc.message, on_step)
            raise _Abort(
                Verdict.PREFLIGHT_FAILED, messages.verdict_preflight_failed(check, exc.message)
            ) from None
        failed = [c for c in answer.get("checks", []) if not c.get("ok")]
        if failed:
            first = failed[0]
            detail = "; ".join(f"{c['check']}: {c['detail']}" for c in failed)
            await self._fail(run, rec, detail, on_step)
            raise _Abort(
                Verdict.PREFLIGHT_FAILED, messages.verdict_preflight_failed(first["check"], first["detail"])
            )
        seen = answer.get("running")
        if seen and (seen.get("alive") or seen.get("count")):
            pids = list(seen.get("pids") or []) or [int(recorded_identity(running)["pid"] or 0)]
            detail = messages.already_running(name, pids)
            await self._fail(run, rec, detail, on_step)
            raise _Abort(Verdict.PREFLIGHT_FAILED, messages.verdict_preflight_failed("running", detail))
        names = [c["check"] for c in answer.get("checks", [])]
        await self._end(run, rec, Outcome.OK, messages.step_preflight_ok(list(dict.fromkeys(names))), on_step)
        return answer

    async def _stop(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        current: Mapping[str, str] | None,
        on_step: StepCallback | None,
    ) -> str | None:
        """Stop the old run; returns the stale-record note if the record was stale."""
        rec = await self._begin(run, Step.STOP, on_step)
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
            await self._fail(run, rec, exc.message, on_step)
            raise _Abort(Verdict.STOP_FAILED, messages.verdict_stop_failed([], exc.message)) from None
        stale = answer.get("stale")
        note = (
            messages.stale_record(stale["pid"], stale.get("recorded"), stale.get("found")) if stale else None
        )
        targets = answer.get("targets") or []
        survivors = [int(p) for p in answer.get("survivors") or []]
        if targets:
            detail = messages.step_stopped(
                len(targets), float(answer.get("seconds") or 0), answer.get("killed") or [], job.stop_timeout
            )
        else:
            detail = messages.step_stop_nothing()
        if note:
            detail = f"{note}; {detail}"
        if survivors:
            why = messages.stop_failed(name, survivors, "")
            await self._fail(run, rec, f"{detail}; {why}", on_step)
            raise _Abort(Verdict.STOP_FAILED, messages.verdict_stop_failed(survivors, "survived SIGKILL"))
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
                await self._fail(run, rec, f"{detail}; {exc.message}", on_step)
                raise _Abort(Verdict.STOP_FAILED, messages.verdict_stop_failed([], exc.message)) from None
            holders = sorted({int(h["pid"]) for h in gpu.get("holders") or []})
            if holders:
                held = messages.gpu_memory_held(holders, float(gpu.get("seconds") or self.gpu_wait_timeout))
                await self._fail(run, rec, f"{detail}; {held}", on_step)
                raise _Abort(Verdict.STOP_FAILED, messages.verdict_stop_failed(holders, held))
            detail += "; " + messages.gpu_memory_freed(float(gpu.get("seconds") or 0))
        await self._mark_stopped(name, run)
        await self._end(run, rec, Outcome.OK, detail, on_step)
        return note

    async def _clear_cache(
        self, run: RunRecord, name: str, job: JobConfig, fresh: bool, on_step: StepCallback | None
    ) -> None:
        rec = await self._begin(run, Step.CLEAR_CACHE, on_step)
        if not fresh:
            await self._end(run, rec, Outcome.SKIPPED, messages.step_cache_skipped(), on_step)
            return
        if not job.clear_cache:
            await self._end(run, rec, Outcome.SKIPPED, messages.step_cache_none(), on_step)
            return
        try:
            answer = await call_helper(
                self.ssh, "clear", {"paths": list(job.clear_cache)}, job=name, timeout=CALL_TIMEOUT * 4
            )
        except RemoteError as exc:
            await self._fail(run, rec, exc.message, on_step)
            raise _Abort(Verdict.LAUNCH_FAILED, messages.verdict_launch_failed(exc.message)) from None
        cleared = answer.get("cleared") or []
        detail = messages.step_cache_cleared(
            [
                (c["path"], int(c.get("files", 0)), int(c.get("bytes", 0)), bool(c.get("missing")))
                for c in cleared
            ]
        )
        errors = [e for c in cleared for e in c.get("errors", [])]
        if errors:
            why = f"cannot clear cache: {'; '.join(errors[:3])}"
            await self._fail(run, rec, f"{detail}; {why}", on_step)
            raise _Abort(Verdict.LAUNCH_FAILED, messages.verdict_launch_failed(why))
        await self._end(run, rec, Outcome.OK, detail, on_step)

    async def _patch(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        texts: Mapping[str, str],
        applied: Mapping[str, bool],
        add: Sequence[str],
        remove: Sequence[str],
        on_step: StepCallback | None,
    ) -> None:
        rec = await self._begin(run, Step.PATCH, on_step)
        in_effect = sorted(n for n, on in applied.items() if on)
        to_apply = [p for p in add if not applied.get(p)]
        to_revert = [p for p in remove if applied.get(p)]
        if not to_apply and not to_revert:
            run.patches = in_effect
            await self._store_patches(name, in_effect)
            await self._end(run, rec, Outcome.SKIPPED, messages.step_patches([], [], in_effect), on_step)
            return
        try:
            answer = await call_helper(
                self.ssh,
                "patch",
                {"workdir": job.workdir, "apply": to_apply, "revert": to_revert},
                job=name,
                stdin=json.dumps(dict(texts)),
                timeout=CALL_TIMEOUT * 2,
            )
        except RemoteError as exc:
            await self._fail(run, rec, exc.message, on_step)
            raise _Abort(
                Verdict.LAUNCH_FAILED, messages.verdict_launch_failed(messages.patch_failed(exc.message))
            ) from None
        in_effect = sorted(answer.get("in_effect") or [])
        run.patches = in_effect
        await self._store_patches(name, in_effect)
        detail = messages.step_patches(answer.get("applied") or [], answer.get("reverted") or [], in_effect)
        if answer.get("failed"):
            why = messages.patch_failed("; ".join(answer["failed"]))
            await self._fail(run, rec, f"{detail}; {why}", on_step)
            raise _Abort(Verdict.LAUNCH_FAILED, messages.verdict_launch_failed(why))
        await self._end(run, rec, Outcome.OK, detail, on_step)

    async def _launch(self, run: RunRecord, name: str, job: JobConfig, on_step: StepCallback | None) -> None:
        rec = await self._begin(run, Step.LAUNCH, on_step)
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
            detail = messages.launch_hung(exc.timeout, await self._state_text(name, job))
            await self._fail(run, rec, detail, on_step)
            raise _Abort(Verdict.LAUNCH_FAILED, messages.verdict_launch_failed(detail)) from None
        except RemoteError as exc:
            detail = exc.message
            if not isinstance(exc, HostKeyRejected):
                detail += f"; process state: {await self._state_text(name, job)}"
            await self._fail(run, rec, detail, on_step)
            raise _Abort(Verdict.LAUNCH_FAILED, messages.verdict_launch_failed(detail)) from None
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
        key = keys.job_current(self._prefix, name)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping=current)
            pipe.zadd(keys.runs_unverified(self._prefix), {run.id: run.launched_at + job.start_window})
            await pipe.execute()
        await self._end(
            run, rec, Outcome.OK, messages.step_launched(run.pid, job.log, run.log_size_at_launch), on_step
        )

    async def _await_verify(self, run: RunRecord, job: JobConfig, on_step: StepCallback | None) -> None:
        rec = StepRecord(
            step=Step.VERIFY,
            started_at=time.time(),
            outcome=Outcome.WAITING,
            detail=messages.step_verify_waiting(job.start_window),
        )
        run.steps.append(rec)
        await self.runs.save(run)
        await self._emit(run, rec, on_step)

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

    async def _patch_texts(
        self, run: RunRecord, name: str, job: JobConfig, asked: Sequence[str], on_step: StepCallback | None
    ) -> dict[str, str]:
        unknown = [p for p in asked if p not in job.patches]
        if unknown:
            rec = await self._begin(run, Step.PREFLIGHT, on_step)
            known = ", ".join(job.patches) or "none"
            detail = f"unknown patch {', '.join(unknown)} for {name} (known: {known})"
            await self._fail(run, rec, detail, on_step)
            raise _Abort(Verdict.PREFLIGHT_FAILED, messages.verdict_preflight_failed("patch", detail))
        texts: dict[str, str] = {}
        for patch, path in job.patches.items():
            try:
                texts[patch] = await asyncio.to_thread(Path(path).read_text, encoding="utf-8")
            except OSError as exc:
                if patch not in asked:
                    continue
                rec = await self._begin(run, Step.PREFLIGHT, on_step)
                detail = f"{patch}: cannot read {path}: {exc.strerror}"
                await self._fail(run, rec, detail, on_step)
                raise _Abort(
                    Verdict.PREFLIGHT_FAILED, messages.verdict_preflight_failed("patch", detail)
                ) from None
        return texts

    async def _boundary(
        self, run: RunRecord, after: Step | None, cancelled: CancelCheck | None, on_step: StepCallback | None
    ) -> None:
        asked = bool(await self._redis.exists(keys.cancel_request(self._prefix, run.id)))
        if not asked and cancelled is not None:
            asked = await cancelled()
        if asked:
            raise _Abort(
                Verdict.CANCELLED,
                messages.verdict_cancelled(after.value if after else None),
                messages.run_cancelled(run.job, run.id, after.value if after else None),
            )

    async def _current(self, name: str) -> dict[str, str]:
        raw = await self._redis.hgetall(keys.job_current(self._prefix, name))
        return {str(k): str(v) for k, v in raw.items()}

    async def _mark_stopped(self, name: str, run: RunRecord) -> None:
        key = keys.job_current(self._prefix, name)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(key, "pid", "start_time", "sid", "pgid")
            pipe.hset(
                key, mapping={"state": "stopped", "stopped_at": repr(time.time()), "stopped_by": run.id}
            )
            await pipe.execute()

    async def _store_patches(self, name: str, in_effect: Sequence[str]) -> None:
        key = keys.job_patches(self._prefix, name)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            if in_effect:
                pipe.sadd(key, *in_effect)
            await pipe.execute()

    async def _patches_from_redis(self, name: str) -> set[str]:
        return {str(m) for m in await self._redis.smembers(keys.job_patches(self._prefix, name))}

    def _job_key(self, job: str) -> str:
        try:
            return self.config.job_name(job)
        except KeyError:
            return job

    async def _begin(self, run: RunRecord, step: Step, on_step: StepCallback | None) -> StepRecord:
        rec = StepRecord(step=step, started_at=time.time())
        run.steps.append(rec)
        await self.runs.save(run)
        await self._emit(run, rec, on_step)
        return rec

    async def _end(
        self, run: RunRecord, rec: StepRecord, outcome: Outcome, detail: str, on_step: StepCallback | None
    ) -> None:
        rec.ended_at = time.time()
        rec.outcome = outcome
        rec.detail = detail
        await self.runs.save(run)
        await self._emit(run, rec, on_step)

    async def _fail(self, run: RunRecord, rec: StepRecord, detail: str, on_step: StepCallback | None) -> None:
        await self._end(run, rec, Outcome.FAILED, detail, on_step)

    async def _emit(self, run: RunRecord, rec: StepRecord, on_step: StepCallback | None) -> None:
        await self._publish(run, rec)
        if on_step is not None:
            await on_step(run, rec)

    async def _publish(self, run: RunRecord, rec: StepRecord) -> None:
        await self.events.publish(
            EventKind.STEP,
            run.job,
            run_id=run.id,
            step=rec.step.value,
            outcome=rec.outcome.value,
            detail=rec.detail,
        )

    async def _finish(self, run: RunRecord, verdict: Verdict, line: str, evidence: str) -> RunRecord:
        run.verdict = verdict
        run.verdict_line = line
        run.evidence = evidence or line
        run.finished_at = time.time()
        await self.runs.save(run)
        return run
