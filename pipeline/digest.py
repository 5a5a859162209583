"""Throughput digests: what a training job did since the last digest, from its metric log.

A digest reads only the metric-log bytes written since the last scheduled digest — never the
whole log — and aggregates them:

- **window**: the byte offset where the last scheduled digest stopped is kept in Redis
  (``keys.digest_offset``) with the file's inode, size and the last bytes before the offset (a
  fingerprint).  A file now shorter than the offset was truncated; another inode, or other bytes
  before the offset, means it was rotated or rewritten: either way the digest starts again from
  the beginning of the current file.  At most ``max_bytes`` (8 MiB) are read per digest: when
  more was written, only the **last** ``max_bytes``, aligned to a line start, are read.  Only
  complete lines count; a partial last line is read by the next digest.
- **scheduled vs on demand**: a scheduled digest moves the offset and stores its headline numbers
  (``keys.digest_last``) for the next one's ±% change.  An on-demand digest moves nothing: it
  reads what was written since the scheduled offset, or — when nothing complete was written since
  — the last scheduled digest's window again, or the last ``max_bytes`` when there is no offset.
- **aggregation** (:func:`summarise`, pure): per rank, tokens/s is Δtokens/Δtime between its
  first and last line in the window from the cumulative ``tokens`` counter (not an average of
  rates).  A counter that goes down was restarted from zero (a relaunch): the value after the
  reset counts as that step's increase (as Prometheus' ``increase()`` treats counter resets).  The
  pipeline's tokens/s is the sum over the ranks that are not ``target`` (the drafters, which
  consume what targets produce); targets are summed separately and never added in.

The I/O around it (:func:`build_digest`) is thin: one bounded read through a :data:`LogReader`
(the job's host over SSH, or a local file), GPU statistics from ``nvidia-smi`` when the job has
``gpus``, a PNG chart, and the Redis bookkeeping.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import keys, messages
from pipeline.errors import PitstopError
from pipeline.events import EventKind
from pipeline.gpus import query_gpus
from pipeline.hostprobe import read_log_chunk
from pipeline.metrics import MetricLine, parse_metric_lines

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from handlers.context import Context
    from pipeline.config import JobConfig
    from pipeline.remote import RemoteHosts
    from pipeline.runs import RunRecord

MAX_WINDOW_BYTES = 8 * 1024 * 1024  #: most bytes of metric log read per digest
FINGERPRINT_BYTES = 64  #: bytes before the stored offset kept to recognise the same file
STARVED_BELOW = 0.5  #: mean drafter queue depth under which drafters are starved of hidden states
CHARTS_KEPT = 20  #: chart PNGs kept per job under ``state/charts``
TARGET = "target"
DRAFTER = "drafter"
COMPARED = ("pipeline_tokens_per_s", "step_p50", "step_p95", "top1", "top4", "top8")


# --- aggregation (pure) -----------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile of ``values`` by linear interpolation between closest ranks.

    The same definition as numpy's default: position ``(n - 1) * q`` in the sorted values.

    :param q: in [0, 1] (0.5 is the median, 0.95 the 95th percentile).
    :returns: the quantile, or None for no values.
    """
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def counter_increase(values: Sequence[float]) -> tuple[float, int]:
    """The increase of a cumulative counter over consecutive samples, and the resets seen.

    A sample lower than the one before means the counter restarted from zero, so that sample's
    whole value is the increase for that step.

    :param values: the counter's samples in time order.
    :returns: (total increase, number of resets).
    """
    total = 0.0
    resets = 0
    for prev, cur in itertools.pairwise(values):
        if cur < prev:
            resets += 1
            total += cur
        else:
            total += cur - prev
    return total, resets


@dataclass(frozen=True)
class RankStats:
    """One rank's numbers over the window.

    :ivar tokens: tokens processed between its first and last line (resets handled).
    :ivar seconds: time between its first and last line.
    :ivar tokens_per_s: ``tokens / seconds``; when the rank has fewer than two timed lines, the
        mean of its reported ``tokens_per_s`` (``rate_from`` says which: ``counter``,
        ``reported`` or ``none``).
    :ivar step_p50: median ``step_time_s`` of its lines, seconds (``step_p95``: 95th percentile).
    :ivar loss: its last line's loss (``top1``/``top4``/``top8`` likewise).
    """

    rank: int
    role: str
    role_rank: int | None
    device: str | None
    lines: int
    first_ts: float | None
    last_ts: float | None
    tokens: float | None
    seconds: float | None
    tokens_per_s: float | None
    rate_from: str
    resets: int
    step_p50: float | None
    step_p95: float | None
    queue_mean: float | None
    queue_max: float | None
    loss: float | None
    top1: float | None
    top4: float | None
    top8: float | None
    gpu_mem_bytes: int | None


