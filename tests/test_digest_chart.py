"""The digest chart, checked from its data (matplotlib's artists), not by eye: the pipeline's
throughput smoothed with the raw bins behind it, one labelled vertical line per restart in the
window, no segment across a gap, the previous attempt's median as a reference, stragglers in a
strip — and the digest drawing it from the run records over real Redis and a real SSH host."""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from matplotlib.image import AxesImage

from devhost.sshhost import LocalSSHHost
from handlers.views.reports import digest_command
from pipeline.digest.chart import (
    DAY_S,
    RestartMark,
    draw_chart,
    pipeline_rate,
    rank_intervals,
    restart_label,
    throughput,
)
from pipeline.digest.report import build_digest, restart_marks
from pipeline.digest.stats import summarise
from pipeline.observe.metrics import MetricLine
from tests.test_digest import _config, gpu_host, make_ctx, nvidia_dir  # noqa: F401  (fixtures)

T = 1_700_000_000.0
PNG = b"\x89PNG\r\n\x1a\n"
TARGET_RATE = 400.0  #: tokens/s of each target rank
DRAFTER_RATE = 200.0  #: tokens/s of each drafter rank at speed 1


def _launch(
    t0: float, t1: float, *, speed: float = 1.0, slow: int | None = None, step: float = 2.0
) -> list[MetricLine]:
    """Eight ranks (5 targets, 3 drafters) from one launch: counters from zero, one line per rank every ``step`` s."""
    out = []
    n = 0
    while t0 + n * step < t1:
        n += 1
        for rank in range(8):
            role = "target" if rank < 5 else "drafter"
            rate = (
                (TARGET_RATE if role == "target" else DRAFTER_RATE) * speed * (0.5 if rank == slow else 1.0)
            )
            out.append(
                MetricLine(
                    ts=t0 + n * step + rank * 0.01,
                    role=role,
                    rank=rank,
                    device=f"cuda:{rank}",
                    tokens=rate * n * step,
                )
            )
    return out


def _pause(lines: Sequence[MetricLine], at: float, seconds: float) -> list[MetricLine]:
    """The same lines with nothing written for ``seconds`` from ``at`` (the counters go on)."""
    return [ln for ln in lines if ln.ts is None or not at <= ln.ts < at + seconds]


#: three launches: r-1 (with a 60 s pause, no restart), r-2 topk (drafter 6 at half speed), r-3 topk
WINDOW = (
    _pause(_launch(T, T + 600), T + 300, 60)
    + _launch(T + 660, T + 1200, speed=1.5, slow=6)
    + _launch(T + 1500, T + 1800, speed=1.5)
)
MARKS = (RestartMark(T + 640, "r-2", "r-2 topk"), RestartMark(T + 1480, "r-3", "r-3 topk"))
#: where no rank wrote for longer than a few sampling intervals: the pause, each restart's downtime
GAPS = ((T + 300, T + 360), (T + 600, T + 662), (T + 1200, T + 1502))


def _days(ts: float) -> float:
    return ts / DAY_S


def _by_gid(artists: Sequence[Any], gid: str) -> list[Any]:
    return [a for a in artists if a.get_gid() == gid]


