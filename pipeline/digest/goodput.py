"""Goodput: the share of a window's wall-clock time in which a job made progress, and the rest by cause.

As Google's ML goodput measurement defines it: *productive* time over total time, the rest
*badput* by cause.  :func:`goodput` is pure, over a :class:`Timeline` built from records Pitstop
already keeps (:func:`timeline`: the job's runs with their reach and loss, its incidents with their
open and resolve times, the window's metric lines):

- **total** is the window less the time the job was stopped on purpose (a ``stop`` run until the
  next launch) and the time before its first recorded launch;
- **restart**: from an attempt's last progress (its last metric line; unknown: the next run's
  request) to the next attempt's first step — charged to that attempt (``r-7's restart``);
- **pending**: a launched run queued by its scheduler (Slurm ``PENDING``), launch to running;
- **stall**: an open ``stalled``, ``stuck_rank``, ``dead``, ``degraded``, ``unreachable`` or
  ``crash_loop`` incident while the job was otherwise counted productive;
- **loss**: an open ``loss_nan`` or ``loss_spike`` incident (by name: the kinds are the watcher's);
- **redone**: the steps a resume lost, at the previous run's rate (``lost_s``), trained again after it.

Where causes overlap, the first of :class:`Cause`'s order wins, so the parts add up to the lost time.
With the job's GPU count (:func:`gpu_count`), the time lost is also GPU-hours.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pipeline import fmt
from pipeline.config import JobConfig
from pipeline.observe.metrics import MetricLine
from pipeline.state.incidents import Incident, IncidentSpan, IncidentStore
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunRecord
from pipeline.verdict import Verdict

DAY_S = 86400.0  #: the window of ``/metrics``' goodput and ``history --attempts``' longest
GOODPUT_RUNS = 100  #: a job's newest runs read for its goodput (a day of restarts, and more)


class Cause(StrEnum):
    """Why time was lost, in precedence order (where two overlap, the first counts); the values
    are ``pitstop_gpu_hours_lost_total``'s ``cause`` label."""

    PENDING = "pending"
    RESTART = "restart"
    STALL = "stall"
    LOSS = "loss"
    REDONE = "redone"


#: incident kind → the cause its open time counts as (kinds not named here cost nothing: idle GPUs)
CAUSE_OF_KIND: Mapping[str, Cause] = {
    "stalled": Cause.STALL,
    "stuck_rank": Cause.STALL,
    "dead": Cause.STALL,
    "degraded": Cause.STALL,
    "unreachable": Cause.STALL,
    "crash_loop": Cause.STALL,
    "loss_nan": Cause.LOSS,
    "loss_spike": Cause.LOSS,
}


@dataclass(frozen=True)
class Attempt:
    """One launched run as goodput sees it; times in unix s."""

    run_id: str
    created_at: float  #: when it was asked for (a restart's stop began then)
    launched_at: float
    running_at: float | None = None  #: when its scheduler started it (None: at launch, or still queued)
    queued: bool = False  #: still queued now (verdict ``PENDING``)
    first_at: float | None = None  #: its first step (None: none yet)
    last_at: float | None = None  #: its last progress (None: progressing still, or unknown)
    lost_s: float | None = None  #: the training time its resume lost, to be trained again (s)


@dataclass(frozen=True)
class Timeline:
    """What a job did, as goodput needs it: attempts and stops (unix s), and incidents."""

    attempts: tuple[Attempt, ...] = ()  #: oldest first
    stops: tuple[float, ...] = ()  #: when the job was stopped on purpose (a ``stop`` run)
    incidents: tuple[IncidentSpan, ...] = ()  #: ``resolved_at`` None: still open
    gpus: int | None = None  #: the job's GPU count (:func:`gpu_count`)


@dataclass(frozen=True)
class Lost:
    """Seconds lost to one cause (and, for a restart, pending or redone work, one attempt)."""

    cause: Cause
    seconds: float
    run_id: str | None = None


@dataclass(frozen=True)
class Goodput:
    """A window's goodput: total and productive seconds, and the time lost by cause (largest first)."""

    start: float
    end: float
    total_s: float
    productive_s: float
    lost: tuple[Lost, ...]
    gpus: int | None

    @property
    def ratio(self) -> float | None:
        """Productive over total, in [0, 1]; None when the job ran no time of the window."""
        return self.productive_s / self.total_s if self.total_s > 0 else None

    @property
    def lost_s(self) -> float:
        """Seconds lost, all causes."""
        return sum(part.seconds for part in self.lost)

    def by_cause(self) -> dict[Cause, float]:
        """Cause → seconds lost (every cause, 0 when none)."""
        out = dict.fromkeys(Cause, 0.0)
        for part in self.lost:
            out[part.cause] += part.seconds
        return out

    def gpu_hours(self, seconds: float) -> float | None:
        """``seconds`` of the job as GPU-hours (None without a GPU count)."""
        return None if self.gpus is None else seconds * self.gpus / 3600


