"""Attempts: work lost at a restart, throughput recovered or not — the pure rules, and end to end on the
reference pipeline (SIGKILL mid-run → the lost steps exactly; a slowed restart → the slower alert)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.runtime.assembly import build_context, close_context
from devhost.sshhost import start_local_ssh_host
from handlers.context import Context
from handlers.outbox import MemoryOutbox
from handlers.reply import Reply
from handlers.runs.view import followup_reply
from pipeline.config import AuthSettings, Config, JobConfig, SlackSettings, WatchSettings
from pipeline.config.jobs import LostDuration
from pipeline.errors import IllegalTransition
from pipeline.host.probe import read_log_chunk
from pipeline.observe.attempts import (
    account_previous,
    checkpoint_interval,
    compared_role,
    lost_warning,
    lost_work,
    median_throughput,
    metrics_offset,
    no_progress_streak,
    over_max_lost,
    reach_of,
    record_dead,
    recovery,
    resumed_role,
)
from pipeline.observe.metrics import MetricLine
from pipeline.observe.resume import ResumePoint
from pipeline.state.runs import RECOVERY_LEASE, Reach, RunRecord
from pipeline.verdict import Lost, Verdict, VerdictLine, format_line, parse_line
from tests.fixtures.dflash import SMALLEST
from tests.fixtures.ssh import BIN, GIT_ENV
from tests.test_watch import job_config, open_harness

DFLASH = Path(__file__).resolve().parents[1] / "pipeline" / "dflash"


async def deliver_recoveries(ctx: Context, *, now: float) -> list[Reply]:
    """The follow-ups the run service made at ``now``, as posted (:func:`followup_reply`)."""
    return [followup_reply(e) for e in await ctx.service.followups_due(now=now)]


def line(role: str, rank: int, step: int, ts: float, tps: float | None = 100.0) -> MetricLine:
    """One metric line."""
    return MetricLine(ts=ts, role=role, rank=rank, step=step, tokens_per_s=tps)


# --- the verdict line's clause -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lost", "expected"),
    [
        (
            Lost(1004, 533, "drafter", 250.0, "00:32:01 UTC"),
            "RUNNING 8/8 processes pid 4242, resumed at step 471; the previous run reached drafter step 1,004 "
            "— 533 drafter steps (about 4 min of training) lost since the checkpoint of 00:32:01 UTC",
        ),
        (
            Lost(471, 0, "drafter"),
            "RUNNING 8/8 processes pid 4242, resumed at step 471; the previous run reached drafter step 471 "
            "— 0 drafter steps lost",
        ),
        (
            Lost(481, 10, "drafter", 0.4),  # under a second of training: no "(about 0 s …)"
            "RUNNING 8/8 processes pid 4242, resumed at step 471; the previous run reached drafter step 481 "
            "— 10 drafter steps lost",
        ),
        (
            Lost(472, 1, None, 2.0),
            "RUNNING 8/8 processes pid 4242, resumed at step 471; the previous run reached step 472 "
            "— 1 step (about 2 s of training) lost",
        ),
    ],
)
def test_the_lost_clause_is_written_and_read_back(lost: Lost, expected: str) -> None:
    """'N steps … lost' (a role word between, 0 said too) reads back to the same facts and line."""
    built = format_line(lost.on(VerdictLine(Verdict.RUNNING, 8, 8, 4242, resumed_at=471)))
    assert built == expected
    parsed = parse_line(built)
    assert (parsed.resumed_at, parsed.reached, parsed.lost, parsed.lost_role) == (
        471,
        lost.reached,
        lost.steps,
        lost.role,
    )
    assert format_line(parsed) == built


@given(
    resumed=st.integers(1, 10**9),
    reached=st.integers(0, 10**9),
    lost=st.integers(0, 10**9),
    role=st.none() | st.sampled_from(["drafter", "worker", "policy_net"]),
    seconds=st.none() | st.floats(0, 1e7),
    at=st.none() | st.sampled_from(["00:32:01 UTC", "2026-12-01 23:59:59 CET"]),
)
def test_lost_clauses_round_trip_for_any_numbers(
    resumed: int, reached: int, lost: int, role: str | None, seconds: float | None, at: str | None
) -> None:
    """Any steps, role word, training time and checkpoint time survive a write and a read."""
    built = format_line(
        Lost(reached, lost, role, seconds, at).on(
            VerdictLine(Verdict.RUNNING, 8, 8, 4242, resumed_at=resumed)
        )
    )
    parsed = parse_line(built)
    assert (parsed.reached, parsed.lost, parsed.lost_role, parsed.checkpoint_at) == (reached, lost, role, at)
    assert format_line(parsed) == built


# --- the pure rules ----------------------------------------------------------------------------------


def test_the_compared_role_is_the_one_that_resumed() -> None:
    """Drafters resume from the checkpoint (first step 471), targets count from 1: drafters are compared."""
    assert compared_role({"target": 1, "drafter": 472}, {"target": 900, "drafter": 600}) == "drafter"
    assert compared_role({"target": 1, "drafter": 1}, {"target": 50, "drafter": 30}) == "drafter"
    assert compared_role({"worker": 1}, {"worker": 7}) == "worker"
    assert compared_role({}, {}) is None


def test_a_role_counting_afresh_is_not_taken_for_the_one_that_resumed() -> None:
    """Resumed at 471 but only the targets (counting from 1) have logged yet: the previous attempt's
    own lines decide (drafter 1,004 reached, 533 lost), not the targets' 533."""
    assert resumed_role({"target": 1}, {"target": 19}, 471) is None
    assert resumed_role({"target": 1, "drafter": 472}, {"target": 9, "drafter": 480}, 471) == "drafter"
    assert resumed_role({"drafter": 472}, {"drafter": 480}, None) is None
    prev = [line("drafter", 5, s, 1000.0 + s) for s in range(472, 1005)]
    prev += [line("target", 0, s - 471, 1000.0 + s) for s in range(472, 1005)]
    reach = reach_of(prev, window_s=300.0, role=resumed_role({"target": 1}, {"target": 19}, 471))
    lost = lost_work(reach, 471)
    assert lost is not None and (lost.role, lost.reached, lost.steps) == ("drafter", 1004, 533)


