"""Digest statistics (pure): a window's metric lines aggregated per rank, per role and overall.

Per rank, tokens/s is the tokens it processed over the time it had a known rate in the window
(the chart's intervals, :func:`pipeline.digest.chart.rank_intervals`: Δtokens/Δts of its cumulative
``tokens`` counter, else its reported ``tokens_per_s``; gaps, relaunches and restarts left out).
The pipeline's tokens/s is the sum over the ranks that are not ``target`` (the drafters, which
consume what targets produce) — the headline, and the chart's line, by one definition
(:func:`pipeline.digest.chart.pipeline_rate`); targets are summed separately and never added in.
A rank whose lines carry no ``ts`` (or one line only) has the mean of its reported
``tokens_per_s`` instead (``rate_from``), and its ``samples_per_s`` likewise.  The ``tokens``
increase and its resets count as Prometheus' ``increase()`` counts them (:func:`counter_increase`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.digest.chart import Interval, RestartMark, covered, rank_intervals
from pipeline.observe.metrics import DRAFTER, TARGET, MetricLine, percentile

STARVED_BELOW = 0.5  #: mean drafter queue depth under which drafters are starved of hidden states
COMPARED = ("pipeline_tokens_per_s", "step_p50", "step_p95", "top1", "top4", "top8")
MIN_TREND_S = 10.0  #: seconds: a window shorter than this (a rank's single line, its own rate) has no trend
_LAST = ("loss", "top1", "top4", "top8")  #: taken from each rank's last line
_HEADLINE = (  # DigestSummary.headline's keys, in order (window_s: its ``seconds``)
    "pipeline_tokens_per_s target_tokens_per_s step_p50 step_p95 top1 top4 top8 loss_last window_end"
    " window_s resets"
).split()


def _sum(values: Iterable[float | None], *, mean: bool = False) -> float | None:
    """The sum of the values present (with ``mean``: their mean); None if none is."""
    present = [v for v in values if v is not None]
    return (sum(present) / len(present) if mean else sum(present)) if present else None


@dataclass(frozen=True)
class Flow:
    """Step-time percentiles (``step_time_s``, seconds) and queue depths over some metric lines."""

    step_p50: float | None
    step_p95: float | None
    queue_mean: float | None
    queue_max: float | None


@dataclass(frozen=True)
class RankStats(Flow):
    """One rank's numbers over the window: ``tokens`` between its first and last line (resets
    handled); ``tokens_per_s`` over the ``seconds`` it had a known rate (module docstring), else
    the mean of its reported ``tokens_per_s`` (``rate_from``: ``counter``, ``reported`` or
    ``none``); ``samples_per_s`` the mean of its reported ones; ``step_p50``/``step_p95`` of its
    ``step_time_s`` (seconds); ``loss`` and ``top1``… from its last line."""

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
    samples_per_s: float | None
    resets: int
    loss: float | None
    top1: float | None
    top4: float | None
    top8: float | None
    gpu_mem_bytes: int | None


@dataclass(frozen=True)
class RoleStats(Flow):
    """One role's numbers over the window: the sum of its ranks' tokens/s, ``step_time_s`` and
    ``queue_depth`` over all its lines."""

    role: str
    ranks: int
    lines: int
    tokens_per_s: float | None


@dataclass(frozen=True)
class DigestSummary(Flow):
    """A window of metric lines, aggregated (module docstring).  The step and queue numbers are
    the pipeline (non-target) lines'; ``loss_last``, ``top1``… the mean over drafter ranks of
    each one's last value, ``loss_mean``, ``top1_mean``… over every drafter line."""

    window_start: float | None  #: ``ts`` of the first metric line (unix s), None without timestamps
    window_end: float | None
    ranks: tuple[RankStats, ...]  #: by rank
    roles: tuple[RoleStats, ...]  #: targets first
    pipeline_tokens_per_s: float | None  #: the sum over every non-target rank (the drafters)
    target_tokens_per_s: float | None  #: shown apart, never added in
    samples_per_s: float | None  #: the non-target ranks' reported ``samples_per_s``, summed
    reported: bool  #: a rate shown is the lines' own (no ``ts`` to measure it by, or ``samples_per_s``)
    starved: bool  #: the drafters' mean queue depth is under :data:`STARVED_BELOW`: targets lag
    loss_last: float | None
    loss_mean: float | None
    top1: float | None
    top4: float | None
    top8: float | None
    top1_mean: float | None
    top4_mean: float | None
    top8_mean: float | None
    resets: int  #: counter resets (relaunches) across ranks
    metric_lines: int
    lines_read: int  #: complete log lines read, metric or not
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
        return {k: getattr(self, "seconds" if k == "window_s" else k) for k in _HEADLINE}


