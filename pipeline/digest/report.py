"""Throughput digests: what a training job did since the last digest, from its metric log.

:func:`build_digest` assembles a :class:`Digest` from a bounded read of the log
(:mod:`~pipeline.digest.window`), parsed (:mod:`~pipeline.observe.metrics`), aggregated
(:mod:`~pipeline.digest.stats`) and charted (:mod:`~pipeline.digest.chart`, which imports matplotlib on its first chart); its dependencies are
passed in, it knows nothing of the handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pipeline.config import Config, JobConfig
from pipeline.digest import window as windows
from pipeline.digest.chart import RestartMark, draw_chart, restart_label
from pipeline.digest.goodput import Goodput, job_goodput
from pipeline.digest.stats import DigestSummary, compare, summarise
from pipeline.errors import PitstopError
from pipeline.host.remote import RemoteHosts
from pipeline.observe.attempts import TrainingProgress, progress_toward
from pipeline.observe.gpus import GpuStat, query_gpus
from pipeline.observe.metrics import DRAFTER, TARGET, MetricLine, parse_metric_lines, why_none
from pipeline.state.events import EventKind, Events
from pipeline.state.jobstate import DigestMemory, JobStore
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunRecord, RunStore

CHARTS_KEPT = 20  #: chart PNGs kept per job under ``state/charts``
ATTEMPTS_SHOWN = 3  #: attempts in a digest's footer


@dataclass(frozen=True)
class GpuRow(GpuStat):
    """One configured GPU of a job: nvidia-smi's numbers (None = n/a; ``name`` empty when it did
    not report the GPU) and the GPU's role."""

    role: str


@dataclass(frozen=True)
class SilentRank:
    """A rank that was expected in the window and wrote no metric line in it."""

    rank: int
    role: str  #: from ``gpus`` or from the digest that last saw it
    last_seen: float | None  #: ``ts`` of its last metric line in an earlier digest (unix s)


def silent_ranks(
    spec: JobConfig, summary: DigestSummary, seen: Mapping[int, SilentRank]
) -> tuple[SilentRank, ...]:
    """The ranks a digest of the job should list with no metric line in the window, by rank: from
    its ``gpus`` (ranks ``0..T-1`` targets, then drafters: ``pipeline/dflash/README.md``), and every
    rank an earlier digest saw (``seen``), whose recorded role wins."""
    gpus = spec.gpus
    roles = [TARGET] * len(gpus.target) + [DRAFTER] * len(gpus.drafter) if gpus is not None else []
    expected = {rank: SilentRank(rank, role, None) for rank, role in enumerate(roles)} | dict(seen)
    present = {r.rank for r in summary.ranks}
    return tuple(silent for rank, silent in sorted(expected.items()) if rank not in present)


def seen_update(summary: DigestSummary, seen: Mapping[int, SilentRank]) -> dict[str, str]:
    """The ``keys.digest_ranks`` fields to write for the ranks in this window (never moving a
    rank's last ``ts`` backwards)."""
    out: dict[str, str] = {}
    for r in summary.ranks:
        known = [t for t in (seen[r.rank].last_seen if r.rank in seen else None, r.last_ts) if t is not None]
        out[str(r.rank)] = json.dumps({"role": r.role, "last_ts": max(known, default=None)})
    return out


@dataclass(frozen=True)
class Digest:
    """A built digest: the summary plus everything around it a reply shows."""

    job: str
    summary: DigestSummary
    window: windows.LogWindow  #: without its bytes (``data`` is empty)
    path: str  #: the metric log on the host
    max_bytes: int  #: the read bound used
    change: dict[str, float] = field(default_factory=dict)  #: ±% against the last scheduled digest
    gpus: tuple[GpuRow, ...] | None = None  #: None when the job has no ``gpus`` or no data came back
    gpu_note: str | None = None  #: why there is no (or partial) GPU data
    chart: Path | None = None  #: the PNG written; None when the window had no timed metric lines
    empty_why: str | None = None  #: why no line of the window counts (:func:`why_none`), when none does
    uptime_s: float | None = None  #: seconds since the current run was launched; None if unknown or stopped
    restarts: tuple[str, ...] | None = None  #: run ids created since the window began, newest first
    silent: tuple[SilentRank, ...] = ()  #: expected ranks without a line (:func:`silent_ranks`)
    marks: tuple[RestartMark, ...] = ()  #: the restarts drawn on the chart, oldest first
    progress: TrainingProgress | None = None  #: against ``total_steps`` (when set): the ETA
    attempts: tuple[RunRecord, ...] = ()  #: the last :data:`ATTEMPTS_SHOWN`, newest first (the footer)
    live_run: str | None = None  #: the attempt running now
    goodput: Goodput | None = None  #: over the window: since the last scheduled digest (else its first line)