@dataclass(frozen=True)
class RoleStats:
    """One role's numbers over the window.

    :ivar tokens_per_s: the sum of its ranks' tokens/s (None when no rank has a rate).
    :ivar step_p50: median ``step_time_s`` over all its lines, seconds (``step_p95`` likewise).
    :ivar queue_mean: mean ``queue_depth`` over its lines (``queue_max``: the largest).
    """

    role: str
    ranks: int
    lines: int
    tokens_per_s: float | None
    step_p50: float | None
    step_p95: float | None
    queue_mean: float | None
    queue_max: float | None


@dataclass(frozen=True)
class DigestSummary:
    """A window of metric lines, aggregated (see the module docstring for the definitions).

    :ivar window_start: ``ts`` of the first metric line (unix s), None without timestamps.
    :ivar window_end: ``ts`` of the last metric line.
    :ivar ranks: per-rank stats, by rank.
    :ivar roles: per-role stats, targets first.
    :ivar pipeline_tokens_per_s: the sum over every non-target rank (the drafters).
    :ivar target_tokens_per_s: the sum over target ranks, shown apart, never added in.
    :ivar step_p50: median step time of the pipeline (non-target) lines, seconds (``step_p95``).
    :ivar queue_mean: mean hidden-state queue depth seen by the pipeline lines (``queue_max``).
    :ivar starved: the drafters' mean queue depth is ~0 (below :data:`STARVED_BELOW`): targets
        cannot keep up.
    :ivar loss_last: mean over drafter ranks of each one's last loss; ``loss_mean``: mean of
        every drafter line's loss in the window.
    :ivar top1: mean over drafter ranks of each one's last top-1 accuracy (``top4``, ``top8``);
        ``top1_mean``…: mean over every drafter line in the window.
    :ivar resets: counter resets (relaunches) seen across ranks.
    :ivar metric_lines: metric records aggregated.
    :ivar lines_read: complete log lines read (metric or not).
    :ivar bytes_read: log bytes read.
    """

    window_start: float | None
    window_end: float | None
    ranks: tuple[RankStats, ...]
    roles: tuple[RoleStats, ...]
    pipeline_tokens_per_s: float | None
    target_tokens_per_s: float | None
    step_p50: float | None
    step_p95: float | None
    queue_mean: float | None
    queue_max: float | None
    starved: bool
    loss_last: float | None
    loss_mean: float | None
    top1: float | None
    top4: float | None
    top8: float | None
    top1_mean: float | None
    top4_mean: float | None
    top8_mean: float | None
    resets: int
    metric_lines: int
    lines_read: int
    bytes_read: int

    @property
    def seconds(self) -> float | None:
        """Seconds between the first and last metric line."""
        if self.window_start is None or self.window_end is None:
            return None
        return self.window_end - self.window_start

    def role(self, name: str) -> RoleStats | None:
        """The stats of role ``name``, or None if no line had it."""
        return next((r for r in self.roles if r.role == name), None)

    def headline(self) -> dict[str, float | None]:
        """The numbers a later digest compares against (stored in ``keys.digest_last``)."""
        return {
            "pipeline_tokens_per_s": self.pipeline_tokens_per_s,
            "target_tokens_per_s": self.target_tokens_per_s,
            "step_p50": self.step_p50,
            "step_p95": self.step_p95,
            "top1": self.top1,
            "top4": self.top4,
            "top8": self.top8,
            "loss_last": self.loss_last,
            "window_end": self.window_end,
        }

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON-ready data."""
        return asdict(self)


def _rank_stats(lines: Sequence[MetricLine]) -> RankStats:
    last = lines[-1]
    timed = [ln for ln in lines if ln.ts is not None and ln.tokens is not None]
    tokens: float | None = None
    seconds: float | None = None
    rate: float | None = None
    rate_from = "none"
    counted = [ln.tokens for ln in lines if ln.tokens is not None]
    increase, resets = counter_increase(counted)
    if len(timed) >= 2:
        assert timed[0].ts is not None and timed[-1].ts is not None
        seconds = timed[-1].ts - timed[0].ts
        tokens, _ = counter_increase([ln.tokens for ln in timed if ln.tokens is not None])
        if seconds > 0:
            rate, rate_from = tokens / seconds, "counter"
    elif counted:
        tokens = increase
    if rate is None and (reported := _present(ln.tokens_per_s for ln in lines)):
        rate, rate_from = _mean(reported), "reported"
    steps = _present(ln.step_time_s for ln in lines)
    queue = _present(ln.queue_depth for ln in lines)
    ts = _present(ln.ts for ln in lines)
    mem = [ln.gpu_mem_bytes for ln in lines if ln.gpu_mem_bytes is not None]
    return RankStats(
        rank=last.rank,
        role=last.role,
        role_rank=last.role_rank,
        device=last.device,
        lines=len(lines),
        first_ts=min(ts) if ts else None,
        last_ts=max(ts) if ts else None,
        tokens=tokens,
        seconds=seconds,
        tokens_per_s=rate,
        rate_from=rate_from,
        resets=resets,
        step_p50=percentile(steps, 0.5),
        step_p95=percentile(steps, 0.95),
        queue_mean=_mean(queue),
        queue_max=max(queue) if queue else None,
        loss=next((ln.loss for ln in reversed(lines) if ln.loss is not None), None),
        top1=next((ln.top1 for ln in reversed(lines) if ln.top1 is not None), None),
        top4=next((ln.top4 for ln in reversed(lines) if ln.top4 is not None), None),
        top8=next((ln.top8 for ln in reversed(lines) if ln.top8 is not None), None),
        gpu_mem_bytes=mem[-1] if mem else None,
    )


def _sum(values: Iterable[float | None]) -> float | None:
    present = _present(values)
    return sum(present) if present else None


def _role_stats(role: str, ranks: Sequence[RankStats], lines: Sequence[MetricLine]) -> RoleStats:
    steps = _present(ln.step_time_s for ln in lines)
    queue = _present(ln.queue_depth for ln in lines)
    return RoleStats(
        role=role,
        ranks=len(ranks),
        lines=len(lines),
        tokens_per_s=_sum(r.tokens_per_s for r in ranks),
        step_p50=percentile(steps, 0.5),
        step_p95=percentile(steps, 0.95),
        queue_mean=_mean(queue),
        queue_max=max(queue) if queue else None,
    )


def summarise(
    lines: Sequence[MetricLine], *, lines_read: int | None = None, bytes_read: int = 0
) -> DigestSummary:
    """Aggregate the metric lines of one window (see the module docstring for definitions).

    :param lines: the window's metric records in file order.
    :param lines_read: complete log lines read, metric or not (default: ``len(lines)``).
    :param bytes_read: log bytes read for this window.
    :returns: the summary; numbers without data are None, never 0.
    """
    by_rank: dict[tuple[str, int], list[MetricLine]] = {}
    for ln in lines:
        by_rank.setdefault((ln.role, ln.rank), []).append(ln)
    ranks = sorted((_rank_stats(group) for group in by_rank.values()), key=lambda r: (r.rank, r.role))
    role_names = sorted({r.role for r in ranks}, key=lambda name: (name != TARGET, name))
    roles = tuple(
        _role_stats(
            name,
            [r for r in ranks if r.role == name],
            [ln for ln in lines if ln.role == name],
        )
        for name in role_names
    )
    pipe_lines = [ln for ln in lines if ln.role != TARGET]
    pipe_ranks = [r for r in ranks if r.role != TARGET]
    drafters = [r for r in ranks if r.role == DRAFTER] or pipe_ranks
    drafter_lines = [ln for ln in lines if ln.role == DRAFTER] or pipe_lines
    pipe_steps = _present(ln.step_time_s for ln in pipe_lines)
    pipe_queue = _present(ln.queue_depth for ln in pipe_lines)
    queue_mean = _mean(pipe_queue)
    ts = _present(ln.ts for ln in lines)
    return DigestSummary(
        window_start=min(ts) if ts else None,
        window_end=max(ts) if ts else None,
        ranks=tuple(ranks),
        roles=roles,
        pipeline_tokens_per_s=_sum(r.tokens_per_s for r in pipe_ranks),
        target_tokens_per_s=_sum(r.tokens_per_s for r in ranks if r.role == TARGET),
        step_p50=percentile(pipe_steps, 0.5),
        step_p95=percentile(pipe_steps, 0.95),
        queue_mean=queue_mean,
        queue_max=max(pipe_queue) if pipe_queue else None,
        starved=queue_mean is not None and queue_mean < STARVED_BELOW,
        loss_last=_mean(_present(r.loss for r in drafters)),
        loss_mean=_mean(_present(ln.loss for ln in drafter_lines)),
        top1=_mean(_present(r.top1 for r in drafters)),
        top4=_mean(_present(r.top4 for r in drafters)),
        top8=_mean(_present(r.top8 for r in drafters)),
        top1_mean=_mean(_present(ln.top1 for ln in drafter_lines)),
        top4_mean=_mean(_present(ln.top4 for ln in drafter_lines)),
        top8_mean=_mean(_present(ln.top8 for ln in drafter_lines)),
        resets=sum(r.resets for r in ranks),
        metric_lines=len(lines),
        lines_read=len(lines) if lines_read is None else lines_read,
        bytes_read=bytes_read,
    )


def compare(
    prev: DigestSummary | Mapping[str, float | None] | None, cur: DigestSummary | Mapping[str, float | None]
) -> dict[str, float]:
    """The change of each headline number against a previous digest, in percent.

    Only numbers present in both with a non-zero previous value are compared.

    :param prev: the previous summary or its :meth:`DigestSummary.headline` (None: no change known).
    :param cur: the current summary or its headline.
    :returns: key → ``(cur - prev) / |prev| * 100`` for keys in :data:`COMPARED`.
    """
    if prev is None:
        return {}
    before = prev.headline() if isinstance(prev, DigestSummary) else prev
    now = cur.headline() if isinstance(cur, DigestSummary) else cur
    out: dict[str, float] = {}
    for key in COMPARED:
        a, b = before.get(key), now.get(key)
        if isinstance(a, int | float) and isinstance(b, int | float) and a != 0:
            out[key] = (b - a) / abs(a) * 100.0
    return out


# --- the window: bounded reads from a byte offset ---------------------------------------------


@dataclass(frozen=True)
class LogRead:
    """What one bounded read of the metric log returned.

    :ivar data: the bytes read.
    :ivar offset: the file offset of ``data[0]`` (0 when the reader restarted a truncated file).
    :ivar size: the file's size when it was read, bytes.
    :ivar inode: the file's inode, when the reader knows it.
    """

    data: bytes
    offset: int
    size: int
    inode: int | None = None


LogReader = Callable[[int, int], Awaitable[LogRead]]
"""``await reader(offset, max_bytes)``: at most ``max_bytes`` of the log from ``offset``; a
negative ``offset`` counts from the end of the file (``-N``: its last ``N`` bytes)."""


class WindowKind(StrEnum):
    """How a digest's window was chosen."""

    SINCE_LAST = "since_last"  #: everything written since the scheduled offset
    LAST_BYTES = "last_bytes"  #: no offset yet: the last ``max_bytes`` (or the whole smaller file)
    REPEAT = "repeat"  #: on demand, nothing new: the last scheduled digest's window again
    TRUNCATED = "truncated"  #: the file shrank below the offset: read from its start
    ROTATED = "rotated"  #: another file (inode or bytes before the offset differ): from its start