def _finite_runs(xs: Sequence[float], ys: Sequence[float]) -> list[list[tuple[float, float]]]:
    """The polyline's pieces matplotlib draws: runs of consecutive points with both coordinates finite."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in zip(xs, ys, strict=True):
        if math.isfinite(x) and math.isfinite(y):
            runs[-1].append((x, y))
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def test_each_restart_is_one_labelled_vertical_line() -> None:
    """A restart in the window is one vertical line at its launch time, labelled with its run and patches."""
    fig = draw_chart(WINDOW, title="dflash: pipeline tokens/s", restarts=MARKS)
    top = fig.axes[0]
    for mark in MARKS:
        (line,) = _by_gid(top.get_lines(), f"restart:{mark.run}")
        assert list(line.get_xdata()) == [_days(mark.at)] * 2  # vertical: one x from bottom to top
        assert [t.get_text().strip() for t in top.texts if t.get_position()[0] == _days(mark.at)] == [
            mark.label
        ]
    assert len([ln for ln in top.get_lines() if str(ln.get_gid()).startswith("restart:")]) == len(MARKS)
    assert restart_label("r-2", "restart", ["topk"]) == "r-2 topk"
    assert restart_label("r-4", "auto-restart", []) == "r-4 auto-restart"
    assert restart_label("r-5", "start", ["topk", "hang"]) == "r-5 start topk, hang"


def test_no_segment_spans_a_gap_or_a_restart() -> None:
    """The smoothed and raw throughput lines are broken at every pause and restart: no segment joins across one."""
    fig = draw_chart(WINDOW, restarts=MARKS)
    top = fig.axes[0]
    for gid in ("pipeline", "pipeline-raw"):
        (line,) = _by_gid(top.get_lines(), gid)
        pieces = _finite_runs(line.get_xdata(), line.get_ydata())
        assert len(pieces) == 4  # before the pause, after it, r-2's launch, r-3's launch
        for piece in pieces:
            for (x0, _), (x1, _) in itertools.pairwise(piece):
                for start, end in GAPS:
                    assert not (x0 < _days(end) and x1 > _days(start)), (gid, x0, x1, start, end)
                for mark in MARKS:
                    assert not x0 < _days(mark.at) < x1
    # the diagonal of old: without the marks, the relaunch (counters back to zero) still breaks it
    unmarked = throughput(WINDOW, rank_intervals(WINDOW))
    assert len(unmarked.segments) == 4
    assert all(
        iv.end <= T + 1201 or iv.start >= T + 1500 for ivs in rank_intervals(WINDOW).values() for iv in ivs
    )


def test_smoothed_line_in_front_of_the_raw_bins_with_the_pipeline_sum() -> None:
    """The solid line is the smoothed drafters' sum, the faint raw bins are behind it; targets are not added in."""
    fig = draw_chart(WINDOW, restarts=MARKS)
    top = fig.axes[0]
    (smooth,) = _by_gid(top.get_lines(), "pipeline")
    (raw,) = _by_gid(top.get_lines(), "pipeline-raw")
    assert raw.get_zorder() < smooth.get_zorder() and (raw.get_alpha() or 1.0) < 0.5
    xs, ys = list(raw.get_xdata()), list(raw.get_ydata())
    first = [y for x, y in zip(xs, ys, strict=True) if _days(T + 10) < x < _days(T + 290)]
    assert first and all(y == pytest.approx(3 * DRAFTER_RATE) for y in first)  # 600 tokens/s, not + 5 × 400
    second = [y for x, y in zip(xs, ys, strict=True) if _days(T + 670) < x < _days(T + 1190)]
    assert second and all(y == pytest.approx(1.5 * DRAFTER_RATE * 2.5) for y in second)  # 750: rank 6 at half
    assert smooth.get_label().startswith("pipeline tokens/s")


def test_previous_attempts_median_is_the_reference() -> None:
    """The dashed reference is the median of the attempt before the last restart, from that restart on."""
    fig = draw_chart(WINDOW, restarts=MARKS, last_digest=123.0)
    top = fig.axes[0]
    (ref,) = _by_gid(top.collections, "reference")
    ((start, value), (end, same)) = ref.get_segments()[0]
    assert value == same == pytest.approx(750.0)  # r-2's attempt: 1.5 × (200 + 100 + 200)
    assert start == _days(MARKS[1].at) and end > start
    assert ref.get_label() == "before r-3: 750 tokens/s"
    # no restart in the window: the last scheduled digest's number instead, over the whole window
    alone = draw_chart(_launch(T, T + 600), last_digest=500.0).axes[0]
    (ref,) = _by_gid(alone.collections, "reference")
    assert ref.get_label() == "last digest: 500 tokens/s"
    assert not _by_gid(draw_chart(_launch(T, T + 600)).axes[0].collections, "reference")