def test_reach_and_lost_work_from_the_previous_runs_lines() -> None:
    """Reached = the compared role's highest step; lost = reached - resumed, its time at the run's steps/s."""
    lines = [line("target", 0, s, 1000.0 + s) for s in range(1, 50)]
    lines += [line("drafter", 5, s, 1000.0 + (s - 100) / 2) for s in range(101, 301)]  # 2 steps/s
    reach = reach_of(lines, window_s=60.0)
    assert (reach.role, reach.step, reach.steps) == ("drafter", 300, {"target": 49, "drafter": 300})
    assert reach.steps_per_s == pytest.approx(2.0)
    ckpt = ResumePoint("/c/latest.json", 240, age_s=100.0)
    lost = lost_work(reach, 240, checkpoint=ckpt, sampled_at=1_796_000_000.0)
    assert lost is not None
    assert (lost.reached, lost.steps, lost.role, lost.seconds) == (300, 60, "drafter", pytest.approx(30.0))
    assert lost.checkpoint_at is not None and lost.checkpoint_at.endswith("UTC")
    assert lost_work(reach, 300) == Lost(300, 0, "drafter", 0.0, None)  # stopped at its checkpoint
    # its SIGTERM checkpoint (step 304) came after its last metric line (300): it reached 304
    assert lost_work(reach, 304) == Lost(304, 0, "drafter", 0.0, None)
    assert lost_work(reach, 0) == Lost(300, 300, "drafter", pytest.approx(150.0), None)  # started over
    assert lost_work(Reach(), 10) is None


def test_a_restart_from_scratch_says_what_it_lost() -> None:
    """A restart that started from step 0 after a run that reached step 45 lost all 45, and says so."""
    built = format_line(Lost(45, 45, "drafter", 30.0).on(VerdictLine(Verdict.RUNNING, 8, 8, 4242)))
    assert built == (
        "RUNNING 8/8 processes pid 4242, started from step 0; the previous run reached drafter step 45 "
        "— 45 drafter steps (about 30 s of training) lost"
    )
    parsed = parse_line(built)
    assert (parsed.resumed_at, parsed.reached, parsed.lost) == (None, 45, 45)
    assert format_line(parsed) == built
    assert format_line(VerdictLine(Verdict.RUNNING, 8, 8, 4242)) == "RUNNING 8/8 processes pid 4242"


