"""No-progress loops: automatic restarts stop when the last attempts keep dying where they resumed; a
person's restart is warned, never blocked."""

from __future__ import annotations

from pathlib import Path

from bot.scheduler import PitstopScheduler
from handlers.attempts import attempts_command, auto_restart_no_progress, no_progress_warning
from handlers.dispatch import Dispatcher, Request
from pipeline.config import AutoRestart, Config
from pipeline.observe.attempts import crash_words
from pipeline.observe.crashes import Crash, CrashClass
from pipeline.state.events import EventKind
from pipeline.state.runs import Reach, RunRecord
from pipeline.verdict import Verdict
from tests.test_scheduler import _events
from tests.test_watch import MENTION, open_harness

DFLASH = Path(__file__).resolve().parents[1] / "pipeline" / "dflash"

#: resumes from its own latest.json as the reference pipeline does (``resume_step=N``, drafter steps
#: from N+1, a checkpoint every 10 steps), and fails in step 21 with the reference pipeline's own
#: fault (``faults.crash_if_due``: the NCCL watchdog's lines, then SIGABRT) — so every attempt after
#: the first dies where it resumed, at step 20
RESUMER = f"""\
import json, os, sys, time
sys.path.insert(0, {str(DFLASH)!r})
import faults
here = os.path.dirname(os.path.abspath(__file__))
latest = os.path.join(here, "latest.json")
resume = json.load(open(latest))["step"] if os.path.exists(latest) else 0
print("dflash-main pid %d resume_step=%d" % (os.getpid(), resume), flush=True)

class Log:
    def line(self, text): print(text, flush=True)
    def metric(self, rec): print(json.dumps(rec), flush=True)
    def same_file_as(self, fd): return True

spec = {{"rank": 6, "role": "drafter", "role_rank": 1, "device": "cpu",
        "faults": {{"crash": [6, 21, "nccl_timeout"]}}}}
step = resume
while True:
    step += 1
    faults.crash_if_due(spec, Log(), step)
    print(json.dumps({{"ts": time.time(), "step": step, "role": "drafter", "rank": 6, "tokens_per_s": 9.0}}), flush=True)
    if step % 10 == 0:
        json.dump({{"step": step}}, open(latest, "w"))
    time.sleep(0.15)
"""


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


async def test_three_attempts_dying_where_they_resumed_stop_automatic_restarts(
    tmp_path: Path, redis_config: Config
) -> None:
    """A crash at the same step under auto_restart: the first attempt progressed (0 → 20); the next three
    die at step 20 where they resumed → one give-up alert naming step 20 and the NCCL timeout, no fourth
    automatic restart; ``history --attempts`` shows the four; a person's restart is queued with a
    warning, not refused."""
    policy = AutoRestart(max=6, within=600, backoff=0.2)
    job = {"start_window": 1.0, "auto_restart": policy, "no_progress_after": 3}
    async with open_harness(tmp_path, redis_config, {"dflash": job}) as h:
        (h.root / "dflash" / "worker.py").write_text(RESUMER)
        ctx = h.ctx
        sched = PitstopScheduler(ctx, leader_ttl=2.0, poll_interval=0.2)
        await sched.start()
        try:
            after = await ctx.events.last_id()
            run = await h.launch("dflash")  # verified RUNNING: the job is expected to be up
            assert run.verdict is Verdict.RUNNING, run.evidence
            restarts = await _events(h, EventKind.RESTART, "dflash", after, count=3, timeout=90)
            assert [e.data["attempt"] for e in restarts] == [1, 2, 3]
            posts: list[str] = []
            for _ in range(120):
                posts = [p.reply.title for p in h.thread(f"{MENTION} dflash: automatic restarts stopped")]
                if posts:
                    break
                await _events(h, EventKind.ALERT, "dflash", restarts[-1].id, count=1, timeout=0.5)
            assert len(posts) == 1, [p.reply.title for p in h.outbox.of("thread")]
            assert "the last 3 attempts" in posts[0] and "died before advancing 1 step past" in posts[0]
            assert "every attempt died at step 20: NCCL timeout" in posts[0], posts[0]
            more = await _events(h, EventKind.RESTART, "dflash", restarts[-1].id, count=1, timeout=2.0)
            assert more == []
            attempts = await ctx.runs.attempts("dflash", 5)
            assert [a.resumed_at for a in attempts] == [20, 20, 20, 0]
            assert [a.reach.step if a.reach else None for a in attempts][3] == 20
            warning = await no_progress_warning(ctx, "dflash")
            assert warning is not None and warning.startswith(
                "⚠ the last 3 attempts of dflash made no progress"
            )
            table = await attempts_command(ctx, "dflash", 5)
            [rows] = [t.rows for t in table.tables]
            assert [r[2] for r in rows] == ["20", "20", "20", "0"]  # resumed at
            assert rows[3][3] == "20" and all(r[5].startswith("NCCL timeout") for r in rows), rows
            d = Dispatcher(ctx, lock_ttl=5)
            answer = await d.handle(Request("restart dflash", "U0TEST"))
            assert answer.exit_code == 0 and answer.title.startswith("queued run r-"), answer.title
            assert any(line.startswith("⚠ the last 3 attempts of dflash") for line in answer.lines)
            await d.drain(30)
        finally:
            await sched.stop()
