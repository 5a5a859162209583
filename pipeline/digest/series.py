"""The digest chart's data (pure): throughput over time broken at gaps, restarts, stragglers.

A rank's rate is Δtokens/Δts between samples of its ``tokens`` counter (else its reported
``tokens_per_s``).  An interval is a **gap**, not data, when longer than :data:`GAP_FACTOR` median
sampling intervals, when the counter went down (a relaunch), or when a restart falls inside it.
The pipeline's rate (non-``target`` ranks, summed) is binned within each *segment* (a stretch
without a gap): per rank the tokens in the bin over the part of it covered.  The smoothed series
is a centred moving mean (:data:`SMOOTH_FRACTION` of the bins), never across a gap.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.observe.metrics import TARGET, MetricLine, percentile

GAP_FACTOR = 4.0  #: an interval longer than this many median sampling intervals is a gap
MAX_BINS = 300  #: most bins over the window (a longer window gets wider bins)
SMOOTH_FRACTION = 1 / 30  #: the moving mean's width, as a fraction of the window's bins
NAN = math.nan

Key = tuple[str, int]  #: (role, rank)


@dataclass(frozen=True)
class RestartMark:
    """A restart inside the chart's window."""

    at: float  #: when the new run was launched (its ``launched_at``), unix s
    run: str  #: the run id (``r-2``)
    label: str  #: what the chart writes beside its line (:func:`restart_label`)


@dataclass(frozen=True)
class Interval:
    """A stretch of one rank's log with a known rate: ``(start, end]`` in unix s, tokens/s."""

    start: float
    end: float
    rate: float


@dataclass(frozen=True)
class Throughput:
    """The pipeline's throughput over the window, as drawn: bins within segments, separated by
    one NaN point in every list so that a line drawn from them breaks at each gap."""

    x: list[float]  #: bin centres, unix s
    raw: list[float]  #: tokens/s per bin
    smooth: list[float]  #: the moving mean of ``raw`` within each segment
    segments: list[tuple[float, float]]  #: ``(start, end)`` of each stretch with data, unix s

    def median(self, start: float = -math.inf, end: float = math.inf) -> float | None:
        """The median of the bins whose centre is in ``[start, end)``, tokens/s; None if none."""
        values = [v for t, v in zip(self.x, self.raw, strict=True) if start <= t < end and math.isfinite(v)]
        return percentile(values, 0.5)


@dataclass(frozen=True)
class RankStrip:
    """Every rank on one grid, each bin as a percentage of its role's median in that bin."""

    edges: list[float]  #: bin edges, unix s (``len(edges) == bins + 1``)
    rows: list[Key]  #: targets first, then the other roles, by rank
    share: list[list[float]]  #: per row, per bin: smoothed tokens/s in % of the role's median (NaN: no data)


def restart_label(run: str, action: str, patches: Sequence[str]) -> str:
    """The label of a restart's line: the run id, its action unless a restart, its patches
    (``r-2 topk``, ``r-3``, ``r-4 auto-restart``, ``r-5 start topk, hang``)."""
    parts = [run] + ([action] if action != "restart" else [])
    return " ".join(parts) + (" " + ", ".join(patches) if patches else "")


def _samples(lines: Iterable[MetricLine]) -> dict[Key, list[tuple[float, MetricLine]]]:
    out: dict[Key, list[tuple[float, MetricLine]]] = {}
    for ln in lines:
        if ln.ts is not None:
            out.setdefault((ln.role, ln.rank), []).append((float(ln.ts), ln))
    return out