@dataclass(frozen=True)
class OffsetState:
    """What a scheduled digest remembers in ``keys.digest_offset`` about the log.

    :ivar offset: byte offset after the last complete line read.
    :ivar start: where that digest's window began (an on-demand digest re-reads it when nothing
        is new).
    :ivar size: the file's size then.
    :ivar inode: the file's inode then, if known.
    :ivar fingerprint: the bytes just before ``offset`` (up to :data:`FINGERPRINT_BYTES`).
    :ivar at: when it was stored (unix s).
    """

    offset: int
    start: int
    size: int
    inode: int | None
    fingerprint: bytes
    at: float

    def to_hash(self) -> dict[str, str]:
        """The Redis hash fields."""
        return {
            "offset": str(self.offset),
            "start": str(self.start),
            "size": str(self.size),
            "inode": "" if self.inode is None else str(self.inode),
            "fingerprint": self.fingerprint.hex(),
            "at": repr(self.at),
        }

    @classmethod
    def from_hash(cls, raw: Mapping[str, str]) -> OffsetState | None:
        """Parse the Redis hash; None when absent or unreadable (the digest starts afresh)."""
        try:
            return cls(
                offset=int(raw["offset"]),
                start=int(raw.get("start") or 0),
                size=int(raw.get("size") or 0),
                inode=int(raw["inode"]) if raw.get("inode") else None,
                fingerprint=bytes.fromhex(raw.get("fingerprint") or ""),
                at=float(raw.get("at") or 0.0),
            )
        except (KeyError, ValueError):
            return None


