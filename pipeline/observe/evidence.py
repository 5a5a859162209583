"""What verification reads, and the one decision of a verdict from an observation.

:func:`decide` turns any engine's :class:`Observation` into the verdict,
its one-line verdict line and the evidence text posted with it (the runner's verify uses it
for every engine).  :func:`gather` asks the host helper for one :class:`Evidence` sample of an
ssh run (its session and processes, the log since launch, the waiter's exit record, where the
run started, the newest checkpoint).
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
from pipeline.verdict import Lost, Step, Verdict, VerdictLine

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


@dataclass(frozen=True)
class Observation:
    """One sample of a launched run, normalised across engines (what the verdict is decided from).

    :ivar state: ``alive``, ``pending`` (queued, not started), ``gone`` or ``stale`` (pid reused).
    :ivar count: the run's processes seen (on every node); ``expected``: how many it should have.
    :ivar pid: the run's pid (one-host engines) and ``job_id`` its scheduler job id: the run's
        identity in the verdict line (``pid 4242`` / ``job 12``); ``nodes`` its node count.
    :ivar sampled_at: Pitstop's clock when the answer came (unix s); ``started_at``: when the run
        started running (unix s; None while pending).
    :ivar complete: False for a cheap look (state only) the runner polls with until it decides.
    :ivar settling: a pending run between states (Slurm's ``COMPLETING``): awaited a while longer.
    :ivar short: where the count falls short (``n2: 3/4``, ``1/2 nodes``): a wrong count too.
    :ivar new_bytes: output bytes written since launch (None: unreadable, see ``output_error``).
    :ivar error_line: the first traceback / ``…Error`` line since launch.
    :ivar exit_code, signal, ran_for: how an ended run ended and after how many seconds.
    :ivar pending_reason: why a pending run waits (``Resources``).
    :ivar tail: the last output lines since launch; ``facts``: evidence lines, engine's words.
    :ivar output: what the engine calls the run's output in evidence (``log``, ``output``).
    :ivar start_step, checkpoint: where the run started from, the newest checkpoint (resume check).
    :ivar stale: the stop step's note when the recorded pid was reused.
    """

    state: str
    count: int = 0
    expected: int = 0
    pid: int | None = None
    job_id: int | None = None
    nodes: int | None = None
    sampled_at: float = 0.0
    started_at: float | None = None
    complete: bool = True
    settling: bool = False
    short: tuple[str, ...] = ()
    new_bytes: int | None = None
    error_line: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    ran_for: float | None = None
    pending_reason: str | None = None
    tail: str = ""
    facts: tuple[str, ...] = ()
    output: str = "log"
    start_step: int | None = None
    checkpoint: ResumePoint | None = None


async def gather(
    ssh: RemoteHosts, run: RunRecord, job: JobConfig, *, log: str | None = None, processes: bool = True
) -> Evidence:
    """One sample of the launched ``run`` (host helper ``evidence``: its session, log since launch,
    exit status, start step, newest checkpoint).

    :param log: the run's output file, if not ``job.log`` (a Slurm job's ``StdOut``).
    :param processes: count the processes matching ``job.match`` too (not where they run
        elsewhere: a Slurm job's nodes).
    :raises RemoteError: if the host cannot be asked.
    """
    path = log or job.log
    args: EvidenceArgs = {
        "name": run.job,
        "match": job.match if processes else "(?!x)x",
        "pid": run.pid,
        "start_time": run.start_time,
        "sid": run.sid,
        "log": path,
        "offset": run.log_size_at_launch or 0,
        "tail_lines": TAIL_LINES,
        "progress_log": path,
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


def decide(run: RunRecord, obs: Observation, *, lost: Lost | None = None) -> tuple[Verdict, str, str]:
    """The verdict, verdict line and evidence text of a launched run from one observation, for
    every engine.

    Precedence (:class:`~pipeline.verdict.Verdict`): ``PENDING`` (queued, not started),
    ``EXITED`` (exit code or signal, last output lines), ``ERROR_IN_LOG``, ``WRONG_COUNT``
    (expected vs seen, or ``short`` somewhere), ``NO_PROGRESS`` (output silent), else
    ``RUNNING`` (with where it resumed); a run whose stop found a stale record is ``STALE_RECORD``.

    :param run: the launched run (its launch time and stop step are read).
    :param obs: a complete :class:`Observation` of it.
    :param lost: what the restart lost of the previous run (:func:`pipeline.observe.attempts.lost_work`):
        the clause a RUNNING line that resumed from a checkpoint ends with.
    """
    now = obs.sampled_at
    since = now - (run.launched_at or now)
    ran = now - (obs.started_at or run.launched_at or now)
    pid, job_id = obs.pid, obs.job_id
    tail = obs.tail.strip() or log_since_launch_empty()
    facts = list(obs.facts)
    if obs.state == "pending":
        line = verdict.pending(obs.pending_reason or "", obs.job_id or 0, since)
        return Verdict.PENDING, line, "\n".join(facts)
    if obs.state not in ("alive", "pending"):
        after = obs.ran_for if obs.ran_for is not None else since
        decided, line = Verdict.EXITED, verdict.exited(obs.exit_code, obs.signal, after)
    elif obs.error_line:
        decided, line = Verdict.ERROR_IN_LOG, verdict.error_in_log(obs.error_line, pid=pid, job_id=job_id)
    elif obs.count != obs.expected or obs.short:
        line = verdict.wrong_count(obs.count, obs.expected, pid=pid, job_id=job_id, short=obs.short)
        decided = Verdict.WRONG_COUNT
    elif not obs.new_bytes or obs.new_bytes <= 0:
        decided, line = (
            Verdict.NO_PROGRESS,
            verdict.no_progress(obs.count, obs.expected, ran, pid=pid, job_id=job_id),
        )
    else:
        resume = check_resume(obs.start_step, obs.checkpoint, since)
        running = VerdictLine(
            Verdict.RUNNING,
            obs.count,
            obs.expected,
            pid=pid,
            job_id=job_id,
            nodes=obs.nodes,
            resumed_at=resume.started_at,
            ignored_checkpoint=resume.ignored,
        )
        if lost is not None and resume.started_at:
            running = lost.on(running)
        decided, line = Verdict.RUNNING, verdict.format_line(running)
    if obs.checkpoint is not None:
        facts.append(checkpoint_fact(obs.checkpoint.path, obs.checkpoint.step, obs.checkpoint.age_s))
    stop = run.step(Step.STOP)
    if stop is not None and stop.stale:
        facts.insert(0, stop.detail)
        decided, line = Verdict.STALE_RECORD, verdict.stale_record(run.old_pid or 0, line)
    evidence = "\n".join(facts)
    if decided is not Verdict.RUNNING:
        evidence += f"\n--- last {TAIL_LINES} {obs.output} lines since launch ---\n{tail}"
    elif obs.tail.strip():  # healthy: a glimpse of the output is enough
        last = tail.rstrip("\n").splitlines()[-RUNNING_TAIL_LINES:]
        evidence += f"\n--- last {len(last)} {obs.output} lines ---\n" + "\n".join(last)
    return decided, line, evidence


# --- text ---------------------------------------------------------------------------------------


def log_since_launch_empty() -> str:
    """Evidence when the job wrote nothing since its launch."""
    return "(no log output since launch)"
