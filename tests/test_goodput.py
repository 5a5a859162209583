"""Issue 37 part 5: goodput — productive time over a window's time, the rest lost by cause — checked
against timelines the tests set (fixed times, a frozen clock): the pure function with exact figures,
the incidents the store keeps once resolved, and ``/metrics`` and ``history --attempts`` over the
served stack."""

from __future__ import annotations

import pytest
import time_machine
from prometheus_client.parser import text_string_to_metric_families

from bot.runtime.serve import FRESH
from handlers.text import incident_resolved
from handlers.views.read import attempts_command
from pipeline.config import JobConfig
from pipeline.digest.goodput import (
    Attempt,
    Cause,
    Lost,
    Timeline,
    goodput,
    goodput_line,
    gpu_count,
    incident_cost,
    timeline_of,
)
from pipeline.observe.metrics import MetricLine
from pipeline.state.incidents import Incident, IncidentKind, IncidentSpan, IncidentStore
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import Reach, RunRecord, StepRecord
from pipeline.verdict import Outcome, Step, Verdict
from tests.test_slack_http import MakeStack, make_stack  # noqa: F401 (a fixture)

T = 1_700_000_000.0


def _span(kind: str, opened: float, resolved: float | None) -> IncidentSpan:
    return IncidentSpan(
        n=1, kind=kind, opened_at=T + opened, resolved_at=None if resolved is None else T + resolved
    )


def test_a_restart_queue_stall_and_redone_work_add_up_exactly() -> None:
    """r-1 steps from +100 s to +3600 s; r-2 queues 600 s and steps from +4500 s with 300 s to redo; a
    dead incident inside the restart counts as the restart, a stall after it as a stall, idle GPUs as nothing."""
    line = Timeline(
        attempts=(
            Attempt("r-1", T - 10, T, first_at=T + 100, last_at=T + 3600),
            Attempt("r-2", T + 3700, T + 3720, running_at=T + 4320, first_at=T + 4500, lost_s=300),
        ),
        incidents=(_span("dead", 3630, 4500), _span("stalled", 6000, 6720), _span("idle_gpus", 7000, 8000)),
        gpus=8,
    )
    g = goodput(line, T, T + 10_000)
    assert g.total_s == 10_000
    assert g.productive_s == 10_000 - 100 - 600 - 300 - 720 - 300 == 7980
    assert g.ratio == pytest.approx(0.798)
    assert g.lost == (
        Lost(Cause.STALL, 720),
        Lost(Cause.PENDING, 600, "r-2"),
        Lost(Cause.RESTART, 300, "r-2"),
        Lost(Cause.REDONE, 300, "r-2"),
        Lost(Cause.RESTART, 100, "r-1"),
    )
    assert g.by_cause() == {
        Cause.PENDING: 600,
        Cause.RESTART: 400,
        Cause.STALL: 720,
        Cause.LOSS: 0,
        Cause.REDONE: 300,
    }
    assert g.gpu_hours(g.lost_s) == pytest.approx(2020 * 8 / 3600)
    assert goodput_line(g, "over 24 h") == (
        "goodput 80 % over 24 h: 4.5 GPU-h lost — 12 min stalled, 10 min queued (r-2), "
        "5 min to r-2's restart, 5 min redone after r-2's resume, 1 min to r-1's restart"
    )


def test_stopped_time_is_not_the_jobs_and_loss_incidents_count_by_name() -> None:
    """A stop on purpose takes its time out of the total; the restart after it runs from r-1's last step
    to r-2's first; an open loss_nan incident (a kind counted by name) runs to the window's end."""
    line = Timeline(
        attempts=(
            Attempt("r-1", T - 10, T, first_at=T, last_at=T + 990),
            Attempt("r-3", T + 4990, T + 5000, first_at=T + 5100),
        ),
        stops=(T + 1000,),
        incidents=(_span("loss_nan", 5800, None),),
    )
    g = goodput(line, T, T + 6000)
    assert g.total_s == 6000 - 4000  # stopped from +1000 s to r-3's launch at +5000 s
    assert g.lost == (Lost(Cause.LOSS, 200), Lost(Cause.RESTART, 110, "r-3"))
    assert g.productive_s == 2000 - 310
    assert g.gpu_hours(60) is None
    assert goodput_line(g) == (
        "goodput 84 % over 1 h 40 min: 5 min lost — 3 min of loss trouble, 1 min to r-3's restart"
    )


