"""Throughput digests: hand-computed aggregation, bounded windows from byte offsets, Redis
bookkeeping, GPU tables with n/a, the chart, and the replies — over real Redis and a real
in-process SSH host."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import time_machine

from devhost.sshhost import LocalSSHHost, start_local_ssh_host
from handlers.context import Context
from handlers.outbox import MemoryOutbox
from handlers.reply import Status, render_text
from handlers.text import (
    digest_all_title,
    digest_resets,
    digest_starved,
    digest_targets,
    digest_window_note,
    gpus_title,
    unknown_name,
)
from handlers.views.reports import digest_command, digest_reply, gpus_command
from pipeline.config import Config, GpuRoles, JobConfig, StateSettings
from pipeline.digest.chart import draw_chart
from pipeline.digest.report import Digest, build_digest
from pipeline.digest.stats import MIN_TREND_S, compare, counter_increase, summarise
from pipeline.digest.window import (
    LogRead,
    LogWindow,
    OffsetState,
    WindowKind,
    _read_from,
    read_window,
)
from pipeline.engines.runner import Runner
from pipeline.host.remote import SSHPool
from pipeline.observe.metrics import MetricLine, parse_metric_lines, percentile
from pipeline.state import keys
from pipeline.state.events import EventKind, Events
from pipeline.state.jobstate import DigestMemory
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunStore
from tests.fixtures.localread import local_reader

DATA = Path(__file__).parent / "data"
FIXTURES = Path(__file__).parent / "fixtures"
DFLASH_LOG = (DATA / "dflash_metrics.log").read_bytes()
COMPLETE = DFLASH_LOG[: DFLASH_LOG.rfind(b"\n") + 1]  # without the partial last line
T = 1_700_000_000.0
PNG = b"\x89PNG\r\n\x1a\n"


# --- aggregation, by hand ---------------------------------------------------------------------


def test_summary_equals_hand_computed_numbers() -> None:
    """Every headline number of tests/data/dflash_metrics.log equals the value worked out by hand."""
    lines = parse_metric_lines(DFLASH_LOG, "jsonl")
    s = summarise(lines, lines_read=39, bytes_read=len(COMPLETE))
    # targets 0..4 run at 500, 600, 700, 800, 900 tokens/s: (tokens last - first) / 20 s
    assert [(r.rank, r.role, r.tokens, r.seconds, r.tokens_per_s) for r in s.ranks[:5]] == [
        (0, "target", 10_000, 20.0, 500.0),
        (1, "target", 12_000, 20.0, 600.0),
        (2, "target", 14_000, 20.0, 700.0),
        (3, "target", 16_000, 20.0, 800.0),
        (4, "target", 18_000, 20.0, 900.0),
    ]
    assert s.target_tokens_per_s == 3500.0
    # drafter 5: (8000 - 2000) / 30 = 200; drafter 6 relaunched between its 2nd and 3rd line: its
    # counter went 2000 + 500 + 2000 = 4500, but it has a rate only while it ran, 2000 + 2000 over
    # the 20 s either side of the relaunch = 200 (the chart's gap is no time of its);
    # drafter 7: (5500 - 1000) / 30 = 150 — the pipeline is the drafters only: 550, not 4050
    assert [(r.rank, r.tokens, r.seconds, r.tokens_per_s, r.resets) for r in s.ranks[5:]] == [
        (5, 6000, 30.0, 200.0, 0),
        (6, 4500, 20.0, 200.0, 1),
        (7, 4500, 30.0, 150.0, 0),
    ]
    assert all(r.rate_from == "counter" for r in s.ranks)
    assert s.pipeline_tokens_per_s == 550.0 and not s.reported
    assert s.resets == 1
    # drafter step times sorted: .10 .10 .10 .11 .12 .12 .12 .13 .14 .16 .20 .30
    assert s.step_p50 == pytest.approx(0.12)
    assert s.step_p95 == pytest.approx(0.245)  # position 10.45: .20 + .45 * (.30 - .20)
    target = s.role("target")
    assert target is not None and (target.ranks, target.lines) == (5, 15)
    assert (target.step_p50, target.step_p95) == (pytest.approx(0.06), pytest.approx(0.07))
    drafter = s.role("drafter")
    assert drafter is not None and (drafter.ranks, drafter.lines, drafter.tokens_per_s) == (3, 13, 550.0)
    # drafter queue depth: 4 items over 12 lines, max 1 → starved
    assert s.queue_mean == pytest.approx(1 / 3) and s.queue_max == 1.0 and s.starved
    assert s.loss_last == pytest.approx(2.5)  # (2.0 + 3.0 + 2.5) / 3
    assert s.loss_mean == pytest.approx(2.85)  # 34.2 / 12
    assert (s.top1, s.top4, s.top8) == (pytest.approx(0.375), pytest.approx(0.625), pytest.approx(0.875))
    assert (s.top1_mean, s.top4_mean, s.top8_mean) == (
        pytest.approx(0.28125),
        pytest.approx(0.53125),
        pytest.approx(0.78125),
    )
    assert (s.window_start, s.window_end, s.seconds) == (T, T + 30, 30.0)
    assert (s.metric_lines, s.lines_read) == (28, 39)
    assert s.ranks[5].gpu_mem_bytes == 3000 and s.ranks[6].gpu_mem_bytes is None


def test_counter_reset_counts_from_zero() -> None:
    """A counter that goes down restarted from zero: its new value is the increase."""
    assert counter_increase([100, 300, 50, 80]) == (200 + 50 + 30, 1)
    assert counter_increase([5]) == (0.0, 0)
    assert counter_increase([]) == (0.0, 0)


def test_percentile_interpolates_between_closest_ranks() -> None:
    """p50/p95 use numpy's default linear interpolation; no values give None."""
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([10.0], 0.95) == 10.0
    assert percentile([0.0, 10.0], 0.95) == pytest.approx(9.5)
    assert percentile([], 0.5) is None


