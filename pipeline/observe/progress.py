"""Per-rank progress from the metric stream: which rank stopped advancing, and for how long.

Each watch cycle reads the job's metric log from where the last one stopped (:func:`plan_many`: the read
rides on the host's probe) and folds the new lines into a :class:`ProgressState` kept in Redis
(``keys.rank_progress``): per rank its last ``step``, when it last went up (Pitstop's clock: one
watch interval's precision), its pid, and whether it reported waiting since (a JSON line
``{"event": "waiting", "rank", "role", "step", "on"}``, as the reference pipeline writes when
blocked in a collective or on a full queue; older logs name the role ``rank_role``).

:func:`judge` decides, purely:

- a rank whose step has not gone up for ``rank_stall_after`` s, that has not reported waiting
  since, while another rank advanced within that time or waits → **stuck** (``stuck_rank``);
- no rank advanced for ``stall_after`` s and none is stuck → the job is **frozen** (``stalled``:
  a log that keeps growing with warnings or wait reports is not progress).

The same lines feed the ranks' losses (:mod:`pipeline.observe.loss`): :func:`judge_many` reports
their trouble, if any, with the judgement.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from pipeline.config import JobConfig
from pipeline.errors import PitstopError
from pipeline.host.contract import LogRead
from pipeline.host.probe import JobProbe, LogChunk, read_log_chunk
from pipeline.host.remote import RemoteHosts
from pipeline.observe.loss import LossState, LossTrouble, trouble
from pipeline.observe.metrics import MAX_READ, parse_metric_lines, percentile
from pipeline.state.incidents import IncidentStore

log = logging.getLogger(__name__)

MIN_RANK_STALL = 60.0  #: seconds: the smallest default ``rank_stall_after``
STALL_FACTOR = 20.0  #: default ``rank_stall_after`` = this × the p95 time between advances
GAPS_KEPT = 200  #: advance gaps (s) kept for the p95


class RankState(BaseModel):
    """One rank's progress."""

    model_config = ConfigDict(extra="ignore")

    role: str = "worker"
    step: int = 0  #: the highest step it logged
    advanced_at: float  #: when (Pitstop's clock, unix s) its step last went up
    pid: int | None = None
    waiting_on: str | None = None  #: what it reported waiting on since its last advance (``all_reduce``)


class ProgressState(BaseModel):
    """A job's per-rank progress between cycles (``keys.rank_progress``, JSON)."""

    model_config = ConfigDict(extra="ignore")

    run_pid: int | None = None  #: the launched pid these ranks belong to (a new run starts afresh)
    offset: int = 0  #: the metric log byte read up to
    inode: int | None = None
    ranks: dict[str, RankState] = {}  #: keyed by rank as a string
    gaps: list[float] = []  #: recent seconds between a rank's advances (for the default threshold)
    loss: LossState = LossState()  #: the ranks' losses (:mod:`pipeline.observe.loss`)

    def ingest(self, data: bytes, job: JobConfig, now: float) -> ProgressState:
        """The copy with the metric log's new bytes folded in (complete lines only; the caller
        keeps the offset), read at ``now`` (Pitstop's clock, unix s)."""
        ranks = {k: v.model_copy() for k, v in self.ranks.items()}
        gaps = list(self.gaps)
        lines = parse_metric_lines(data, job.metrics)
        for line in lines:
            if line.step is None:
                continue
            if (r := ranks.get(key := str(line.rank))) is None:
                ranks[key] = RankState(role=line.role, step=line.step, advanced_at=now)
            elif line.step > r.step:
                if now > r.advanced_at:
                    gaps.append(now - r.advanced_at)
                r.step, r.advanced_at, r.role, r.waiting_on = line.step, now, line.role, None
        for rec in _json_records(data):
            rank = rec.get("rank")
            if not isinstance(rank, int):
                continue
            r = ranks.get(key := str(rank))
            if isinstance(rec.get("pid"), int) and r is not None:
                r.pid = rec["pid"]
            if rec.get("event") == "waiting":
                if r is None:
                    role = str(rec.get("role") or rec.get("rank_role") or "worker")
                    r = ranks[key] = RankState(role=role, step=int(rec.get("step") or 0), advanced_at=now)
                r.waiting_on = str(rec.get("on") or "?")
        loss = self.loss.ingest(lines, job.watch)
        return self.model_copy(update={"ranks": ranks, "gaps": gaps[-GAPS_KEPT:], "loss": loss})