def goodput(line: Timeline, start: float, end: float) -> Goodput:
    """The goodput of ``line`` over ``[start, end]`` (unix s), as the module docstring defines it.

    :raises ValueError: if ``end`` is before ``start``.
    """
    if end < start:
        raise ValueError(f"goodput window ends ({end}) before it starts ({start})")
    # labelled spans; the sweep below keeps, for each stretch, the first label in ``order``
    spans: list[tuple[float, float, str, str | None]] = []
    attempts = sorted(line.attempts, key=lambda a: a.launched_at)
    if attempts:
        spans.append((-math.inf, attempts[0].launched_at, "off", None))
    else:
        spans.append((-math.inf, math.inf, "off", None))
    for stop in line.stops:
        after = [a.launched_at for a in attempts if a.launched_at > stop]
        spans.append((stop, min(after, default=math.inf), "off", None))
    since = attempts[0].launched_at if attempts else math.inf  # where the current gap began
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        queued_until = math.inf if a.queued else a.running_at
        if queued_until is not None and queued_until > a.launched_at:
            spans.append((a.launched_at, queued_until, Cause.PENDING, a.run_id))
        if a.first_at is None:  # never stepped: the gap goes on to a later attempt's first step
            if nxt is None:
                spans.append((since, math.inf, Cause.RESTART, a.run_id))
            continue
        spans.append((since, a.first_at, Cause.RESTART, a.run_id))
        until = a.last_at if a.last_at is not None else (nxt.created_at if nxt is not None else math.inf)
        spans.append((a.first_at, until, "productive", a.run_id))
        since = until
    for inc in line.incidents:
        if (cause := CAUSE_OF_KIND.get(inc.kind)) is not None:
            spans.append((inc.opened_at, inc.resolved_at or math.inf, cause, None))
    order = ["off", Cause.PENDING, Cause.RESTART, Cause.STALL, Cause.LOSS, "productive"]
    cuts = sorted({start, end} | {t for s, e, *_ in spans for t in (s, e) if start < t < end})
    seconds: dict[tuple[str, str | None], float] = {}
    for lo, hi in itertools.pairwise(cuts):
        here = [(order.index(label), label, run) for s, e, label, run in spans if s <= lo and hi <= e]
        # a stretch nothing covers: the job made progress that no record contradicts
        _, label, run = min(here, default=(0, "productive", None))
        key = (label, run if label in (Cause.PENDING, Cause.RESTART) else None)
        seconds[key] = seconds.get(key, 0.0) + (hi - lo)
    productive = sum(s for (label, _), s in seconds.items() if label == "productive")
    lost = [
        Lost(Cause(label), s, run) for (label, run), s in seconds.items() if label in set(Cause) and s > 0
    ]
    for a in attempts:  # work redone: taken from the productive time after its resume
        if a.lost_s and a.first_at is not None and start <= a.first_at < end and productive > 0:
            redone = min(a.lost_s, productive)
            productive -= redone
            lost.append(Lost(Cause.REDONE, redone, a.run_id))
    total = (end - start) - seconds.get(("off", None), 0.0)
    ordered = tuple(sorted(lost, key=lambda p: (-p.seconds, order_of(p.cause), p.run_id or "")))
    return Goodput(start, end, total, productive, ordered, line.gpus)


def order_of(cause: Cause) -> int:
    """``cause``'s place in :class:`Cause`'s precedence order."""
    return list(Cause).index(cause)


# --- the job's GPUs ------------------------------------------------------------------------------

_SLURM_GPUS = re.compile(r"(?:gpu:)?(?:[\w-]+:)?(\d+)")  #: ``4``, ``gpu:4``, ``gpu:a100:4``
_GPU_FLAGS = {"--gpus": False, "-G": False, "--gpus-per-node": True, "--gres": True}  #: flag → per node


def gpu_count(job: JobConfig) -> int | None:
    """The job's GPU count: its ``gpus`` roles, else its Slurm allocation as its ``sbatch_args`` ask
    for it (``--gpus=N``, ``-G N``; ``--gpus-per-node=N`` or ``--gres=gpu[:type]:N`` × ``nodes``);
    None when neither says."""
    if job.gpus is not None and job.gpus.all:
        return len(job.gpus.all)
    table = job.slurm or {}
    args = [str(a) for a in table.get("sbatch_args", [])]
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        if flag in _GPU_FLAGS and (m := _SLURM_GPUS.fullmatch(value)):
            return int(m.group(1)) * (int(table.get("nodes", 1)) if _GPU_FLAGS[flag] else 1)
    return None


