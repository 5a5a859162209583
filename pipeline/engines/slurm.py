"""The Slurm engine: the restart sequence's steps on a Slurm cluster, through its login node.

Same steps, same meaning as the ssh engine (:mod:`pipeline.engines.base`):

- ``preflight``: the partition is up (``sinfo``), the batch script exists, ``sbatch --test-only``
  accepts it, and the workdir, log directory, free space and patches pass the host helper's
  checks on the login node (the workdir is on the shared filesystem); nothing is touched before.
- ``stop``: ``scancel --signal=TERM --full ID``, up to ``stop_timeout`` for the job to end, then
  ``scancel ID``; done once the old job id no longer holds an allocation; its final state and
  exit code are recorded in the step's detail.
- ``clear_cache`` and ``patch``: as on ssh, on the shared workdir.
- ``launch``: ``sbatch --parsable --hold`` (or, with ``requeue``, ``scontrol requeuehold ID``), the output
  file measured, then ``scontrol release ID`` — returns the
  job id at once; the job's ``StdOut`` and its size are recorded.
- ``verify`` at ``start_window``: ``RUNNING`` on the expected node count, the expected task
  processes on every node (the host helper under ``srun --overlap``), ``StdOut`` grew, no
  traceback in it.  A job still queued is ``PENDING`` — not a failure — and is verified again
  every ``pending_recheck`` s until it runs or ends; the window then counts from its start.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline import verdict
from pipeline.config import JobConfig, SlurmSettings
from pipeline.engines.base import CancelCheck
from pipeline.engines.sequence import restart_sequence
from pipeline.engines.ssh import KILL_TIMEOUT, VERIFY_GRACE, Restarter
from pipeline.engines.steplog import step_preflight_ok, step_stop_nothing
from pipeline.engines.workdir import CALL_TIMEOUT
from pipeline.errors import LaunchFailed, PreflightFailed, RemoteError, SequenceAborted, StopFailed
from pipeline.host import slurm
from pipeline.host.contract import EvidenceArgs, PreflightAnswer
from pipeline.host.probe import ProcessCount, call_helper, log_tail
from pipeline.host.slurm import SlurmClient, SlurmJob
from pipeline.observe.evidence import TAIL_LINES, log_since_launch_empty
from pipeline.state.runs import RunRecord
from pipeline.verdict import Outcome, Step, Verdict

PENDING_RECHECK = 15.0  #: seconds between checks of a job still PENDING after its verdict was posted
STOP_POLL = 0.5  #: seconds between state checks while a job stops
KILL_WAIT = 60.0  #: seconds a job may take to leave after a plain scancel (covers Slurm's KillWait)

_PREFLIGHT = r"""
script="$1"; shift
echo "@@sinfo"; sinfo -h -o '%P|%a' 2>&1; echo "@@rc=$?"
if [ -r "$script" ]; then echo "@@script=ok"; else echo "@@script=missing"; fi
echo "@@test"; sbatch --test-only "$@" "$script" 2>&1; echo "@@rc=$?"
"""


def _partition(args: Sequence[str]) -> str | None:
    for i, a in enumerate(args):
        if a in ("-p", "--partition") and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--partition="):
            return a.split("=", 1)[1]
        if a.startswith("-p") and len(a) > 2:
            return a[2:]
    return None


def _signame(number: int | None) -> str | None:
    if not number:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


class SlurmEngine:
    """:class:`pipeline.engines.base.Engine` for ``engine = "slurm"`` jobs; records runs through the
    :class:`~pipeline.engines.ssh.Restarter` it is attached to (same run store, events, step records).

    :param restarter: the Restarter whose runs, Redis and SSH pool it uses.
    :param pending_recheck: seconds between re-checks of a job posted as PENDING.
    """

    def __init__(self, restarter: Restarter, *, pending_recheck: float = PENDING_RECHECK) -> None:
        self.r = restarter
        self.steps = restarter.steps
        self.client = SlurmClient(restarter.ssh)
        self.pending_recheck = pending_recheck

    @classmethod
    def attach(cls, restarter: Restarter, **kw: float) -> SlurmEngine:
        """Create an engine and register it as ``restarter.engines["slurm"]``."""
        engine = cls(restarter, **kw)
        restarter.engines["slurm"] = engine
        return engine

    def _spec(self, job: str) -> tuple[str, JobConfig, SlurmSettings]:
        name = self.r.config.job_name(job)
        spec = self.r.config.jobs[name]
        assert spec.slurm is not None, "a slurm job has a [slurm] table (config validation)"
        return name, spec, spec.slurm

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
        """See :meth:`pipeline.engines.base.Engine.restart`."""
        name, job, _ = self._spec(run.job)
        return await restart_sequence(
            self,
            self.steps,
            self.r.ssh,
            run,
            name,
            job,
            add=add,
            remove=remove,
            fresh_cache=fresh_cache,
            cancelled=cancelled,
        )

    # --- the Slurm engine's own steps (pipeline.engines.sequence.EngineSteps) -------------------------------

    def remember_old(self, run: RunRecord, current: Mapping[str, str]) -> None:
        """The old Slurm job id, from the job's current record."""
        run.old_slurm_job = _int(current.get("slurm_job"))

    async def preflight_step(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        wants: Mapping[str, str],
        texts: Mapping[str, str],
    ) -> Mapping[str, bool]:
        """Partition up, script present, ``sbatch --test-only``, and the helper's checks on the login node."""
        return (await self._preflight(run, name, job, wants, texts)).get("applied") or {}

    async def stop_step(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        current: Mapping[str, str],
    ) -> None:
        """``scancel --signal=TERM --full``, ``stop_timeout``, ``scancel``, until the old job id has left."""
        await self._stop(run, name, job, run.old_slurm_job)

    async def launch_step(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        current: Mapping[str, str],
    ) -> None:
        """``sbatch --hold`` (or ``scontrol requeuehold``), measure the output, ``scontrol release``."""
        await self._launch(run, name, job, run.old_slurm_job)

    async def start(self, run: RunRecord, *, cancelled: CancelCheck | None = None) -> RunRecord:
        """See :meth:`pipeline.engines.base.Engine.start`: refuses while the recorded job is active."""
        name, job, _ = self._spec(run.job)
        try:
            current = await self.steps.current(name)
            old = _int(current.get("slurm_job"))
            await self._preflight(run, name, job, {}, {}, running=old)
            await self.steps.boundary(run, None, cancelled)
            run.patches = sorted(await self.steps.stored_patches(name))
            await self._launch(run, name, job, old)
            await self.steps.await_verify(run, job.start_window)
            return run
        except SequenceAborted as stop:
            return await self.steps.finish(run, stop)

    async def stop(self, run: RunRecord) -> RunRecord:
        """See :meth:`pipeline.engines.base.Engine.stop`."""
        name, job, _ = self._spec(run.job)
        try:
            current = await self.steps.current(name)
            run.old_slurm_job = _int(current.get("slurm_job"))
            await self._stop(run, name, job, run.old_slurm_job)
        except SequenceAborted as stop:
            return await self.steps.finish(run, stop)
        return await self.r.runs.finish(run)

    # --- steps ------------------------------------------------------------------------------------

    async def _preflight(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        wants: Mapping[str, str],
        texts: Mapping[str, str],
        *,
        running: int | None = None,
    ) -> PreflightAnswer:
        r = self.r
        sl = job.slurm
        assert sl is not None
        rec = await self.steps.begin(run, Step.PREFLIGHT)

        async def fail(check: str, detail: str) -> PreflightFailed:
            await self.steps.fail(run, rec, detail)
            return PreflightFailed(name, check, detail, line=verdict.preflight_failed(check, detail))

        test_args = ["-D", job.workdir, *sl.sbatch_args]
        try:
            result = await self.client.checked(
                name, ["bash", "-c", _PREFLIGHT, "pitstop-slurm-preflight", sl.script, *test_args]
            )
            answer = await call_helper(
                r.ssh,
                "preflight",
                {
                    "workdir": job.workdir,
                    "program": "sbatch",
                    "log": job.log,
                    "min_free": r.min_free_bytes,
                    "patches": dict(wants) if texts else {},
                    "running": None,
                },
                job=name,
                stdin=json.dumps(dict(texts)) if texts else None,
                timeout=CALL_TIMEOUT,
            )
        except RemoteError as exc:
            raise await fail("host", exc.message) from None
        sections: dict[str, list[str]] = {}
        current = "head"
        for line in result.stdout.splitlines():
            if line.startswith("@@") and "=" not in line:
                current = line[2:]
            else:
                sections.setdefault(current, []).append(line)
        info = sections.get("sinfo", [])
        parts = {p.split("|")[0]: p.split("|")[1] for p in info if "|" in p}
        want = _partition(sl.sbatch_args) or next((p for p in parts if p.endswith("*")), None)
        state = parts.get(want or "", parts.get(f"{want}*", "")) if want else ""
        if not want or state != "up":
            known = ", ".join(f"{p.rstrip('*')} {s}" for p, s in parts.items()) or " ".join(info)[:200]
            shown = want.rstrip("*") if want else "(default)"
            raise await fail("partition", f"partition {shown} is not up ({known or 'none'})")
        if "@@script=ok" not in result.stdout:
            raise await fail("script", f"{sl.script}: no such file on {job.host}")
        test = [ln for ln in sections.get("test", []) if not ln.startswith("@@rc=")]
        if "@@rc=0" != (sections.get("test", ["@@rc=?"])[-1] if sections.get("test") else ""):
            raise await fail("sbatch", "sbatch --test-only refused the job: " + " ".join(test)[-300:])
        failed = [c for c in answer.get("checks", []) if not c.get("ok") and c.get("check") != "launch"]
        if failed:
            detail = "; ".join(f"{c['check']}: {c['detail']}" for c in failed)
            await self.steps.fail(run, rec, detail)
            raise PreflightFailed(
                name,
                failed[0]["check"],
                detail,
                line=verdict.preflight_failed(failed[0]["check"], failed[0]["detail"]),
            )
        if running is not None:
            try:
                j = await self.client.one(name, running)
            except RemoteError as exc:
                raise await fail("host", exc.message) from None
            if j is not None and j.active:
                raise await fail("running", f"{name} is already {j.state} as Slurm job {j.id}")
        checks = ["partition", "script", "sbatch", *(c["check"] for c in answer.get("checks", []))]
        names = [c for c in dict.fromkeys(checks) if c != "launch"]
        await self.steps.end(run, rec, Outcome.OK, step_preflight_ok(names))
        return answer

    async def _wait_gone(self, name: str, job_id: int, timeout: float) -> SlurmJob | None:
        """Poll until the job holds no allocation (or ``timeout`` s); its last known state."""
        deadline = time.monotonic() + timeout
        while True:
            j = await self.client.one(name, job_id)
            if j is None or not j.active or time.monotonic() >= deadline:
                return j
            await asyncio.sleep(STOP_POLL)

    async def _stop(self, run: RunRecord, name: str, job: JobConfig, old: int | None) -> None:
        rec = await self.steps.begin(run, Step.STOP)
        try:
            j = await self.client.one(name, old) if old is not None else None
            if old is None or j is None or not j.active:
                detail = slurm.job_ended(j) + "; nothing to stop" if j is not None else step_stop_nothing()
                await self.steps.mark_stopped(name, run)
                await self.steps.end(run, rec, Outcome.OK, detail)
                return
            began = time.monotonic()
            how = "SIGTERM"
            if j.state == "PENDING":
                await self.client.checked(name, ["scancel", str(old)])
                how = "scancel (pending)"
            else:
                await self.client.checked(name, ["scancel", "--signal=TERM", "--full", str(old)])
            j = await self._wait_gone(name, old, job.stop_timeout)
            if j is not None and j.active:
                how = f"scancel after {job.stop_timeout:.0f} s"
                await self.client.checked(name, ["scancel", str(old)])
                j = await self._wait_gone(name, old, KILL_TIMEOUT + KILL_WAIT)
        except RemoteError as exc:
            await self.steps.fail(run, rec, exc.message)
            raise StopFailed(name, [], exc.message, line=verdict.stop_failed([], exc.message)) from None
        took = time.monotonic() - began
        if j is not None and j.active:
            why = f"Slurm job {old} is still {j.state} after scancel"
            await self.steps.fail(run, rec, why)
            raise StopFailed(name, [], why, line=verdict.stop_failed([], why))
        ended = slurm.job_ended(j) if j is not None else f"job {old} left the queue"
        await self.steps.mark_stopped(name, run)
        await self.steps.end(
            run, rec, Outcome.OK, f"stopped Slurm job {old} in {took:.1f} s ({how}); {ended}"
        )

    async def _launch(self, run: RunRecord, name: str, job: JobConfig, old: int | None) -> None:
        sl = job.slurm
        assert sl is not None
        rec = await self.steps.begin(run, Step.LAUNCH)
        try:
            # Queued held, measured, then released: a job that starts at once cannot write its
            # first lines before the offset that verification reads from is taken.
            if sl.requeue and old is not None:
                await self.client.checked(name, ["scontrol", "requeuehold", str(old)])
                job_id, how = old, f"requeued Slurm job {old}"
            else:
                job_id = await self.client.submit(name, job.workdir, sl.script, sl.sbatch_args, hold=True)
                how = f"submitted Slurm job {job_id}"
            try:
                j = await self.client.one(name, job_id)
                stdout = (j.stdout if j is not None else None) or job.log
                size = await self.client.file_size(name, stdout)
            finally:
                await self.client.checked(name, ["scontrol", "release", str(job_id)])
        except RemoteError as exc:
            await self.steps.fail(run, rec, exc.message)
            raise LaunchFailed(name, exc.message, line=verdict.launch_failed(exc.message)) from None
        run.slurm_job = job_id
        run.log_size_at_launch = size
        run.launched_at = time.time()
        current = {
            "run_id": run.id,
            "engine": "slurm",
            "slurm_job": str(job_id),
            "launched_at": repr(run.launched_at),
            "log": stdout,
            "state": "running",
            "patches": ",".join(run.patches),
        }
        await self.steps.record_launch(run, name, current, run.launched_at + job.start_window)
        await self.steps.end(run, rec, Outcome.OK, f"{how}; output {stdout} from byte {size}")

    # --- verification ---------------------------------------------------------------------------

    async def verify(self, run: RunRecord) -> RunRecord:
        """See :meth:`pipeline.engines.base.Engine.verify`; a run posted as PENDING is verified again.

        Polls the job's state every ``verify_poll`` s.  It ends early when the job ends
        (``EXITED`` with its exit code or signal).  A job that runs is judged ``start_window`` s
        after it started (``squeue %M``): node count, tasks on every node, output growth and
        errors.  A job still queued at the deadline is ``PENDING``: the run stays in
        ``keys.runs_unverified``, due again in ``pending_recheck`` s.
        """
        if run.slurm_job is None or run.launched_at is None:
            return run
        name, job, sl = self._spec(run.job)
        r = self.r
        rec = self.steps.verify_step(run)
        deadline = run.launched_at + job.start_window
        failure: RemoteError | None = None
        j: SlurmJob | None = None
        while True:
            now = time.time()
            try:
                j = await self.client.one(name, run.slurm_job)
                failure = None
            except RemoteError as exc:
                failure = exc
            if failure is None:
                if j is None or not j.active:
                    break
                if j.state == "RUNNING":
                    started = now - (j.elapsed or 0.0)
                    if now >= max(deadline, started + job.start_window):
                        break
                elif now >= deadline and (j.state != "COMPLETING" or now >= deadline + VERIFY_GRACE):
                    break  # still queued (or starting): PENDING; a job completing is awaited
            elif now >= deadline + VERIFY_GRACE:
                await self.steps.verify_unreachable(run, rec, failure.message)
                raise failure
            await asyncio.sleep(max(0.05, r.verify_poll))
        decided, line, evidence = await self._decide(run, name, job, sl, j)
        recheck = time.time() + self.pending_recheck if decided is Verdict.PENDING else None
        await self.steps.verified(run, rec, (decided, line, evidence), recheck_at=recheck)
        return run

    async def _decide(
        self, run: RunRecord, name: str, job: JobConfig, sl: SlurmSettings, j: SlurmJob | None
    ) -> tuple[Verdict, str, str]:
        job_id = run.slurm_job or 0
        now = time.time()
        if j is None:
            line = verdict.exited(None, None, now - (run.launched_at or now))
            return Verdict.EXITED, line, f"Slurm job {job_id} is no longer known to the cluster"
        if j.state == "PENDING" or (j.active and j.state != "RUNNING"):
            line = verdict.pending(j.reason or j.state, job_id, now - (run.launched_at or now))
            return Verdict.PENDING, line, f"Slurm job {job_id}: {j.state}, reason {j.reason or 'None'}"
        out = await self._output(run, name, job, j)
        tail = str(out.get("tail") or "").strip() or log_since_launch_empty()
        facts = [f"Slurm job {job_id}: {j.state} on {j.nodes} node(s) {','.join(j.nodelist)}".rstrip()]
        if not j.active:
            facts.append(slurm.job_ended(j))
            line = verdict.exited(j.exit_code, _signame(j.signal), j.elapsed or 0)
            return (
                Verdict.EXITED,
                line,
                "\n".join(facts) + f"\n--- last {TAIL_LINES} output lines ---\n{tail}",
            )
        per_node = sl.tasks_per_node or max(1, job.processes // sl.nodes)
        expected = job.expected_processes
        tasks = await self.client.node_tasks(name, job_id, j.nodes, job.match)
        seen = sum(t.count for t in tasks)
        short = [f"{t.node}: {t.count}/{per_node}" for t in tasks if t.count != per_node]
        short += [f"{n}: no answer" for n in j.nodelist if n not in {t.node for t in tasks}]
        facts.append(
            "tasks matching "
            + repr(job.match)
            + ": "
            + "; ".join(
                f"{t.node} {t.count}/{per_node}" + (f" ({t.error})" if t.error else "") for t in tasks
            )
        )
        new_bytes = out.get("new_bytes")
        facts.append(
            f"output {out.get('path')}: "
            + (f"+{new_bytes} bytes since launch" if new_bytes is not None else "unreadable")
        )
        if out.get("error_line"):
            decided, line = Verdict.ERROR_IN_LOG, verdict.error_in_log(str(out["error_line"]), job_id=job_id)
        elif j.nodes != sl.nodes or seen != expected or short:
            if j.nodes != sl.nodes:
                short.insert(0, f"{j.nodes}/{sl.nodes} nodes")
            decided, line = (
                Verdict.WRONG_COUNT,
                verdict.wrong_count(seen, expected, job_id=job_id, short=short),
            )
        elif not new_bytes or new_bytes <= 0:
            decided, line = (
                Verdict.NO_PROGRESS,
                verdict.no_progress(seen, expected, j.elapsed or 0, job_id=job_id),
            )
        else:
            decided, line = Verdict.RUNNING, verdict.running_job(seen, expected, job_id, j.nodes)
        evidence = "\n".join(facts)
        if decided is Verdict.RUNNING:
            last = tail.splitlines()[-3:]
            evidence += f"\n--- last {len(last)} output lines ---\n" + "\n".join(last)
        else:
            evidence += f"\n--- last {TAIL_LINES} output lines since launch ---\n{tail}"
        return decided, line, evidence

    async def _output(self, run: RunRecord, name: str, job: JobConfig, j: SlurmJob) -> dict[str, Any]:
        """Growth, first error and tail of the job's output since launch (host helper on the login node)."""
        path = j.stdout or job.log
        args: EvidenceArgs = {
            "name": name,
            "match": "(?!x)x",
            "pid": None,
            "start_time": None,
            "sid": None,
            "log": path,
            "offset": run.log_size_at_launch or 0,
            "tail_lines": TAIL_LINES,
        }
        raw = await call_helper(self.r.ssh, "evidence", args, job=name)
        return {**raw, "path": path}

    # --- queries ---------------------------------------------------------------------------------

    async def job_processes(self, job: str) -> ProcessCount:
        """The recorded job's task processes on all its nodes (``status``); none when it is not RUNNING.

        :raises RemoteError: if the cluster cannot be asked.
        """
        name, spec, _ = self._spec(job)
        current = await self.steps.current(name)
        job_id = _int(current.get("slurm_job"))
        j = await self.client.one(name, job_id) if job_id is not None else None
        pids: tuple[int, ...] = ()
        if j is not None and j.state == "RUNNING":
            tasks = await self.client.node_tasks(name, j.id, j.nodes, spec.match)
            pids = tuple(p for t in tasks for p in t.pids)
        return ProcessCount(
            job=name,
            pids=pids,
            count=len(pids),
            expected=spec.expected_processes,
            alive=None if j is None else j.state == "RUNNING",
            pid=job_id,
        )

    async def job_state(self, job: str) -> SlurmJob | None:
        """The recorded Slurm job as the cluster reports it now (``status``), or None."""
        name, _, _ = self._spec(job)
        job_id = _int((await self.steps.current(name)).get("slurm_job"))
        return await self.client.one(name, job_id) if job_id is not None else None

    async def log_tail(self, job: str, lines: int) -> str:
        """The last ``lines`` lines of the job's output (recorded ``StdOut``, else ``log``).

        :raises RemoteError: if it cannot be read.
        """
        name, spec, _ = self._spec(job)
        path = (await self.steps.current(name)).get("log") or spec.log
        return await log_tail(self.r.ssh, name, spec.model_copy(update={"log": path}), lines)