def test_the_headline_is_the_charts_tokens_per_s() -> None:
    """The digest's headline and the chart share one definition (the drafters' tokens over the time
    they had a rate, gaps and restarts left out): it lies within the bins the chart draws, unlike
    tokens over the whole window; the reference is the same definition before the restart."""
    per_rank = rank_intervals(WINDOW, MARKS)
    headline = summarise(WINDOW, restarts=MARKS).pipeline_tokens_per_s
    assert headline == pytest.approx(pipeline_rate(per_rank))
    bins = [v for v in throughput(WINDOW, per_rank).raw if math.isfinite(v)]
    assert min(bins) <= headline <= max(bins)  # 600 (r-1), 750 (r-2), 900 (r-3)
    # by hand: each drafter's tokens while it had a rate over those seconds (r-1 200 tokens/s,
    # then 300, then 300; rank 6 at half speed in r-2), summed
    seconds = {k: sum(iv.end - iv.start for iv in ivs) for k, ivs in per_rank.items()}
    tokens = {k: sum(iv.rate * (iv.end - iv.start) for iv in ivs) for k, ivs in per_rank.items()}
    assert headline == pytest.approx(sum(tokens[k] / seconds[k] for k in per_rank if k[0] == "drafter"))
    ref = draw_chart(WINDOW, restarts=MARKS).axes[0]
    (line,) = _by_gid(ref.collections, "reference")
    assert line.get_segments()[0][0][1] == pytest.approx(pipeline_rate(per_rank, MARKS[0].at, MARKS[1].at))


def test_the_time_axis_shows_clock_times_in_the_configured_zone() -> None:
    """Tick labels are ``HH:MM:SS`` in ``[scheduler] timezone`` (not bare seconds), the zone named."""
    from zoneinfo import ZoneInfo

    fig = draw_chart(_launch(T, T + 120), timezone="Europe/Paris")
    fig.canvas.draw()
    axis = fig.axes[1]  # the strip under the throughput panel (the colour bar is last)
    assert axis.get_xlabel() == "time (Europe/Paris)"
    zone = ZoneInfo("Europe/Paris")
    shown = [(t.get_text(), t.get_position()[0]) for t in axis.get_xticklabels() if t.get_text()]
    assert len(shown) >= 2
    for label, days in shown:
        assert label == datetime.fromtimestamp(days * DAY_S, zone).strftime("%H:%M:%S")
    assert shown[0][0].startswith("23:1")  # T is 22:13:20 UTC, 23:13:20 in Paris


def test_stragglers_are_a_strip_not_eight_lines() -> None:
    """The second panel is one row per rank, coloured by its share of its role's median: the slow drafter reads ~50%."""
    fig = draw_chart(WINDOW, restarts=MARKS)
    top, strip = fig.axes[0], fig.axes[1]
    drawn = {str(ln.get_gid()).split(":")[0] for ln in top.get_lines()}
    assert drawn == {"pipeline", "pipeline-raw", "restart"}  # no line per rank up there
    (image,) = [i for i in strip.get_images() if isinstance(i, AxesImage) and i.get_gid() == "strip"]
    share = image.get_array()
    assert share is not None and share.shape[0] == 8
    labels = [t.get_text() for t in strip.get_yticklabels()]
    assert labels[0] == "0 target cuda:0" and labels[6] == "6 drafter cuda:6"
    x0, x1, _, _ = image.get_extent()
    cols = share.shape[1]

    def column(ts: float) -> int:
        return int((_days(ts) - x0) / (x1 - x0) * cols)

    mid = column(T + 900)  # in r-2's launch, rank 6 at half speed
    assert (
        abs(float(share[6, mid]) - 50) < 1
    )  # 150 of the drafters' median 300 (ranks 5, 6, 7: 300, 150, 300)
    assert abs(float(share[5, mid]) - 100) < 1 and abs(float(share[0, mid]) - 100) < 1
    assert bool(share.mask[:, column(T + 1350)].all())  # nobody wrote during r-3's downtime: no colour
    assert len([ln for ln in strip.get_lines() if str(ln.get_gid()).startswith("restart-strip:")]) == 2


def test_many_ranks_name_every_straggler_on_the_strip() -> None:
    """With 64 ranks the strip names every n-th rank, and always the slow one."""
    lines = [
        MetricLine(
            ts=T + n * 2.0,
            role="target" if r < 40 else "drafter",
            rank=r,
            device=f"cuda:{r % 8}",
            tokens=n * 2.0 * (60.0 if r == 50 else 100.0),
        )
        for n in range(1, 30)
        for r in range(64)
    ]
    strip = draw_chart(lines).axes[1]
    labels = [t.get_text() for t in strip.get_yticklabels()]
    assert "50 drafter cuda:2" in labels and len(labels) < 64
    assert "49 drafter cuda:1" not in labels and "51 drafter cuda:3" not in labels  # no label on top of it