@dataclass(frozen=True)
class LogWindow:
    """The bytes a digest aggregates: complete lines only.

    :ivar data: complete lines (ends with a newline, or is empty).
    :ivar start: file offset of ``data[0]``.
    :ivar end: file offset after the last complete line (the next scheduled offset).
    :ivar size: file size seen, bytes.
    :ivar inode: the file's inode, if known.
    :ivar kind: how the window was chosen.
    :ivar skipped: bytes written since the offset that were not read (more than ``max_bytes``).
    :ivar fingerprint: the last bytes before ``end``.
    """

    data: bytes
    start: int
    end: int
    size: int
    inode: int | None
    kind: WindowKind
    skipped: int = 0
    fingerprint: bytes = b""

    def state(self, at: float) -> OffsetState:
        """The offset state a scheduled digest stores after reading this window."""
        return OffsetState(self.end, self.start, self.size, self.inode, self.fingerprint, at)


async def _read_from(
    reader: LogReader, start: int, size: int, max_bytes: int, kind: WindowKind, skipped: int = 0
) -> LogWindow:
    """Read ``[max(start, size - max_bytes), size)`` aligned to a line start; keep complete lines."""
    begin = max(start, size - max_bytes)
    skipped += begin - start
    if begin > 0 and begin > start:
        # read one byte before: if it is a newline, ``begin`` already starts a line
        got = await reader(begin - 1, size - begin + 1)
        nl = got.data.find(b"\n")
        data = got.data[nl + 1 :] if nl >= 0 else b""
        first = got.offset + (nl + 1 if nl >= 0 else len(got.data))
    else:
        got = await reader(begin, size - begin)
        data, first = got.data, got.offset
    return _complete(data, first, got, kind, skipped)


