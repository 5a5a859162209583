"""The Slurm engine: the restart sequence's steps on a Slurm cluster, through its login node (the
host helper's checks run there: the workdir is shared).  A job still queued is ``pending``, not a
failure: the runner verifies it again until it runs or ends.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import re
import signal
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError

from pipeline.config import Config, JobConfig, validation_problems
from pipeline.config.base import _Model, matching
from pipeline.engines.base import Entry, NodeOutputs, Observation, Plan, Reads, Sighting, Target
from pipeline.engines.steplog import STOP_NOTHING, StepLog, failed_checks, step_preflight_ok
from pipeline.engines.workdir import WorkdirSteps
from pipeline.errors import (
    PitstopError,
    PreflightFailed,
    RemoteCommandError,
    RemoteError,
)
from pipeline.host import slurm
from pipeline.host.probe import JobProbe, parse_int
from pipeline.host.remote import RemoteHosts
from pipeline.host.slurm import SlurmClient, SlurmJob
from pipeline.observe.evidence import gather
from pipeline.state.runs import RunRecord
from pipeline.verdict import Outcome, Step

log = logging.getLogger(__name__)

#: seconds a requeue whose cause the cluster does not show yet waits to be told: the preempting job
#: starts once the preempted one has left its nodes, a little after the requeue
CAUSE_WAIT = 15.0
KILL_TIMEOUT = 10.0  #: seconds for a job to leave after a second scancel, beyond ``KILL_WAIT``
STOP_POLL = 0.5  #: seconds between state checks while a job stops
KILL_WAIT = 60.0  #: seconds a job may take to leave after a plain scancel (covers Slurm's KillWait)

_PREFLIGHT = r"""
script="$1"; shift
[ -r "$script" ] && echo "@@script=ok"
sinfo -h -o '%P|%a' 2>&1
echo "@@test"; sbatch --test-only "$@" "$script" 2>&1; echo "@@rc=$?"
"""


def _partition(args: Sequence[str]) -> str | None:
    """The partition ``args`` ask for (``-p P``, ``-pP``, ``--partition P``, ``--partition=P``), first one."""
    found = re.search(r"(?:^|\0)(?:-p\0?|--partition[=\0])([^\0]+)", "\0".join(args))
    return found[1] if found else None


def _signame(number: int | None) -> str | None:
    """``SIGTERM`` for 15 (``signal 99`` for a number without a name); None for none."""
    return ({s.value: s.name for s in signal.Signals}.get(number) or f"signal {number}") if number else None


def _warning_signal(value: str) -> str:
    """``[jobs.NAME.slurm] signal``: ``SIG[@SECONDS]`` as ``sbatch --signal`` takes it, the signal
    a name (``USR1``, ``SIGUSR1``) or number (1-64), the seconds before the time limit 0-65535
    (Slurm's default 60); no ``B:`` (it would reach only the batch shell).

    :raises ValueError: naming what is wrong and the fix.
    """
    if value[:2].upper() == "B:":
        raise ValueError(_no_batch_only(value))
    sig, at, seconds = value.removeprefix("R:").partition("@")
    names = {s.name.removeprefix("SIG") for s in signal.Signals}
    if not (sig.isdigit() and 1 <= int(sig) <= 64) and sig.upper().removeprefix("SIG") not in names:
        close = difflib.get_close_matches(sig.upper().removeprefix("SIG"), sorted(names), n=1)
        raise ValueError(_unknown_signal(value, sig, close[0] if close else None))
    if at and not (seconds.isdigit() and int(seconds) <= 65535):
        raise ValueError(_bad_signal_time(value, seconds))
    return value


class SlurmSettings(_Model):
    """``[jobs.NAME.slurm]``: the job is a Slurm batch job; the job's ``host`` is the login node."""

    #: the batch script on the login node (absolute path)
    script: Annotated[str, matching("(?s)/.*", "must be an absolute path on the login node")]
    #: extra sbatch arguments, e.g. ["--partition", "gpu"]
    sbatch_args: list[str] = Field(default_factory=list)
    #: restart with ``scontrol requeuehold`` + ``release`` (same job id), else scancel + sbatch
    requeue: bool = False
    nodes: int = Field(default=1, ge=1)  #: nodes the job runs on
    tasks_per_node: int | None = Field(default=None, ge=1)  #: processes per node (else ``processes``)
    #: ``sbatch --signal``: ``USR1@120`` sends SIGUSR1 to every job step 120 s (up to 60 s more)
    #: before the time limit, so the job can save its work (None: none)
    signal: Annotated[str, AfterValidator(_warning_signal)] | None = None
    #: resubmit the job when it ends at its time limit (Slurm's ``TIMEOUT``), verified like a restart
    resubmit_on_timeout: bool = False

    @property
    def submit_args(self) -> list[str]:
        """``sbatch_args`` with ``--signal=…`` when a ``signal`` is set."""
        return [*self.sbatch_args, *([f"--signal={self.signal}"] if self.signal else [])]


def settings(job: JobConfig) -> SlurmSettings:
    """The job's ``[jobs.NAME.slurm]`` table (checked when the config was: :meth:`SlurmEngine.check`)."""
    return SlurmSettings.model_validate(job.slurm or {})


def resubmits_on_timeout(job: JobConfig) -> bool:
    """Whether ``job`` is a Slurm job to resubmit when it reaches its time limit (``resubmit_on_timeout``)."""
    return job.engine == "slurm" and settings(job).resubmit_on_timeout


def expected_processes(job: JobConfig) -> int:
    """Processes the job should have: ``nodes`` × ``tasks_per_node``, else ``processes``."""
    sl = settings(job)
    return sl.nodes * sl.tasks_per_node if sl.tasks_per_node is not None else job.processes


def clusters(config: Config) -> dict[str, tuple[str, ...]]:
    """The Slurm clusters Pitstop knows, each named by its login node and ``exec`` prefix (``login``,
    ``login env SLURM_CONF=/etc/b.conf``), with its Slurm jobs in config order: node verbs run
    through the first (its host, its ``exec``)."""
    out: dict[str, tuple[str, ...]] = {}
    for name, job in config.jobs.items():
        if job.engine == "slurm":
            key = " ".join([job.host, *job.exec])
            out[key] = (*out.get(key, ()), name)
    return out


def cluster_of(config: Config, job: str) -> str:
    """The name of the cluster of Slurm job ``job`` (as :func:`clusters` names it)."""
    return next(key for key, jobs in clusters(config).items() if job in jobs)


class SlurmEngine(WorkdirSteps):
    """:class:`pipeline.engines.base.Engine` for ``engine = "slurm"`` jobs: a batch job on a cluster,
    driven through its login node (the job's ``host``)."""

    kernel_log = False  #: its tasks run on compute nodes: the login node's dmesg says nothing of them
    nodes = True  #: a cluster's nodes: ``nodes``, ``drain``, ``restart … excluding``, suspects
    resume_step = False  #: the batch script is submitted as configured (``resume_from`` is not appended)

    def __init__(self, ssh: RemoteHosts, steps: StepLog) -> None:
        super().__init__(ssh, steps)
        self.client = SlurmClient(ssh)
        #: Slurm job id → the nodes and ``StartTime`` of its run last seen RUNNING: where a requeue
        #: happened, read when Slurm's ``Restarts`` grows (:func:`pipeline.host.slurm.requeue_cause`)
        self._ran: dict[int, tuple[tuple[str, ...], str]] = {}
        #: Slurm job id → when (monotonic s) its requeue was first seen without a cause to tell
        self._unexplained: dict[int, float] = {}

    @staticmethod
    def check(job: JobConfig, at: str) -> list[str]:
        """:meth:`EngineKind.check <pipeline.engines.base.EngineKind.check>`: the job's
        ``[jobs.NAME.slurm]`` table is there and valid (:class:`SlurmSettings`)."""
        if job.slurm is None:
            return [f'{at}: engine "slurm" needs a [jobs.NAME.slurm] table with at least script']
        try:
            settings(job)
        except ValidationError as exc:
            return validation_problems(exc, f"{at}.slurm", SlurmSettings)
        return []

    async def preflight(self, run: RunRecord, t: Target, plan: Plan) -> Mapping[str, bool]:
        """Partition, script, ``sbatch --test-only``, the helper's checks, and (a start) the
        recorded job no longer active."""
        name, job, sl = t.name, t.job, settings(t.job)
        old = parse_int(t.current.get("slurm_job")) if plan.start else None
        rec = await self.steps.begin(run, Step.PREFLIGHT)

        async def fail(check: str, detail: str) -> PreflightFailed:
            return await self.steps.refuse(run, rec, name, check, detail)

        script = ["bash", "-c", _PREFLIGHT, "pitstop-slurm-preflight", sl.script, "-D", job.workdir]
        try:
            result = await self.client.checked(name, [*script, *sl.submit_args])
            j = await self.client.one(name, old) if old is not None else None
        except RemoteError as exc:
            raise await fail("host", exc.message) from None
        answer = await self._preflight_call(run, rec, t, "sbatch", replace(plan, start=False))
        head, _, test = result.stdout.partition("@@test\n")  # the script's check and sinfo's lines first
        info = [line for line in head.splitlines() if line != "@@script=ok"]
        parts = {p.split("|")[0]: p.split("|")[1] for p in info if "|" in p}
        want = _partition(sl.sbatch_args) or next((p for p in parts if p.endswith("*")), None)
        if not want or parts.get(want, parts.get(f"{want}*")) != "up":
            known = ", ".join(f"{p.rstrip('*')} {s}" for p, s in parts.items()) or " ".join(info)[:200]
            shown = want.rstrip("*") if want else "(default)"
            raise await fail("partition", f"partition {shown} is not up ({known or 'none'})")
        if "@@script=ok" not in head:
            raise await fail("script", f"{sl.script}: no such file on {job.host}")
        *said, rc = test.splitlines() or [""]
        if rc != "@@rc=0":
            raise await fail("sbatch", "sbatch --test-only refused the job: " + " ".join(said)[-300:])
        helper = [c for c in answer.get("checks", []) if c.get("check") != "launch"]
        if failed := failed_checks(helper):
            raise await self.steps.refuse(run, rec, name, *failed)
        if j is not None and j.active:
            raise await fail("running", f"{name} is already {j.state} as Slurm job {j.id}")
        names = ["partition", "script", "sbatch", *(c["check"] for c in helper)]
        await self.steps.end(run, rec, Outcome.OK, step_preflight_ok(names))
        return answer.get("applied") or {}

    async def _wait_gone(self, name: str, job_id: int, timeout: float) -> SlurmJob | None:
        """Poll until the job holds no allocation (or ``timeout`` s); its last known state."""
        deadline = time.monotonic() + timeout
        while True:
            j = await self.client.one(name, job_id)
            if j is None or not j.active or time.monotonic() >= deadline:
                return j
            await asyncio.sleep(STOP_POLL)

    async def _scancel(self, name: str, job_id: int, *args: str) -> tuple[bool, SlurmJob | None]:
        """``scancel ARGS JOB_ID``: ``(True, None)`` once sent; ``(False, its state)`` when scancel
        refused a job that is no longer active (it ended since it was last looked at).
        :raises RemoteError: if scancel failed and the job is still active (or cannot be asked)."""
        try:
            await self.client.checked(name, ["scancel", *args, str(job_id)])
            return True, None
        except RemoteCommandError:
            j = await self.client.one(name, job_id)
            if j is not None and j.active:
                raise
            return False, j

    async def stop(self, run: RunRecord, t: Target) -> None:
        """``scancel --signal=TERM --full``, ``stop_timeout``, ``scancel``, until the old job id has
        left; a job that ended before its first scancel (scancel refuses it) had nothing to stop."""
        name, job = t.name, t.job
        old = run.old_slurm_job = parse_int(t.current.get("slurm_job"))
        rec = await self.steps.begin(run, Step.STOP)
        try:
            j = await self.client.one(name, old) if old is not None else None
            sent = False
            if old is not None and j is not None and j.active:
                began, pending = time.monotonic(), j.state == "PENDING"
                how = "scancel (pending)" if pending else "SIGTERM"
                sent, j = await self._scancel(name, old, *([] if pending else ["--signal=TERM", "--full"]))
            if old is not None and sent:
                j = await self._wait_gone(name, old, job.stop_timeout)
                if j is not None and j.active:
                    how = f"scancel after {job.stop_timeout:.0f} s"
                    again, j = await self._scancel(name, old)
                    if again:
                        j = await self._wait_gone(name, old, KILL_TIMEOUT + KILL_WAIT)
        except RemoteError as exc:
            raise await self.steps.stop_failed(run, rec, name, exc.message) from None
        if j is not None and j.active:
            raise await self.steps.stop_failed(
                run, rec, name, f"Slurm job {old} is still {j.state} after scancel"
            )
        if sent:
            ended = slurm.job_ended(j) if j is not None else f"job {old} left the queue"
            detail = f"stopped Slurm job {old} in {time.monotonic() - began:.1f} s ({how}); {ended}"
        else:  # it had ended (scancel refused it) or was never recorded
            detail = slurm.job_ended(j) + "; nothing to stop" if j is not None else STOP_NOTHING
        await self.steps.records.mark_stopped(name, run.id)
        await self.steps.end(run, rec, Outcome.OK, detail)

    async def launch(self, run: RunRecord, t: Target) -> None:
        """``sbatch --hold`` (or ``scontrol requeuehold``), measure the output, ``scontrol release``;
        the run's ``exclude`` nodes as ``--exclude`` (a requeued job: its ``ExcNodeList``).  A
        ``requeue`` run (Slurm requeued the recorded job itself) submits nothing: the job is
        recorded as Slurm relaunched it, its output measured now."""
        name, job, sl = t.name, t.job, settings(t.job)
        old = parse_int(t.current.get("slurm_job"))
        rec = await self.steps.begin(run, Step.LAUNCH)
        left_out = ",".join(run.exclude)
        requeue = run.action == "requeue"  # Slurm relaunched the recorded job itself: nothing to submit
        if requeue and old is None:
            raise await self.steps.launch_failed(run, rec, name, "no Slurm job is recorded")
        try:
            # held until measured: it cannot write before verification's offset is taken
            if requeue and old is not None:
                job_id, how = old, f"Slurm requeued job {old}"
            elif sl.requeue and old is not None:
                await self.client.checked(name, ["scontrol", "requeuehold", str(old)])
                if left_out:
                    update = ["scontrol", "update", f"JobId={old}", f"ExcNodeList={left_out}"]
                    await self.client.checked(name, update)
                job_id, how = old, f"requeued Slurm job {old}"
            else:
                args = [*sl.submit_args, *([f"--exclude={left_out}"] if left_out else [])]
                job_id = await self.client.submit(name, job.workdir, sl.script, args)
                how = f"submitted Slurm job {job_id}"
            how += f" excluding {', '.join(run.exclude)}" if run.exclude else ""
            try:
                j = await self.client.one(name, job_id)
                stdout = (j.stdout if j is not None else None) or job.log
                size = await self.client.file_size(name, stdout)
            finally:
                if not requeue:
                    await self.client.checked(name, ["scontrol", "release", str(job_id)])
        except RemoteError as exc:
            raise await self.steps.launch_failed(run, rec, name, exc.message) from None
        run.slurm_job = job_id
        run.log_size_at_launch = size
        restarts = j.restarts if j is not None else 0  # Pitstop's own requeue is no requeue to tell
        await self.steps.launched(
            run, name, job.start_window, engine="slurm", slurm_job=job_id, log=stdout, slurm_restarts=restarts
        )
        await self.steps.end(run, rec, Outcome.OK, f"{how}; output {stdout} from byte {size}")

    async def observe(self, run: RunRecord, t: Target, *, complete: bool) -> Observation:
        """The run's Slurm job: its state alone, or (``complete``) with its tasks and output since launch."""
        name, job, job_id = t.name, t.job, run.slurm_job or 0
        j = await self.client.one(name, job_id)
        now = time.time()
        seen = partial(Observation, job_id=job_id, sampled_at=now)
        if j is None:
            gone = f"Slurm job {job_id} is no longer known to the cluster"
            return seen("gone", facts=(gone,), output="output")
        if j.active and j.state != "RUNNING":
            fact = f"Slurm job {job_id}: {j.state}, reason {j.reason or 'None'}"
            why, settling = j.reason or j.state, j.state == "COMPLETING"
            return seen("pending", pending_reason=why, facts=(fact,), settling=settling)
        started, state = now - (j.elapsed or 0.0), "alive" if j.active else "gone"
        if not complete:
            return seen(state, started_at=started, complete=False)
        path = j.stdout or job.log
        out = await gather(self.ssh, run, job, log=path, processes=False)
        facts = [f"Slurm job {job_id}: {j.state} on {j.nodes} node(s) {','.join(j.nodelist)}".rstrip()]
        more: dict[str, Any]
        if not j.active:
            facts.append(slurm.job_ended(j))
            more = dict(exit_code=j.exit_code, signal=_signame(j.signal), ran_for=j.elapsed or 0)
        else:
            sl = settings(job)
            per_node = sl.tasks_per_node or max(1, job.processes // sl.nodes)
            tasks = await self.client.node_tasks(name, job_id, job.match)
            short = [f"{t.node}: {t.count}/{per_node}" for t in tasks if t.count != per_node]
            short += [f"{n}: no answer" for n in j.nodelist if n not in {t.node for t in tasks}]
            if j.nodes != sl.nodes:
                short.insert(0, f"{j.nodes}/{sl.nodes} nodes")
            cells = "; ".join(
                f"{t.node} {t.count}/{per_node}" + (f" ({t.error})" if t.error else "") for t in tasks
            )
            facts.append(f"tasks matching {job.match!r}: {cells}")
            grew = f"+{out.new_bytes} bytes since launch" if out.new_bytes is not None else "unreadable"
            facts.append(f"output {path}: {grew}")
            more = dict(
                count=sum(t.count for t in tasks), expected=expected_processes(job), short=tuple(short)
            )
            more |= dict(new_bytes=out.new_bytes, error_line=out.error_line or None)
        more |= dict(tail=out.tail, start_step=out.start_step, checkpoint=out.checkpoint)
        more |= dict(nodelist=j.nodelist)
        return seen(state, nodes=j.nodes, started_at=started, output="output", facts=tuple(facts), **more)

    async def observe_many(self, entries: Sequence[Entry], reads: Reads | None = None) -> dict[str, Sighting]:
        """One call on the login node for every job of its cluster: ``squeue``/``scontrol``/``sacct``,
        output sizes, ``reads`` and one ``srun`` per RUNNING job for its tasks (its error, if any,
        in its sighting)."""
        ids = {name: parse_int((cur or {}).get("slurm_job")) for name, _, cur in entries}
        paths = {name: (cur or {}).get("log") or cfg.log for name, cfg, cur in entries}
        #: Slurm's requeues of each job when Pitstop launched it (its own ``requeuehold`` counts)
        known = {name: parse_int((cur or {}).get("slurm_restarts")) or 0 for name, _, cur in entries}
        wants = {name: r for name, r in (reads or {}).items() if r["offset"] >= 0}
        shared = {p for p, n in Counter(w["path"] for w in wants.values()).items() if n > 1}
        wants = {name: w for name, w in wants.items() if w["path"] not in shared}  # those read alone
        try:
            matches = {i: c.match for n, c, _ in entries if (i := ids[n]) is not None}  # id → its match
            jobs, sizes, got, listed = await self.client.query_with_reads(
                entries[0][0], list(matches), sorted(set(paths.values())), list(wants.values()), matches
            )
        except RemoteError as exc:
            return {
                n: Sighting(JobProbe(job=n, error=exc.message), expected_processes(c)) for n, c, _ in entries
            }

        causes: dict[str, str | None] = {}  #: the jobs whose requeue is told now, and why
        requeued = {
            i for name, _, _ in entries if (i := ids[name]) in jobs and jobs[i].restarts > known[name]
        }
        for name, _, _ in entries:
            if (j := jobs.get(ids[name] or -1)) is not None and j.id in requeued:
                cause = await self._requeue_cause(name, j)
                first = self._unexplained.setdefault(j.id, time.monotonic())
                unknown = j.requeues or j.id not in self._ran  # accounting said, or it will never tell
                if cause is not None or unknown or time.monotonic() - first >= CAUSE_WAIT:
                    causes[name] = cause
                    self._unexplained.pop(j.id, None)
        for j in jobs.values():
            if j.state == "RUNNING" and j.nodelist and j.id not in requeued:  # kept until told
                self._ran[j.id] = (j.nodelist, j.started)

        def one(name: str, cfg: JobConfig) -> Sighting:
            expected, job_id, size = expected_processes(cfg), ids[name], sizes.get(paths[name])
            j = jobs.get(job_id) if job_id is not None else None
            probe = partial(JobProbe, job=name, log_size=size, host_gpus=False)
            if j is None:
                gone = None if job_id is None else f"Slurm job {job_id} is no longer known to the cluster"
                state = "none" if job_id is None else "gone"
                return Sighting(
                    probe(), expected, state, job_id=job_id, word="stopped", exit_cause=gone, ok=True
                )
            pids: tuple[int, ...] = ()
            detail, error, cause = None, None, slurm.state_cause(j) if j.state != "RUNNING" else None
            if j.state == "RUNNING":
                found = listed.get(j.id)
                tasks = found if isinstance(found, list) else []
                if not isinstance(found, list):
                    error = found.message if found else f"no task listing of Slurm job {j.id} came back"
                want = settings(cfg).tasks_per_node or max(1, expected // max(1, j.nodes))
                seen = {t.node: t.count for t in tasks}
                nodes = sorted(j.nodelist or seen)
                short = [f"{n} has {seen.get(n, 0)}/{want} processes" for n in nodes if seen.get(n, 0) < want]
                detail = f"{'; '.join(short)} (Slurm job {j.id})" if short else None
                pids = tuple(sorted(p for t in tasks for p in t.pids))
            asked = wants.get(name) if pids else None
            read = got.get(asked["path"]) if asked is not None else None
            read_error = (
                f"{asked['path']} cannot be read on the login node" if asked and read is None else None
            )
            return Sighting(
                probe(pids=pids, count=len(pids), error=error, read=read, read_error=read_error),
                expected,
                # being preempted: Slurm holds it (it requeues it or ends it PREEMPTED), as when queued
                "alive" if j.state == "RUNNING" and not j.preempting else "pending" if j.active else "gone",
                job_id=j.id,
                word=j.state.lower(),
                who=f"job {j.id}",
                uptime_s=j.elapsed or 0.0,
                line=slurm.status_line(name, j),
                exit_cause=cause,
                detail=detail,
                ok=j.state == "RUNNING" and len(pids) == expected and not detail,
                end_state=None if j.active else j.state,
                exit_code=None if j.active or j.signal else j.exit_code,
                nodes=j.nodelist,
                restarts=j.restarts,
                requeued=slurm.requeued_line(name, j, causes.get(name)) if name in causes else None,
                requeue_cause=slurm.requeue_why(j, causes.get(name)) if name in causes else "",
            )

        return {name: one(name, cfg) for name, cfg, _ in entries}

    async def _requeue_cause(self, name: str, j: SlurmJob) -> str | None:
        """Why Slurm requeued ``j`` (:meth:`SlurmClient.requeue_cause`, on the nodes this engine last
        saw it run on); None when unknown (never seen running, or the cluster cannot be asked)."""
        ran = self._ran.get(j.id)
        if ran is None:
            return None
        try:
            return await self.client.requeue_cause(name, j, *ran)
        except RemoteError as exc:
            log.info("%s: why Slurm requeued job %s is unknown: %s", name, j.id, exc.message)
            return None

    async def node_outputs(self, t: Target, argv: Sequence[str]) -> NodeOutputs | None:
        """``argv`` on every node of the recorded job, inside its allocation (``srun --overlap``).
        :raises PitstopError: if the job is not RUNNING."""
        job_id = parse_int(t.current.get("slurm_job"))
        j = await self.client.one(t.name, job_id) if job_id is not None else None
        if j is None or j.state != "RUNNING":
            why = f"Slurm job {j.id} is {j.state}" if j is not None else "no Slurm job is recorded"
            raise PitstopError(slurm.gpus_not_running(t.name, why))
        return NodeOutputs(f"Slurm job {j.id}", await self.client.node_gpus(t.name, j.id, j.nodes, argv))


# --- text ---------------------------------------------------------------------------------------


def _no_batch_only(value: str) -> str:
    """``signal = "B:USR1@120"``: refused, with why and the fix."""
    return (
        f"{value!r}: no B: here - B: sends the signal only to the batch shell, which does not pass it "
        f"on to the training; write {value[2:]!r} and every job step (the training's tasks) gets it"
    )


def _unknown_signal(value: str, sig: str, close: str | None) -> str:
    """``signal = "USR9@60"``: not a signal."""
    hint = f" - did you mean {close}?" if close else ""
    return f"{value!r}: {sig!r} is not a signal: write a name (USR1, TERM) or a number, then @SECONDS{hint}"


def _bad_signal_time(value: str, seconds: str) -> str:
    """``signal = "USR1@-5"``: not seconds Slurm takes."""
    return f"{value!r}: {seconds!r} after @ must be whole seconds before the time limit, 0 to 65535"