def test_a_restart_after_the_last_line_is_drawn_inside_the_chart(tmp_path: Path) -> None:
    """A run launched after the window's last line widens the time axis to its line; the PNG is drawn without a layout warning."""
    late = RestartMark(T + 1500, "r-9", "r-9 topk")
    fig = draw_chart(_launch(T, T + 600), restarts=(late,))
    left, right = fig.axes[0].get_xlim()
    assert left < _days(T + 2) and right > _days(late.at)
    (ref,) = _by_gid(fig.axes[0].collections, "reference")
    ((start, _), (end, _)) = ref.get_segments()[0]
    assert start == _days(late.at) and end > start  # the attempt before it, from it on
    draw_chart(_launch(T, T + 600), path=tmp_path / "late.png", restarts=(late,))  # warnings are errors here
    assert (tmp_path / "late.png").read_bytes().startswith(PNG)


def test_charts_without_rates_say_so() -> None:
    """No metric lines, or too few for a rate, is a chart that says so, not an empty frame or an error."""
    empty = draw_chart([])
    assert [t.get_text() for t in empty.axes[0].texts] == ["no metric lines in this window"]
    one = draw_chart([MetricLine(ts=T, role="drafter", rank=5, tokens=10)], last_digest=500.0)
    assert len(one.axes) == 1 and "too few" in one.axes[0].texts[0].get_text()


# --- the digest draws it from the run records --------------------------------------------------


def _jsonl(lines: Sequence[MetricLine]) -> bytes:
    return b"".join(
        (json.dumps({k: v for k, v in ln._asdict().items() if v is not None}) + "\n").encode() for ln in lines
    )


async def test_digest_marks_the_runs_launched_in_its_window(
    gpu_host: LocalSSHHost,  # noqa: F811
    tmp_path: Path,
    make_ctx: Any,  # noqa: F811
) -> None:
    """restart_marks reads the runs launched within the window (not stops, not failed launches); the digest's chart is drawn."""
    ctx = make_ctx(_config(gpu_host, tmp_path, gpus=False))
    now = time.time()
    start = now - 1800
    window = [ln._replace(ts=(ln.ts or 0) - T + start) for ln in WINDOW]
    (tmp_path / "dflash.log").write_bytes(_jsonl(window))
    old = await ctx.runs.create("dflash", "U1")
    old.launched_at = start - 3600  # before the window: not marked
    await ctx.runs.record_step(old)
    r2 = await ctx.runs.create("dflash", "U1", patches=["topk"])
    r2.launched_at = start + 640
    await ctx.runs.record_step(r2)
    await ctx.runs.create("dflash", "U1", action="stop")  # a stop launches nothing
    failed = await ctx.runs.create("dflash", "U1")  # a launch that failed has no launched_at
    r3 = await ctx.runs.create("dflash", "U1", action="auto-restart", patches=["topk"])
    r3.launched_at = start + 1480
    await ctx.runs.record_step(r3)
    marks = restart_marks(await ctx.runs.recent("dflash", 100), window[0].ts, now)
    assert marks == (
        RestartMark(start + 640, r2.id, f"{r2.id} topk"),
        RestartMark(start + 1480, r3.id, f"{r3.id} auto-restart topk"),
    )
    assert failed.id not in {m.run for m in marks}
    digest = await build_digest(
        "dflash", config=ctx.config, redis=ctx.redis, ssh=ctx.ssh, events=ctx.events, scheduled=False
    )
    assert digest.marks == marks  # what the chart was drawn with
    assert digest.chart is not None and digest.chart.read_bytes().startswith(PNG)


async def test_the_all_jobs_digest_draws_each_job_in_the_same_style(
    gpu_host: LocalSSHHost,  # noqa: F811
    tmp_path: Path,
    make_ctx: Any,  # noqa: F811
) -> None:
    """`digest` of every job gives each job's follow-up its own chart of the same kind."""
    ctx = make_ctx(_config(gpu_host, tmp_path, gpus=False, jobs=("dflash", "other")))
    for name in ("dflash", "other"):
        (tmp_path / f"{name}.log").write_bytes(_jsonl(_launch(T, T + 120)))
    reply = await digest_command(ctx, None)
    charts = [Path(f.chart) for f in reply.follow_ups if f.chart]
    assert len(charts) == 2 and all(c.read_bytes().startswith(PNG) for c in charts)
    assert {c.name.split("-")[0] for c in charts} == {"dflash", "other"}