def _complete(data: bytes, first: int, got: LogRead, kind: WindowKind, skipped: int) -> LogWindow:
    cut = data.rfind(b"\n") + 1
    whole = data[:cut]
    return LogWindow(
        data=whole,
        start=first,
        end=first + cut,
        size=got.size,
        inode=got.inode,
        kind=kind,
        skipped=skipped,
        fingerprint=whole[-FINGERPRINT_BYTES:],
    )


async def read_window(
    reader: LogReader, state: OffsetState | None, *, scheduled: bool, max_bytes: int = MAX_WINDOW_BYTES
) -> LogWindow:
    """The bytes a digest aggregates, read with at most two bounded reads.

    :param reader: reads the job's metric log (:data:`LogReader`).
    :param state: what the last scheduled digest stored, or None.
    :param scheduled: a scheduled digest (reads from the offset); on demand, when nothing
        complete was written since the offset, the last scheduled window is read again.
    :param max_bytes: the most bytes aggregated; when more was written, the last ``max_bytes``.
    :returns: the window; the caller stores ``window.state(now)`` when scheduled.
    """
    if state is None:  # the last max_bytes and the byte before them, in one read
        got = await reader(-(max_bytes + 1), max_bytes + 1)
        if got.offset == 0 and len(got.data) <= max_bytes:
            return _complete(got.data, 0, got, WindowKind.LAST_BYTES, 0)
        nl = got.data.find(b"\n")  # the byte before ``begin`` decides whether it starts a line
        data = got.data[nl + 1 :] if nl >= 0 else b""
        first = got.offset + (nl + 1 if nl >= 0 else len(got.data))
        return _complete(data, first, got, WindowKind.LAST_BYTES, got.offset + 1)
    fp = state.fingerprint[len(state.fingerprint) - min(len(state.fingerprint), state.offset) :]
    ask = state.offset - len(fp)
    got = await reader(ask, len(fp) + max_bytes)
    if got.size < state.offset:
        return await _read_from(reader, 0, got.size, max_bytes, WindowKind.TRUNCATED)
    other_inode = state.inode is not None and got.inode is not None and got.inode != state.inode
    if other_inode or got.offset != ask or got.data[: len(fp)] != fp:
        return await _read_from(reader, 0, got.size, max_bytes, WindowKind.ROTATED)
    if got.size - state.offset > max_bytes:
        return await _read_from(reader, state.offset, got.size, max_bytes, WindowKind.SINCE_LAST)
    window = _complete(got.data[len(fp) :], state.offset, got, WindowKind.SINCE_LAST, 0)
    if window.data:
        return window
    if not scheduled and state.start < state.offset:
        again = await _read_from(reader, state.start, state.offset, max_bytes, WindowKind.REPEAT)
        return LogWindow(
            again.data, again.start, again.end, got.size, got.inode, WindowKind.REPEAT, again.skipped
        )
    # nothing complete since the offset: stay there, keeping the fingerprint of the bytes before it
    return LogWindow(b"", state.offset, state.offset, got.size, got.inode, WindowKind.SINCE_LAST, 0, fp)