async def _gpu_rows(ssh: RemoteHosts, job: JobConfig) -> tuple[tuple[GpuRow, ...] | None, str | None]:
    if job.gpus is None or not job.gpus.all:
        return None, None
    try:
        stats = {g.index: g for g in await query_gpus(ssh, job.host)}
    except PitstopError as exc:
        return None, f"no GPU data: {exc.message}"
    if not stats:
        return None, "no GPU data: nvidia-smi listed no GPUs"
    roles = [(i, TARGET) for i in job.gpus.target] + [(i, DRAFTER) for i in job.gpus.drafter]
    rows = tuple(
        GpuRow(**asdict(stats.get(i) or GpuStat(i, "", None, None, None, None)), role=role)
        for i, role in roles
    )
    missing = ", ".join(str(i) for i, _ in roles if i not in stats)
    return rows, f"GPU index(es) {missing} configured but not reported by nvidia-smi" if missing else None


def restart_marks(
    recent: Sequence[RunRecord], start: float | None, end: float | None
) -> tuple[RestartMark, ...]:
    """The runs (``recent``: newest first) launched within ``[start, end]`` (unix s) as the chart's
    restart lines, oldest first (a ``stop`` launches nothing; a failed launch has no
    ``launched_at``).  None for ``start`` or ``end`` (no timestamps) marks nothing."""
    return tuple(
        RestartMark(r.launched_at, r.id, restart_label(r.id, r.action, r.patches))
        for r in reversed(recent)
        if start is not None
        and end is not None
        and r.launched_at is not None
        and start <= r.launched_at <= end
        and r.action != "stop"
    )


def _draw(
    lines: Sequence[MetricLine],
    path: Path,
    job: str,
    marks: Sequence[RestartMark],
    last_digest: float | None,
    timezone: str,
) -> Path:
    """Draw the window's lines (in a worker thread: it is slow) and keep the job's last
    :data:`CHARTS_KEPT` charts; the PNG's path with links resolved (the demo's ``charts`` links to a
    lasting place)."""
    path = path.parent.resolve() / path.name
    draw_chart(
        lines,
        title=f"{job}: pipeline tokens/s",
        restarts=marks,
        last_digest=last_digest,
        path=path,
        timezone=timezone,
    )
    for old in sorted(path.parent.glob(f"{job.lower()}-*.png"), key=lambda p: p.name)[:-CHARTS_KEPT]:
        old.unlink(missing_ok=True)
    return path


