"""Loss health: NaN and infinite losses, loss spikes against a rolling median (pure rules on an
injected timeline), the incidents and the stop policy they lead to, and, end to end, the reference
pipeline's own ``--nan-at-step`` and ``--loss-spike-at-step`` faults caught by the watcher."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
from pathlib import Path

import pytest

from handlers.request.auth import SYSTEM_USER
from handlers.watch.alerts import alert_reply, resolved_reply
from handlers.watch.cycle import Watcher
from pipeline.config import Config, HostConfig, MetricsPattern, WatchSettings
from pipeline.observe.loss import LossState, trouble
from pipeline.observe.metrics import parse_jsonl, parse_pattern
from pipeline.observe.progress import Judgement
from pipeline.observe.watch import ActionKind, Observation, Situation
from pipeline.state.events import EventKind
from pipeline.state.incidents import IncidentKind
from pipeline.verdict import Verdict
from tests.fixtures.dflash import DFLASH, SMALLEST, dflash_job
from tests.test_dflash import load_module
from tests.test_watch import T0, Harness, job_cfg, open_harness, run_cycles, until


def _line(step: int, loss: object, rank: int = 1, **extra: object) -> bytes:
    rec = {"step": step, "role": "drafter", "rank": rank, "loss": loss, **extra}
    return json.dumps(rec).encode() + b"\n"  # Python's json writes NaN and Infinity as such


def _state(watch: WatchSettings, losses: dict[int, object], rank: int = 1) -> LossState:
    data = b"".join(_line(step, loss, rank) for step, loss in losses.items())
    return LossState().ingest(parse_jsonl(data), watch)


# --- parsing ---------------------------------------------------------------------------------------


def test_nan_and_infinite_losses_are_kept_aside_never_read_as_numbers() -> None:
    """JSON NaN / Infinity / -Infinity and the strings "nan", "inf" give loss None and loss_not_finite;
    a line without role whose only loss is NaN still counts as a metric line."""
    data = b"".join(
        [
            _line(1, float("nan")),
            _line(2, float("inf")),
            _line(3, float("-inf")),
            _line(4, "nan"),
            _line(5, " -Infinity "),
            _line(6, 2.5),
            b'{"step": 7, "loss": NaN}\n',
        ]
    )
    got = [(m.step, m.loss, m.loss_not_finite, m.role) for m in parse_jsonl(data)]
    assert got == [
        (1, None, "NaN", "drafter"),
        (2, None, "Inf", "drafter"),
        (3, None, "-Inf", "drafter"),
        (4, None, "NaN", "drafter"),
        (5, None, "-Inf", "drafter"),
        (6, 2.5, None, "drafter"),
        (7, None, "NaN", "worker"),
    ]
    [m] = parse_pattern(
        b"step 9 loss nan\n", MetricsPattern(pattern=r"step (?P<step>\d+) loss (?P<loss>\S+)")
    )
    assert (m.step, m.loss, m.loss_not_finite) == (9, None, "NaN")


# --- the rules, on an injected timeline -----------------------------------------------------------


def test_a_nan_names_the_rank_and_its_first_step_until_a_finite_loss_returns() -> None:
    """Rank 2 goes NaN at step 40, rank 1 at 45: rank 2 since step 40 is named, rank 1 as another;
    a finite loss afterwards clears each rank."""
    w = WatchSettings()
    lines = [_line(s, 4.0, r) for s in (30, 35) for r in (1, 2)]
    lines += [_line(40, 4.0, 1), _line(40, float("nan"), 2), _line(45, float("inf"), 1), _line(45, "nan", 2)]
    state = LossState().ingest(parse_jsonl(b"".join(lines)), w)
    found = trouble(state, w)
    assert found is not None and found.kind is IncidentKind.LOSS_NAN
    assert (found.rank, found.role, found.since, found.step, found.value, found.others) == (
        2,
        "drafter",
        40,
        45,
        "NaN",
        (1,),
    )
    healed = state.ingest(parse_jsonl(_line(50, 3.9, 1) + _line(50, 3.8, 2)), w)
    assert trouble(healed, w) is None


def test_a_spike_counts_only_after_loss_spike_steps_above_3x_the_rolling_median() -> None:
    """Losses ~2 for steps 1-100, then 7 (> 3 × 2) from step 101: no incident at step 119 (19 steps),
    a loss_spike at step 120 (20 steps) naming step 101 and the median; 6.5 is under the bound."""
    w = WatchSettings()  # loss_spike 3, loss_window 200, loss_spike_steps 20
    base = {s: 2.0 + 0.01 * (s % 3) for s in range(1, 101)}
    state = _state(w, {**base, **{s: 7.0 for s in range(101, 120)}})
    assert trouble(state, w) is None
    state = state.ingest(parse_jsonl(_line(120, 7.0)), w)
    found = trouble(state, w)
    assert found is not None and found.kind is IncidentKind.LOSS_SPIKE
    assert (found.rank, found.since, found.step, found.value, found.median) == (1, 101, 120, "7", 2.01)
    under = _state(w, {**base, **{s: 6.0 for s in range(101, 140)}})
    assert trouble(under, w) is None
    # back under the bound for one line: the run starts again
    broken = _state(
        w, {**base, **{s: 7.0 for s in range(101, 115)}, 115: 2.0, **{s: 7.0 for s in range(116, 130)}}
    )
    assert trouble(broken, w) is None


def test_the_median_rolls_over_loss_window_steps_and_needs_a_baseline() -> None:
    """loss_window 50: losses of 10 long ago do not hold the median up once 50 steps of 1 passed,
    so 4 is a spike; fewer than 5 losses before a line judge nothing; steps logged every 10 count
    their span (step 60 to 80 is 21 steps)."""
    w = WatchSettings(loss_window=50, loss_spike_steps=21)
    losses: dict[int, object] = {s: 10.0 for s in range(1, 51)}
    losses |= {s: 1.0 for s in range(51, 101)}
    losses |= {s: 4.0 for s in range(101, 122)}
    found = trouble(_state(w, losses), w)
    assert found is not None and (found.since, found.median) == (101, 1.0)
    at_once = WatchSettings(loss_spike_steps=1)
    assert trouble(_state(at_once, {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 9.0}), at_once) is None
    found = trouble(_state(at_once, {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 9.0}), at_once)
    assert found is not None and found.since == 6
    every_10 = WatchSettings(loss_window=100, loss_spike_steps=21)
    sparse: dict[int, object] = {s: 1.0 for s in range(10, 60, 10)} | {60: 5.0, 70: 5.0}
    assert trouble(_state(every_10, sparse), every_10) is None
    found = trouble(_state(every_10, sparse | {80: 5.0}), every_10)
    assert found is not None and (found.since, found.step) == (60, 80)


# --- the incidents and the stop policy ---------------------------------------------------------------


def _obs(t: float, state: LossState, watch: WatchSettings, *, read: bool = True) -> Observation:
    judged = Judgement(known=True, frozen_for=0.0, loss=trouble(state, watch)) if read else None
    return Observation(at=T0 + t, count=3, pids=(100, 101, 102), log_size=int(t), progress=judged)


def test_loss_nan_opens_one_incident_stops_only_under_the_stop_policy_and_resolves_when_finite() -> None:
    """A NaN opens one loss_nan incident naming rank and first step; "stop" adds one STOP after the
    OPEN, "alert" none; an unread metric log keeps it open; a finite loss resolves it."""
    nan = _state(WatchSettings(), {30: 4.0, 35: 4.1, 40: float("nan")})
    healthy = nan.ingest(parse_jsonl(_line(45, 3.9)), WatchSettings())
    for policy, stops in (("stop", 1), ("alert", 0)):
        cfg = job_cfg(processes=3, on_loss_nan=policy, warmup=1)
        observed = [_obs(1, nan, cfg.watch), _obs(2, nan, cfg.watch), _obs(3, nan, cfg.watch, read=False)]
        decisions = run_cycles(cfg, [*observed, _obs(4, healthy, cfg.watch)], Situation(launched_at=T0 - 60))
        kinds = [a.kind for d in decisions for a in d.actions]
        assert kinds == [ActionKind.OPEN, *[ActionKind.STOP] * stops, ActionKind.RESOLVE], policy
        opened = decisions[0].actions[0].incident
        assert (opened.kind, opened.rank, opened.rank_role, opened.loss_step, opened.loss_value) == (
            IncidentKind.LOSS_NAN,
            1,
            "drafter",
            40,
            "NaN",
        )
        assert opened.cause == "loss NaN on rank 1 (drafter) since step 40 (last logged: step 40)"
        assert decisions[2].condition == IncidentKind.LOSS_NAN.value  # unread: still open


def test_a_loss_alert_says_nan_and_offers_the_rollback_and_its_resolution_says_healthy() -> None:
    """The headline says the loss is NaN on rank 1 since step 40; the rollback offer names
    `restart dflash from step 30`, or says no checkpoint was found; resolved: "healthy again"."""
    cfg = job_cfg(processes=3, warmup=1)
    d = run_cycles(cfg, [_obs(1, _state(cfg.watch, {35: 4.0, 40: "nan"}), cfg.watch)])[0]
    inc = d.actions[0].incident.model_copy(update={"job": "dflash", "n": 1, "rollback_step": 30})
    config = Config(hosts={"gpu1": HostConfig(address="127.0.0.1")}, jobs={"dflash": cfg})
    reply = alert_reply(inc, config, now=T0 + 1)
    assert reply.title == "dflash is training on garbage: its loss is NaN on rank 1 since step 40"
    assert (
        "`restart dflash from step 30` rolls back to checkpoint step 30, the newest before step 40"
        in reply.lines
    )
    none = alert_reply(inc.model_copy(update={"rollback_step": None}), config, now=T0 + 1)
    assert "no checkpoint of dflash from before step 40 was found to roll back to" in none.lines
    done = inc.model_copy(update={"resolved_at": T0 + 61, "resolution": "running"})
    assert (
        resolved_reply(done, now=T0 + 61).title == "resolved after 1 min: the loss of dflash is healthy again"
    )


def test_the_pipeline_fault_flags_are_checked() -> None:
    """--nan-at-step and --loss-spike-at-step plan as asked (+N after the resume); bad values are named."""
    faults = load_module(DFLASH / "faults.py", "dflash_faults")

    def plan(*argv: str, resume: int = 0) -> dict[str, object]:
        p = argparse.ArgumentParser()
        faults.add_arguments(p)
        return dict(faults.plan(p.parse_args(list(argv)), 3, resume))

    assert plan("--nan-at-step", "+5", resume=40)["nan"] == 45
    assert plan("--loss-spike-at-step", "60")["spike"] == (60, 10.0, None)
    spec = {"faults": plan("--loss-spike-at-step", "60", "--loss-spike-factor", "4", "--loss-spike-for", "2")}
    assert [faults.reported_loss(spec, s, 1.5) for s in (59, 60, 61, 62)] == [1.5, 6.0, 6.0, 1.5]
    with pytest.raises(SystemExit, match=r"--loss-spike-factor 0\.5: more than 1"):
        plan("--loss-spike-at-step", "60", "--loss-spike-factor", "0.5")
    with pytest.raises(SystemExit, match="go with --loss-spike-at-step"):
        plan("--loss-spike-for", "3")
    with pytest.raises(SystemExit, match="--nan-at-step 0: steps start at 1"):
        plan("--nan-at-step", "0")


# --- end to end: the reference pipeline's own faults, watched over SSH ----------------------------

#: the reference pipeline at its smallest (drafters are global ranks 1 and 2), a metric line every 5
#: steps, paced so that the watcher sees the trouble before the next checkpoint is written
PACED = [*SMALLEST, "--metric-every", "5"]


def _kill(run_sid: int | None) -> None:
    if run_sid is not None:
        with contextlib.suppress(OSError):
            os.killpg(run_sid, signal.SIGKILL)


async def _posted(h: Harness, prefix: str, kind: str = "thread") -> bool:
    return any(p.reply.title.startswith(prefix) for p in h.outbox.of(kind))


@pytest.mark.timeout(240)
async def test_nan_at_step_35_alerts_with_rank_step_and_rollback_and_the_stop_policy_stops_the_job(
    tmp_path: Path, redis_config: Config
) -> None:
    """--nan-at-step 35 (checkpoints every 30): one loss_nan alert saying the loss is NaN on rank 1
    since step 35 and offering `restart dflash from step 30`; on_loss_nan = "stop" stops the job as
    pitstop-auto (a stop run, recorded and announced, said in the thread); the incident then
    resolves as stopped on purpose."""
    args = [*PACED, "--checkpoint-every", "30", "--step-time", "0.3", "--nan-at-step", "35"]
    watch = WatchSettings(interval=0.5, stall_after=600, degraded_after=600, warmup=1, on_loss_nan="stop")
    job = dflash_job(
        tmp_path / "dflash", args, 3, watch=watch, channel="CDFLASH", resume_from=["--resume-step", "{step}"]
    )
    async with open_harness(tmp_path, redis_config, {"dflash": job}) as h:
        ctx, watcher, run = h.ctx, Watcher(h.ctx), None
        try:
            run = await h.launch("dflash")
            assert run.verdict is Verdict.RUNNING, run.verdict_line
            after = await ctx.events.last_id()
            assert await until(lambda: _posted(h, "stopping dflash"), 120, lambda: watcher.cycle("local"))
            [alert] = h.alerts()
            # drafter ranks 1 and 2 both go NaN at step 35: the alert names whichever the watcher read
            # first (the lowest when both were logged) and the others after "also", when they were logged
            title = re.fullmatch(
                r"dflash is training on garbage: its loss is NaN on rank ([12]) since step 35",
                alert.reply.title,
            )
            assert title is not None, alert.reply.title
            assert alert.channel == "CDFLASH"
            lines = "\n".join(alert.reply.lines)
            assert f"detected cause: loss NaN on rank {title[1]} (drafter) since step 35" in lines, lines
            rollback = (
                "`restart dflash from step 30` rolls back to checkpoint step 30, the newest before step 35"
            )
            assert rollback in alert.reply.lines
            event = await ctx.events.wait_for(EventKind.ALERT, "dflash", after=after, timeout=5)
            assert event is not None and event.data["alert"] == "loss_nan"
            [note] = [p for p in h.outbox.of("thread") if p.reply.title.startswith("stopping dflash")]
            assert note.key == alert.key and note.reply.run_id is not None
            assert note.reply.title.startswith(
                'stopping dflash: its loss is NaN (on_loss_nan = "stop"): queued run'
            )
            await watcher.drain(60)
            stop = await ctx.runs.get(note.reply.run_id)
            assert (stop.action, stop.requested_by) == ("stop", SYSTEM_USER)
            assert stop.finished_at is not None, stop
            announced = [p for p in h.outbox.posted if p.reply.run_id == stop.id and p.key != alert.key]
            assert announced, [(p.kind, p.key, p.reply.title) for p in h.outbox.posted]
            assert await until(lambda: _posted(h, "resolved after"), 30, lambda: watcher.cycle("local"))
            [resolved] = [p for p in h.outbox.of("thread") if p.reply.title.startswith("resolved after")]
            assert (
                resolved.reply.title.endswith("dflash was stopped on purpose") and resolved.key == alert.key
            )
            for _ in range(3):
                await watcher.cycle("local")
            assert len(h.alerts()) == 1
        finally:
            await watcher.drain(5)
            _kill(run.sid if run is not None else None)


@pytest.mark.timeout(240)
async def test_a_loss_spike_from_the_pipelines_own_flag_is_one_incident_resolved_when_it_ends(
    tmp_path: Path, redis_config: Config
) -> None:
    """--loss-spike-at-step 40 --loss-spike-factor 10 --loss-spike-for 30 (checkpoints every 35,
    loss_spike_steps 6): one loss_spike alert naming rank 1 since step 40 and `restart dflash from
    step 35`; the job keeps running (alert only); once the spike ends, one "healthy again"."""
    args = [*PACED, "--checkpoint-every", "35", "--step-time", "0.25"]
    args += ["--loss-spike-at-step", "40", "--loss-spike-factor", "10", "--loss-spike-for", "30"]
    watch = WatchSettings(interval=0.5, stall_after=600, degraded_after=600, warmup=1, loss_spike_steps=6)
    job = dflash_job(
        tmp_path / "dflash", args, 3, watch=watch, channel="CDFLASH", resume_from=["--resume-step", "{step}"]
    )
    async with open_harness(tmp_path, redis_config, {"dflash": job}) as h:
        ctx, watcher, run = h.ctx, Watcher(h.ctx), None
        try:
            run = await h.launch("dflash")
            assert run.verdict is Verdict.RUNNING, run.verdict_line
            assert await until(
                lambda: _posted(h, "dflash's loss spiked", "announce"), 120, lambda: watcher.cycle("local")
            )
            [alert] = h.alerts()
            assert alert.reply.title.startswith("dflash's loss spiked: "), alert.reply.title
            assert alert.reply.title.endswith(" on rank 1 since step 40")
            lines = "\n".join(alert.reply.lines)
            assert "above 3 × its median" in lines and "over 200 steps since step 40" in lines, lines
            rollback = (
                "`restart dflash from step 35` rolls back to checkpoint step 35, the newest before step 40"
            )
            assert rollback in alert.reply.lines
            assert await until(lambda: _posted(h, "resolved after"), 120, lambda: watcher.cycle("local"))
            [resolved] = [p for p in h.outbox.of("thread") if p.reply.title.startswith("resolved after")]
            assert (
                resolved.reply.title.endswith("the loss of dflash is healthy again")
                and resolved.key == alert.key
            )
            assert len(h.alerts()) == 1
            assert [r.id for r in await ctx.runs.recent("dflash")] == [run.id]  # alert only: no stop
        finally:
            await watcher.drain(5)
            _kill(run.sid if run is not None else None)