def _json_records(data: bytes) -> list[dict[str, Any]]:
    """JSON objects of the complete lines holding a ``pid`` or an ``event`` (cheap pre-filter)."""
    out = []
    for line in data[: data.rfind(b"\n") + 1].splitlines():
        if line.startswith(b"{") and (b'"event"' in line or b'"pid"' in line):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return [rec for rec in out if isinstance(rec, dict)]


@dataclass(frozen=True)
class StuckRank:
    """A rank that stopped advancing while others advanced or wait on it."""

    rank: int
    role: str
    step: int
    stuck_for: float  #: seconds since its step last went up
    pid: int | None


@dataclass(frozen=True)
class Judgement:
    """What the ranks' progress says now."""

    known: bool  #: at least one rank logged a step (otherwise the log-bytes rule applies)
    stuck: tuple[StuckRank, ...] = ()  #: lowest rank first
    waiting: tuple[int, ...] = ()  #: ranks that report waiting
    frozen_for: float | None = None  #: seconds since any rank last advanced
    loss: LossTrouble | None = None  #: what is wrong with the ranks' loss, if anything


def rank_stall_threshold(job: JobConfig, gaps: Sequence[float]) -> float:
    """``watch.rank_stall_after``, else max(60 s, 20 × the p95 of ``gaps``) (seconds)."""
    if job.watch.rank_stall_after is not None:
        return job.watch.rank_stall_after
    return max(MIN_RANK_STALL, STALL_FACTOR * (percentile(gaps, 0.95) or 0.0))


def judge(state: ProgressState, now: float, threshold: float) -> Judgement:
    """Decide which ranks are stuck (module docstring); ``threshold``: ``rank_stall_after``, s."""
    if not state.ranks:
        return Judgement(known=False)
    ranks = sorted((int(k), r) for k, r in state.ranks.items())
    ages = {rank: now - r.advanced_at for rank, r in ranks}
    waiting = tuple(rank for rank, r in ranks if r.waiting_on)
    frozen_for = min(ages.values())
    # a rank past the threshold is stuck when another advanced within it (the freshest did) or waits
    live = frozen_for < threshold or bool(waiting)
    late = [(rank, r) for rank, r in ranks if live and not r.waiting_on and ages[rank] >= threshold]
    stuck = tuple(StuckRank(rank, r.role, r.step, ages[rank], r.pid) for rank, r in late)
    return Judgement(known=True, stuck=stuck, waiting=waiting, frozen_for=frozen_for)


def stuck_facts(steps: Judgement, host: str) -> dict[str, Any]:
    """The incident fields ``rank``, ``rank_role``, ``rank_step``, ``rank_pid`` naming the first
    stuck rank of ``steps`` (at least one), and the ``cause`` line naming all of them on ``host``."""
    first = steps.stuck[0]
    others = [s.rank for s in steps.stuck[1:]]
    cause = (
        f"rank {first.rank} ({first.role}) stuck at step {first.step} for {first.stuck_for:.0f} s"
        + (f", pid {first.pid} on {host}" if first.pid is not None else f" on {host}")
        + (f"; also stuck: ranks {', '.join(map(str, others))}" if others else "")
        + (f"; waiting on it: ranks {', '.join(map(str, steps.waiting))}" if steps.waiting else "")
    )
    return dict(rank=first.rank, rank_role=first.role, rank_step=first.step, rank_pid=first.pid, cause=cause)