def test_median_throughput_sums_non_target_ranks_and_skips_each_ranks_first_line() -> None:
    """Per drafter the median of its rates (the start-up line left out), summed; targets not added in."""
    lines = [line("drafter", 5, 1, 0.0, 1.0), line("drafter", 6, 1, 0.0, 1.0), line("target", 0, 1, 0.0, 9e9)]
    lines += [line("drafter", 5, s, float(s), 100.0 + s) for s in range(2, 5)]  # 102, 103, 104
    lines += [line("drafter", 6, s, float(s), 50.0) for s in range(2, 5)]
    assert median_throughput(lines) == pytest.approx(103.0 + 50.0)
    assert median_throughput(lines, since=4.0) == pytest.approx(104.0 + 50.0)
    assert median_throughput([line("drafter", 5, 1, 0.0)]) is None


def test_recovery_compares_with_the_threshold() -> None:
    """Under slow_after_restart × before is slow; either side unknown compares nothing."""
    slow = recovery(2516.0, 5905.0, 0.8)
    assert slow is not None and slow.slow and round(slow.ratio * 100) == 43
    back = recovery(5905.0, 5950.0, 0.8)
    assert back is not None and not back.slow
    assert recovery(None, 5905.0, 0.8) is None and recovery(10.0, None, 0.8) is None


def test_max_lost_in_steps_or_time_and_the_interval_it_suggests() -> None:
    """Over max_lost (steps, or training time) → the warning names the checkpoint interval that keeps under."""
    lost = Lost(1004, 533, "drafter", 250.0)
    assert over_max_lost(lost, 500) and not over_max_lost(lost, 600) and not over_max_lost(lost, None)
    assert over_max_lost(lost, LostDuration(seconds=120)) and not over_max_lost(
        lost, LostDuration(seconds=300)
    )
    assert checkpoint_interval(500, 2.0) == 500
    assert checkpoint_interval(LostDuration(seconds=120), 2.0) == 240
    assert checkpoint_interval(LostDuration(seconds=120), None) is None
    text = lost_warning("dflash", lost, LostDuration(seconds=120), 2.0)
    assert text.startswith("⚠ dflash lost 533 drafter steps (about 4 min of training) at this restart")
    assert "more than max_lost (2 min of training)" in text and "checkpointing every 240 steps" in text


def _attempt(n: int, resumed: int, reached: int | None) -> RunRecord:
    reach = Reach(steps={"drafter": reached}, role="drafter", step=reached) if reached is not None else None
    return RunRecord(
        id=f"r-{n}", job="j", requested_by="u", created_at=float(n), resumed_at=resumed, reach=reach
    )


def test_no_progress_streak_counts_consecutive_attempts_newest_first() -> None:
    """Attempts that died before advancing min_progress past their resume step, in a row, newest first."""
    attempts = [
        _attempt(5, 1210, 1210),
        _attempt(4, 1210, 1210),
        _attempt(3, 1200, 1210),
        _attempt(2, 0, 1200),
    ]
    assert [r.id for r in no_progress_streak(attempts, 1)] == ["r-5", "r-4"]
    assert [r.id for r in no_progress_streak(attempts, 20)] == ["r-5", "r-4", "r-3"]
    assert no_progress_streak([_attempt(6, 1210, None), *attempts], 1) == []  # unknown ends the row
    silent = _attempt(7, 1210, None).model_copy(update={"reach": Reach()})  # said 1210, logged no step
    assert [r.id for r in no_progress_streak([silent, *attempts], 1)] == ["r-7", "r-5", "r-4"]
    fresh = _attempt(8, 0, None).model_copy(update={"reach": Reach()})  # a log without steps: unknown
    assert no_progress_streak([fresh, *attempts], 1) == []