def test_single_line_rank_falls_back_to_reported_rate() -> None:
    """A rank with one line in the window uses its own tokens_per_s and says so; none at all is None."""
    lines = [
        MetricLine(ts=T, role="drafter", rank=5, tokens=10, tokens_per_s=321.0, queue_depth=7),
        MetricLine(ts=T, role="drafter", rank=6, tokens=10),
    ]
    s = summarise(lines)
    assert [(r.tokens_per_s, r.rate_from) for r in s.ranks] == [(321.0, "reported"), (None, "none")]
    assert s.pipeline_tokens_per_s == 321.0
    assert not s.starved


def test_a_job_counting_samples_has_samples_per_s_and_only_its_own_rows() -> None:
    """Timed lines with ``samples_per_s`` and ``loss`` only: the title is samples/s (reported, and
    said so), no tokens/s, and no row for what the lines lack (step time, queue depth, top-k)."""
    data = b"".join(
        json.dumps(
            {"ts": T + i, "step": i, "samples_per_s": 30.0 + i % 2 * 2, "loss": 2.0 - i / 100}
        ).encode()
        + b"\n"
        for i in range(1, 11)
    )
    s = summarise(parse_metric_lines(data, "jsonl"))
    assert (s.pipeline_tokens_per_s, s.samples_per_s, s.reported) == (None, 31.0, True)
    window = LogWindow(data, 0, len(data), len(data), None, WindowKind.LAST_BYTES)
    reply = digest_reply(Digest("tj", s, window, "/srv/tj/train.log", len(data)))
    assert reply.title == "digest tj: 31 samples/s"
    assert [label for label, _ in reply.fields] == ["uptime", "restarts", "window", "samples/s", "loss"]
    assert dict(reply.fields)["loss"] == "1.900 last, 1.945 mean"
    assert "samples/s is the metric lines' own samples_per_s, averaged" in reply.lines


def test_empty_window_has_no_numbers() -> None:
    """No metric lines: every number is None (shown as n/a), never 0."""
    s = summarise([])
    assert s.pipeline_tokens_per_s is None and s.step_p50 is None and s.top1 is None
    assert s.window_start is None and not s.starved and s.metric_lines == 0


def test_compare_gives_signed_percent() -> None:
    """compare() is (cur - prev) / |prev| in percent for the headline numbers present in both."""
    cur = {**summarise(parse_metric_lines(DFLASH_LOG, "jsonl")).headline(), "resets": 0}  # a steady window
    prev = {**cur, "pipeline_tokens_per_s": 400.0, "top1": 0.5, "step_p50": None, "top8": 0.0}
    change = compare(prev, cur)
    assert change["pipeline_tokens_per_s"] == pytest.approx(37.5)  # 550 against 400
    assert change["top1"] == pytest.approx(-25.0)
    assert "step_p50" not in change and "top8" not in change
    assert compare(None, cur) == {}
    assert compare(cur, cur)["pipeline_tokens_per_s"] == 0.0