def local_reader(path: str | os.PathLike[str]) -> LogReader:
    """A :data:`LogReader` over a file on this machine (benchmarks, tests).

    Reads happen in a worker thread so the event loop is never blocked.

    :param path: the log file.
    :raises FileNotFoundError: (from the returned reader) if the file does not exist.
    """

    def _read(offset: int, max_bytes: int) -> LogRead:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if offset < 0:
                offset = max(0, st.st_size + offset)
            elif offset > st.st_size:
                offset = 0
            f.seek(offset)
            data = f.read(max(0, min(max_bytes, st.st_size - offset)))
        return LogRead(data, offset, st.st_size, st.st_ino)

    async def reader(offset: int, max_bytes: int) -> LogRead:
        return await asyncio.to_thread(_read, offset, max_bytes)

    return reader


def remote_reader(ssh: RemoteHosts, job_name: str, job: JobConfig) -> LogReader:
    """A :data:`LogReader` over the job's metric log (``metrics_log``, else ``log``) on its host.

    Each read is one SSH call to the host helper, on the job's side of its ``exec`` wrapper
    (:func:`pipeline.hostprobe.read_log_chunk`).

    :raises RemoteCommandError: (from the returned reader) if the log cannot be read.
    :raises HostUnreachable: (likewise) if the host cannot be reached.
    """

    async def reader(offset: int, max_bytes: int) -> LogRead:
        chunk = await read_log_chunk(ssh, job_name, job, offset, max_bytes, path=job.metrics_path)
        return LogRead(chunk.data, chunk.offset - len(chunk.data), chunk.size, chunk.inode)

    return reader


# --- the digest: read, aggregate, GPUs, chart, bookkeeping --------------------------------------


@dataclass(frozen=True)
class GpuRow:
    """One configured GPU of a job, with its role and nvidia-smi's numbers (None = n/a)."""

    index: int
    role: str
    name: str | None
    utilization_pct: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    power_w: float | None


@dataclass(frozen=True)
class SilentRank:
    """A rank that was expected in the window and wrote no metric line in it.

    :ivar rank: global rank.
    :ivar role: its role (``target``/``drafter``), from ``gpus`` or from the digest that last saw it.
    :ivar last_seen: ``ts`` of its last metric line in an earlier digest (unix s), None if never seen.
    """

    rank: int
    role: str
    last_seen: float | None


def expected_ranks(spec: JobConfig, seen: Mapping[int, tuple[str, float | None]]) -> dict[int, str]:
    """Every rank a digest of the job should list: rank → role.

    From the job's ``gpus`` (targets first: ranks ``0..T-1`` are targets, ``T..T+D-1`` drafters —
    the reference pipeline's layout, ``pipeline/dflash/README.md``) and from every rank an earlier
    digest saw (``keys.digest_ranks``), whose recorded role wins.
    """
    out: dict[int, str] = {}
    if spec.gpus is not None:
        roles = [TARGET] * len(spec.gpus.target) + [DRAFTER] * len(spec.gpus.drafter)
        out.update(enumerate(roles))
    out.update({rank: role for rank, (role, _) in seen.items()})
    return out


def silent_ranks(
    summary: DigestSummary, expected: Mapping[int, str], seen: Mapping[int, tuple[str, float | None]]
) -> tuple[SilentRank, ...]:
    """The expected ranks with no metric line in the window, by rank."""
    present = {r.rank for r in summary.ranks}
    return tuple(
        SilentRank(rank, role, seen.get(rank, (role, None))[1])
        for rank, role in sorted(expected.items())
        if rank not in present
    )


async def load_seen_ranks(
    client: aioredis.Redis, prefix: str, job: str
) -> dict[int, tuple[str, float | None]]:
    """Ranks earlier digests saw: rank → (role, ``ts`` of its last metric line or None)."""
    raw: dict[str, str] = await client.hgetall(keys.digest_ranks(prefix, job))  # type: ignore[assignment]
    out: dict[int, tuple[str, float | None]] = {}
    for rank, value in raw.items():
        try:
            data = json.loads(value)
            last = data.get("last_ts")
            out[int(rank)] = (str(data["role"]), float(last) if last is not None else None)
        except (ValueError, KeyError, TypeError):
            continue
    return out