def rank_intervals(
    lines: Sequence[MetricLine], marks: Sequence[RestartMark] = ()
) -> dict[Key, list[Interval]]:
    """Each rank's stretches with a known rate, in time order, gaps left out (module docstring);
    lines without ``ts`` are ignored."""
    at = sorted(m.at for m in marks)
    out: dict[Key, list[Interval]] = {}
    for key, samples in _samples(lines).items():
        points = [(t, float(ln.tokens)) for t, ln in samples if ln.tokens is not None]
        if not (by_counter := len(points) >= 2):
            points = [(t, float(ln.tokens_per_s)) for t, ln in samples if ln.tokens_per_s is not None]
        # the median sampling interval (None, 0: no two samples apart, so no interval either)
        typical = percentile([b[0] - a[0] for a, b in itertools.pairwise(points) if b[0] > a[0]], 0.5) or 0.0
        out[key] = []
        for (t0, v0), (t1, v1) in itertools.pairwise(points):
            i = bisect.bisect_right(at, t0)  # a restart inside: the two ends are two processes
            restarted = i < len(at) and at[i] <= t1
            relaunched = by_counter and v1 < v0  # the counter restarted from zero
            if 0 < t1 - t0 <= GAP_FACTOR * typical and not restarted and not relaunched:
                out[key].append(Interval(t0, t1, (v1 - v0) / (t1 - t0) if by_counter else v1))
    return out


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
    """The centred mean over ``k`` bins of the finite values around each finite one; NaN stays NaN."""
    half = k // 2
    near = (
        [v for v in values[max(0, i - half) : i + half + 1] if math.isfinite(v)] for i in range(len(values))
    )
    return [sum(n) / len(n) if math.isfinite(v) else NAN for n, v in zip(near, values, strict=True)]


def _bins(span: float, lines: Sequence[MetricLine]) -> tuple[float, int]:
    """The bin width over ``span`` seconds (at least the ranks' median sampling interval), and the
    moving mean's width in bins (odd)."""
    pairs = (pair for samples in _samples(lines).values() for pair in itertools.pairwise(samples))
    typical = percentile([b[0] - a[0] for a, b in pairs if b[0] > a[0]], 0.5) or span / MAX_BINS
    width = max(typical, span / MAX_BINS, 1e-6)
    return width, max(1, round(span / width * SMOOTH_FRACTION)) | 1


def throughput(lines: Sequence[MetricLine], per_rank: dict[Key, list[Interval]]) -> Throughput:
    """The pipeline's tokens/s over the window, binned within segments (module docstring); empty
    when no pipeline rank has two usable samples.

    :param per_rank: the window's :func:`rank_intervals`.
    """
    pipe = {k: v for k, v in per_rank.items() if k[0] != TARGET and v}
    segments = _union(iv for ivs in pipe.values() for iv in ivs)
    if not segments:
        return Throughput([], [], [], [])
    width, k = _bins(segments[-1][1] - segments[0][0], lines)
    x: list[float] = []
    raw: list[float] = []
    smooth: list[float] = []
    for start, end in segments:
        gap = [NAN] if x else []  # one NaN point between segments
        edges = _grid(start, end, width)
        columns = [_binned(ivs, edges) for ivs in pipe.values()]
        values = [sum(v for v in col if math.isfinite(v)) for col in zip(*columns, strict=True)]
        x += gap + [(a + b) / 2 for a, b in itertools.pairwise(edges)]
        raw += gap + values
        smooth += gap + _moving_mean(values, k)
    return Throughput(x, raw, smooth, segments)


def rank_strip(lines: Sequence[MetricLine], per_rank: dict[Key, list[Interval]]) -> RankStrip:
    """Every rank's tokens/s per bin as a percentage of its role's median; no rows when no rank
    has two usable samples.  ``per_rank`` as for :func:`throughput`."""
    rows = sorted((k for k, v in per_rank.items() if v), key=lambda k: (k[0] != TARGET, k[0], k[1]))
    if not rows:
        return RankStrip([], [], [])
    start = min(per_rank[k][0].start for k in rows)
    end = max(per_rank[k][-1].end for k in rows)
    width, k_smooth = _bins(end - start, lines)
    edges = _grid(start, end, width)
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
