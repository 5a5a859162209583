"""The digest chart's data (pure): throughput over time broken at gaps, restarts, stragglers.

A rank's throughput is read from consecutive samples of its cumulative ``tokens`` counter
(Δtokens/Δts over the interval between them), or, for a rank with no counter, from its reported
``tokens_per_s`` over the interval since its previous line.  An interval is **not** data — a gap —
when it is longer than :data:`GAP_FACTOR` times the rank's median sampling interval, when the
counter went down (a relaunch: the new process counts from zero), or when a restart
(:class:`RestartMark`) falls inside it.  So a line is never drawn across a pause, and a rank's
last point before a restart is never joined to the next launch's first one.

The pipeline's throughput (the sum over the ranks that are not ``target`` — the drafters, as in
:mod:`pipeline.digest.stats`) is binned within each *segment* (a stretch of time some pipeline
rank covers without a gap): a bin's value is, per rank, the tokens it processed in the bin divided
by the part of the bin it covered, summed over the ranks.  Bins are at least the ranks' median
sampling interval wide and at most :data:`MAX_BINS` span the window.  The smoothed series is a
centred moving mean over about :data:`SMOOTH_FRACTION` of the bins, never across a gap.

The straggler strip (:class:`RankStrip`) puts every rank on one grid of the same bin width,
smoothed the same way, each bin as a percentage of the median of its role's ranks in that bin: a
slow rank reads as a row below 100%.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.digest.metrics import MetricLine
from pipeline.digest.stats import TARGET, percentile

GAP_FACTOR = 4.0  #: an interval longer than this many median sampling intervals is a gap
MAX_BINS = 300  #: most bins over the window (a longer window gets wider bins)
SMOOTH_FRACTION = 1 / 30  #: the moving mean's width, as a fraction of the window's bins
NAN = math.nan

Key = tuple[str, int]  #: (role, rank)


@dataclass(frozen=True)
class RestartMark:
    """A restart inside the chart's window.

    :ivar at: when the new run was launched (the run record's ``launched_at``), unix s.
    :ivar run: the run id (``r-2``).
    :ivar label: what the chart writes beside its line (``r-2 topk``, :func:`restart_label`).
    """

    at: float
    run: str
    label: str


@dataclass(frozen=True)
class Interval:
    """A stretch of one rank's log with a known rate: ``(start, end]`` in unix s, tokens/s."""

    start: float
    end: float
    rate: float


@dataclass(frozen=True)
class Throughput:
    """The pipeline's throughput over the window, as drawn: bins within segments.

    Segments are separated by one NaN point in every list, so a line drawn from them is broken
    at each gap.

    :ivar x: bin centres, unix s (NaN between segments).
    :ivar raw: tokens/s per bin (NaN between segments).
    :ivar smooth: the moving mean of ``raw`` within each segment.
    :ivar width: the nominal bin width, seconds.
    :ivar segments: ``(start, end)`` of each stretch with data, unix s, in time order.
    """

    x: list[float]
    raw: list[float]
    smooth: list[float]
    width: float
    segments: list[tuple[float, float]]

    def median(self, start: float = -math.inf, end: float = math.inf) -> float | None:
        """The median of the bins whose centre is in ``[start, end)``, tokens/s; None if none."""
        values = [v for t, v in zip(self.x, self.raw, strict=True) if start <= t < end and math.isfinite(v)]
        return percentile(values, 0.5)


@dataclass(frozen=True)
class RankStrip:
    """Every rank on one grid, each bin as a percentage of its role's median in that bin.

    :ivar edges: bin edges, unix s (``len(edges) == bins + 1``).
    :ivar rows: (role, rank) of each row: targets first, then the other roles, by rank.
    :ivar share: per row, per bin: the rank's smoothed tokens/s in percent of its role's median
        (NaN: no data).
    """

    edges: list[float]
    rows: list[Key]
    share: list[list[float]]


def restart_label(run: str, action: str, patches: Sequence[str]) -> str:
    """The label of a restart's line: the run id, its action unless a restart, its patches.

    ``r-2 topk``, ``r-3``, ``r-4 auto-restart``, ``r-5 start topk, hang``.
    """
    parts = [run] + ([action] if action != "restart" else [])
    return " ".join(parts) + (" " + ", ".join(patches) if patches else "")


def _samples(lines: Iterable[MetricLine]) -> dict[Key, list[tuple[float, MetricLine]]]:
    out: dict[Key, list[tuple[float, MetricLine]]] = {}
    for ln in lines:
        if ln.ts is not None:
            out.setdefault((ln.role, ln.rank), []).append((float(ln.ts), ln))
    return out


def _rank_intervals(samples: list[tuple[float, MetricLine]], marks: Sequence[float]) -> list[Interval]:
    counted = [(t, float(ln.tokens)) for t, ln in samples if ln.tokens is not None]
    by_counter = len(counted) >= 2
    points = (
        counted
        if by_counter
        else [(t, float(ln.tokens_per_s)) for t, ln in samples if ln.tokens_per_s is not None]
    )
    typical = percentile([b[0] - a[0] for a, b in itertools.pairwise(points) if b[0] > a[0]], 0.5)
    if typical is None:
        return []
    out = []
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        dt = t1 - t0
        if dt <= 0 or dt > GAP_FACTOR * typical:
            continue
        i = bisect.bisect_right(marks, t0)
        if i < len(marks) and marks[i] <= t1:  # a restart inside: the two ends are two processes
            continue
        if by_counter and v1 < v0:
            continue  # the counter restarted from zero: a relaunch
        out.append(Interval(t0, t1, (v1 - v0) / dt if by_counter else v1))
    return out


def rank_intervals(
    lines: Sequence[MetricLine], marks: Sequence[RestartMark] = ()
) -> dict[Key, list[Interval]]:
    """Each rank's stretches with a known rate, gaps left out (see the module docstring).

    :param lines: the window's metric records in file order (lines without ``ts`` are ignored).
    :param marks: restarts in the window; an interval holding one is a gap.
    :returns: (role, rank) → intervals in time order; a rank with fewer than two usable samples
        has none.
    """
    at = sorted(m.at for m in marks)
    return {key: _rank_intervals(samples, at) for key, samples in _samples(lines).items()}


def _typical_step(lines: Sequence[MetricLine]) -> float | None:
    steps = [
        b[0] - a[0]
        for samples in _samples(lines).values()
        for a, b in itertools.pairwise(samples)
        if b[0] > a[0]
    ]
    return percentile(steps, 0.5)


def _union(intervals: Iterable[Interval]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for iv in sorted(intervals, key=lambda i: i.start):
        if out and iv.start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], iv.end))
        else:
            out.append((iv.start, iv.end))
    return out