def test_the_slow_fault_is_planned_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """--slow-after-step +N counts from the resume step; --slow-rank is optional; a factor under 1, a
    rank out of range or a factor without its step is refused before anything starts; --step-time
    holds a step to its seconds."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("dflash_faults_slow", DFLASH / "faults.py")
    assert spec is not None and spec.loader is not None
    faults = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(faults)
    parser = argparse.ArgumentParser()
    faults.add_arguments(parser)
    plan = faults.plan(parser.parse_args(["--slow-after-step", "+5", "--slow-factor", "6"]), 8, 100)
    assert plan["slow"] == (None, 105, 6.0)
    args = parser.parse_args(["--slow-rank", "6", "--slow-after-step", "40", "--slow-factor", "2"])
    assert faults.plan(args, 8)["slow"] == (6, 40, 2.0)
    assert "slow" not in faults.plan(parser.parse_args([]), 8)
    for argv, said in [
        (["--slow-factor", "2"], "--slow-after-step and --slow-factor go together"),
        (["--slow-after-step", "3", "--slow-factor", "0.5"], "1 or more"),
        (
            ["--slow-rank", "9", "--slow-after-step", "3", "--slow-factor", "2"],
            "--slow-rank 9: ranks are 0..7",
        ),
    ]:
        with pytest.raises(SystemExit, match=said):
            faults.plan(parser.parse_args(argv), 8)
    slept: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    slowed = {"rank": 6, "faults": {"slow": (6, 40, 3.0)}}
    faults.slow_if_due(slowed, 40, time.monotonic() - 0.05)  # its step 40: not yet slowed
    faults.slow_if_due({**slowed, "rank": 5}, 41, time.monotonic() - 0.05)  # another rank
    assert slept == []
    faults.slow_if_due(slowed, 41, time.monotonic() - 0.05)  # a 0.05 s step now takes 3 × as long
    assert len(slept) == 1 and slept[0] >= 0.1
    assert faults.plan(parser.parse_args(["--step-time", "0.4"]), 8)["pace"] == 0.4
    with pytest.raises(SystemExit, match=r"--step-time 0\.0: seconds per step, more than 0"):
        faults.plan(parser.parse_args(["--step-time", "0"]), 8)
    slept.clear()
    faults.pace({"faults": {"pace": 0.4}}, time.monotonic() - 0.1)  # a 0.1 s step is held to 0.4 s
    assert len(slept) == 1 and 0.25 < slept[0] <= 0.3
    faults.pace({"faults": {"pace": 0.4}}, time.monotonic() - 1.0)  # a longer one is not made up for
    faults.pace({"faults": {}}, time.monotonic())
    assert slept[1:] == [0.0]


async def test_attempts_of_a_job_with_a_metrics_log_are_read_there(
    tmp_path: Path, redis_config: Config
) -> None:
    """A job whose metric lines have a ``metrics_log`` of their own (real SSH, real processes): each
    launch notes that file's size, and a dead attempt's reach, the previous attempt's reach and what
    resuming lost of it are read from it, between the launches — not from the job's log, and not
    from lines written before."""
    root = tmp_path / "jobs"
    metrics = root / "m" / "metrics.jsonl"
    base = job_config(root, "m", uuid.uuid4().hex)
    job = base.model_copy(update={"metrics_log": str(metrics)})
    metrics.write_text(_metric_lines("drafter", range(500, 503)))  # an older run's
    async with open_harness(tmp_path, redis_config, {"m": job}) as h:
        ctx, sids = h.ctx, list[int]()
        try:
            first = await h.launch("m", verify=False)
            sids.append(first.sid or 0)
            assert (await ctx.runs.get(first.id)).metrics_size_at_launch == metrics.stat().st_size
            with metrics.open("a") as f:
                f.write(_metric_lines("drafter", range(1, 41)) + _metric_lines("target", range(1, 81)))
            await h.kill("m")
            dead = await record_dead(
                partial(read_log_chunk, ctx.ssh), ctx.runs, "m", job, first, ended="killed"
            )
            assert dead is not None and dead.reach is not None
            assert (dead.reach.role, dead.reach.step, dead.reach.ended) == ("drafter", 40, "killed")
            await _until_gone(sids[0])
            size = metrics.stat().st_size
            second = await h.launch("m", verify=False)
            sids.append(second.sid or 0)
            second = await ctx.runs.get(second.id)
            assert second.metrics_size_at_launch == size
            with metrics.open("a") as f:
                f.write(_metric_lines("drafter", range(31, 36)) + _metric_lines("target", range(1, 11)))
            previous = await account_previous(
                partial(read_log_chunk, ctx.ssh), ctx.runs, "m", job, second, resumed_at=30, checkpoint=None,
                sampled_at=time.time(), timezone="UTC",
            )  # fmt: skip
            assert previous is not None and previous.run.id == first.id
            assert previous.run.reach is not None and previous.run.reach.step == 40
            assert previous.lost is not None and (previous.lost.reached, previous.lost.steps) == (40, 10)
            assert previous.lost.role == "drafter"
            assert (
                await metrics_offset(partial(read_log_chunk, ctx.ssh), "m", base) is None
            )  # metric lines in the log: its offset
            gone = job.model_copy(update={"metrics_log": str(root / "m" / "not-yet.jsonl")})
            assert (
                await metrics_offset(partial(read_log_chunk, ctx.ssh), "m", gone) == 0
            )  # not written yet: all of it is new
        finally:
            for sid in filter(None, sids):
                with contextlib.suppress(OSError):
                    os.killpg(sid, signal.SIGKILL)


#: a drafter rank logging one step every 0.1 s at a steady throughput
STEADY = """\
import json, time
step = 0
while True:
    step += 1
    print(json.dumps({"ts": time.time(), "step": step, "role": "drafter", "rank": 5, "tokens_per_s": 900.0}), flush=True)
    time.sleep(0.1)
