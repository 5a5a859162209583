"""What verification reads, and the one decision of a verdict from an observation.

:func:`decide` turns any engine's :class:`Observation` into the verdict, its line and evidence;
:func:`ended` and :func:`count_right` are the judgements the watcher, the crash check and
``status`` share.  :func:`gather` asks the host helper for one :class:`Observation` of an ssh run;
:func:`crash_evidence` and :func:`hang_evidence` read what a dead or hung run leaves there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from pipeline.config import JobConfig
from pipeline.config.jobs import CrashClass
from pipeline.errors import RemoteError
from pipeline.host.contract import EvidenceArgs, HangAnswer, HangArgs
from pipeline.host.probe import CRASH_BYTES, JobProbe, Ops, call_helper, read_log_chunk, recorded_identity
from pipeline.host.remote import RemoteHosts
from pipeline.observe.crashes import classify
from pipeline.observe.resume import ResumePoint, check_resume, checkpoint_fact
from pipeline.state.runs import RunRecord
from pipeline.verdict import ERROR_LINE_LIMIT, Lost, Step, Verdict, VerdictLine

RUNNING_TAIL_LINES = 3  #: log lines kept as evidence of a healthy start
TAIL_LINES = 30  #: log lines kept as evidence
KERNEL_LINES = 200  #: the newest kernel OOM-killer lines read for a crash check
HANG_TIMEOUT = 120.0  #: seconds for a ``hang`` call (py-spy dumps of up to 16 processes)


@dataclass(frozen=True)
class Observation:
    """One sample of a launched run, normalised across engines (what the verdict is decided from).

    ``pid`` (one-host engines) or ``job_id`` (a scheduler's) is the run's identity in the verdict
    line (``pid 4242`` / ``job 12``); ``exit_code``, ``signal`` and ``ran_for`` (s) say how an
    ended run ended; ``start_step`` and ``checkpoint`` feed the resume check.
    """

    state: str  #: ``alive``, ``pending`` (queued, not started), ``gone`` or ``stale`` (pid reused)
    count: int = 0  #: the run's processes seen, on every node
    expected: int = 0
    pid: int | None = None
    job_id: int | None = None
    nodes: int | None = None
    nodelist: tuple[
        str, ...
    ] = ()  #: the nodes it runs on (a scheduler's), named in the verdict when some were excluded
    sampled_at: float = 0.0  #: Pitstop's clock when the answer came (unix s)
    started_at: float | None = None  #: when the run started running (unix s; None while pending)
    complete: bool = True  #: False for a cheap look (state only) the runner polls with until it decides
    settling: bool = False  #: a pending run between states (Slurm's ``COMPLETING``): awaited longer
    short: tuple[str, ...] = ()  #: where the count falls short (``n2: 3/4``, ``1/2 nodes``): wrong too
    new_bytes: int | None = None  #: output bytes written since launch (None: unreadable)
    error_line: str | None = None  #: the first traceback / ``…Error`` line since launch
    exit_code: int | None = None
    signal: str | None = None
    ran_for: float | None = None
    pending_reason: str | None = None  #: why a pending run waits (``Resources``)
    tail: str = ""  #: the last output lines since launch
    facts: tuple[str, ...] = ()  #: evidence lines, in the engine's words
    output: str = "log"  #: what the engine calls the run's output in evidence (``log``, ``output``)
    start_step: int | None = None
    checkpoint: ResumePoint | None = None


async def gather(
    ssh: RemoteHosts, run: RunRecord, job: JobConfig, *, log: str | None = None, processes: bool = True
) -> Observation:
    """One complete sample of the launched ``run`` (host helper ``evidence``); a gone run is asked
    again for up to about 1 s, until its waiter has recorded the exit.

    :param log: the run's output file, if not ``job.log`` (a Slurm job's ``StdOut``).
    :param processes: count the processes matching ``job.match`` too (not for a Slurm job's nodes).
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
    raw = await call_helper(ssh, Ops.evidence(args), job=run.job)
    for _ in range(10 if processes else 0):
        if raw.get("state") == "alive" or raw.get("status") is not None:
            break
        await asyncio.sleep(0.1)
        try:
            raw = await call_helper(ssh, Ops.evidence(args), job=run.job)
        except RemoteError:
            break
    state, count, pids = str(raw.get("state") or "gone"), int(raw.get("count") or 0), raw.get("pids") or []
    how = ended(state, raw.get("status")) or Exit(None, None, None)
    info, grew, started = raw.get("log"), raw.get("new_bytes"), raw.get("start_step")
    start = None if not started else started["said"] if started["said"] is not None else started["first"]
    wrote = f"+{grew} bytes since launch" if grew is not None else f"{info and info['error']}"
    listed = f" (pids {', '.join(str(p) for p in pids[:20])})" if pids else ""
    return Observation(
        state,
        count,
        job.processes,
        pid=run.pid or 0,
        sampled_at=time.time(),
        started_at=run.launched_at,
        new_bytes=grew,
        error_line=raw.get("error_line"),
        exit_code=how.code,
        signal=how.signal,
        ran_for=how.ran_for,
        tail=str(raw.get("tail") or ""),
        facts=(
            f"pid {run.pid or 0}: {state}",
            f"processes matching {job.match!r} in session {run.sid}: {count}/{job.processes}{listed}",
            f"log {path}: {wrote}",
        ),
        start_step=start,
        checkpoint=ResumePoint.from_helper(raw.get("checkpoint"), raw.get("time")),
    )


class Exit(NamedTuple):
    """How a run's recorded process ended: its exit ``code`` (None when a signal ended it), the
    ``signal`` (``SIGKILL``) and ``ran_for``, seconds from its start to its end (None: unknown)."""

    code: int | None
    signal: str | None
    ran_for: float | None


def ended(state: str | None, status: Mapping[str, Any] | None) -> Exit | None:
    """How the run ended, from its launch waiter's record (``code``, ``signal``, ``started_at``,
    ``ended_at``); None while the recorded process's ``state`` is ``alive`` or without a record."""
    if not status or state == "alive":
        return None
    began, end = status.get("started_at"), status.get("ended_at")
    ran_for = float(end) - float(began) if began is not None and end is not None else None
    return Exit(status.get("code"), status.get("signal"), ran_for)


def count_right(count: int, expected: int, short: object = None) -> bool:
    """Whether a run has the processes it should — exactly ``expected``, short nowhere (``short``:
    where the engine saw a node short of them) — for verify (else ``WRONG_COUNT``) and ``status``."""
    return count == expected and not short


def decide(run: RunRecord, obs: Observation, *, lost: Lost | None = None) -> tuple[Verdict, str, str]:
    """The verdict, verdict line and evidence text of a launched run from one complete
    observation, for every engine.  Precedence: ``PENDING``, ``EXITED``, ``ERROR_IN_LOG``,
    ``WRONG_COUNT``, ``NO_PROGRESS`` (output silent), else ``RUNNING`` (with where it resumed, and
    what the restart ``lost``: :func:`pipeline.observe.attempts.lost_work`, every step of an
    advanced run when it started from step 0); a run whose stop found
    a stale record is ``STALE_RECORD``."""
    now = obs.sampled_at
    since = now - (run.launched_at or now)
    ran = now - (obs.started_at or run.launched_at or now)
    tail = obs.tail.strip() or NO_LOG_SINCE_LAUNCH
    facts = list(obs.facts)
    if obs.state == "pending":
        queued = VerdictLine(
            Verdict.PENDING, job_id=obs.job_id or 0, reason=obs.pending_reason, queued_s=since
        )
        return Verdict.PENDING, str(queued), "\n".join(facts)
    who = (obs.pid, obs.job_id)
    seen = (obs.count, obs.expected, *who)  # VerdictLine's fields in order
    if obs.state != "alive":
        after = obs.ran_for if obs.ran_for is not None else since
        v = VerdictLine(Verdict.EXITED, code=obs.exit_code, signal=obs.signal, after_s=after)
    elif obs.error_line:
        v = VerdictLine(Verdict.ERROR_IN_LOG, None, None, *who, detail=obs.error_line[:ERROR_LINE_LIMIT])
    elif not count_right(obs.count, obs.expected, obs.short):
        v = VerdictLine(Verdict.WRONG_COUNT, *seen, detail=", ".join(obs.short))
    elif not obs.new_bytes or obs.new_bytes <= 0:
        v = VerdictLine(Verdict.NO_PROGRESS, *seen, silent_s=ran)
    else:
        ignored = check_resume(obs.start_step, obs.checkpoint, since)
        v = VerdictLine(Verdict.RUNNING, *seen, obs.nodes, obs.start_step, ignored)
        if run.verified is not None and obs.start_step and obs.start_step == run.verified_step:
            v = replace(v, verified=run.verified)
        if run.exclude:  # the person asked to leave nodes out: where it runs now is named
            v = replace(v, nodelist=obs.nodelist)
        if lost is not None:  # resumed, or started over after a run that advanced (all its steps)
            v = lost.on(v)
    if obs.checkpoint is not None:
        facts.append(checkpoint_fact(obs.checkpoint.path, obs.checkpoint.step, obs.checkpoint.age_s))
    stop = run.step(Step.STOP)
    if stop is not None and stop.stale:
        facts.insert(0, stop.detail)
        v = VerdictLine(Verdict.STALE_RECORD, pid=run.old_pid or 0, then=v)
    evidence = "\n".join(facts)
    if v.verdict is not Verdict.RUNNING:
        evidence += f"\n--- last {TAIL_LINES} {obs.output} lines since launch ---\n{tail}"
    elif obs.tail.strip():  # healthy: a glimpse of the output is enough
        last = tail.rstrip("\n").splitlines()[-RUNNING_TAIL_LINES:]
        evidence += f"\n--- last {len(last)} {obs.output} lines ---\n" + "\n".join(last)
    return v.verdict, str(v), evidence


async def crash_evidence(
    ssh: RemoteHosts,
    name: str,
    job: JobConfig,
    current: Mapping[str, str],
    offset: int,
    seen: JobProbe | None,
    *,
    kernel: bool = True,
) -> JobProbe:
    """What the job's dead run left, for the crash check: ``state``, ``exit_status``, ``log_size``
    (``seen``'s when it brought ``tail``, else one helper ``evidence`` call) and ``crash``: the last
    :data:`CRASH_BYTES` of its log since byte ``offset`` (``seen``'s, else read); and, when it was
    killed by SIGKILL with no OOM line in its log and ``kernel`` (the job runs on this host), the
    host kernel's OOM-killer lines (``kernel``; or ``kernel_unreadable``: why not).

    :raises RemoteCommandError: if the log cannot be read; connection errors as ``SSHPool.run``.
    """
    if seen is None or seen.tail is None:
        ident = recorded_identity(current)
        args: EvidenceArgs = {
            "name": name,
            "match": job.match,
            "log": job.log,
            "offset": offset,
            "tail_lines": 0,
            "pid": ident["pid"],
            "start_time": ident["start_time"],
            "sid": ident["sid"],
        }
        answer = await call_helper(ssh, Ops.evidence(args), job=name)
        info = answer.get("log")
        size = int((info["size"] if info else None) or 0)
        seen = JobProbe(name, state=answer.get("state"), log_size=size, exit_status=answer.get("status"))
    if seen.crash is None:
        size = seen.log_size or 0
        start = max(offset if size >= offset else 0, size - CRASH_BYTES)  # truncated since launch: its end
        seen = replace(seen, crash=await read_log_chunk(ssh, name, job, start, CRASH_BYTES))
    how = ended(seen.state, seen.exit_status)
    killed = classify(seen.crash.data if seen.crash else b"", exit_signal=how.signal if how else None)
    if not kernel:
        return replace(seen, kernel_unreadable=ELSEWHERE)
    if seen.kernel is not None or seen.kernel_unreadable or killed.kind is not CrashClass.KILLED:
        return seen
    try:  # a SIGKILL with no OOM line in the log: did the kernel's OOM killer send it?
        oom = await call_helper(ssh, Ops.kernel_oom({"lines": KERNEL_LINES}), job=name)
    except RemoteError as exc:
        return replace(seen, kernel_unreadable=exc.message)
    lines = oom.get("lines")
    return replace(
        seen, kernel=None if lines is None else tuple(lines), kernel_unreadable=oom.get("unreadable")
    )


async def hang_evidence(
    ssh: RemoteHosts, name: str, job: JobConfig, current: Mapping[str, str], pids: Sequence[int]
) -> HangAnswer:
    """One helper ``hang`` call: state, ``wchan`` and ``py-spy`` stacks of the job's processes (or ``pids``).

    :raises RemoteError: if the host cannot be asked (within :data:`HANG_TIMEOUT` s).
    """
    ident = recorded_identity(current)
    args: HangArgs = {
        "name": name,
        "match": job.match,
        "workdir": job.workdir,
        "pid": ident["pid"],
        "start_time": ident["start_time"],
        "sid": ident["sid"],
    }
    if pids:
        args["pids"] = list(pids)
    return await call_helper(ssh, Ops.hang(args), job=name, timeout=HANG_TIMEOUT)


# --- text ---------------------------------------------------------------------------------------

NO_LOG_SINCE_LAUNCH = "(no log output since launch)"
ELSEWHERE = "not asked: the job's processes run on other nodes"  #: why a job's kernel log was not read  #: evidence when the job wrote nothing since its launch
