"""The digest chart: tokens/s of each GPU (rank) over the digest's window, as a PNG.

Drawn with matplotlib's object API on the Agg canvas (no pyplot, no GUI, no global figure
state), so it is safe in a server process and in a worker thread.  Drafter ranks are solid
lines, target ranks dashed, so the two roles read apart at a glance.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure

from pipeline.digest.metrics import MetricLine

MAX_POINTS = 2000  #: most points drawn per rank (longer series are thinned evenly)


def rank_rates(lines: Sequence[MetricLine]) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """Each rank's tokens/s over time, from consecutive lines of its cumulative counter.

    Between two lines the rate is Δtokens/Δts; a counter that went down restarted from zero,
    so the later value is the increase.  A line without a usable pair (the first one, no
    timestamps) contributes its reported ``tokens_per_s`` instead, when it has one; a line
    without a counter value is skipped over when pairing.

    :param lines: metric records in file order.
    :returns: (role, rank) → [(ts unix s, tokens/s), …] in time order; lines without ``ts``
        are left out.
    """
    out: dict[tuple[str, int], list[tuple[float, float]]] = {}
    prev: dict[tuple[str, int], MetricLine] = {}
    for ln in lines:
        key = (ln.role, ln.rank)
        if ln.ts is None:
            continue
        before = prev.get(key)
        if ln.tokens is not None:
            prev[key] = ln  # the counter's last sample: lines without one do not break the pair
        rate: float | None = None
        if (
            before is not None
            and before.ts is not None
            and before.tokens is not None
            and ln.tokens is not None
            and ln.ts > before.ts
        ):
            delta = ln.tokens - before.tokens if ln.tokens >= before.tokens else ln.tokens
            rate = delta / (ln.ts - before.ts)
        elif ln.tokens_per_s is not None:
            rate = ln.tokens_per_s
        if rate is not None:
            out.setdefault(key, []).append((ln.ts, rate))
    return out


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= MAX_POINTS:
        return points
    step = len(points) / MAX_POINTS
    return [points[int(i * step)] for i in range(MAX_POINTS - 1)] + [points[-1]]


def tokens_chart(lines: Sequence[MetricLine], path: Path, *, title: str = "tokens/s per GPU") -> Path:
    """Write a PNG line chart of tokens/s per rank over time.

    :param lines: the window's metric records.
    :param path: the PNG file to write (its directory is created if missing).
    :param title: the chart's title.
    :returns: ``path``.
    :raises OSError: if the file cannot be written.
    """
    series = rank_rates(lines)
    fig = Figure(figsize=(9, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    devices = {(ln.role, ln.rank): ln.device for ln in lines if ln.device}
    for role, rank in sorted(series, key=lambda k: (k[0] == "target", k[1])):
        pts = _thin(series[(role, rank)])
        xs: Any = [datetime.fromtimestamp(t, UTC) for t, _ in pts]
        ys = [r for _, r in pts]
        device = devices.get((role, rank))
        label = f"{role} {rank}" + (f" ({device})" if device else "")
        ax.plot(
            xs,
            ys,
            linestyle="--" if role == "target" else "-",
            linewidth=1.0 if role == "target" else 1.6,
            marker="." if len(pts) < 50 else None,
            label=label,
        )
    if series:
        locator = AutoDateLocator()  # type: ignore[no-untyped-call]
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    else:
        ax.text(0.5, 0.5, "no metric lines in this window", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title)
    ax.set_ylabel("tokens/s")
    ax.set_xlabel("time (UTC)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