"""


class _DiesPosting(MemoryOutbox):
    """A replica that dies between claiming a follow-up and posting it (its thread post raises)."""

    async def thread(self, key: str, reply: Reply, channel: str | None) -> None:
        raise RuntimeError("the process died before posting")


async def test_a_follow_up_whose_claimant_died_is_posted_once_by_another_replica(
    tmp_path: Path, redis_config: Config
) -> None:
    """A restart's throughput follow-up (real process, real SSH, real Redis): one replica claims it
    and dies before posting → no one posts it during the lease, another replica posts it once after;
    a claim taken and never completed likewise; a posted one is never delivered again, and two
    replicas looking at once post it once."""
    async with open_harness(tmp_path, redis_config, {"train": {"start_window": 1.0}}) as h:
        ctx = h.ctx
        other_box = MemoryOutbox()
        dying, other = await h.context("dying", _DiesPosting()), await h.context("B", other_box)
        (h.root / "train" / "worker.py").write_text(STEADY)
        await h.launch("train")
        second = await ctx.restarter.restart(await ctx.runs.create("train", "U0TEST"))
        second = await ctx.restarter.verify(second)
        assert second.verdict is Verdict.RUNNING, second.evidence
        t = time.time() + h.config.jobs["train"].watch.recovery_window + 1
        assert await ctx.runs.due_recoveries(t) == [second.id]  # queued at the verdict
        with pytest.raises(RuntimeError, match="died before posting"):
            await deliver_recoveries(dying, now=t)
        assert await deliver_recoveries(other, now=t + RECOVERY_LEASE - 1) == []  # still leased
        assert await ctx.runs.claim_recovery(second.id, now=t + RECOVERY_LEASE + 1) is not None  # never done
        assert await deliver_recoveries(other, now=t + RECOVERY_LEASE + 2) == []
        t += 2 * RECOVERY_LEASE + 2
        back, none = await asyncio.gather(deliver_recoveries(other, now=t), deliver_recoveries(ctx, now=t))
        assert [r.title for r in back + none] == [(back + none)[0].title]
        assert (back + none)[0].title.startswith("throughput back: "), back + none
        posts = [
            p
            for box in (other_box, h.outbox)
            for p in box.of("thread")
            if p.reply.title.startswith("throughput")
        ]
        assert len(posts) == 1 and posts[0].key == f"run:{second.id}"
        for later in (t + 1, t + 10 * RECOVERY_LEASE):
            assert (
                await deliver_recoveries(other, now=later) == []
                and await ctx.runs.due_recoveries(later) == []
            )
        assert (await ctx.runs.get(second.id)).recovery == posts[0].reply.title


def _metric_lines(role: str, steps: range) -> str:
    """One JSON metric line per step, a second apart, as the reference pipeline writes them."""
    rank = 0 if role == "target" else 5
    return "".join(
        json.dumps({"ts": 1_796_000_000.0 + s, "step": s, "role": role, "rank": rank, "tokens_per_s": 100.0})
        + "\n"
        for s in steps
    )


# --- end to end: the reference pipeline on CPU -------------------------------------------------------


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(["git", *args], cwd=cwd, check=True, env=env, capture_output=True, text=True)
    return done.stdout


def _drafter_steps(log: Path, start: int = 0) -> list[int]:
    """Every drafter step logged from byte ``start`` (the truth the verdict must match)."""
    steps = []
    for raw in log.read_bytes()[start:].splitlines():
        if raw.startswith(b"{") and b'"drafter"' in raw and b'"event"' not in raw:
            with contextlib.suppress(ValueError):
                rec = json.loads(raw)
                if rec.get("role") == "drafter" and isinstance(rec.get("step"), int):
                    steps.append(rec["step"])
    return steps


async def _until_steps(log: Path, start: int, at_least: int, timeout: float = 180.0) -> None:
    """Wait (bounded) until the log holds ``at_least`` drafter lines from byte ``start``."""
    deadline = time.monotonic() + timeout
    while len(_drafter_steps(log, start)) < at_least:
        assert time.monotonic() < deadline, f"only {len(_drafter_steps(log, start))} drafter lines"
        await asyncio.sleep(0.2)


async def _until_between_checkpoints(log: Path, past: int, every: int, timeout: float = 180.0) -> None:
    """Wait (bounded) until the newest drafter step is beyond ``past`` and 3 to 7 steps after a
    checkpoint (``every`` steps): a SIGKILL then loses steps, whichever moment it lands (one that
    landed just after a checkpoint lost none, and the test read that as a failure)."""
    deadline = time.monotonic() + timeout
    while True:
        steps = _drafter_steps(log)
        newest = max(steps, default=0)
        if newest > past and 3 <= newest % every <= 7:
            return
        assert time.monotonic() < deadline, f"newest drafter step {newest}"
        await asyncio.sleep(0.05)


async def _until_gone(sid: int, timeout: float = 30.0) -> None:
    """Wait (bounded) until no process of group ``sid`` is left (every line it wrote is written)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(sid, 0)
        except ProcessLookupError:
            return
        await asyncio.sleep(0.1)


