"""No-progress loops: automatic restarts stop when the last attempts keep dying where they resumed; a
person's restart is warned, never blocked."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from bot.runtime.scheduler import PitstopScheduler
from handlers.request.dispatch import Dispatcher, Request
from handlers.views.read import attempts_command
from pipeline.config import AutoRestart, Config, WatchSettings
from pipeline.config.jobs import CrashClass
from pipeline.observe.attempts import crash_words, progressed, reach_of
from pipeline.observe.crashes import Crash
from pipeline.observe.metrics import MetricLine
from pipeline.runs.attempts import auto_restart_no_progress
from pipeline.state.events import EventKind
from pipeline.state.runs import Reach, RunRecord
from tests.fixtures.dflash import SMALLEST, dflash_job
from tests.test_attempts import _verified
from tests.test_scheduler import _events
from tests.test_watch import MENTION, open_harness

#: the reference pipeline at its smallest: the tiny profile, 1 target + 2 DDP drafters (global ranks
#: 0, 1, 2), a checkpoint every 20 drafter steps; drafter rank 2 fails in step 41 with the pipeline's
#: own fault (the NCCL watchdog's lines, then SIGABRT), so every attempt after the first resumes at
#: step 40 and dies there
CRASHING = [*SMALLEST, "--metric-every", "5", "--checkpoint-every", "20"]
CRASHING += ["--crash-rank", "2", "--crash-at-step", "41", "--crash", "nccl_timeout"]


def _attempt(n: int, resumed: int, ended: str) -> RunRecord:
    reach = Reach(steps={"drafter": resumed}, role="drafter", step=resumed, ended=ended)
    return RunRecord(
        id=f"r-{n}", job="dflash", requested_by="u", created_at=float(n), resumed_at=resumed, reach=reach
    )


def test_the_alert_names_the_step_and_the_common_cause() -> None:
    """'every attempt died at step 1,210: CUDA out of memory on rank 6'."""
    oom = crash_words(Crash(CrashClass.CUDA_OOM, rank=6))
    assert oom == "CUDA out of memory on rank 6"
    assert crash_words(Crash(CrashClass.PYTHON_EXCEPTION, exc_type="ValueError", message="loss is nan")) == (
        "ValueError: loss is nan"
    )
    text = auto_restart_no_progress("dflash", [_attempt(n, 1210, oom) for n in (9, 8, 7)], 1)
    assert text.startswith("dflash: automatic restarts stopped - the last 3 attempts (r-7, r-8, r-9) died")
    assert "every attempt died at step 1,210: CUDA out of memory on rank 6" in text
    # a peer's watchdog may fire first: the same cause on another rank is still the one cause
    nccl = [_attempt(n, 40, f"NCCL timeout on rank {r} (exit code 1)") for n, r in ((4, 1), (3, 2), (2, 2))]
    assert "every attempt died at step 40: NCCL timeout on ranks 1, 2." in auto_restart_no_progress(
        "dflash", nccl, 1
    )
    mixed = [_attempt(2, 40, "NCCL timeout on rank 1"), _attempt(3, 40, "CUDA out of memory on rank 1")]
    assert "every attempt died at step 40." in auto_restart_no_progress("dflash", mixed, 1)


def test_an_attempt_dying_before_its_resumed_role_logged_made_no_progress() -> None:
    """Resumed at 40, died in step 41: only its targets (counting afresh) logged; in the role the
    attempt before it was compared in, its step is unknown and it did not advance."""
    lines = [MetricLine(ts=100.0 + s, role="target", rank=0, step=s) for s in range(1, 11)]
    assert reach_of(lines, window_s=60).step == 10  # the targets' own count, not the pipeline's
    reach = reach_of(lines, window_s=60, role="drafter", ended="NCCL timeout on rank 2")
    assert (reach.role, reach.step, reach.steps_per_s) == ("drafter", None, None)
    run = RunRecord(id="r-2", job="dflash", requested_by="u", created_at=2.0, resumed_at=40, reach=reach)
    assert progressed(run, 1) is False
    assert "every attempt died at step 40: NCCL timeout on rank 2" in auto_restart_no_progress(
        "dflash", [run], 1
    )


@pytest.mark.timeout(300)
async def test_three_attempts_dying_where_they_resumed_stop_automatic_restarts(
    tmp_path: Path, redis_config: Config
) -> None:
    """The reference pipeline crashing at the same step under auto_restart: the first attempt progressed
    (0 → 40); the next three die at step 40 where they resumed → one give-up alert naming step 40 and
    the NCCL timeout, no fourth automatic restart; ``history --attempts`` shows the four; a person's
    restart is queued with a warning, not refused."""
    watch = WatchSettings(
        interval=0.5, stall_after=600, degraded_after=600, no_progress_after=3,
        auto_restart=AutoRestart(max=6, within=600, backoff=0.2),
    )  # fmt: skip
    job = dflash_job(tmp_path / "dflash", CRASHING, 3, watch=watch, channel="CDFLASH")
    async with open_harness(tmp_path, redis_config, {"dflash": job}) as h:
        ctx = h.ctx
        sched = PitstopScheduler(ctx, leader_ttl=2.0, poll_interval=0.2)
        await sched.start()
        try:
            after = await ctx.events.last_id()
            run = await h.launch("dflash", verify=False)
            await _verified(ctx, run)  # RUNNING: the job is expected to be up
            restarts = await _events(h, EventKind.RESTART, "dflash", after, count=3, timeout=200)
            # each attempt is verified RUNNING before it dies, so each death is an incident of its own
            assert len(restarts) == 3 and all(e.data["auto"] and e.data["run_id"] for e in restarts)
            posts: list[str] = []
            seen, deadline = restarts[-1].id, time.monotonic() + 120
            while not posts and time.monotonic() < deadline:  # the fourth death, then the give-up
                alerts = await _events(h, EventKind.ALERT, "dflash", seen, count=1, timeout=2.0)
                seen = alerts[-1].id if alerts else seen
                posts = [p.reply.title for p in h.thread(f"{MENTION} dflash: automatic restarts stopped")]
            dbg = [(a.id, a.resumed_at, a.reach) for a in await ctx.runs.attempts("dflash", 8)]
            assert len(posts) == 1, ([p.reply.title for p in h.outbox.of("thread")], dbg)
            assert "the last 3 attempts" in posts[0] and "died before advancing 1 step past" in posts[0]
            assert "every attempt died at step 40: NCCL timeout" in posts[0], (posts[0], dbg)
            more = await _events(h, EventKind.RESTART, "dflash", restarts[-1].id, count=1, timeout=2.0)
            assert more == []
            attempts = await ctx.runs.attempts("dflash", 5)
            assert [a.resumed_at for a in attempts] == [40, 40, 40, 0]
            assert [a.reach.step if a.reach else None for a in attempts][3] == 40
            warning = await ctx.service.no_progress_warning("dflash")
            assert warning is not None and warning.startswith(
                "⚠ the last 3 attempts of dflash made no progress"
            )
            table = await attempts_command(ctx, "dflash", 5)
            [rows] = [t.rows for t in table.tables]
            assert [r[2] for r in rows] == ["40", "40", "40", "0"]  # resumed at
            assert rows[3][3] == "40" and all(r[5].startswith("NCCL timeout") for r in rows), rows
            d = Dispatcher(ctx, lock_ttl=5)
            answer = await d.handle(Request("restart dflash", "U0TEST"))
            assert answer.exit_code == 0 and answer.title.startswith("queued run r-"), answer.title
            assert any(line.startswith("⚠ the last 3 attempts of dflash") for line in answer.lines)
            await d.drain(60)
        finally:
            await sched.stop()
            for attempt in await ctx.runs.attempts("dflash", 10):
                if attempt.sid is not None:
                    with contextlib.suppress(OSError):
                        os.killpg(attempt.sid, signal.SIGKILL)