async def build_digest(
    job: str,
    *,
    config: Config,
    redis: RedisHandle,
    ssh: RemoteHosts,
    events: Events,
    scheduled: bool,
    max_bytes: int = windows.MAX_WINDOW_BYTES,
    first_bytes: int = windows.FIRST_WINDOW_BYTES,
    reader: windows.LogReader | None = None,
    chart: bool = True,
) -> Digest:
    """Read the job's new metric lines (``reader``: default the job's host over SSH), aggregate
    them, add GPU stats, uptime and a ``chart``; a scheduled digest stores the new offset and its
    headline numbers (in ``keys.digest_last``, for the next one's ±% change), an on-demand one
    nothing but the chart; a ``digest`` event either way.

    :param first_bytes: the most read by a first digest (no stored offset: the log's last bytes).
    :raises KeyError: if ``job`` (case-insensitive) is not configured.
    :raises RemoteCommandError: if the metric log cannot be read (missing file…).
    :raises HostUnreachable: if the host cannot be reached.
    """
    name = config.job_name(job)
    spec = config.jobs[name]
    memory = redis.open_store(DigestMemory)
    state = windows.OffsetState.from_hash(await memory.offset(name))
    read = reader if reader is not None else windows.remote_reader(ssh, name, spec)
    max_bytes = min(max_bytes, first_bytes) if state is None else max_bytes
    window = await windows.read_window(read, state, scheduled=scheduled, max_bytes=max_bytes)
    lines = await asyncio.to_thread(parse_metric_lines, window.data, spec.metrics)
    repeat = window.kind is windows.WindowKind.REPEAT  # the last scheduled digest again: no change
    now = time.time()
    runs = redis.open_store(RunStore)
    recent = await runs.recent(name, 100)
    timed = [ln.ts for ln in lines if ln.ts is not None]
    # the restarts in the window: the chart's lines, and where a rank's rate has a gap
    marks = restart_marks(recent, min(timed, default=None), (max(timed, default=now) if repeat else now))
    summary = summarise(
        lines, lines_read=window.data.count(b"\n"), bytes_read=len(window.data), restarts=marks
    )
    seen: dict[int, SilentRank] = {}  # the ranks earlier digests saw, with their role and last ts
    for rank, value in (await memory.ranks(name)).items():
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):  # not {"role", …}
            data = json.loads(value)
            last = data.get("last_ts")
            seen[int(rank)] = SilentRank(int(rank), str(data["role"]), None if last is None else float(last))
    if summary.ranks:
        await memory.add_ranks(name, seen_update(summary, seen))
    previous = None  # the last scheduled digest's headline numbers (DigestSummary.headline)
    with contextlib.suppress(ValueError):
        previous = json.loads(await memory.last(name) or "null")
    previous = previous if isinstance(previous, dict) else None
    change = compare(previous, summary) if not repeat else {}
    gpus, gpu_note = await _gpu_rows(ssh, spec)
    path: Path | None = None
    if chart and timed:  # lines without ts have no time axis: no chart
        where = config.state.path / "charts" / f"{name.lower()}-{int(now * 1000)}.png"
        last_rate = None if repeat else (previous or {}).get("pipeline_tokens_per_s")
        zone = config.scheduler.timezone
        path = await asyncio.to_thread(_draw, lines, where, name, marks, last_rate, zone)
    since = summary.window_start if summary.window_start is not None else (state.at if state else None)
    # goodput over the window: since the last scheduled digest, else since the window's first line
    began = state.at if state is not None and not repeat else summary.window_start
    good = None
    if began is not None and began < now:
        good = await job_goodput(redis, name, spec, recent, start=began, end=now, lines=lines)
    snapshot = await redis.open_store(JobStore, config).read(name, now=now)
    digest = Digest(
        job=name,
        summary=summary,
        window=replace(window, data=b""),
        path=spec.metrics_path,
        max_bytes=max_bytes,
        change=change,
        gpus=gpus,
        gpu_note=gpu_note,
        chart=path,
        empty_why=why_none(window.data, spec.metrics) if not lines and window.data else None,
        uptime_s=snapshot.uptime(now),
        restarts=None
        if since is None
        else tuple(r.id for r in recent if r.created_at >= since and r.action != "stop"),
        silent=silent_ranks(spec, summary, seen),
        marks=marks,
        progress=progress_toward(lines, spec.total_steps) if spec.total_steps is not None and lines else None,
        attempts=tuple(await runs.attempts(name, ATTEMPTS_SHOWN)),
        live_run=snapshot.run_id,
        goodput=good,
    )
    if scheduled:
        last = json.dumps({**summary.headline(), "at": now}) if summary.metric_lines else None
        await memory.save(name, window.state(now).to_hash(), last)
    await events.publish(
        EventKind.DIGEST,
        name,
        tokens_per_s=summary.pipeline_tokens_per_s,
        target_tokens_per_s=summary.target_tokens_per_s,
        change_pct=change.get("pipeline_tokens_per_s"),
        scheduled=scheduled,
        window=window.kind.value,
        lines=summary.metric_lines,
        bytes=summary.bytes_read,
        chart=str(path) if path else None,
    )
    return digest