def fold(state: ProgressState, chunk: LogChunk, job: JobConfig, now: float) -> ProgressState:
    """The progress after the bytes :func:`plan_many`'s read returned, at ``now`` (unix s): complete
    lines only (a partial last line is read again); a log far behind skips to its last
    :data:`MAX_READ` bytes."""
    end = chunk.data.rfind(b"\n") + 1
    base = ProgressState(run_pid=state.run_pid, gaps=state.gaps, loss=state.loss) if chunk.reset else state
    new = base.ingest(chunk.data[:end], job, now)
    # far behind (a long log first seen): only the recent lines matter
    offset = max(chunk.offset - (len(chunk.data) - end), chunk.size - MAX_READ)
    return new.model_copy(update={"offset": offset, "inode": chunk.inode})


@dataclass(frozen=True)
class Tracked:
    """A job whose progress a watch cycle follows."""

    name: str
    job: JobConfig
    run_pid: int | None = None  #: its newest run's launched pid (a new one starts the ranks afresh)
    launch_offset: int | None = None  #: the log's size at that launch, bytes


Planned = dict[str, tuple[ProgressState, LogRead]]
"""Job name → the state its bytes fold into, and the read that goes with the host's probe."""


async def plan_many(store: IncidentStore, tracked: Sequence[Tracked]) -> Planned:
    """For every job of a cycle (their stored progress read in one Redis round trip) the state to
    pass to :func:`fold`, and this cycle's read of its metric log (it goes with the host's probe).
    A new ``run_pid`` starts with no ranks, from ``launch_offset`` (the log's size at its launch)
    when the metric lines are in the job's log."""
    stored = await store.progress([t.name for t in tracked])
    planned: Planned = {}
    for t in tracked:
        st = ProgressState.model_validate_json(raw) if (raw := stored.get(t.name)) else ProgressState()
        if t.run_pid is not None and t.run_pid != st.run_pid:
            at = t.launch_offset if t.launch_offset is not None and t.job.metrics_log is None else st.offset
            st = ProgressState(run_pid=t.run_pid, offset=at, inode=st.inode)
        read = LogRead(
            path=t.job.metrics_path, offset=st.offset, max_bytes=MAX_READ, inode=st.inode, if_running=True
        )
        planned[t.name] = st, read
    return planned


async def judge_many(
    ssh: RemoteHosts,
    store: IncidentStore,
    tracked: Sequence[Tracked],
    probes: Mapping[str, JobProbe],
    planned: Planned,
    now: float,
) -> list[Judgement | None]:
    """Each job's :class:`Judgement` after its probe (``probes``: by job name), with its loss
    trouble (:func:`pipeline.observe.loss.trouble`), in ``tracked``'s order: the bytes the probe read (a job whose engine did not read them: read in a call of its
    own) folded into ``planned`` (:func:`plan_many`), every new state stored in one round trip.
    None for a job with no process, not seen, or whose metric log could not be read (logged)."""

    async def read(t: Tracked) -> LogChunk | None:
        probe, (_, r) = probes.get(t.name), planned[t.name]
        if probe is None or probe.error or probe.count == 0:
            return None
        why = probe.read_error
        if why is None and probe.read is not None:
            return probe.read
        try:
            if why is None:  # the engine did not read it with the probe
                at = (r["offset"], r["max_bytes"])
                return await read_log_chunk(ssh, t.name, t.job, *at, inode=r["inode"], path=r["path"])
        except PitstopError as exc:
            why = exc.message
        log.info("watch %s: no step progress: %s", t.name, why)
        return None

    chunks = zip(tracked, await asyncio.gather(*map(read, tracked)), strict=True)
    states = {t.name: fold(planned[t.name][0], chunk, t.job, now) for t, chunk in chunks if chunk is not None}
    await store.save_progress({name: state.model_dump_json() for name, state in states.items()})
    return [
        dataclasses.replace(
            judge(st, now, rank_stall_threshold(t.job, st.gaps)), loss=trouble(st.loss, t.job.watch)
        )
        if (st := states.get(t.name))
        else None
        for t in tracked
    ]