# --- building the timeline from Pitstop's records ---------------------------------------------


def attempt_of(run: RunRecord, lines: Sequence[MetricLine] = ()) -> Attempt | None:
    """``run`` as an :class:`Attempt` (None if it launched nothing).  Its first step is its reach's,
    else the first of ``lines`` (a window's metric lines) at or after its launch, else — a RUNNING
    verdict says it stepped — when its verification ended."""
    if run.launched_at is None or run.action == "stop":
        return None
    reach = run.reach
    first = reach.first_at if reach is not None else None
    if first is None:
        first = min((ln.ts for ln in lines if ln.ts is not None and ln.ts >= run.launched_at), default=None)
    if first is None and run.verdict is Verdict.RUNNING and (verify := run.steps[-1:]):
        first = verify[0].ended_at
    return Attempt(
        run_id=run.id,
        created_at=run.created_at,
        launched_at=run.launched_at,
        running_at=run.running_at,
        queued=run.verdict is Verdict.PENDING,
        first_at=first,
        last_at=reach.last_at if reach is not None else None,
        lost_s=run.lost_s,
    )


def timeline_of(
    runs: Iterable[RunRecord],
    incidents: Iterable[Incident | IncidentSpan],
    *,
    gpus: int | None,
    lines: Sequence[MetricLine] = (),
) -> Timeline:
    """The :class:`Timeline` of one job's ``runs`` (any order) and ``incidents`` (resolved spans, and
    the open one)."""
    runs = sorted(runs, key=lambda r: r.created_at)
    attempts = tuple(a for r in runs if (a := attempt_of(r, lines)) is not None)
    stops = tuple(r.created_at for r in runs if r.action == "stop" and r.verdict is None and r.finished_at)
    spans = tuple(
        IncidentSpan(n=i.n, kind=i.kind, opened_at=i.opened_at, resolved_at=i.resolved_at)
        if isinstance(i, Incident)
        else i
        for i in incidents
    )
    return Timeline(attempts, stops, spans, gpus)


async def job_goodput(
    redis: RedisHandle,
    name: str,
    job: JobConfig,
    runs: Iterable[RunRecord],
    *,
    start: float,
    end: float,
    lines: Sequence[MetricLine] = (),
) -> Goodput:
    """The goodput of job ``name`` over ``[start, end]`` (unix s) from its ``runs`` (the caller's
    read: every run of the job back to before ``start``), the incidents of it resolved since
    ``start`` and the open one, and a window's metric ``lines``.

    :raises StateUnavailable: if Redis does not answer.
    """
    store = redis.open_store(IncidentStore)
    spans: list[Incident | IncidentSpan] = list(await store.history(name, since=start))
    if (open_now := await store.incident(name)) is not None:
        spans.append(open_now)
    line = timeline_of((r for r in runs if r.job == name), spans, gpus=gpu_count(job), lines=lines)
    return goodput(line, start, end)


# --- text ---------------------------------------------------------------------------------------


def _part(part: Lost) -> str:
    took = fmt.duration(part.seconds)
    return {
        Cause.PENDING: f"{took} queued ({part.run_id})",
        Cause.RESTART: f"{took} to {part.run_id}'s restart",
        Cause.STALL: f"{took} stalled",
        Cause.LOSS: f"{took} of loss trouble",
        Cause.REDONE: f"{took} redone after {part.run_id}'s resume",
    }[part.cause]


def goodput_line(g: Goodput, over: str | None = None) -> str | None:
    """``goodput 91 % over 24 h: 1.3 GPU-h lost — 40 min to r-7's restart, 12 min stalled`` (the
    time lost when the GPU count is unknown; ``over``: the window's words, default its length);
    None when the job ran no time of the window."""
    if (ratio := g.ratio) is None:
        return None
    over = over if over is not None else f"over {fmt.duration(g.end - g.start)}"
    head = f"goodput {ratio * 100:.0f} % {over}"
    if not g.lost:
        return f"{head}: nothing lost"
    gpu_h = g.gpu_hours(g.lost_s)
    lost = f"{gpu_h:.1f} GPU-h" if gpu_h is not None else fmt.duration(g.lost_s)
    return f"{head}: {lost} lost — " + ", ".join(_part(p) for p in g.lost)


def incident_cost(kind: str, open_s: float, gpus: int | None) -> str | None:
    """``cost 0.6 GPU-h``: what an incident of ``kind`` open ``open_s`` seconds cost a job of
    ``gpus`` GPUs; None when its kind costs nothing (idle GPUs) or the GPU count is unknown."""
    if kind not in CAUSE_OF_KIND or gpus is None:
        return None
    return f"cost {open_s * gpus / 3600:.1f} GPU-h"
