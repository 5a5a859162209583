"""The digest chart (PNG): two panels on one time axis (clock times, ``10:16:20``, in the
configured ``[scheduler] timezone``), and its data (pure functions).

- **the pipeline's tokens/s**: smoothed in a solid line, the raw bins faint behind it, broken at
  every gap; each restart in the window a labelled vertical line (``r-2 topk``); the previous
  attempt's tokens/s (:func:`reference`, the headline's definition: :func:`pipeline_rate`) a dashed line;
- **the straggler strip**: one row per rank, each bin coloured by the rank's tokens/s as a
  percentage of its role's median then (red below 100%, blue above, grey without data).

Drawn with matplotlib's object API on the Agg canvas (no pyplot, no global state: safe in a
worker thread), imported on the first chart.  The artists carry ``gid``\\ s: ``pipeline``,
``pipeline-raw``, ``reference``, ``restart:r-2``, ``strip``.

The data (pure, :func:`rank_intervals`, :func:`throughput`, :func:`rank_strip`): a rank's rate is Δtokens/Δts between samples of its ``tokens`` counter (else its reported
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
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from pipeline import fmt
from pipeline.observe.metrics import TARGET, MetricLine, percentile

if TYPE_CHECKING:  # matplotlib is imported on the first chart, not when a surface starts (ack latency)
    from matplotlib.figure import Figure

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


class Interval(NamedTuple):
    """A stretch of one rank's log with a known rate: ``(start, end]`` in unix s, tokens/s (a tuple:
    a digest makes one per pair of a rank's lines)."""

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


def covered(
    intervals: Iterable[Interval], start: float = -math.inf, end: float = math.inf
) -> tuple[float, float]:
    """(tokens, seconds) of a rank's ``intervals`` within ``[start, end]`` (unix s): the tokens it
    processed while it had a known rate there, and for how long."""
    tokens = seconds = 0.0
    for iv in intervals:
        if (overlap := min(iv.end, end) - max(iv.start, start)) > 0:
            tokens, seconds = tokens + iv.rate * overlap, seconds + overlap
    return tokens, seconds


def rate_over(intervals: Iterable[Interval], start: float = -math.inf, end: float = math.inf) -> float | None:
    """A rank's tokens/s within ``[start, end]``: :func:`covered` tokens over its seconds (gaps,
    relaunches and restarts left out); None without an interval there."""
    tokens, seconds = covered(intervals, start, end)
    return tokens / seconds if seconds > 0 else None


def pipeline_rate(
    per_rank: dict[Key, list[Interval]], start: float = -math.inf, end: float = math.inf
) -> float | None:
    """The pipeline's tokens/s within ``[start, end]`` (unix s), the one definition the digest's
    headline and its chart share: every non-``target`` rank's :func:`rate_over`, summed; None when
    none has an interval there.

    :param per_rank: the window's :func:`rank_intervals`.
    """
    rates = [
        r for k, ivs in per_rank.items() if k[0] != TARGET and (r := rate_over(ivs, start, end)) is not None
    ]
    return sum(rates) if rates else None


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


STRIP_LABELS = 24  #: most ranks named on the strip (more: every n-th)
STRIP_RANGE = (50.0, 150.0)  #: the strip's colour scale, percent of the role's median
STRAGGLER_BAND = (90.0, 110.0)  #: a rank whose median share is outside it is always named on the strip
CHART_PIPELINE = "pipeline tokens/s (drafters), smoothed; raw behind"
CHART_STRIP_TITLE = "stragglers: each rank's tokens/s as % of its role's median (red: slower)"
CHART_CLOCK = "%H:%M:%S"  #: the time axis's tick labels: clock times, ``10:16:20``
DAY_S = 86_400.0  #: unix seconds per matplotlib date number (days since its epoch, 1970-01-01)


def reference(
    per_rank: dict[Key, list[Interval]], marks: Sequence[RestartMark], last_digest: float | None
) -> tuple[float, float | None, str] | None:
    """The dashed reference: (tokens/s, from when (unix s; None: the whole window), its label):
    the pipeline's tokens/s (:func:`pipeline_rate`, as the headline) between the last two restarts
    in the window (or its start and the last one), else the last scheduled digest's headline
    (``last_digest``), else None."""
    ordered = sorted(marks, key=lambda m: m.at)
    if ordered:
        last = ordered[-1]
        before = ordered[-2].at if len(ordered) > 1 else -math.inf
        if (rate := pipeline_rate(per_rank, before, last.at)) is not None:
            return rate, last.at, f"before {last.run}: {fmt.number(rate)} tokens/s"
    if last_digest is not None and math.isfinite(last_digest):
        return last_digest, None, f"last digest: {fmt.number(last_digest)} tokens/s"
    return None