def counter_increase(values: Sequence[float]) -> tuple[float, int]:
    """(total increase, resets) of a cumulative counter's samples in time order: a sample lower
    than the one before means it restarted from zero, so its whole value is that step's increase."""
    if len(values) < 2:
        return 0.0, 0
    if values[0] <= values[-1] and list(values) == sorted(values):  # no reset: one C pass
        return float(values[-1] - values[0]), 0
    pairs = list(itertools.pairwise(values))
    increase = sum((cur if cur < prev else cur - prev for prev, cur in pairs), 0.0)
    return increase, sum(cur < prev for prev, cur in pairs)


def _last(values: Iterable[Any]) -> Any:
    return next((v for v in values if v is not None), None)


def _flow(ranks: Sequence[Sequence[MetricLine]]) -> dict[str, Any]:
    """The step-time percentiles (seconds) and queue depths over every line of ``ranks``."""
    steps, queue = _column(ranks, "step_time_s"), _column(ranks, "queue_depth")
    return {
        "step_p50": percentile(steps, 0.5),
        "step_p95": percentile(steps, 0.95),
        "queue_mean": _sum(queue, mean=True),
        "queue_max": max(queue, default=None),
    }


def _rank_stats(lines: Sequence[MetricLine], intervals: Sequence[Interval]) -> RankStats:
    """One rank's numbers from its lines in file order and its chart intervals (``role_rank`` and
    ``device``: its last line's)."""
    counted = _column([lines], "tokens")
    increase, resets = counter_increase(counted)
    timed = [(ln.ts, ln.tokens) for ln in lines if ln.ts is not None and ln.tokens is not None]
    tokens = counter_increase([n for _, n in timed])[0] if len(timed) >= 2 else increase if counted else None
    reported = _column([lines], "tokens_per_s")
    measured, seconds = covered(intervals)
    rate: float | None
    if seconds > 0:
        rate, rate_from = measured / seconds, "counter" if len(timed) >= 2 else "reported"
    else:
        rate, rate_from = (_sum(reported, mean=True), "reported") if reported else (None, "none")
    ts = _column([lines], "ts")
    return RankStats(
        **{key: getattr(lines[-1], key) for key in ("rank", "role", "role_rank", "device")},
        lines=len(lines),
        first_ts=min(ts, default=None),
        last_ts=max(ts, default=None),
        tokens=tokens,
        seconds=seconds if seconds > 0 else None,
        tokens_per_s=rate,
        rate_from=rate_from,
        samples_per_s=_sum(_column([lines], "samples_per_s"), mean=True),
        resets=resets,
        **_flow([lines]),
        **{key: _last(getattr(ln, key) for ln in reversed(lines)) for key in (*_LAST, "gpu_mem_bytes")},
    )


def _column(ranks: Iterable[Sequence[MetricLine]], key: str) -> list[float]:
    """Every present value of ``key`` over the lines of ``ranks``."""
    return [v for lines in ranks for ln in lines if (v := getattr(ln, key)) is not None]


