"""Per-rank progress: the pure rules (stuck rank, frozen job, threshold, warm-up) and, end to end, a
hung rank of the real reference pipeline named in one stuck-rank alert."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from bot.runtime.assembly import build_context, close_context
from devhost.sshhost import start_local_ssh_host
from handlers.outbox import MemoryOutbox
from handlers.watch.cycle import Watcher
from pipeline.config import AuthSettings, Config, JobConfig, SlackSettings, WatchSettings
from pipeline.observe.progress import ProgressState, judge, rank_stall_threshold
from pipeline.observe.watch import ActionKind, Observation, Situation, assess
from pipeline.state.incidents import IncidentKind, WatchState
from tests.fixtures.ssh import BIN
from tests.test_watch import T0, job_cfg, run_cycles

DFLASH = Path(__file__).resolve().parents[1] / "pipeline" / "dflash"


def lines(*records: dict[str, object]) -> bytes:
    """JSON lines."""
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def metric(rank: int, step: int, role: str = "drafter", **extra: object) -> dict[str, object]:
    """A metric record of ``rank`` at ``step``."""
    return {"step": step, "role": role, "rank": rank, "tokens_per_s": 10.0, **extra}


def feed(cfg: JobConfig, steps_at: list[tuple[float, bytes]]) -> ProgressState:
    """Ingest each chunk at its time (s after T0)."""
    state = ProgressState()
    for t, data in steps_at:
        state = state.ingest(data, cfg, T0 + t)
    return state


def test_a_rank_that_stops_while_others_advance_is_stuck_only_after_the_threshold() -> None:
    """Rank 6 stops at step 40 while 5 and 7 go on: stuck once 10 s passed, not before; named with its pid."""
    cfg = job_cfg()
    chunks = [(0.0, lines(*(metric(r, 35, pid=100 + r) for r in (5, 6, 7))))]
    chunks.append((1.0, lines(*(metric(r, 40) for r in (5, 6, 7)))))
    chunks += [(1.0 + t, lines(metric(5, 40 + 5 * int(t)), metric(7, 40 + 5 * int(t)))) for t in range(1, 12)]
    state = feed(cfg, chunks)
    assert judge(state, T0 + 10.5, threshold=10.0).stuck == ()
    found = judge(state, T0 + 11.5, threshold=10.0)
    assert [(s.rank, s.role, s.step, s.pid) for s in found.stuck] == [(6, "drafter", 40, 106)]
    assert found.stuck[0].stuck_for == pytest.approx(10.5)


def test_ranks_waiting_on_a_silent_rank_point_at_it_and_all_frozen_is_not_stuck() -> None:
    """Nobody advances: with 5 and 7 reporting waiting, rank 6 is the stuck one; without reports, none is."""
    cfg = job_cfg()
    base = [(0.0, lines(*(metric(r, 40) for r in (5, 6, 7))))]
    silent = feed(cfg, base)
    frozen = judge(silent, T0 + 30, threshold=10.0)
    assert frozen.stuck == () and frozen.frozen_for == pytest.approx(30.0) and frozen.known
    waits = [  # rank 7's line as the previous version wrote it: the role named rank_role
        {"event": "waiting", "rank": 5, "role": "drafter", "step": 40, "on": "all_reduce"},
        {"event": "waiting", "rank": 7, "rank_role": "drafter", "step": 40, "on": "all_reduce"},
        {"event": "waiting", "rank": 4, "role": "target", "step": 9, "on": "queue"},
    ]
    waiting = feed(cfg, [*base, (3.0, lines(*waits))])
    found = judge(waiting, T0 + 30, threshold=10.0)
    assert [s.rank for s in found.stuck] == [6] and found.waiting == (4, 5, 7)
    assert (waiting.ranks["4"].role, waiting.ranks["4"].step) == ("target", 9)  # known by its wait line only
    assert not judge(ProgressState(), T0, 10.0).known


def test_default_threshold_is_60_s_or_20_times_the_p95_gap() -> None:
    """rank_stall_after unset: max(60 s, 20 × p95 of the seconds between advances); set: as set."""
    cfg = job_cfg()
    assert rank_stall_threshold(cfg, []) == 60.0
    assert rank_stall_threshold(cfg, [1.0] * 50) == 60.0
    assert rank_stall_threshold(cfg, [5.0] * 50) == pytest.approx(100.0)
    assert rank_stall_threshold(job_cfg(rank_stall_after=7), [5.0] * 50) == 7.0
    state = feed(cfg, [(float(t), lines(metric(0, t))) for t in range(5)])
    assert state.gaps == [1.0, 1.0, 1.0, 1.0]


def _stuck_obs(t: float, state: ProgressState, count: int = 8) -> Observation:
    return Observation(
        at=T0 + t, count=count, pids=tuple(range(100, 100 + count)), log_size=int(t) + 1,
        progress=judge(state, T0 + t, 10.0),
    )  # fmt: skip


def test_stuck_rank_incident_names_rank_role_step_and_pid_but_not_during_warmup_or_a_restart() -> None:
    """One stuck_rank incident naming rank 6; none while a restart is in flight or in the warm-up."""
    cfg = job_cfg(processes=8, warmup=30)
    chunks = [(0.0, lines(*(metric(r, 40, pid=100 + r) for r in (5, 6, 7))))]
    chunks += [(float(t), lines(metric(5, 40 + t), metric(7, 40 + t))) for t in range(1, 40)]
    state = feed(cfg, chunks)
    obs = [_stuck_obs(t, state) for t in (12.0, 13.0, 14.0)]
    decisions = run_cycles(cfg, obs, Situation(launched_at=T0 - 60))
    opened = [a.incident for d in decisions for a in d.actions if a.kind is ActionKind.OPEN]
    assert len(opened) == 1 and opened[0].kind is IncidentKind.STUCK_RANK
    inc = opened[0]
    assert (inc.rank, inc.rank_role, inc.rank_step, inc.rank_pid) == (6, "drafter", 40, 106)
    assert inc.cause is not None and inc.cause.startswith(
        "rank 6 (drafter) stuck at step 40 for 12 s, pid 106"
    )
    assert all(not d.actions for d in run_cycles(cfg, obs, Situation(launched_at=T0 - 5)))  # warming up
    assert all(not d.actions for d in run_cycles(cfg, obs, Situation(in_flight=True)))


def test_stalled_is_decided_on_steps_while_the_log_keeps_growing() -> None:
    """Every rank frozen for stall_after with a growing log (wait reports, warnings) is stalled."""
    cfg = job_cfg(processes=3, stall_after=20)
    state = feed(cfg, [(0.0, lines(*(metric(r, 40) for r in (5, 6, 7))))])
    d = assess("job", cfg, _stuck_obs(25.0, state, 3), WatchState(progress_at=T0 + 24.0), None, Situation())
    assert d.condition == IncidentKind.STALLED.value
    d = assess("job", cfg, _stuck_obs(15.0, state, 3), WatchState(progress_at=T0), None, Situation())
    assert d.condition == "ok"  # 15 s without a step < stall_after, however quiet the log


# --- end to end: the reference pipeline, hung, watched over SSH -----------------------------------


@pytest.mark.timeout(420)
async def test_hung_rank_6_of_the_reference_pipeline_is_one_stuck_rank_alert(
    tmp_path: Path, redis_config: Config
) -> None:
    """--hang-rank 6 --hang-at-step 40: one stuck-rank alert naming rank 6, within threshold + 2 intervals."""
    venv_bin = Path(sys.executable).parent  # py-spy (installed with the train extra) lives beside it
    assert shutil.which("py-spy", path=str(venv_bin)), "py-spy missing: pip install -e '.[train]'"
    host = await start_local_ssh_host(tmp_path / "sshhost", path_prepend=[BIN, venv_bin])
    workdir = tmp_path / "dflash"
    shutil.copytree(DFLASH, workdir, ignore=shutil.ignore_patterns("__pycache__"))
    log, ckpt = workdir / "train.log", workdir / "ckpt"
    launch = ["/usr/bin/env", f"PYTHON={sys.executable}", "./run.sh", "--cpu", "--profile", "tiny"]
    launch += ["--log", str(log), "--checkpoint-dir", str(ckpt), "--metric-every", "5"]
    launch += ["--hang-rank", "6", "--hang-at-step", "40"]
    interval, threshold = 1.0, 8.0
    job = JobConfig(
        host="local", workdir=str(workdir), launch=launch, log=str(log), match="^dflash-worker ",
        processes=8, start_window=3, stop_timeout=3, checkpoint_dir=str(ckpt),
        watch=WatchSettings(interval=interval, rank_stall_after=threshold, warmup=1, stall_after=600),
    )  # fmt: skip
    config = redis_config.model_copy(
        update={
            "hosts": {"local": host.host_config(connect_timeout=5)},
            "jobs": {"dflash": job},
            "slack": SlackSettings(alert_mention="S0ONCALL", announce_channel="CANNOUNCE"),
            "auth": AuthSettings(operators=["U0TEST"], viewers=["*"]),
        }
    )
    outbox = MemoryOutbox()
    ctx = await build_context(config, outbox, instance="A")
    watcher = Watcher(ctx)
    run = None
    try:
        run = await ctx.restarter.start(await ctx.runs.create("dflash", "U0TEST", action="start"))
        assert run.pid is not None, run.verdict_line
        await ctx.restarter.verify(run)
        stuck_since: float | None = None
        deadline = time.monotonic() + 300
        alert_at = None
        while time.monotonic() < deadline and alert_at is None:
            started = time.monotonic()
            decisions = await watcher.cycle("local")
            state = ProgressState.model_validate_json(
                await ctx.redis.client.get(f"{ctx.redis.prefix}progress:dflash") or "{}"
            )
            r6 = state.ranks.get("6")
            if stuck_since is None and r6 is not None and r6.step == 40:
                stuck_since = r6.advanced_at
            if decisions["dflash"].condition == IncidentKind.STUCK_RANK.value:
                alert_at = time.time()
            await _sleep_rest(started, interval)
        assert alert_at is not None and stuck_since is not None, log.read_text()[-3000:]
        assert alert_at - stuck_since <= threshold + 2 * interval + 1.0  # + one cycle's own duration
        for _ in range(3):
            await watcher.cycle("local")
        alerts = [p for p in outbox.of("announce") if p.key and p.key.startswith("incident:")]
        assert len({p.key for p in alerts}) == 1
        first = alerts[0].reply
        assert first.title.startswith("dflash has a stuck rank")
        text = "\n".join(first.lines)
        assert "rank 6 (drafter) stuck at step 40" in text and "pid " in text, text
        evidence = [
            p.reply for p in outbox.of("thread") if p.reply.title.startswith("hang evidence for rank 6")
        ]
        assert len(evidence) == 1, [p.reply.title for p in outbox.of("thread")]
        assert (
            evidence[0].lines[0].startswith("pid ") and "dflash-worker drafter rank 6" in evidence[0].lines[0]
        )
        assert evidence[0].log is not None and "hang_if_due" in evidence[0].log, evidence[0]
    finally:
        await watcher.drain(5)
        if run is not None and run.sid is not None:
            with contextlib.suppress(OSError):
                os.killpg(run.sid, signal.SIGKILL)  # the hung rank ignores SIGTERM
        await close_context(ctx)
        await host.close()


async def _sleep_rest(started: float, interval: float) -> None:
    """Pace the loop at one watch interval, as the scheduler does."""
    await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))


def test_hang_reply_says_a_d_state_rank_needs_the_host_recycled_and_how_to_get_py_spy() -> None:
    """State D: 'a restart will not free rank 6; the host may need recycling'; no py-spy: the install line."""
    from handlers.watch.evidence import hang_reply
    from pipeline.state.incidents import Incident

    inc = Incident(
        n=2, job="dflash", host="gpu1", kind=IncidentKind.STUCK_RANK, opened_at=T0, notified_at=T0, rank=6
    )
    proc = {"pid": 4301, "cmdline": "dflash-worker drafter rank 6", "state": "D", "wchan": "nv_wait"}
    reply = hang_reply(inc, {"processes": [proc], "py_spy": None})
    assert (
        reply.title == "hang evidence for rank 6: 1 process on the host"
        and reply.thread_key == "incident:dflash:2"
    )
    assert (
        reply.lines[0]
        == "pid 4301 `dflash-worker drafter rank 6`: state D (uninterruptible sleep), wchan nv_wait"
    )
    assert "py-spy is not installed on gpu1, so no Python stacks: `pip install py-spy` there" in reply.lines
    assert "a restart will not free rank 6; the host may need recycling" in reply.lines[-1]
    spied = hang_reply(
        inc, {"processes": [{**proc, "state": "S", "stack": "Thread 1\n  hang"}], "py_spy": "/x"}
    )
    assert spied.log == "py-spy dump --pid 4301\nThread 1\n  hang" and len(spied.lines) == 1