def test_a_run_still_queued_or_starting_loses_time_to_the_windows_end() -> None:
    """A run queued now (PENDING) is pending to the end; one that stepped never since its launch is a
    restart to the end; a window before the first launch is no time of the job's."""
    queued = Timeline(
        attempts=(
            Attempt("r-1", T, T, first_at=T + 10, last_at=T + 100),
            Attempt("r-2", T + 100, T + 200, queued=True),
        )
    )
    g = goodput(queued, T, T + 1000)
    assert g.lost == (
        Lost(Cause.PENDING, 800, "r-2"),
        Lost(Cause.RESTART, 100, "r-2"),  # from r-1's last step to r-2's launch
        Lost(Cause.RESTART, 10, "r-1"),  # its start-up
    )
    assert g.productive_s == 90
    before = goodput(queued, T - 500, T)
    assert (before.total_s, before.ratio, goodput_line(before)) == (0, None, None)
    with pytest.raises(ValueError, match="ends"):
        goodput(queued, T, T - 1)


def test_gpu_count_from_gpus_or_the_slurm_allocation() -> None:
    """``gpus`` roles count first; else ``--gpus``/``-G`` as asked, ``--gpus-per-node``/``--gres`` × nodes."""
    base = {"host": "h", "workdir": "/w", "launch": ["x"], "match": "x", "log": "/l"}
    assert gpu_count(JobConfig.model_validate({**base, "gpus": {"target": [0, 1], "drafter": [2]}})) == 3
    assert gpu_count(JobConfig.model_validate(base)) is None
    for args, nodes, count in (
        (["--partition", "gpu", "--gpus=8"], 2, 8),
        (["-G", "4"], 1, 4),
        (["--gpus-per-node", "4"], 2, 8),
        (["--gres=gpu:a100:2"], 3, 6),
        (["--partition", "gpus"], 1, None),
    ):
        slurm = {"script": "/s.sbatch", "sbatch_args": args, "nodes": nodes}
        assert gpu_count(JobConfig.model_validate({**base, "engine": "slurm", "slurm": slurm})) == count


def test_timeline_from_run_records_and_metric_lines() -> None:
    """A run's first step is its reach's, else the window's first line after its launch, else when a
    RUNNING verdict was decided; a stop run is a stop; an open incident is open to the end."""
    old = RunRecord(
        id="r-1",
        job="j",
        requested_by="U",
        created_at=T,
        launched_at=T + 1,
        reach=Reach(first_at=T + 5, last_at=T + 50),
    )
    stop = RunRecord(
        id="r-2", job="j", action="stop", requested_by="U", created_at=T + 60, finished_at=T + 61
    )
    verified = StepRecord(step=Step.VERIFY, started_at=T + 101, ended_at=T + 130, outcome=Outcome.OK)
    new = RunRecord(
        id="r-3",
        job="j",
        action="start",
        requested_by="U",
        created_at=T + 100,
        launched_at=T + 101,
        verdict=Verdict.RUNNING,
        steps=[verified],
    )
    opened = Incident(job="j", host="h", kind=IncidentKind.STALLED, opened_at=T + 150, notified_at=T + 150)
    line = timeline_of([new, stop, old], [opened], gpus=None)
    assert [(a.run_id, a.first_at, a.last_at) for a in line.attempts] == [
        ("r-1", T + 5, T + 50),
        ("r-3", T + 130, None),
    ]
    assert line.stops == (T + 60,)
    assert line.incidents == (IncidentSpan(n=0, kind="stalled", opened_at=T + 150),)
    ts = MetricLine(rank=0, role="drafter", ts=T + 120, step=7)
    assert timeline_of([new], [], gpus=None, lines=[ts]).attempts[0].first_at == T + 120
    g = goodput(line, T, T + 200)  # r-3's restart: r-1's last step to the stop, r-3's launch to its verdict
    assert g.lost == (Lost(Cause.STALL, 50), Lost(Cause.RESTART, 39, "r-3"), Lost(Cause.RESTART, 4, "r-1"))
    assert g.total_s == 200 - 1 - 41  # before r-1's launch, and stopped from +60 s to r-3's launch