def seen_update(summary: DigestSummary, seen: Mapping[int, tuple[str, float | None]]) -> dict[str, str]:
    """The ``keys.digest_ranks`` fields to write for the ranks in this window (never moving a
    rank's last ``ts`` backwards)."""
    out: dict[str, str] = {}
    for r in summary.ranks:
        before = seen.get(r.rank, (r.role, None))[1]
        last = r.last_ts if before is None or (r.last_ts is not None and r.last_ts > before) else before
        out[str(r.rank)] = json.dumps({"role": r.role, "last_ts": last})
    return out


@dataclass(frozen=True)
class Digest:
    """A built digest: the summary plus everything around it a reply shows.

    :ivar job: the job's configured name.
    :ivar scheduled: built by the scheduler (moved the offset) or on demand.
    :ivar summary: the aggregated window.
    :ivar window: the window read, without its bytes (``data`` is empty).
    :ivar path: the metric log on the host.
    :ivar max_bytes: the read bound used.
    :ivar change: ±% against the last scheduled digest (:func:`compare`).
    :ivar previous: the last scheduled digest's headline numbers, if any.
    :ivar gpus: the job's GPUs, or None when the job has no ``gpus`` or no data came back.
    :ivar gpu_note: why there is no (or partial) GPU data, else None.
    :ivar chart: the PNG written, or None when the window had no metric lines.
    :ivar uptime_s: seconds since the current run was launched, None if unknown or stopped.
    :ivar restarts: run ids created since the window began, newest first (None: unknown).
    :ivar built_at: unix s.
    :ivar silent: expected ranks (:func:`expected_ranks`) that wrote no metric line in the window.
    """

    job: str
    scheduled: bool
    summary: DigestSummary
    window: LogWindow
    path: str
    max_bytes: int
    change: dict[str, float] = field(default_factory=dict)
    previous: dict[str, float | None] | None = None
    gpus: tuple[GpuRow, ...] | None = None
    gpu_note: str | None = None
    chart: Path | None = None
    uptime_s: float | None = None
    restarts: tuple[str, ...] | None = None
    built_at: float = 0.0
    silent: tuple[SilentRank, ...] = ()


async def load_offset(client: aioredis.Redis, prefix: str, job: str) -> OffsetState | None:
    """The last scheduled digest's :class:`OffsetState`, or None."""
    raw: dict[str, str] = await client.hgetall(keys.digest_offset(prefix, job))  # type: ignore[assignment]
    return OffsetState.from_hash(raw) if raw else None


async def load_last(client: aioredis.Redis, prefix: str, job: str) -> dict[str, float | None] | None:
    """The last scheduled digest's headline numbers (:meth:`DigestSummary.headline`), or None."""
    raw = await client.get(keys.digest_last(prefix, job))
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


async def _gpu_rows(ctx: Context, job: JobConfig) -> tuple[tuple[GpuRow, ...] | None, str | None]:
    if job.gpus is None or not job.gpus.all:
        return None, None
    try:
        stats = {g.index: g for g in await query_gpus(ctx.ssh, job.host)}
    except PitstopError as exc:
        return None, messages.digest_no_gpu_data(exc.message)
    if not stats:
        return None, messages.digest_no_gpu_data("nvidia-smi listed no GPUs")
    roles = [(i, TARGET) for i in job.gpus.target] + [(i, DRAFTER) for i in job.gpus.drafter]
    rows = []
    for index, role in roles:
        g = stats.get(index)
        rows.append(
            GpuRow(
                index,
                role,
                g.name if g else None,
                g.utilization_pct if g else None,
                g.memory_used_mib if g else None,
                g.memory_total_mib if g else None,
                g.power_w if g else None,
            )
        )
    missing = [i for i, _ in roles if i not in stats]
    return tuple(rows), messages.digest_gpus_missing(missing) if missing else None


async def _uptime(ctx: Context, job: str, now: float) -> float | None:
    current: dict[str, str] = await ctx.redis.client.hgetall(keys.job_current(ctx.prefix, job))  # type: ignore[assignment]
    if current.get("state") == "stopped":
        return None
    launched: float | None = None
    try:
        launched = float(current["launched_at"]) if current.get("launched_at") else None
    except ValueError:
        launched = None
    if launched is None and not current:
        run = await ctx.runs.latest(job)
        launched = run.launched_at if run is not None and run.action != "stop" else None
    return max(0.0, now - launched) if launched is not None else None