async def _verified(ctx: Context, run: RunRecord, timeout: float = 150.0) -> RunRecord:
    """Verify ``run`` until RUNNING (bounded): eight workers need a while to start on a busy 2-core
    machine, longer than a start window worth waiting in every test (verification is re-runnable)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            run = await ctx.restarter.verify(run)
        except IllegalTransition:  # a running scheduler verified it first: its verdict stands
            run = await ctx.runs.get(run.id)
        if run.verdict is Verdict.RUNNING or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.5)
        run = await ctx.runs.get(run.id)
    assert run.verdict is Verdict.RUNNING, run.evidence
    return run


@pytest.mark.timeout(600)
async def test_sigkill_then_restart_states_the_lost_steps_and_a_slowed_restart_alerts(
    tmp_path: Path, redis_config: Config
) -> None:
    """SIGKILL mid-run → the restart's verdict says exactly the steps lost (the log's and latest.json's
    numbers) and, healthy, 'throughput back'; a restart with a slowing patch → '0 drafter steps lost'
    (SIGTERM checkpoints) and the 'slower since' alert at the follow-up, in its thread and the channel."""
    host = await start_local_ssh_host(tmp_path / "sshhost", path_prepend=[BIN])
    workdir = tmp_path / "dflash"
    shutil.copytree(DFLASH, workdir, ignore=shutil.ignore_patterns("__pycache__"))
    _git(workdir, "init", "-q")
    _git(workdir, "add", "-A")
    _git(workdir, "commit", "-qm", "dflash")
    run_sh = workdir / "run.sh"
    text = run_sh.read_text()
    run_sh.write_text(text.replace('"$@"', '"$@" --slow-after-step +5 --slow-factor 6'))
    slow_diff = tmp_path / "slow.diff"
    slow_diff.write_text(_git(workdir, "diff"))
    run_sh.write_text(text)
    log, ckpt = workdir / "train.log", workdir / "ckpt"
    launch = ["/usr/bin/env", f"PYTHON={sys.executable}", "./run.sh", *SMALLEST]
    launch += ["--log", str(log), "--checkpoint-dir", str(ckpt), "--metric-every", "1"]
    launch += ["--checkpoint-every", "10"]
    job = JobConfig(
        host="local", workdir=str(workdir), launch=launch, log=str(log), match="^dflash-worker ",
        processes=3, start_window=3, stop_timeout=20, checkpoint_dir=str(ckpt), patches={"slow": slow_diff},
        max_lost=1,
        watch=WatchSettings(recovery_window=5, slow_after_restart=0.5), channel="CDFLASH",
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
    sids: list[int] = []
    try:
        first = await ctx.restarter.start(await ctx.runs.create("dflash", "U0TEST", action="start"))
        assert first.sid is not None, first.verdict_line
        sids.append(first.sid)
        first = await _verified(ctx, first)
        await _until_between_checkpoints(log, past=30, every=10)
        os.killpg(first.sid, signal.SIGKILL)  # mid-run: the kernel's OOM killer, a kill -9
        await _until_gone(first.sid)
        reached = max(_drafter_steps(log))
        resumed = json.loads((ckpt / "latest.json").read_text())["step"]
        assert resumed % 10 == 0 and reached > resumed

        second = await ctx.runs.create("dflash", "U0TEST")
        second = await ctx.restarter.restart(second)
        assert second.sid is not None, second.verdict_line
        sids.append(second.sid)
        second = await _verified(ctx, second)
        facts = parse_line(second.verdict_line or "")
        assert (facts.resumed_at, facts.reached, facts.lost, facts.lost_role) == (
            resumed,
            reached,
            reached - resumed,
            "drafter",
        ), second.verdict_line
        # the training time is said from a second up ("about 0 s" is never written)
        took = " (about " if (second.lost_s or 0) >= 1 else " lost"
        assert f"{reached - resumed:,} drafter steps{took}" in (second.verdict_line or "")
        assert (second.previous_run, second.lost) == (first.id, reached - resumed)
        took = " (about " if (second.lost_s or 0) >= 1 else " at this restart"
        assert second.warning is not None and second.warning.startswith(
            f"⚠ dflash lost {reached - resumed:,} drafter steps{took}"
        ), second.warning  # over max_lost = 1 step
        assert "more than max_lost (1 step): checkpointing every 1 step, about " in second.warning
        prev = await ctx.runs.get(first.id)
        assert prev.reach is not None and prev.reach.step == reached and prev.reach.tokens_per_s
        assert prev.reach.ended is not None and prev.reach.ended.startswith(f"had ended when {second.id}")

        await _until_steps(log, second.log_size_at_launch or 0, 2 * 40)  # 2 drafters × 40 steps
        assert second.id in await ctx.runs.due_recoveries(time.time() + 60)  # queued at the verdict
        [back] = await deliver_recoveries(ctx, now=time.time() + 60)
        assert back.title.startswith("throughput back: ") and back.title.endswith(" of before"), back.title
        assert back.thread_key == f"run:{second.id}"

        third = await ctx.runs.create("dflash", "U0TEST")
        third = await ctx.restarter.restart(third, add=["slow"])
        assert third.sid is not None, third.verdict_line
        sids.append(third.sid)
        third = await _verified(ctx, third)
        assert "— 0 drafter steps lost since the checkpoint of " in (third.verdict_line or ""), (
            third.verdict_line
        )
        assert third.warning is None  # 0 lost: within max_lost
        await _until_steps(log, third.log_size_at_launch or 0, 2 * 30)
        [slow] = await deliver_recoveries(ctx, now=time.time() + 60)
        assert slow.title.startswith(f"dflash is slower since {third.id}: "), slow.title
        assert slow.title.endswith(" before (patches now: slow)") and slow.status.value == "warning"
        posted = [p for p in outbox.of("post") if p.reply.title == slow.title]
        assert len(posted) == 1 and posted[0].reply.page == "S0ONCALL" and posted[0].channel == "CDFLASH"
        assert (await ctx.runs.get(third.id)).recovery == slow.title
        assert await deliver_recoveries(ctx, now=time.time() + 60) == []  # posted once
    finally:
        for sid in sids:
            with contextlib.suppress(OSError):
                os.killpg(sid, signal.SIGKILL)
        await close_context(ctx)
        await host.close()