def test_a_resolved_incident_says_what_it_cost() -> None:
    """A stall open 15 min on 4 GPUs cost 1.0 GPU-h; idle GPUs, or no GPU count, say no cost."""
    inc = Incident(
        job="j", host="h", kind=IncidentKind.STALLED, opened_at=T, notified_at=T, count=1, expected=1
    )
    assert incident_cost("stalled", 900, 4) == "cost 1.0 GPU-h"
    assert incident_cost("idle_gpus", 900, 4) is None
    assert (
        incident_resolved(inc, 900, 4)
        == "resolved after 15 min: j is running again (1/1 processes) - cost 1.0 GPU-h"
    )
    assert incident_resolved(inc, 900) == "resolved after 15 min: j is running again (1/1 processes)"


async def test_the_store_keeps_resolved_incidents_for_goodput(redis_handle: RedisHandle) -> None:
    """Closing an incident keeps its span, resolved at the time given; history reads those since a time."""
    store = redis_handle.open_store(IncidentStore)
    for kind, opened, resolved in ((IncidentKind.DEAD, 0, 100), (IncidentKind.STALLED, 200, 500)):
        inc = await store.open(Incident(job="J", host="h", kind=kind, opened_at=T + opened, notified_at=T))
        assert inc is not None and await store.close(inc, at=T + resolved)
    assert await store.incident("J") is None
    assert await store.history("J", since=T + 100) == [
        IncidentSpan(n=1, kind="dead", opened_at=T, resolved_at=T + 100),
        IncidentSpan(n=2, kind="stalled", opened_at=T + 200, resolved_at=T + 500),
    ]
    assert await store.history("J", since=T + 101) == [await store.history("J", since=T + 500)][0]


async def test_metrics_and_history_show_goodput_over_the_day(make_stack: MakeStack) -> None:  # noqa: F811
    """Over the day before a frozen clock, r-a steps for 10 h, r-b's restart takes 10 min and redoes
    5 min, a stall takes 30 min: /metrics says 96.875 % and GPU-hours by cause; history --attempts says it."""
    stack = await make_stack(gpus={"target": [0, 1], "drafter": [2, 3]})
    ctx, job = stack.runtime.ctx, stack.job
    store = ctx.redis.open_store(IncidentStore)
    with time_machine.travel(T + 86_400, tick=False):
        a = await ctx.runs.create(job, "U1", action="start")
        await ctx.runs.amend(
            a.id,
            created_at=T - 100,
            launched_at=T - 90,
            pid=4242,
            reach=Reach(first_at=T - 60, last_at=T + 36_000, ended="killed by SIGKILL"),
        )
        b = await ctx.runs.create(job, "U1", action="auto-restart")
        verified = StepRecord(
            step=Step.VERIFY, started_at=T + 36_100, ended_at=T + 36_600, outcome=Outcome.OK
        )
        await ctx.runs.amend(
            b.id,
            created_at=T + 36_060,
            launched_at=T + 36_100,
            running_at=T + 36_100,
            pid=4343,
            verdict=Verdict.RUNNING,
            steps=[verified],
            previous_run=a.id,
            lost_s=300.0,
        )
        stall = Incident(job=job, host="h", kind=IncidentKind.STALLED, opened_at=T + 50_000, notified_at=T)
        opened = await store.open(stall)
        assert opened is not None and await store.close(opened, at=T + 51_800)
        stack.clock.now += FRESH
        async with stack.http.get(f"{stack.admin.url}/metrics") as resp:
            text = await resp.text()
        reply = await attempts_command(ctx, job, 5)
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert got[("pitstop_goodput_ratio", (("job", job),))] == (86_400 - 600 - 1800 - 300) / 86_400 == 0.96875
    lost = {c.value: got[("pitstop_gpu_hours_lost_total", (("cause", c.value), ("job", job)))] for c in Cause}
    assert lost == {
        "pending": 0.0,
        "restart": pytest.approx(600 * 4 / 3600),
        "stall": pytest.approx(2.0),
        "loss": 0.0,
        "redone": pytest.approx(300 * 4 / 3600),
    }
    assert reply.lines == (
        f"goodput 97 % over 1 d: 3.0 GPU-h lost — 30 min stalled, 10 min to {b.id}'s restart, "
        f"5 min redone after {b.id}'s resume",
    )