async def _restarts_since(ctx: Context, job: str, since: float | None) -> tuple[str, ...] | None:
    if since is None:
        return None
    runs: list[RunRecord] = await ctx.runs.recent(job, 100)
    return tuple(r.id for r in runs if r.created_at >= since and r.action != "stop")


def _chart_path(ctx: Context, job: str, now: float) -> Path:
    return ctx.config.state.path / "charts" / f"{job.lower()}-{int(now * 1000)}.png"


def _prune_charts(directory: Path, job: str, keep: int = CHARTS_KEPT) -> None:
    charts = sorted(directory.glob(f"{job.lower()}-*.png"), key=lambda p: p.name)
    for old in charts[:-keep] if keep else charts:
        old.unlink(missing_ok=True)


def _draw(lines: Sequence[MetricLine], path: Path, job: str) -> Path:
    from pipeline.chart import tokens_chart  # lazy: matplotlib, loaded only when a chart is drawn

    out = tokens_chart(lines, path, title=f"{job}: tokens/s per GPU")
    _prune_charts(path.parent, job)
    return out


async def build_digest(
    ctx: Context,
    job: str,
    *,
    scheduled: bool,
    max_bytes: int = MAX_WINDOW_BYTES,
    reader: LogReader | None = None,
    chart: bool = True,
) -> Digest:
    """Read the job's new metric lines, aggregate them, add GPU stats, uptime and a chart.

    A scheduled digest stores the new offset (``keys.digest_offset``) and its headline numbers
    (``keys.digest_last``); an on-demand one writes nothing but the chart.  Publishes a
    ``digest`` event either way.

    :param job: a configured job name (case-insensitive).
    :param scheduled: True for the scheduler's digests (moves the offset).
    :param max_bytes: the most bytes of metric log read.
    :param reader: where the log is read from (default: the job's host over SSH).
    :param chart: draw the PNG (when the window has metric lines).
    :returns: the digest.
    :raises KeyError: if ``job`` is not configured.
    :raises RemoteCommandError: if the metric log cannot be read (missing file…).
    :raises HostUnreachable: if the host cannot be reached.
    """
    name = ctx.config.job_name(job)
    spec = ctx.config.jobs[name]
    client = ctx.redis.client
    state = await load_offset(client, ctx.prefix, name)
    read = reader if reader is not None else remote_reader(ctx.ssh, name, spec)
    window = await read_window(read, state, scheduled=scheduled, max_bytes=max_bytes)
    lines = parse_metric_lines(window.data, spec.metrics)
    summary = summarise(lines, lines_read=window.data.count(b"\n"), bytes_read=len(window.data))
    seen = await load_seen_ranks(client, ctx.prefix, name)
    silent = silent_ranks(summary, expected_ranks(spec, seen), seen)
    if summary.ranks:
        await client.hset(keys.digest_ranks(ctx.prefix, name), mapping=seen_update(summary, seen))  # type: ignore[arg-type]
    previous = await load_last(client, ctx.prefix, name)
    # a repeated window is the last scheduled digest itself: no change to speak of
    change = compare(previous, summary) if window.kind is not WindowKind.REPEAT else {}
    now = time.time()
    gpus, gpu_note = await _gpu_rows(ctx, spec)
    path: Path | None = None
    if chart and lines:
        path = await asyncio.to_thread(_draw, lines, _chart_path(ctx, name, now), name)
    since = summary.window_start if summary.window_start is not None else (state.at if state else None)
    digest = Digest(
        job=name,
        scheduled=scheduled,
        summary=summary,
        window=LogWindow(
            b"",
            window.start,
            window.end,
            window.size,
            window.inode,
            window.kind,
            window.skipped,
            window.fingerprint,
        ),
        path=spec.metrics_path,
        max_bytes=max_bytes,
        change=change,
        previous=previous,
        gpus=gpus,
        gpu_note=gpu_note,
        chart=path,
        uptime_s=await _uptime(ctx, name, now),
        restarts=await _restarts_since(ctx, name, since),
        built_at=now,
        silent=silent,
    )
    if scheduled:
        async with client.pipeline(transaction=True) as pipe:
            state_fields = window.state(now).to_hash()
            pipe.hset(keys.digest_offset(ctx.prefix, name), mapping=state_fields)  # type: ignore[arg-type]
            if lines:
                pipe.set(keys.digest_last(ctx.prefix, name), json.dumps({**summary.headline(), "at": now}))
            await pipe.execute()
    await ctx.events.publish(
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
