"""The ssh engine (:class:`SshEngine`): a job's steps and looks on one host, through the host helper.

The two classic failures cannot happen: the old run is stopped by its recorded identity (pid +
start time, field 22 of ``/proc/PID/stat``, and its ``setsid`` session: pid = pgid = sid) by a
helper that reads ``/proc`` and excludes its own ancestry (:mod:`pipeline.host.helper`), never by
a pattern a shell could match in its own command line; and the launch is fully detached (new
session, stdin ``/dev/null``, output appended to the log, no descriptor of the SSH channel kept),
so the SSH call returns at once, also through wrappers such as ``pct exec``.  A stop that found
the recorded pid reused marks its step ``stale``, which makes the verdict ``STALE_RECORD``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from pipeline import verdict
from pipeline.config import JobConfig
from pipeline.engines.base import Entry, NodeOutputs, Observation, Plan, Reads, Sighting, Target
from pipeline.engines.steplog import (
    STOP_NOTHING,
    failed_checks,
    stale_record,
    step_preflight_ok,
    step_stopped,
)
from pipeline.engines.workdir import CALL_TIMEOUT, WorkdirSteps
from pipeline.errors import HostKeyRejected, RemoteError, RemoteTimeout, StopFailed
from pipeline.host.contract import LaunchArgs, StopArgs
from pipeline.host.probe import Ops, call_helper, probe_host, recorded_identity
from pipeline.observe.checkpoints import resume_argv
from pipeline.observe.evidence import gather
from pipeline.state.incidents import LOG_LINES
from pipeline.state.runs import RunRecord
from pipeline.verdict import Outcome, Step

log = logging.getLogger(__name__)

KILL_TIMEOUT = 10.0  #: seconds to wait for processes to vanish after SIGKILL
LAUNCH_TIMEOUT = 15.0  #: seconds for the launch call (it returns in well under one)


class SshEngine(WorkdirSteps):
    """:class:`pipeline.engines.base.Engine` for ``engine = "ssh"`` jobs: one process group on one host."""

    gpu_wait_timeout = 60.0  #: seconds to wait for GPU memory of a stopped run to be released

    @staticmethod
    def check(job: JobConfig, at: str) -> list[str]:
        """:meth:`EngineKind.check <pipeline.engines.base.EngineKind.check>`: ``launch`` is set and
        no Slurm table is."""
        problems = [f"{at}: launch: required key is missing"] if not job.launch else []
        if job.slurm is not None:
            problems.append(f'{at}: [jobs.NAME.slurm] is set but engine is "ssh" (set engine = "slurm")')
        return problems

    async def preflight(self, run: RunRecord, t: Target, plan: Plan) -> Mapping[str, bool]:
        """One helper call checks host, workdir, program, patches, log directory and free space
        (and, for a start, that the recorded run's processes are gone)."""
        rec = await self.steps.begin(run, Step.PREFLIGHT)
        answer = await self._preflight_call(run, rec, t, t.job.launch[0], plan)
        if failed := failed_checks(answer.get("checks", [])):
            raise await self.steps.refuse(run, rec, t.name, *failed)
        seen = answer.get("running")
        if seen and (seen.get("alive") or seen.get("count")):
            pids = list(seen.get("pids") or []) or [int(recorded_identity(t.current)["pid"] or 0)]
            detail = f"{t.name} is already running (pid {', '.join(str(p) for p in pids[:10])}) - use restart"
            raise await self.steps.refuse(run, rec, t.name, "running", detail)
        names = [c["check"] for c in answer.get("checks", [])]
        checked = await self.checkpoint_check(run, rec, t)
        done = step_preflight_ok([*names, *(["checkpoint"] if checked else [])])
        await self.steps.end(run, rec, Outcome.OK, f"{done}; {checked}" if checked else done)
        return answer.get("applied") or {}

    async def stop(self, run: RunRecord, t: Target) -> None:
        """Stop the recorded process group (SIGTERM, ``stop_timeout``, SIGKILL), never by pattern."""
        name, job, ident = t.name, t.job, recorded_identity(t.current)
        run.old_pid = ident["pid"]
        rec = await self.steps.begin(run, Step.STOP)
        args: StopArgs = {
            **ident,
            "match": job.match,
            "workdir": job.workdir,
            "term_timeout": job.stop_timeout,
            "kill_timeout": KILL_TIMEOUT,
        }
        try:
            answer = await call_helper(
                self.ssh, Ops.stop(args), job=name, timeout=job.stop_timeout + 2 * KILL_TIMEOUT + CALL_TIMEOUT
            )
        except RemoteError as exc:
            raise await self.steps.stop_failed(run, rec, name, exc.message) from None
        stale, targets, survivors = answer["stale"], answer["targets"], answer["survivors"]
        rec.stale = stale is not None
        note = stale_record(stale["pid"], stale["recorded"], stale["found"]) if stale else None
        stopped = step_stopped(len(targets), answer["seconds"], answer["killed"], job.stop_timeout)
        detail = (f"{note}; " if note else "") + (stopped if targets else STOP_NOTHING)
        if survivors:
            failure = StopFailed(name, survivors, line=verdict.stop_failed(survivors, "survived SIGKILL"))
            await self.steps.end(run, rec, Outcome.FAILED, f"{detail}; {failure.message}")
            raise failure
        if job.gpus is not None and job.gpus.all and targets:
            pairs: list[tuple[int, int | None]] = [(x["pid"], x["start_time"]) for x in targets]
            try:
                gpu = await call_helper(
                    self.ssh,
                    Ops.gpu_wait({"targets": pairs, "timeout": self.gpu_wait_timeout, "nvidia_smi": None}),
                    host=job.host,
                    timeout=self.gpu_wait_timeout + CALL_TIMEOUT,
                )
            except RemoteError as exc:
                raise await self.steps.stop_failed(run, rec, name, exc.message, done=detail) from None
            if holders := sorted({h["pid"] for h in gpu["holders"]}):
                took, pids = gpu["seconds"], ", ".join(str(p) for p in holders)
                held = f"GPU memory still held by old pid {pids} after {took:.0f} s - not relaunching"
                raise await self.steps.stop_failed(run, rec, name, held, holders, detail)
            detail += f"; GPU memory released ({gpu['seconds']:.1f} s)"
        await self.steps.records.mark_stopped(name, run.id)
        await self.steps.end(run, rec, Outcome.OK, detail)
        if note:
            log.info("%s: %s", run.id, note)

    async def launch(self, run: RunRecord, t: Target) -> None:
        """Launch fully detached (new session); the SSH call returns at once."""
        name, job = t.name, t.job
        rec = await self.steps.begin(run, Step.LAUNCH)
        args: LaunchArgs = {
            "workdir": job.workdir,
            "argv": resume_argv(job, run.resume_step),
            "log": job.log,
            "name": name,
            "run_id": run.id,
        }
        try:
            answer = await call_helper(self.ssh, Ops.launch(args), job=name, timeout=LAUNCH_TIMEOUT)
        except RemoteError as exc:
            hung = f"launch channel hung for {exc.timeout:g} s" if isinstance(exc, RemoteTimeout) else None
            detail = hung or exc.message
            if not isinstance(exc, HostKeyRejected):
                detail += f"; process state: {await self._state_text(name, job)}"
            raise await self.steps.launch_failed(run, rec, name, detail) from None
        run.pid, run.pgid, run.sid = answer["pid"], answer["pgid"], answer["sid"]
        run.start_time, run.log_size_at_launch = answer["start_time"], answer["log_size"]
        ident = dict(pid=run.pid, start_time=run.start_time, sid=run.sid, pgid=run.pgid, log=job.log)
        await self.steps.launched(run, name, job.start_window, log_size=run.log_size_at_launch, **ident)
        detail = f"pid {run.pid} (new session), log {job.log} from byte {run.log_size_at_launch}"
        if run.resume_step is not None:
            detail += f"; resume_from step {run.resume_step}"
        await self.steps.end(run, rec, Outcome.OK, detail)

    async def observe(self, run: RunRecord, t: Target, *, complete: bool) -> Observation:
        """One helper ``evidence`` sample, always complete (:func:`~pipeline.observe.evidence.gather`)."""
        return await gather(self.ssh, run, t.job)

    async def observe_many(self, entries: Sequence[Entry], reads: Reads | None = None) -> dict[str, Sighting]:
        """One helper ``probe`` call per ``exec`` prefix for every job of one host, ``reads``
        included, and a job short of processes with its log's last
        :data:`~pipeline.state.incidents.LOG_LINES` lines and exit record (``probe.tail``,
        ``probe.exit_status``)."""
        if not entries:
            return {}
        probes = await probe_host(self.ssh, entries[0][1].host, entries, reads, tail_lines=LOG_LINES)
        out: dict[str, Sighting] = {}
        for name, spec, current in entries:
            p = probes[name]
            out[name] = Sighting(p, spec.processes, p.state or "none", pid=recorded_identity(current)["pid"])
        return out

    async def node_outputs(self, t: Target, argv: Sequence[str]) -> NodeOutputs | None:
        """None: the job runs on its host, which ``gpus HOST`` asks."""
        return None

    async def _state_text(self, name: str, job: JobConfig) -> str:
        """What runs for the job now, in words (for a launch that hung or lost its channel)."""
        p = (await probe_host(self.ssh, job.host, [(name, job, None)]))[name]  # never raises: p.error
        if p.error:
            return f"unknown ({p.error})"
        if not p.pids:
            return f"no process matching {job.match!r}"
        return f"{p.count} process(es) matching {job.match!r}: pid {', '.join(str(x) for x in p.pids[:10])}"
