"""``GET /metrics``: the jobs' shared state from Redis and this process's own measurements in the
Prometheus text format (names and list: the README's "Metrics")."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bot.slack.send import SlackSender
from handlers.context import Context
from handlers.watch.stats import WatchStats
from pipeline.state.digests import DigestMemory
from pipeline.state.incidents import IncidentKind

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  #: the Prometheus text format's media type
RECENT_RUNS = 500  #: runs (all jobs, newest first) counted by ``pitstop_runs_recent``
#: values of ``pitstop_job_state``'s ``state``
JOB_STATES = ("ok", "paused", *(k.value for k in IncidentKind))


@dataclass
class Snapshot:
    """One scrape's numbers (read by :func:`read_snapshot`)."""

    expected: dict[str, int] = field(default_factory=dict)  #: job → processes expected
    seen: dict[str, int] = field(default_factory=dict)  #: job → processes the last probe saw
    state: dict[str, str] = field(default_factory=dict)  #: job → one of :data:`JOB_STATES`
    host: dict[str, str] = field(default_factory=dict)  #: job → its host
    incidents: Counter[str] = field(default_factory=Counter)  #: incident kind → open incidents
    runs: Counter[tuple[str, str, str]] = field(default_factory=Counter)  #: (job, action, verdict) → runs
    auto_restarts: dict[str, int] = field(default_factory=dict)  #: job → automatic restarts in its window
    tokens_per_s: dict[str, float] = field(default_factory=dict)  #: job → its last digest's tokens/s
    watch: WatchStats = field(default_factory=WatchStats)
    queue_depth: int = 0
    queue_oldest_s: float = 0.0


async def read_snapshot(ctx: Context, stats: WatchStats | None, outbox: object) -> Snapshot:
    """Read one scrape's numbers (``stats``: None when this process runs no watcher; a
    :class:`~bot.slack.send.SlackSender` ``outbox`` reports its queue).

    :raises StateUnavailable: if Redis does not answer.
    """
    config = ctx.config
    names = list(config.jobs)
    snaps = await ctx.service.jobs.read_many(names, now=time.time())
    digests = ctx.redis.open_store(DigestMemory)
    lasts, runs = await asyncio.gather(
        asyncio.gather(*(digests.last(n) for n in names)), ctx.runs.recent(None, RECENT_RUNS)
    )
    out = Snapshot(watch=stats or WatchStats())
    for snap, last in zip(snaps, lasts, strict=True):
        name = snap.name
        out.expected[name] = config.jobs[name].processes
        out.host[name] = config.jobs[name].host
        if out.watch.seen.get(name) is not None:
            out.seen[name] = out.watch.seen[name]
        if snap.incident is not None:
            out.state[name] = snap.incident.kind.value
            out.incidents[snap.incident.kind.value] += 1
        else:
            out.state[name] = "paused" if snap.paused else "ok"
        out.auto_restarts[name] = snap.auto_restarts
        if last:
            rate = json.loads(last).get("pipeline_tokens_per_s")
            if isinstance(rate, int | float):
                out.tokens_per_s[name] = float(rate)
    for run in runs:
        out.runs[(run.job, run.action, run.verdict.value if run.verdict else "none")] += 1
    if isinstance(outbox, SlackSender):
        queue = outbox.queue()
        out.queue_depth, out.queue_oldest_s = int(queue["depth"]), float(queue["oldest_s"])
    return out


def _by(
    label: str, name: str, doc: str, kind: type[GaugeMetricFamily | CounterMetricFamily] = GaugeMetricFamily
) -> GaugeMetricFamily | CounterMetricFamily:
    """A metric family with one label."""
    return kind(name, doc, labels=[label])


class _Snapshot(Collector):
    """Renders one :class:`Snapshot` as metric families."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def collect(self) -> Iterator[Metric]:
        """Every metric of the README's list."""
        s = self.snap
        state = GaugeMetricFamily("pitstop_job_state", "1 for the job's state now", labels=["job", "state"])
        expected = _by("job", "pitstop_job_processes_expected", "processes the job should run")
        seen = _by("job", "pitstop_job_processes_seen", "processes the last probe saw")
        auto = _by("job", "pitstop_job_auto_restarts", "automatic restarts within auto_restart.within")
        rate = _by("job", "pitstop_job_tokens_per_second", "the last scheduled digest's pipeline tokens/s")
        for job, value in s.state.items():
            for name in JOB_STATES:
                state.add_metric([job, name], 1.0 if name == value else 0.0)
            expected.add_metric([job], s.expected[job])
            auto.add_metric([job], s.auto_restarts.get(job, 0))
        for job, count in s.seen.items():
            seen.add_metric([job], count)
        for job, tokens in s.tokens_per_s.items():
            rate.add_metric([job], tokens)
        yield from (state, expected, seen, auto, rate)
        incidents = GaugeMetricFamily("pitstop_incidents_open", "open incidents by kind", labels=["kind"])
        for kind in IncidentKind:
            incidents.add_metric([kind.value], s.incidents.get(kind.value, 0))
        yield incidents
        runs = GaugeMetricFamily(
            "pitstop_runs_recent",
            f"restarts, starts and stops among the newest {RECENT_RUNS} runs, by verdict",
            labels=["job", "action", "verdict"],
        )
        for (job, action, verdict), count in sorted(s.runs.items()):
            runs.add_metric([job, action, verdict], count)
        yield runs
        probe = _by("host", "pitstop_host_probe_seconds", "duration of the host's last probe")
        probes = _by("host", "pitstop_host_probes", "probes of the host", CounterMetricFamily)
        failures = _by(
            "host", "pitstop_host_probe_failures", "probes that could not reach the host", CounterMetricFamily
        )
        cycle = _by("host", "pitstop_watch_cycle_seconds", "duration of the host's last watch cycle")
        cycles = _by("host", "pitstop_watch_cycles", "watch cycles of the host", CounterMetricFamily)
        for host, h in sorted(s.watch.hosts.items()):
            if h.probe_s is not None:
                probe.add_metric([host], h.probe_s)
            if h.cycle_s is not None:
                cycle.add_metric([host], h.cycle_s)
            probes.add_metric([host], h.probes)
            failures.add_metric([host], h.failures)
            cycles.add_metric([host], h.cycles)
        yield from (probe, probes, failures, cycle, cycles)
        yield GaugeMetricFamily(
            "pitstop_outbox_queue_depth", "posts and updates waiting for Slack's pace", value=s.queue_depth
        )
        yield GaugeMetricFamily(
            "pitstop_outbox_queue_oldest_seconds",
            "how long the oldest waiting post or update has waited",
            value=s.queue_oldest_s,
        )


def render(snap: Snapshot) -> bytes:
    """The Prometheus text exposition of ``snap`` (:data:`CONTENT_TYPE`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(snap))
    return generate_latest(registry)