def _steady_drafters(start: float, seconds: float, rate: float, *, from_tokens: int = 0) -> list[MetricLine]:
    """Ranks 5-7 writing a line every 5 s from ``start`` for ``seconds``, each at ``rate`` tokens/s."""
    lines = []
    for i in range(int(seconds // 5) + 1):
        for rank in (5, 6, 7):
            tokens = from_tokens + int(rate * 5 * i)
            lines.append(MetricLine(ts=start + 5 * i, role="drafter", rank=rank, tokens=tokens, step=i))
    return lines


def test_no_trend_across_a_relaunch_or_from_a_short_window() -> None:
    """A trend compares steady windows only: one spanning a relaunch (its counters reset) or one
    shorter than MIN_TREND_S has no change against a steady one, either way round."""
    steady = summarise(_steady_drafters(T, 600, 100.0))
    assert steady.pipeline_tokens_per_s == pytest.approx(300.0) and steady.resets == 0
    later = summarise(_steady_drafters(T + 600, 600, 110.0, from_tokens=60_000))
    assert compare(steady, later)["pipeline_tokens_per_s"] == pytest.approx(10.0)  # like with like

    # the job was killed at T+300 and relaunched at T+550: the counters start again from zero
    relaunched = summarise(_steady_drafters(T, 300, 100.0) + _steady_drafters(T + 550, 50, 100.0))
    assert relaunched.resets == 3 and relaunched.pipeline_tokens_per_s is not None
    assert compare(steady, relaunched) == {} and compare(relaunched, later) == {}

    # right after a relaunch: one line per rank, a 0 s window whose rates are the ranks' own
    short = summarise(
        [
            MetricLine(ts=T + 900, role="drafter", rank=r, tokens=640, tokens_per_s=5000.0, step=1)
            for r in (5, 6, 7)
        ]
    )
    assert short.seconds == 0 and short.pipeline_tokens_per_s == pytest.approx(15_000.0)
    assert compare(steady, short) == {} and compare(short.headline(), later) == {}
    assert MIN_TREND_S > 0 and compare(steady, summarise(_steady_drafters(T, MIN_TREND_S, 100.0))) != {}

    # a headline stored before window_s and resets were kept is compared as before
    old = {k: v for k, v in steady.headline().items() if k not in ("window_s", "resets")}
    assert compare(old, later)["pipeline_tokens_per_s"] == pytest.approx(10.0)


# --- windows over a local file --------------------------------------------------------------


def _state(window: LogWindow) -> OffsetState:
    return window.state(at=1.0)


async def test_scheduled_window_reads_only_new_complete_lines(tmp_path: Path) -> None:
    """From a stored offset only bytes written since are read; a partial line waits for the next digest."""
    log = tmp_path / "m.log"
    log.write_bytes(b"line one\nline tw")
    reader = local_reader(log)
    first = await read_window(reader, None, scheduled=True)
    assert (first.data, first.start, first.end, first.kind) == (b"line one\n", 0, 9, WindowKind.LAST_BYTES)
    with log.open("ab") as f:
        f.write(b"o\nline three\n")
    second = await read_window(reader, _state(first), scheduled=True)
    assert (second.data, second.start, second.end) == (b"line two\nline three\n", 9, 29)
    assert second.kind is WindowKind.SINCE_LAST
    third = await read_window(reader, _state(second), scheduled=True)
    assert (third.data, third.start, third.end) == (b"", 29, 29)
    assert _state(third).fingerprint == _state(second).fingerprint  # still recognises the file


async def test_window_is_bounded_to_the_last_bytes_on_a_line_start(tmp_path: Path) -> None:
    """When more than max_bytes were written, only the last max_bytes are read, from a line start."""
    log = tmp_path / "m.log"
    lines = [f"{i:04d} {'x' * 15}\n".encode() for i in range(100)]  # 21 bytes each
    log.write_bytes(b"".join(lines))
    w = await read_window(local_reader(log), None, scheduled=True, max_bytes=100)
    assert w.data == b"".join(lines[-4:])  # 100 bytes hold 4 whole lines, the 5th is cut
    assert w.end == 2100 and w.skipped == 2100 - 100
    aligned = await read_window(local_reader(log), None, scheduled=True, max_bytes=105)
    assert aligned.data == b"".join(lines[-5:])  # exactly 5 lines: the cut falls on a line start
    state = _state(await read_window(local_reader(log), None, scheduled=True, max_bytes=5000))
    with log.open("ab") as f:
        f.write(b"".join(lines[:10]))
    w2 = await read_window(local_reader(log), state, scheduled=True, max_bytes=50)
    assert (w2.kind, w2.data, w2.skipped) == (WindowKind.SINCE_LAST, b"".join(lines[8:10]), 210 - 50)


async def test_truncated_log_is_read_from_its_start(tmp_path: Path) -> None:
    """A log shorter than the stored offset was truncated: the digest starts again at 0."""
    log = tmp_path / "m.log"
    log.write_bytes(b"a" * 50 + b"\n")
    state = _state(await read_window(local_reader(log), None, scheduled=True))
    log.write_bytes(b"fresh\n")
    w = await read_window(local_reader(log), state, scheduled=True)
    assert (w.kind, w.data, w.start, w.end) == (WindowKind.TRUNCATED, b"fresh\n", 0, 6)


async def test_rotated_log_is_read_from_its_start(tmp_path: Path) -> None:
    """Another file at the path (new inode, or other bytes before the offset) is read from 0."""
    log = tmp_path / "m.log"
    log.write_bytes(b"old line 1\nold line 2\n")
    state = _state(await read_window(local_reader(log), None, scheduled=True))
    os.rename(log, tmp_path / "m.log.1")
    log.write_bytes(b"new line 1\nnew line 2\nnew line 3\n")
    w = await read_window(local_reader(log), state, scheduled=True)
    assert (w.kind, w.start, w.data.count(b"\n")) == (WindowKind.ROTATED, 0, 3)
    # same inode, rewritten in place with other content longer than the offset
    state = _state(w)
    log.write_bytes(b"X" * 40 + b"\n")
    w = await read_window(
        local_reader(log), OffsetState(22, 0, 34, None, state.fingerprint, 1.0), scheduled=True
    )
    assert (w.kind, w.start) == (WindowKind.ROTATED, 0)


async def test_on_demand_with_nothing_new_repeats_the_last_window(tmp_path: Path) -> None:
    """On demand, with no new complete line since the scheduled digest, its window is read again."""
    log = tmp_path / "m.log"
    log.write_bytes(b"first\n")
    s1 = _state(await read_window(local_reader(log), None, scheduled=True))
    with log.open("ab") as f:
        f.write(b"second\nthird\npart")
    s2 = _state(await read_window(local_reader(log), s1, scheduled=True))
    again = await read_window(local_reader(log), s2, scheduled=False)
    assert (again.kind, again.data, again.start) == (WindowKind.REPEAT, b"second\nthird\n", 6)


# --- the chart --------------------------------------------------------------------------------


def test_chart_is_a_png_with_a_line_per_rank(tmp_path: Path) -> None:
    """draw_chart writes a non-empty PNG, also for a window without lines."""
    lines = parse_metric_lines(DFLASH_LOG, "jsonl")
    draw_chart(lines, path=tmp_path / "charts" / "c.png")
    data = (tmp_path / "charts" / "c.png").read_bytes()
    assert data.startswith(PNG) and len(data) > 10_000
    draw_chart([], path=tmp_path / "empty.png")
    assert (tmp_path / "empty.png").read_bytes().startswith(PNG)


# --- the digest over real Redis and a real SSH host ----------------------------------------------


def _drafter(ts: float, rank: int, tokens: int, **extra: object) -> bytes:
    rec = {
        "ts": ts,
        "step": 1,
        "role": "drafter",
        "rank": rank,
        "role_rank": rank - 5,
        "device": f"cuda:{rank}",
    }
    rec.update(tokens=tokens, tokens_per_s=1.0, step_time_s=0.1, queue_depth=3, loss=2.0)
    rec.update({"top1": 0.5, "top4": 0.75, "top8": 0.875, **extra})
    return (json.dumps(rec) + "\n").encode()


@pytest.fixture
def nvidia_dir(tmp_path: Path) -> Path:
    """Where the nvidia-smi stand-in looks for query-gpu.txt / query-compute-apps.txt."""
    d = tmp_path / "nvidia"
    d.mkdir()
    return d


@pytest.fixture
async def gpu_host(tmp_path: Path, nvidia_dir: Path) -> AsyncIterator[LocalSSHHost]:
    """An in-process SSH host with the nvidia-smi stand-in on PATH."""
    host = await start_local_ssh_host(
        tmp_path / "ssh",
        path_prepend=[FIXTURES / "bin"],
        env={"PITSTOP_FAKE_NVIDIA_SMI": str(nvidia_dir)},
    )
    try:
        yield host
    finally:
        await host.close()


def _config(
    host: LocalSSHHost, tmp_path: Path, *, gpus: bool = True, jobs: tuple[str, ...] = ("dflash",)
) -> Config:
    specs = {
        name: JobConfig(
            host="gpu1",
            workdir=str(tmp_path),
            launch=["true"],
            log=str(tmp_path / f"{name}.log"),
            match=f"never-{uuid.uuid4().hex}",
            gpus=GpuRoles(target=[0, 1, 2, 3, 4], drafter=[5, 6, 7]) if gpus else None,
            channel="C-digest",
        )
        for name in jobs
    }
    return Config(hosts={"gpu1": host.host_config()}, jobs=specs, state=StateSettings(dir=tmp_path / "state"))


async def _digest(ctx: Context, job: str, **options: Any) -> Digest:
    """:func:`build_digest` with the dependencies a Context holds."""
    return await build_digest(
        job,
        config=ctx.config,
        redis=ctx.redis,
        ssh=ctx.ssh,
        events=ctx.events,
        **options,
    )


@pytest.fixture
async def make_ctx(redis_handle: RedisHandle) -> AsyncIterator[object]:
    """Builds Contexts on the test's Redis; closes their SSH pools afterwards."""
    pools: list[SSHPool] = []

    def build(config: Config) -> Context:
        ssh = SSHPool(config)
        pools.append(ssh)
        runs = RunStore(redis_handle.client, redis_handle.prefix)
        events = Events(redis_handle.client, redis_handle.prefix)
        restarter = Runner(config, ssh, runs, events)
        return Context(config, redis_handle, ssh, runs, restarter, events, MemoryOutbox(), "test")

    yield build
    for pool in pools:
        await pool.close()


async def test_scheduled_digests_move_the_offset_on_demand_does_not(
    gpu_host: LocalSSHHost, tmp_path: Path, make_ctx: object, nvidia_dir: Path
) -> None:
    """Over SSH, scheduled digests read only new bytes and store the offset, on demand moves nothing, truncation is caught."""
    ctx = make_ctx(_config(gpu_host, tmp_path))  # type: ignore[operator]
    log = tmp_path / "dflash.log"
    log.write_bytes(DFLASH_LOG)  # ends in a partial line
    after = await ctx.events.last_id()

    d1 = await _digest(ctx, "DFlash", scheduled=True)
    assert d1.job == "dflash" and d1.window.kind is WindowKind.LAST_BYTES
    assert d1.summary.pipeline_tokens_per_s == 550.0 and d1.summary.bytes_read == len(COMPLETE)
    state = OffsetState.from_hash(await ctx.redis.open_store(DigestMemory).offset("dflash"))
    assert state is not None and state.offset == len(COMPLETE) and state.size == len(DFLASH_LOG)
    assert state.inode == log.stat().st_ino
    event = await ctx.events.wait_for(EventKind.DIGEST, "dflash", after=after, timeout=10)
    assert event is not None and event.data["tokens_per_s"] == 550.0 and event.data["scheduled"] is True

    # the writer finishes the partial line (rank 5 at ts+40: 99,999,999 tokens) and goes on
    more = b'me_s":0.1,"queue_depth":2}\n'
    more += _drafter(T + 40, 6, 3000) + _drafter(T + 40, 7, 6000)
    more += _drafter(T + 50, 5, 100_001_999) + _drafter(T + 50, 6, 5000) + _drafter(T + 50, 7, 7500)
    with log.open("ab") as f:
        f.write(more)
    d2 = await _digest(ctx, "dflash", scheduled=True)
    assert d2.window.kind is WindowKind.SINCE_LAST and d2.window.start == len(COMPLETE)
    assert d2.summary.bytes_read == len(DFLASH_LOG) - len(COMPLETE) + len(more)
    # 2000/10 + 2000/10 + 1500/10 = 550 tokens/s; no trend: d1's window spans rank 6's relaunch
    assert d2.summary.pipeline_tokens_per_s == pytest.approx(550.0)
    assert d2.change == {} and digest_reply(d2).title == "digest dflash: 550 tokens/s"

    # the next steady window against d2's: 2000/10 + 2000/10 + 2050/10 = 605 tokens/s, +10%
    steady = _drafter(T + 60, 5, 100_001_999) + _drafter(T + 60, 6, 5000) + _drafter(T + 60, 7, 7500)
    steady += _drafter(T + 70, 5, 100_003_999, top1=0.25) + _drafter(T + 70, 6, 7000, top1=0.25)
    steady += _drafter(T + 70, 7, 9550, top1=0.25)
    with log.open("ab") as f:
        f.write(steady)
    d2b = await _digest(ctx, "dflash", scheduled=True)
    assert d2b.summary.pipeline_tokens_per_s == pytest.approx(605.0)
    assert d2b.change["pipeline_tokens_per_s"] == pytest.approx(10.0)
    reply2 = digest_reply(d2b)
    assert reply2.title == "digest dflash: 605 tokens/s (+10.0%)"
    # top-1 of the drafters' last lines 0.25 against 0.5; top-4/8 unchanged
    assert dict(reply2.fields)["top-1/4/8"].endswith("(-50.0% / +0.0% / +0.0%)")
    end = len(DFLASH_LOG) + len(more) + len(steady)
    assert OffsetState.from_hash(await ctx.redis.open_store(DigestMemory).offset("dflash")).offset == end  # type: ignore[union-attr]

    with log.open("ab") as f:
        f.write(_drafter(T + 80, 5, 100_005_999))
    d3 = await _digest(ctx, "dflash", scheduled=False)
    assert d3.window.kind is WindowKind.SINCE_LAST and d3.summary.metric_lines == 1
    state3 = OffsetState.from_hash(await ctx.redis.open_store(DigestMemory).offset("dflash"))
    assert state3 is not None and state3.offset == end  # on demand left the offset alone
    last = json.loads(await ctx.redis.client.get(keys.digest_last(ctx.redis.prefix, "dflash")))
    assert last["pipeline_tokens_per_s"] == pytest.approx(605.0)

    log.write_bytes(_drafter(T + 100, 5, 10) + _drafter(T + 110, 5, 1010))
    d4 = await _digest(ctx, "dflash", scheduled=True)
    assert d4.window.kind is WindowKind.TRUNCATED and d4.window.start == 0
    assert d4.summary.pipeline_tokens_per_s == 100.0


async def test_digest_reply_reads_like_the_brief(
    gpu_host: LocalSSHHost, tmp_path: Path, make_ctx: object, nvidia_dir: Path
) -> None:
    """The reply has the title, fields, rank and GPU tables ([N/A]/[Not Supported] as n/a) and a PNG chart."""
    (nvidia_dir / "query-gpu.txt").write_bytes(
        (FIXTURES / "nvidia" / "h100_query_gpu_not_supported.txt").read_bytes()
    )
    ctx = make_ctx(_config(gpu_host, tmp_path))  # type: ignore[operator]
    (tmp_path / "dflash.log").write_bytes(DFLASH_LOG)
    with time_machine.travel(T + 2 * 86400, tick=False):  # two days after the 2023 log lines
        run = await ctx.runs.create("dflash", "U1")
        await ctx.redis.client.hset(
            keys.job_current(ctx.redis.prefix, "dflash"),
            mapping={"launched_at": repr(T - 3600), "state": "running"},
        )
        reply = await digest_command(ctx, "dflash")
    assert reply.title == "digest dflash: 550 tokens/s"
    assert reply.status is Status.WARNING  # the drafters are starved
    fields = dict(reply.fields)
    assert fields["uptime"] == "2 d 1 h"  # launched an hour before the log lines
    assert fields["restarts"] == f"1 ({run.id})"  # created after the window began
    assert fields["step time p50/p95"] == "0.120 s / 0.245 s; targets 0.060 s / 0.070 s"
    assert fields["queue depth"] == "mean 0.3, max 1"
    assert fields["loss"] == "2.500 last, 2.850 mean"
    assert fields["top-1/4/8"].startswith("37.5% / 62.5% / 87.5%")
    assert (
        fields["targets"]
        == digest_targets(3500.0, 5)
        == "3,500 tokens/s over 5 rank(s), not added to the pipeline's throughput"
        " (the drafters consume what the targets produce)"
    )
    assert digest_starved(1 / 3) in reply.lines
    assert digest_resets(1) in reply.lines
    ranks, gpus = reply.tables
    assert ranks.headers == ("rank", "role", "device", "tokens/s", "step p50")
    assert ranks.rows[5] == ("5", "drafter", "cuda:5", "200", "0.115 s")
    assert gpus.rows[0] == ("0", "target", "99%", "79,012 / 81,559 MiB", "n/a")
    assert gpus.rows[5] == ("5", "drafter", "n/a", "41,230 / 81,559 MiB", "n/a")
    assert reply.chart is not None
    chart = Path(reply.chart)
    assert chart.parent == tmp_path / "state" / "charts"
    assert chart.read_bytes().startswith(PNG) and chart.stat().st_size > 10_000
    assert "digest dflash: 550 tokens/s" in render_text(reply)


async def test_uptime_and_restarts_come_from_redis(
    gpu_host: LocalSSHHost, tmp_path: Path, make_ctx: object
) -> None:
    """Uptime is counted from job_current's launched_at; restarts are the runs created in the window."""
    ctx = make_ctx(_config(gpu_host, tmp_path, gpus=False))  # type: ignore[operator]
    log = tmp_path / "dflash.log"
    log.write_bytes(_drafter(T - 60, 5, 0) + _drafter(T, 5, 6000))
    with time_machine.travel(T, tick=False):
        run = await ctx.runs.create("dflash", "U1")
        await ctx.redis.client.hset(
            keys.job_current(ctx.redis.prefix, "dflash"),
            mapping={"launched_at": repr(T - 7500), "state": "running"},
        )
        d = await _digest(ctx, "dflash", scheduled=False, chart=False)
    assert d.uptime_s == 7500.0
    assert d.restarts == (run.id,)
    assert d.gpus is None and d.gpu_note is None  # no gpus configured: no table, no note
    await ctx.redis.client.hset(keys.job_current(ctx.redis.prefix, "dflash"), "state", "stopped")
    assert (await _digest(ctx, "dflash", scheduled=False, chart=False)).uptime_s is None


async def test_host_without_nvidia_smi_says_no_gpu_data(tmp_path: Path, make_ctx: object) -> None:
    """A CPU host (no nvidia-smi at all) gives a digest without a GPU table that says 'no GPU data'."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    host = await start_local_ssh_host(tmp_path / "ssh", env={"PATH": str(bin_dir)})
    try:
        ctx = make_ctx(_config(host, tmp_path))  # type: ignore[operator]
        (tmp_path / "dflash.log").write_bytes(COMPLETE)
        reply = await digest_command(ctx, "dflash")
    finally:
        await host.close()
    assert reply.title == "digest dflash: 550 tokens/s"
    assert len(reply.tables) == 1 and reply.tables[0].headers[0] == "rank"
    assert any(line.startswith("no GPU data:") and "nvidia-smi" in line for line in reply.lines)


async def test_missing_log_and_unknown_job_are_clear_errors(
    gpu_host: LocalSSHHost, tmp_path: Path, make_ctx: object
) -> None:
    """A missing metric log is an error reply naming it; an unknown job gets a did-you-mean."""
    ctx = make_ctx(_config(gpu_host, tmp_path))  # type: ignore[operator]
    reply = await digest_command(ctx, "dflash")
    assert reply.status is Status.ERROR and reply.exit_code != 0
    assert reply.title.startswith("digest dflash: could not be built") and "dflash.log" in reply.title
    unknown = await digest_command(ctx, "dflsh")
    assert unknown.ephemeral and unknown.title == unknown_name("job", "dflsh", ["dflash"])
    assert OffsetState.from_hash(await ctx.redis.open_store(DigestMemory).offset("dflash")) is None


async def test_digest_of_every_job_has_one_follow_up_each(
    gpu_host: LocalSSHHost, tmp_path: Path, make_ctx: object
) -> None:
    """`digest` without a job answers with a heading and one follow-up per job, failures included."""
    ctx = make_ctx(_config(gpu_host, tmp_path, gpus=False, jobs=("dflash", "other")))  # type: ignore[operator]
    (tmp_path / "dflash.log").write_bytes(COMPLETE)
    reply = await digest_command(ctx, None)
    assert reply.title == digest_all_title(2)
    first, second = reply.follow_ups
    assert first.title == "digest dflash: 550 tokens/s"
    assert second.status is Status.ERROR  # other.log does not exist
    assert reply.exit_code == second.exit_code != 0


async def test_scheduled_digest_command_stores_offset_and_draws_chart(
    gpu_host: LocalSSHHost, tmp_path: Path, make_ctx: object
) -> None:
    """scheduled=True stores the offset; an on-demand digest just after repeats that window with no made-up change."""
    ctx = make_ctx(_config(gpu_host, tmp_path, gpus=False))  # type: ignore[operator]
    (tmp_path / "dflash.log").write_bytes(COMPLETE)
    reply = await digest_command(ctx, "dflash", scheduled=True)
    assert reply.title == "digest dflash: 550 tokens/s"
    assert reply.chart is not None and Path(reply.chart).read_bytes().startswith(PNG)
    state = OffsetState.from_hash(await ctx.redis.open_store(DigestMemory).offset("dflash"))
    assert state is not None and (state.start, state.offset) == (0, len(COMPLETE))
    again = await digest_command(ctx, "dflash")
    assert again.title == "digest dflash: 550 tokens/s"  # no "(+0.0%)" against itself
    assert digest_window_note("repeat", str(tmp_path / "dflash.log"), 0) in again.lines


async def test_gpus_command_shows_na_and_maps_processes_to_jobs(
    gpu_host: LocalSSHHost, tmp_path: Path, make_ctx: object, nvidia_dir: Path
) -> None:
    """`gpus HOST` lists each GPU with n/a for unreported fields and the GPU processes with their job."""
    (nvidia_dir / "query-gpu.txt").write_bytes(
        (FIXTURES / "nvidia" / "h200_query_gpu_power_na.txt").read_bytes()
    )
    (nvidia_dir / "query-compute-apps.txt").write_text("4242, 81220\n4243, [N/A]\n")
    ctx = make_ctx(_config(gpu_host, tmp_path))  # type: ignore[operator]
    await ctx.redis.client.hset(
        keys.job_current(ctx.redis.prefix, "dflash"),
        mapping={"pid": "4242", "sid": "4242", "state": "running"},
    )
    reply = await gpus_command(ctx, "GPU1")
    assert reply.title == gpus_title("gpu1", 8)
    gpus = reply.tables[0]
    assert gpus.rows[0] == ("0", "NVIDIA H200", "97%", "81,234 / 143,771 MiB", "n/a")
    assert gpus.rows[7] == ("7", "NVIDIA H200", "0%", "0 / 143,771 MiB", "74 W")
    procs = reply.tables[-1]
    assert procs.rows == (("4242", "dflash", "81,220 MiB"), ("4243", "-", "n/a"))
    unknown = await gpus_command(ctx, "gpu2")
    assert unknown.ephemeral and unknown.title == unknown_name("host", "gpu2", ["gpu1"])


def _line(ts: float, rank: int, tokens: int) -> bytes:
    """A metric line of the eight-rank layout: targets 0..4, drafters 5..7."""
    if rank >= 5:
        return _drafter(ts, rank, tokens)
    rec = {"ts": ts, "step": 1, "role": "target", "rank": rank, "role_rank": rank, "device": f"cuda:{rank}"}
    rec.update(tokens=tokens, tokens_per_s=1.0, step_time_s=0.05, queue_depth=3)
    return (json.dumps(rec) + "\n").encode()


async def test_rank_silent_in_the_window_is_listed_with_when_it_was_last_seen(
    gpu_host: LocalSSHHost, tmp_path: Path, make_ctx: object, nvidia_dir: Path
) -> None:
    """A rank with no metric line in the window is a row `silent since HH:MM:SS UTC` and a warning, not a gap."""
    for with_gpus in (True, False):  # expected ranks from `gpus`, or from the ranks seen before
        ctx = make_ctx(_config(gpu_host, tmp_path / f"gpus-{with_gpus}", gpus=with_gpus))  # type: ignore[operator]
        p = ctx.redis.prefix
        await ctx.redis.client.delete(keys.digest_ranks(p, "dflash"), keys.digest_offset(p, "dflash"))
        log = Path(ctx.config.jobs["dflash"].log)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_bytes(b"".join(_line(T + dt, r, 100 * dt) for dt in (0, 10) for r in range(8)))
        first = await _digest(ctx, "dflash", scheduled=True, chart=False)
        assert first.silent == () and len(first.summary.ranks) == 8
        with log.open("ab") as f:  # rank 5 writes nothing more
            f.write(b"".join(_line(T + dt, r, 100 * dt) for dt in (20, 30) for r in range(8) if r != 5))
        second = await _digest(ctx, "dflash", scheduled=True, chart=False)
        assert [(s.rank, s.role, s.last_seen) for s in second.silent] == [(5, "drafter", T + 10)]
        reply = digest_reply(second)
        ranks = reply.tables[0]
        assert [row[0] for row in ranks.rows] == [str(r) for r in range(8)]
        clock = "22:13:30"  # T + 10 = 2023-11-14 22:13:30 UTC
        assert ranks.rows[5] == ("5", "drafter", "n/a", f"silent since {clock} UTC", "n/a")
        assert f"rank 5 (drafter) silent since {clock} UTC: no metric line in this window" in reply.lines
        assert reply.status is Status.WARNING


@pytest.mark.parametrize("size", [0, 5, 63, 64, 65, 66, 200])
async def test_first_window_in_one_read_matches_size_then_bytes(tmp_path: Path, size: int) -> None:
    """A first digest's one tail read (negative offset) gives the window the size-then-bytes reads gave."""
    path = tmp_path / "m.log"
    path.write_bytes(b"".join(b"line %03d\n" % i if i % 3 else b"x\n" for i in range(60))[:size])
    reads: list[tuple[int, int]] = []
    plain = local_reader(path)

    async def counted(offset: int, max_bytes: int) -> LogRead:
        reads.append((offset, max_bytes))
        return await plain(offset, max_bytes)

    window = await read_window(counted, None, scheduled=True, max_bytes=64)
    assert len(reads) == 1
    before = await _read_from(plain, 0, path.stat().st_size, 64, WindowKind.LAST_BYTES)
    assert (window.data, window.start, window.end, window.skipped) == (
        before.data,
        before.start,
        before.end,
        before.skipped,
    )
