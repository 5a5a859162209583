"""Issue 23: ``pitstop serve`` exposes ``/metrics`` in the Prometheus text format — per job its state,
processes expected and seen, open incidents by kind, runs by verdict; per host its probes; the
outbox queue; the watch cycle — and ``/healthz/details`` shows the outbox queue with its age; both on
the admin listener."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from bot.runtime.serve import FRESH
from pipeline.state.incidents import Incident, IncidentKind, IncidentStore
from tests.test_slack_http import MakeStack, Stack, make_stack  # noqa: F401 (a fixture)

#: every metric the README lists
NAMES = {
    "pitstop_job_state",
    "pitstop_job_processes_expected",
    "pitstop_job_processes_seen",
    "pitstop_job_auto_restarts",
    "pitstop_job_tokens_per_second",
    "pitstop_incidents_open",
    "pitstop_runs_recent",
    "pitstop_host_probe_seconds",
    "pitstop_host_probes",
    "pitstop_host_probe_failures",
    "pitstop_watch_cycle_seconds",
    "pitstop_watch_cycles",
    "pitstop_outbox_queue_depth",
    "pitstop_outbox_queue_oldest_seconds",
    "pitstop_goodput_ratio",
    "pitstop_gpu_hours_lost_total",
}


async def _scrape(stack: Stack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    stack.clock.now += FRESH  # past the reuse of the last scrape
    async with stack.http.get(f"{stack.admin.url}/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await resp.text()
    families = list(text_string_to_metric_families(text))
    assert {f.name for f in families} == NAMES
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


async def test_metrics_show_jobs_hosts_incidents_runs_and_the_queue(make_stack: MakeStack) -> None:  # noqa: F811
    """After one watch cycle, /metrics reads the job ok with its expected and seen processes, its host's probe and cycle; an open incident shows by kind and as the job's state; /healthz/details shows an empty queue."""
    stack = await make_stack()
    runtime, job = stack.runtime, stack.job
    host = runtime.config.jobs[job].host
    assert runtime.scheduler is not None
    await runtime.scheduler.watcher.cycle(host, [job])
    got = await _scrape(stack)
    assert got[("pitstop_job_state", (("job", job), ("state", "ok")))] == 1.0
    assert got[("pitstop_job_state", (("job", job), ("state", "dead")))] == 0.0
    assert got[("pitstop_job_processes_expected", (("job", job),))] == runtime.config.jobs[job].processes
    assert got[("pitstop_job_processes_seen", (("job", job),))] == 0.0  # the quiet job is not running
    assert got[("pitstop_host_probe_seconds", (("host", host),))] > 0
    assert got[("pitstop_host_probes_total", (("host", host),))] >= 1
    assert got[("pitstop_host_probe_failures_total", (("host", host),))] == 0
    assert got[("pitstop_watch_cycles_total", (("host", host),))] >= 1
    assert got[("pitstop_incidents_open", (("kind", "dead"),))] == 0
    assert got[("pitstop_outbox_queue_depth", ())] == 0
    # an incident opens: it shows by kind and as the job's state
    store = runtime.ctx.redis.open_store(IncidentStore)
    now = time.time()
    opened = await store.open(
        Incident(job=job, host=host, kind=IncidentKind.DEAD, opened_at=now, notified_at=now)
    )
    assert opened is not None
    got = await _scrape(stack)
    assert got[("pitstop_incidents_open", (("kind", "dead"),))] == 1
    assert got[("pitstop_job_state", (("job", job), ("state", "dead")))] == 1.0
    assert got[("pitstop_job_state", (("job", job), ("state", "ok")))] == 0.0
    health = await stack.details()
    assert health["slack"]["queue"] == {"depth": 0, "oldest_s": 0.0, "channels": {}}


async def test_metrics_count_runs_by_verdict(make_stack: MakeStack) -> None:  # noqa: F811
    """A verified start shows in pitstop_runs_recent by job, action and verdict."""
    stack = await make_stack()
    ctx = stack.runtime.ctx
    run = await ctx.runs.create(stack.job, "U0TEST", action="start")
    run = await ctx.restarter.verify(await ctx.restarter.start(run))
    assert run.verdict is not None
    got = await _scrape(stack)
    key = ("pitstop_runs_recent", (("action", "start"), ("job", stack.job), ("verdict", run.verdict.value)))
    assert got[key] == 1
