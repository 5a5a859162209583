"""The digest chart (PNG): two panels on one time axis (UTC), from :mod:`pipeline.digest.series`.

- **the pipeline's tokens/s**: smoothed in a solid line, the raw bins faint behind it, broken at
  every gap; each restart in the window a labelled vertical line (``r-2 topk``); the previous
  attempt's median (:func:`reference`) a dashed line;
- **the straggler strip**: one row per rank, each bin coloured by the rank's tokens/s as a
  percentage of its role's median then (red below 100%, blue above, grey without data).

Drawn with matplotlib's object API on the Agg canvas (no pyplot, no global state: safe in a
worker thread).  The artists carry ``gid``\\ s: ``pipeline``, ``pipeline-raw``, ``reference``,
``restart:r-2``, ``strip``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure

from pipeline import fmt
from pipeline.digest.series import (
    RankStrip,
    RestartMark,
    Throughput,
    rank_intervals,
    rank_strip,
    throughput,
)
from pipeline.observe.metrics import MetricLine, percentile

STRIP_LABELS = 24  #: most ranks named on the strip (more: every n-th)
STRIP_RANGE = (50.0, 150.0)  #: the strip's colour scale, percent of the role's median
STRAGGLER_BAND = (90.0, 110.0)  #: a rank whose median share is outside it is always named on the strip
CHART_PIPELINE = "pipeline tokens/s (drafters), smoothed; raw behind"
CHART_STRIP_TITLE = "stragglers: each rank's tokens/s as % of its role's median (red: slower)"
DAY_S = 86_400.0  #: unix seconds per matplotlib date number (days since its epoch, 1970-01-01)


def reference(
    series: Throughput, marks: Sequence[RestartMark], last_digest: float | None
) -> tuple[float, float | None, str] | None:
    """The dashed reference: (tokens/s, from when (unix s; None: the whole window), its label):
    the median of the bins between the last two restarts in the window (or its start and the
    last one), else the last scheduled digest's pipeline tokens/s (``last_digest``), else None."""
    ordered = sorted(marks, key=lambda m: m.at)
    if ordered and series.segments:
        last = ordered[-1]
        before = ordered[-2].at if len(ordered) > 1 else -math.inf
        if (median := series.median(before, last.at)) is not None:
            return median, last.at, f"median before {last.run}: {fmt.number(median)} tokens/s"
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
) -> Figure:
    """The digest chart as a figure on an Agg canvas: its first axes the throughput panel, the
    second (absent without any rank's rate) the straggler strip.

    :param restarts: the restarts launched within the window (a rank's interval holding one is a gap).
    :param last_digest: the last scheduled digest's pipeline tokens/s (:func:`reference`).
    :param path: where to write it as a PNG too (its directory created if missing).
    :raises OSError: if the file cannot be written.
    """
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
        if (ref := reference(series, restarts, last_digest)) is not None:
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
        locator = AutoDateLocator()  # type: ignore[no-untyped-call]
        axis.xaxis.set_major_locator(locator)
        axis.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    axis.set_xlabel("time (UTC)")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
    return fig