def summarise(
    lines: Sequence[MetricLine],
    *,
    lines_read: int | None = None,
    bytes_read: int = 0,
    restarts: Sequence[RestartMark] = (),
) -> DigestSummary:
    """Aggregate the metric lines of one window (``lines_read``: complete log lines read, metric
    or not, default the metric lines; ``restarts``: the runs launched in it, as the chart marks
    them); numbers without data are None, never 0."""
    by_rank: dict[tuple[str, int], list[MetricLine]] = {}
    for ln in lines:
        by_rank.setdefault((ln.role, ln.rank), []).append(ln)
    series = list(by_rank.values())  # in order of each rank's first line
    ordered = sorted(series, key=lambda g: (g[0].rank, g[0].role))
    per_rank = rank_intervals(lines, restarts)
    ranks = [_rank_stats(g, per_rank.get((g[0].role, g[0].rank), [])) for g in ordered]
    role_names = sorted({r.role for r in ranks}, key=lambda name: (name != TARGET, name))
    roles = tuple(
        RoleStats(
            role=name,
            ranks=len([r for r in ranks if r.role == name]),
            lines=sum(r.lines for r in ranks if r.role == name),
            tokens_per_s=_sum(r.tokens_per_s for r in ranks if r.role == name),
            **_flow([g for g in ordered if g[0].role == name]),
        )
        for name in role_names
    )
    pipe = [g for g in series if g[0].role != TARGET]
    pipe_ranks = [r for r in ranks if r.role != TARGET]
    drafters = [r for r in ranks if r.role == DRAFTER] or pipe_ranks
    drafter_series = [g for g in series if g[0].role == DRAFTER] or pipe
    flow = _flow(pipe)
    return DigestSummary(
        window_start=min((r.first_ts for r in ranks if r.first_ts is not None), default=None),
        window_end=max((r.last_ts for r in ranks if r.last_ts is not None), default=None),
        ranks=tuple(ranks),
        roles=roles,
        # the chart's definition; without intervals (no ts, one line): the ranks' own rates
        pipeline_tokens_per_s=_sum(r.tokens_per_s for r in pipe_ranks),
        target_tokens_per_s=_sum(r.tokens_per_s for r in ranks if r.role == TARGET),
        samples_per_s=_sum(r.samples_per_s for r in pipe_ranks),
        # no ts to measure a rate by, or samples/s (only ever reported): the digest says so
        reported=(
            not any(r.last_ts is not None for r in ranks) and any(r.rate_from == "reported" for r in ranks)
        )
        or any(r.samples_per_s is not None for r in pipe_ranks),
        starved=flow["queue_mean"] is not None and flow["queue_mean"] < STARVED_BELOW,
        loss_last=_sum([r.loss for r in drafters], mean=True),
        resets=sum(r.resets for r in ranks),
        metric_lines=len(lines),
        lines_read=len(lines) if lines_read is None else lines_read,
        bytes_read=bytes_read,
        **flow,
        **{key: _sum([getattr(r, key) for r in drafters], mean=True) for key in _LAST[1:]},
        **{f"{key}_mean": _sum(_column(drafter_series, key), mean=True) for key in _LAST},
    )


def compare(
    prev: DigestSummary | Mapping[str, float | None] | None, cur: DigestSummary | Mapping[str, float | None]
) -> dict[str, float]:
    """The change of each :data:`COMPARED` number against a previous digest (a summary or its
    :meth:`DigestSummary.headline`), ``(cur - prev) / |prev| * 100``, for numbers in both with a
    non-zero previous value; empty unless both windows are :func:`steady` (a made-up trend else)."""
    before = prev.headline() if isinstance(prev, DigestSummary) else prev or {}  # no previous: no change
    now = cur.headline() if isinstance(cur, DigestSummary) else cur
    if not (steady(before) and steady(now)):
        return {}
    pairs = ((key, before.get(key), now.get(key)) for key in COMPARED)
    numbers = ((k, a, b) for k, a, b in pairs if isinstance(a, int | float) and isinstance(b, int | float))
    return {k: (b - a) / abs(a) * 100.0 for k, a, b in numbers if a != 0}


def steady(headline: Mapping[str, float | None]) -> bool:
    """Whether a window's headline can anchor a trend: no counter reset in it and at least
    :data:`MIN_TREND_S` s between its first and last metric line (without ``window_s``: steady)."""
    if "window_s" not in headline:
        return True
    seconds = headline.get("window_s")
    return not headline.get("resets") and seconds is not None and seconds >= MIN_TREND_S