def _draw_strip(fig: Figure, ax: Any, strip: RankStrip, devices: dict[tuple[str, int], str]) -> None:
    from matplotlib import colormaps

    image = ax.imshow(
        strip.share,
        aspect="auto",
        interpolation="nearest",
        cmap=colormaps["RdBu"].with_extremes(bad="0.9"),
        vmin=STRIP_RANGE[0],
        vmax=STRIP_RANGE[1],
        extent=(strip.edges[0] / DAY_S, strip.edges[-1] / DAY_S, len(strip.rows), 0),
    )
    image.set_gid("strip")
    ax.set_title(CHART_STRIP_TITLE, fontsize="small", loc="left")
    every = max(1, math.ceil(len(strip.rows) / STRIP_LABELS))  # many ranks: every n-th one named,
    # and every straggler (its median share outside STRAGGLER_BAND), without a neighbour's label on top
    medians = [percentile([v for v in row if math.isfinite(v)], 0.5) for row in strip.share]
    low, high = STRAGGLER_BAND
    slow = [i for i, m in enumerate(medians) if m is not None and not low <= m <= high]
    regular = [i for i in range(0, len(strip.rows), every) if every == 1 or all(abs(i - j) > 1 for j in slow)]
    shown = sorted({*regular, *slow})
    labels = [f"{k[1]} {k[0]} {devices.get(k, '')}".rstrip() for k in (strip.rows[i] for i in shown)]
    ax.set_yticks([i + 0.5 for i in shown], labels, fontsize="small")
    for i, (above, below) in enumerate(itertools.pairwise(strip.rows), 1):
        if above[0] != below[0]:  # a line between roles
            ax.axhline(i, color="black", linewidth=0.8)
    fig.colorbar(image, ax=ax, pad=0.01, fraction=0.04).set_label("% of role median", fontsize="small")


def draw_chart(
    lines: Sequence[MetricLine],
    *,
    title: str = "pipeline tokens/s",
    restarts: Sequence[RestartMark] = (),
    last_digest: float | None = None,
    path: Path | None = None,
    timezone: str = "UTC",
) -> Figure:
    """The digest chart as a figure on an Agg canvas: its first axes the throughput panel, the
    second (absent without any rank's rate) the straggler strip.

    :param restarts: the restarts launched within the window (a rank's interval holding one is a gap).
    :param last_digest: the last scheduled digest's pipeline tokens/s (:func:`reference`).
    :param path: where to write it as a PNG too (its directory created if missing).
    :param timezone: the zone of the time axis's clock times (``[scheduler] timezone``).
    :raises OSError: if the file cannot be written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.dates import AutoDateLocator, DateFormatter
    from matplotlib.figure import Figure

    intervals = rank_intervals(lines, restarts)
    series = throughput(lines, intervals)
    strip = rank_strip(lines, intervals)
    strip_height = min(0.22 * len(strip.rows), 4.0)
    fig = Figure(figsize=(10, 4.5 + strip_height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    if strip.rows:  # sharing x, only the strip's tick labels are shown
        top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, max(1.2, strip_height)))
    else:
        top, bottom = fig.add_subplot(), None
    # the time axis holds the data and every restart line (one after the last line included)
    times = [t for seg in series.segments for t in seg] + strip.edges[:1] + strip.edges[-1:]
    if times := times + [m.at for m in restarts]:
        pad = max((max(times) - min(times)) * 0.02, 1.0)
        top.set_xlim((min(times) - pad) / DAY_S, (max(times) + pad) / DAY_S)
    days = [t / DAY_S for t in series.x]
    if series.x:
        top.plot(days, series.raw, color="C0", alpha=0.3, linewidth=1.0, zorder=2, gid="pipeline-raw")
        top.plot(
            days, series.smooth, color="C0", linewidth=2.0, zorder=3, gid="pipeline", label=CHART_PIPELINE
        )
        if (ref := reference(intervals, restarts, last_digest)) is not None:
            value, since, caption = ref
            start = since / DAY_S if since is not None else days[0]
            end = max(series.segments[-1][1] / DAY_S, top.get_xlim()[1] if since is not None else start)
            top.hlines(
                value,
                start,
                end,
                colors="0.35",
                linestyles="--",
                linewidth=1.2,
                gid="reference",
                label=caption,
            )
        top.legend(loc="lower left", fontsize="small", frameon=False)
    else:
        note = "too few metric lines in this window for a rate" if lines else "no metric lines in this window"
        top.text(0.5, 0.5, note, ha="center", va="center", transform=top.transAxes)
    on_top = top.get_xaxis_transform()  # x in data, y in axes coordinates
    for mark in sorted(restarts, key=lambda m: m.at):
        x = mark.at / DAY_S
        top.axvline(x, color="C3", linewidth=1.2, zorder=4, gid=f"restart:{mark.run}")
        top.text(
            x, 0.98, f" {mark.label}", transform=on_top, rotation=90, ha="right", va="top", fontsize="small"
        ).set_in_layout(False)  # inside the axes: the layout needs no room for it
        if bottom is not None:
            bottom.axvline(x, color="C3", linewidth=1.0, gid=f"restart-strip:{mark.run}")
    top.set(title=title, ylabel="tokens/s", ylim=(0, None))
    top.grid(True, alpha=0.3)
    axis = bottom if bottom is not None else top
    if bottom is not None:
        _draw_strip(fig, bottom, strip, {(ln.role, ln.rank): ln.device for ln in lines if ln.device})
    if series.x or strip.rows:
        zone = fmt.timezone_of(timezone)
        axis.xaxis.set_major_locator(AutoDateLocator(tz=zone))  # type: ignore[no-untyped-call]
        axis.xaxis.set_major_formatter(DateFormatter(CHART_CLOCK, tz=zone))  # type: ignore[no-untyped-call]
    axis.set_xlabel(f"time ({timezone})")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
    return fig
