"""Attempts: how far each launched run got, what a restart lost, and whether throughput came back.

An *attempt* is one launched run of a job; what it wrote lies in the job's metric file between its
launch offset and the next attempt's.  :func:`read_attempt` is the one read (one helper ``read``
call); the rest is pure.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline import fmt
from pipeline.config import JobConfig
from pipeline.config.jobs import SCHEDULED, CrashClass, LostDuration
from pipeline.errors import PitstopError, RemoteCommandError
from pipeline.host.probe import ChunkReader
from pipeline.observe.crashes import Crash
from pipeline.observe.metrics import MAX_READ, TARGET, MetricLine, parse_metric_lines, percentile
from pipeline.observe.resume import ResumePoint
from pipeline.state.runs import Reach, RunRecord, RunStore
from pipeline.verdict import Lost, steps_of


async def metrics_offset(read: ChunkReader, name: str, job: JobConfig) -> int | None:
    """The size of the job's ``metrics_log`` now (bytes; read just before a launch, through the
    engine's ``read``), 0 when it cannot be read (not written yet); None without a ``metrics_log``
    (the engine's launch offset serves) or when the host does not answer."""
    if job.metrics_log is None:
        return None
    try:
        return (await read(name, job, 0, 0, path=job.metrics_log)).size
    except RemoteCommandError:
        return 0
    except PitstopError:
        return None


def attempt_start(run: RunRecord, job: JobConfig) -> int | None:
    """Where ``run``'s metric lines start in the job's metric file (``metrics_log``, else ``log``):
    bytes, None when unknown."""
    return run.metrics_size_at_launch if job.metrics_log is not None else run.log_size_at_launch


async def read_attempt(
    read: ChunkReader, name: str, job: JobConfig, start: int, end: int | None = None
) -> list[MetricLine]:
    """The metric lines of the job's metric file between bytes ``start`` and ``end`` (None: its
    end now; :func:`attempt_start`), of its last :data:`MAX_READ` bytes at most, read through
    ``read`` (the job's engine's).  A log now shorter
    than ``start`` (truncated or rotated) is read from 0; one shorter than ``end``: no lines.

    :raises RemoteError: if the host cannot be read.
    """
    if end is not None and end <= start:
        return []
    if end is None:
        tail = await read(name, job, -MAX_READ, MAX_READ, path=job.metrics_path)
        if tail.reset:
            return []
        # truncated or rotated since the launch (copytruncate): all it holds is this attempt's
        start = 0 if tail.size < start else start
        offset = tail.offset - len(tail.data)  # a chunk's offset is where it ends
        data, offset = tail.data[max(0, start - offset) :], max(offset, start)
    else:
        offset = max(start, end - MAX_READ)
        chunk = await read(name, job, offset, end - offset, path=job.metrics_path)
        if chunk.reset or chunk.size < end:  # truncated since: what the range held is gone
            return []
        data = chunk.data
    if offset > start and (cut := data.find(b"\n")) >= 0:
        data = data[cut + 1 :]
    return parse_metric_lines(data, job.metrics)


def _by_role(lines: Sequence[MetricLine]) -> tuple[dict[str, int], dict[str, int]]:
    """Role → first step logged, role → highest step logged."""
    first: dict[str, int] = {}
    high: dict[str, int] = {}
    for line in lines:
        if line.step is not None:
            first.setdefault(line.role, line.step)
            high[line.role] = max(high.get(line.role, line.step), line.step)
    return first, high


def compared_role(first: Mapping[str, int], high: Mapping[str, int]) -> str | None:
    """The role whose step counts across resumes: the one whose first logged step is the largest (a
    rank that resumed from N logs N+1 first, one that counts afresh logs 1); on a tie a role other
    than ``target`` (the reference pipeline's count from 1 in every run), then the one that got
    furthest.  None without steps."""
    return max(high, key=lambda role: (first.get(role, 0), role != TARGET, high[role], role), default=None)


def resumed_role(first: Mapping[str, int], high: Mapping[str, int], resumed_at: int | None) -> str | None:
    """:func:`compared_role` of a new run's first lines if that role's first step follows
    ``resumed_at`` (±1); None otherwise (then the previous attempt's lines decide)."""
    if not resumed_at or (role := compared_role(first, high)) is None:
        return None
    return None if abs(first[role] - (resumed_at + 1)) > 1 else role


def median_throughput(lines: Sequence[MetricLine], since: float | None = None) -> float | None:
    """The pipeline's throughput (tokens/s): per non-target rank (every rank without targets) the
    median of its reported ``tokens_per_s`` over its lines from ``since`` (unix s), summed; each
    rank's first line, which carries the start-up, is left out.  None when no line reports a rate.
    """
    pipe = [ln for ln in lines if ln.role != TARGET] or list(lines)
    per_rank: dict[tuple[str, int], list[float]] = {}
    for line in pipe:
        if (key := (line.role, line.rank)) not in per_rank:
            per_rank[key] = []  # its first line is left out
        elif line.tokens_per_s is not None and (since is None or (line.ts is not None and line.ts >= since)):
            per_rank[key].append(line.tokens_per_s)
    medians = [m for values in per_rank.values() if (m := percentile(values, 0.5)) is not None]
    return sum(medians) if medians else None


def reach_of(
    lines: Sequence[MetricLine], *, window_s: float, role: str | None = None, ended: str | None = None
) -> Reach:
    """How far an attempt got, from its metric lines in file order; its throughput over the last
    ``window_s`` seconds (``recovery_window``).  ``role`` is the compared role when known (from
    the attempt before or after it; if it logged no step here the step is unknown), else
    :func:`compared_role` of these lines."""
    first, high = _by_role(lines)
    role = role if role is not None else compared_role(first, high)
    last_at = max((ln.ts for ln in lines if ln.ts is not None), default=None)
    first_at = min((ln.ts for ln in lines if ln.ts is not None), default=None)
    timed = [(ln.ts, ln.step) for ln in lines if ln.role == role and ln.ts is not None and ln.step]
    (t0, s0), (t1, s1) = min(timed, default=(0.0, 0)), max(timed, default=(0.0, 0))
    return Reach(
        steps=high,
        role=role,
        step=high.get(role) if role is not None else None,
        steps_per_s=(s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None,
        tokens_per_s=median_throughput(lines, last_at - window_s if last_at is not None else None),
        last_at=last_at,
        first_at=first_at,
        ended=ended,
    )


def lost_work(
    previous: Reach,
    resumed_at: int,
    *,
    checkpoint: ResumePoint | None = None,
    sampled_at: float | None = None,
    timezone: str = "UTC",
) -> Lost | None:
    """What a restart that resumed at ``resumed_at`` (a step of the compared role) lost of
    ``previous``'s work: its reached step minus that, and the training time it took at its rate;
    None when its reach is unknown.  The time of ``checkpoint`` (seen at ``sampled_at``, unix s;
    shown in ``timezone``) is said when its step is the one resumed from."""
    if previous.step is None:
        return None
    # metric lines come every few steps; a checkpoint written at the stop (SIGTERM) can be past
    # the last of them, and the run that wrote it reached at least that step
    reached = max(previous.step, resumed_at)
    steps = reached - resumed_at
    seconds = steps / previous.steps_per_s if previous.steps_per_s else None
    at = None
    if checkpoint is not None and resumed_at and checkpoint.step == resumed_at and sampled_at is not None:
        at = fmt.clock(sampled_at - checkpoint.age_s, timezone, now=sampled_at)
    role = previous.role if len(previous.steps) > 1 else None
    return Lost(reached, steps, role, seconds, at)


def over_max_lost(lost: Lost, max_lost: int | LostDuration | None) -> bool:
    """Whether ``lost`` exceeds ``[jobs.NAME] max_lost`` (steps, or seconds of training)."""
    if isinstance(max_lost, LostDuration):
        return (lost.seconds or 0.0) > max_lost.seconds
    return max_lost is not None and lost.steps > max_lost


def checkpoint_interval(max_lost: int | LostDuration, steps_per_s: float | None) -> int | None:
    """The checkpoint interval (steps) that keeps a loss within ``max_lost``: ``max_lost`` steps, or
    the steps trained in ``max_lost`` seconds at ``steps_per_s`` (None when the rate is unknown)."""
    if not isinstance(max_lost, LostDuration):
        return max(1, max_lost)
    return max(1, math.floor(max_lost.seconds * steps_per_s)) if steps_per_s else None


def progressed(run: RunRecord, min_progress: int) -> bool | None:
    """Whether an attempt advanced ``min_progress`` steps past where it resumed (None: unknown — its
    reach is not recorded yet, or it logged no step and did not say where it started)."""
    if run.reach is None:
        return None
    if run.reach.step is None:  # a run that said where it resumed and logged no step did not advance
        return False if run.resumed_at else None
    return run.reach.step - (run.resumed_at or 0) >= min_progress


def no_progress_streak(attempts: Sequence[RunRecord], min_progress: int) -> list[RunRecord]:
    """The newest attempts, newest first, that in a row made no progress (an unknown ends the row)."""
    return list(itertools.takewhile(lambda run: progressed(run, min_progress) is False, attempts))


@dataclass(frozen=True)
class TrainingProgress:
    """Where a run stands against ``[jobs.NAME] total_steps`` (``total``): the highest ``step`` of
    the progress ``role`` (not ``target`` when there is another: the drafters count ``--max-steps``)."""

    step: int
    total: int
    role: str | None
    steps_per_s: float | None  #: the rate over the lines read, None when unknown

    @property
    def fraction(self) -> float:
        """Done, in [0, 1]."""
        return min(1.0, max(0.0, self.step / self.total))

    @property
    def eta_s(self) -> float | None:
        """Seconds to ``total`` at the current rate (0 once there), None when the rate is unknown."""
        if self.step >= self.total:
            return 0.0
        return (self.total - self.step) / self.steps_per_s if self.steps_per_s else None


def progress_toward(lines: Sequence[MetricLine], total_steps: int) -> TrainingProgress | None:
    """Step, share done and rate of the progress role (:class:`TrainingProgress`) from a window's
    metric lines; None when they hold no step."""
    _, high = _by_role(lines)
    if not high:
        return None
    role = max(high, key=lambda r: (r != TARGET, high[r], r))  # not target when there is another
    return TrainingProgress(
        high[role], total_steps, role, reach_of(lines, window_s=math.inf, role=role).steps_per_s
    )


async def record_dead(
    read: ChunkReader, runs: RunStore, name: str, job: JobConfig, run: RunRecord, *, ended: str | None
) -> RunRecord | None:
    """Record, once, how far ``run`` — the job's current attempt, now dead, ``ended`` as
    :func:`crash_words` says — got: in the role the attempt before it was compared in, when it
    resumed.  None when its log range is unknown.

    :raises RemoteError: if the host cannot be read.
    """
    if run.reach is not None:
        return run
    if (start := attempt_start(run, job)) is None:
        return None
    before = await runs.attempts(name, 1, before=run) if run.resumed_at else []
    role = before[0].reach.role if before and before[0].reach is not None else None
    lines = await read_attempt(read, name, job, start)
    return await runs.amend(
        run.id, reach=reach_of(lines, window_s=job.watch.recovery_window, role=role, ended=ended)
    )


@dataclass(frozen=True)
class Previous:
    """The attempt a newly verified run followed (its reach recorded), and what the restart lost."""

    run: RunRecord
    lost: Lost | None


async def account_previous(
    read: ChunkReader,
    runs: RunStore,
    name: str,
    job: JobConfig,
    run: RunRecord,
    *,
    resumed_at: int | None,
    checkpoint: ResumePoint | None,
    sampled_at: float,
    timezone: str,
) -> Previous | None:
    """Record how far the attempt before ``run`` (the new, launched run) got — in the role of
    :func:`resumed_role`, else the one recorded when it died — and what resuming at ``resumed_at``
    lost of it (0 or None: from scratch, so a restart lost every step; a start is not compared).
    ``checkpoint``: the newest one its verification saw, at ``sampled_at``.  None when there is no previous attempt or its
    log range is unknown.

    :raises RemoteError: if the host cannot be read.
    """
    if (end := attempt_start(run, job)) is None:
        return None
    before = await runs.attempts(name, 1, before=run)
    if not before or (start := attempt_start(prev := before[0], job)) is None:
        return None
    lines = await read_attempt(read, name, job, start, end)
    first, high = _by_role(await read_attempt(read, name, job, end))
    had = prev.reach or Reach()
    role = resumed_role(first, high, resumed_at) or had.role
    reach = reach_of(lines, window_s=job.watch.recovery_window, role=role, ended=had.ended)
    saved = await runs.amend(prev.id, reach=reach) or prev.model_copy(update={"reach": reach})
    # started over (a restart, not a start): all of the previous run's steps
    over = not resumed_at and run.action in ("restart", "auto-restart", "requeue") and bool(reach.step)
    lost = lost_work(reach, resumed_at or 0, checkpoint=checkpoint, sampled_at=sampled_at, timezone=timezone)
    return Previous(saved, lost if resumed_at or over else None)


@dataclass(frozen=True)
class Recovery:
    """The median throughput since a restart against the previous attempt's (tokens/s)."""

    now: float
    before: float
    slow: bool  #: ``now`` is under ``slow_after_restart`` × ``before``

    @property
    def ratio(self) -> float:
        """``now / before``."""
        return self.now / self.before


def recovery(now: float | None, before: float | None, slow_after: float) -> Recovery | None:
    """Compare the throughput since a restart with the one before (None when either is unknown)."""
    if now is None or before is None or before <= 0:
        return None
    return Recovery(now, before, now < slow_after * before)


# --- text ---------------------------------------------------------------------------------------


def lost_warning(job: str, lost: Lost, max_lost: int | LostDuration, steps_per_s: float | None) -> str:
    """The thread's warning for a restart that lost more than ``[jobs.NAME] max_lost``, with the
    checkpoint interval that would have kept it under."""
    took = f" (about {fmt.duration(lost.seconds)} of training)" if (lost.seconds or 0) >= 1 else ""
    limit = (
        steps_of(max_lost) if isinstance(max_lost, int) else f"{fmt.duration(max_lost.seconds)} of training"
    )
    hint = "checkpoint more often (the previous run's rate is unknown, so no interval can be named)"
    if (every := checkpoint_interval(max_lost, steps_per_s)) is not None:
        at = (
            f", about {fmt.duration(every / steps_per_s)} at {steps_per_s:.2f} steps/s" if steps_per_s else ""
        )
        hint = f"checkpointing every {steps_of(every)}{at} would have kept it under"
    return f"⚠ {job} lost {steps_of(lost.steps, lost.role)}{took} at this restart, more than max_lost ({limit}): {hint}"


_CLASS_WORDS = {
    CrashClass.NCCL_TIMEOUT: "NCCL timeout",
    CrashClass.NCCL_ERROR: "NCCL error",
    CrashClass.CUDA_OOM: "CUDA out of memory",
    CrashClass.HOST_OOM: "killed by the host's OOM killer",
    CrashClass.KILLED: "killed by SIGKILL (not the OOM killer)",
    CrashClass.XID: "GPU Xid error",
    CrashClass.SIGNAL: "killed by a signal",
    CrashClass.UNKNOWN: "an unknown cause",
    CrashClass.PREEMPTED: "preempted",
    CrashClass.TIME_LIMIT: "time limit",
    CrashClass.NODE_FAIL: "a node failure (Slurm's NODE_FAIL)",
}


def crash_words(crash: Crash) -> str:
    """A crash as people say it: ``CUDA out of memory on rank 6``, ``ValueError: loss is nan on rank 5``."""
    if crash.kind is CrashClass.PYTHON_EXCEPTION:
        what = f"{crash.exc_type or 'an exception'}" + (f": {crash.message}" if crash.message else "")
    else:
        what = _CLASS_WORDS[crash.kind]
    where = f" on rank {crash.rank}" if crash.rank is not None and crash.kind not in SCHEDULED else ""
    code = f" (exit code {crash.exit_code})" if crash.exit_code is not None else ""
    return what + where + code