def _binned(intervals: Sequence[Interval], edges: Sequence[float]) -> list[float]:
    """The mean rate over the covered part of each bin ``[edges[i], edges[i+1])``; NaN if uncovered."""
    n = len(edges) - 1
    tokens = [0.0] * n
    covered = [0.0] * n
    for iv in intervals:
        i = max(bisect.bisect_right(edges, iv.start) - 1, 0)
        while i < n and edges[i] < iv.end:
            overlap = min(iv.end, edges[i + 1]) - max(iv.start, edges[i])
            if overlap > 0:
                tokens[i] += iv.rate * overlap
                covered[i] += overlap
            i += 1
    return [t / c if c > 0 else NAN for t, c in zip(tokens, covered, strict=True)]


def _grid(start: float, end: float, width: float) -> list[float]:
    n = max(1, math.ceil((end - start) / width - 1e-9))
    step = (end - start) / n
    return [start + i * step for i in range(n)] + [end]


def _moving_mean(values: Sequence[float], k: int) -> list[float]:
    half = k // 2
    out = []
    for i in range(len(values)):
        near = [v for v in values[max(0, i - half) : i + half + 1] if math.isfinite(v)]
        out.append(sum(near) / len(near) if near and math.isfinite(values[i]) else NAN)
    return out


def _width(span: float, lines: Sequence[MetricLine]) -> float:
    typical = _typical_step(lines) or span / MAX_BINS
    return max(typical, span / MAX_BINS, 1e-6)


def throughput(
    lines: Sequence[MetricLine],
    marks: Sequence[RestartMark] = (),
    intervals: dict[Key, list[Interval]] | None = None,
) -> Throughput:
    """The pipeline's tokens/s over the window, binned within segments (module docstring).

    :param lines: the window's metric records.
    :param marks: restarts in the window.
    :param intervals: :func:`rank_intervals` of the same lines and marks, if already computed.
    :returns: the series; empty lists when no pipeline rank has two usable samples.
    """
    per_rank = intervals if intervals is not None else rank_intervals(lines, marks)
    pipe = {k: v for k, v in per_rank.items() if k[0] != TARGET and v}
    segments = _union(iv for ivs in pipe.values() for iv in ivs)
    if not segments:
        return Throughput([], [], [], 0.0, [])
    width = _width(segments[-1][1] - segments[0][0], lines)
    k = max(1, round((segments[-1][1] - segments[0][0]) / width * SMOOTH_FRACTION)) | 1
    x: list[float] = []
    raw: list[float] = []
    smooth: list[float] = []
    for start, end in segments:
        if x:
            x.append(NAN)
            raw.append(NAN)
            smooth.append(NAN)
        edges = _grid(start, end, width)
        columns = [_binned(ivs, edges) for ivs in pipe.values()]
        values = [sum(v for v in col if math.isfinite(v)) for col in zip(*columns, strict=True)]
        x += [(a + b) / 2 for a, b in itertools.pairwise(edges)]
        raw += values
        smooth += _moving_mean(values, k)
    return Throughput(x, raw, smooth, width, segments)


def rank_strip(
    lines: Sequence[MetricLine],
    marks: Sequence[RestartMark] = (),
    intervals: dict[Key, list[Interval]] | None = None,
) -> RankStrip:
    """Every rank's tokens/s per bin as a percentage of its role's median (module docstring).

    :param lines: the window's metric records.
    :param marks: restarts in the window.
    :param intervals: :func:`rank_intervals` of the same lines and marks, if already computed.
    :returns: the strip; no rows when no rank has two usable samples.
    """
    per_rank = intervals if intervals is not None else rank_intervals(lines, marks)
    rows = sorted((k for k, v in per_rank.items() if v), key=lambda k: (k[0] != TARGET, k[0], k[1]))
    if not rows:
        return RankStrip([], [], [])
    start = min(per_rank[k][0].start for k in rows)
    end = max(per_rank[k][-1].end for k in rows)
    width = _width(end - start, lines)
    edges = _grid(start, end, width)
    k_smooth = max(1, round((end - start) / width * SMOOTH_FRACTION)) | 1
    values = {k: _moving_mean(_binned(per_rank[k], edges), k_smooth) for k in rows}
    share: dict[Key, list[float]] = {k: [] for k in rows}
    for role in {k[0] for k in rows}:
        members = [k for k in rows if k[0] == role]
        for i in range(len(edges) - 1):
            median = percentile([values[k][i] for k in members if math.isfinite(values[k][i])], 0.5)
            for k in members:
                v = values[k][i]
                share[k].append(v / median * 100.0 if median and math.isfinite(v) else NAN)
    return RankStrip(edges, rows, [share[k] for k in rows])
