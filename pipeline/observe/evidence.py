"""What verification reads on the ssh engine: one sample of a launched run, and the verdict it leads to.

:func:`gather` asks the host helper for one :class:`Evidence` sample (the run's session and
processes, the log since launch, the waiter's exit record, where the run started, the newest
checkpoint); :func:`decide` turns a sample into the verdict, its one-line verdict line and the
evidence text posted with it.  The Slurm engine reads its own evidence
(:mod:`pipeline.engines.slurm`) and keeps the same tail sizes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline import verdict
from pipeline.config import JobConfig
from pipeline.errors import RemoteError
from pipeline.host.contract import EvidenceArgs
from pipeline.host.probe import call_helper
from pipeline.host.remote import RemoteHosts
from pipeline.observe.resume import ResumePoint, check_resume, checkpoint_fact
from pipeline.state.runs import RunRecord
from pipeline.verdict import Step, Verdict

RUNNING_TAIL_LINES = 3  #: log lines kept as evidence of a healthy start
TAIL_LINES = 30  #: log lines kept as evidence


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
        steps; :func:`pipeline.host.helper.start_step`), None when not seen yet.
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


async def gather(ssh: RemoteHosts, run: RunRecord, job: JobConfig) -> Evidence:
    """One sample of the launched ``run`` (host helper ``evidence``: its session, log since launch,
    exit status, start step, newest checkpoint).

    :raises RemoteError: if the host cannot be asked.
    """
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
    raw = await call_helper(ssh, "evidence", args, job=run.job)
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


async def settle_exit(ssh: RemoteHosts, run: RunRecord, job: JobConfig, ev: Evidence) -> Evidence:
    """The process is gone: give its waiter a moment to record the exit status."""
    for _ in range(10):
        if ev.status is not None:
            break
        await asyncio.sleep(0.1)
        try:
            ev = await gather(ssh, run, job)
        except RemoteError:
            break
    return ev


def decide(run: RunRecord, job: JobConfig, ev: Evidence) -> tuple[Verdict, str, str]:
    """The verdict, verdict line and evidence text of an ssh run from one sample ``ev``.

    Precedence (:class:`~pipeline.verdict.Verdict`): ``EXITED`` (exit code or signal, last log lines),
    ``ERROR_IN_LOG``, ``WRONG_COUNT`` (expected vs seen), ``NO_PROGRESS`` (log silent), else
    ``RUNNING`` (with where it resumed); a run whose stop found a stale record is ``STALE_RECORD``.
    """
    pid = run.pid or 0
    tail = ev.tail.strip() or log_since_launch_empty()
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
        decided, line = Verdict.EXITED, verdict.exited(st.get("code"), st.get("signal"), after)
    elif ev.error_line:
        decided, line = Verdict.ERROR_IN_LOG, verdict.error_in_log(ev.error_line, pid=pid)
    elif ev.count != job.processes:
        decided, line = Verdict.WRONG_COUNT, verdict.wrong_count(ev.count, job.processes, pid=pid)
    elif not ev.new_bytes or ev.new_bytes <= 0:
        silent = ev.sampled_at - (run.launched_at or ev.sampled_at)
        decided, line = (
            Verdict.NO_PROGRESS,
            verdict.no_progress(ev.count, job.processes, silent, pid=pid),
        )
    else:
        resume = check_resume(
            ev.start_step, ev.checkpoint, ev.sampled_at - (run.launched_at or ev.sampled_at)
        )
        decided, line = (
            Verdict.RUNNING,
            verdict.running(
                ev.count,
                job.processes,
                pid,
                resumed_at=resume.started_at,
                ignored_checkpoint=resume.ignored,
            ),
        )
    if ev.checkpoint is not None:
        facts.append(checkpoint_fact(ev.checkpoint.path, ev.checkpoint.step, ev.checkpoint.age_s))
    stop = run.step(Step.STOP)
    if stop is not None and stop.stale:
        facts.insert(0, stop.detail)
        decided, line = Verdict.STALE_RECORD, verdict.stale_record(run.old_pid or 0, line)
    evidence = "\n".join(facts)
    if decided is not Verdict.RUNNING:
        evidence += f"\n--- last {TAIL_LINES} log lines since launch ---\n{tail}"
    elif ev.tail.strip():  # healthy: a glimpse of the log is enough
        last = tail.rstrip("\n").splitlines()[-RUNNING_TAIL_LINES:]
        evidence += f"\n--- last {len(last)} log lines ---\n" + "\n".join(last)
    return decided, line, evidence


# --- text ---------------------------------------------------------------------------------------


def log_since_launch_empty() -> str:
    """Evidence when the job wrote nothing since its launch."""
    return "(no log output since launch)"
