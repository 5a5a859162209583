"""``GET /metrics``: the jobs' shared state from Redis and this process's own measurements in the
Prometheus text format (names and list: the README's "Metrics")."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator, Mapping

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bot.slack.api import SlackSender
from handlers.context import Context
from handlers.watch.cycle import WatchStats
from pipeline.digest.goodput import DAY_S, job_goodput
from pipeline.state.incidents import IncidentKind
from pipeline.state.jobstate import DigestMemory

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  #: the Prometheus text format's media type
RECENT_RUNS = 500  #: runs (all jobs, newest first) counted by ``pitstop_runs_recent``
#: values of ``pitstop_job_state``'s ``state``
JOB_STATES = ("ok", "paused", *(k.value for k in IncidentKind))
_GAUGE, _COUNTER = GaugeMetricFamily, CounterMetricFamily
#: per host: the :class:`~handlers.watch.cycle.HostStats` attribute, the metric, its help, its kind
_HOSTS = (
    ("probe_s", "pitstop_host_probe_seconds", "duration of the host's last probe", _GAUGE),
    ("probes", "pitstop_host_probes", "probes of the host", _COUNTER),
    ("failures", "pitstop_host_probe_failures", "probes that could not reach the host", _COUNTER),
    ("cycle_s", "pitstop_watch_cycle_seconds", "duration of the host's last watch cycle", _GAUGE),
    ("cycles", "pitstop_watch_cycles", "watch cycles of the host", _COUNTER),
)

#: the outbox's queue: the :meth:`~bot.slack.api.SlackSender.queue` key, the metric, its help
_QUEUE = (
    ("depth", "pitstop_outbox_queue_depth", "posts and updates waiting for Slack's pace"),
    (
        "oldest_s",
        "pitstop_outbox_queue_oldest_seconds",
        "how long the oldest waiting post or update has waited",
    ),
)


def _by(
    label: str,
    name: str,
    doc: str,
    values: Mapping[str, float],
    kind: type[GaugeMetricFamily | CounterMetricFamily] = _GAUGE,
) -> Metric:
    """A metric family with one label, a sample per item of ``values``."""
    family = kind(name, doc, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family


class _Scrape(Collector):
    """One scrape's metric families, as :func:`~prometheus_client.generate_latest` reads them."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        """Every metric of the README's list."""
        return iter(self.families)


async def render(ctx: Context, stats: WatchStats | None, outbox: SlackSender) -> bytes:
    """The Prometheus text exposition (:data:`CONTENT_TYPE`) of the jobs, the runs, the watcher's
    ``stats`` (None when this process runs no watcher) and ``outbox``'s queue.

    :raises StateUnavailable: if Redis does not answer.
    """
    config = ctx.config
    names = list(config.jobs)
    snaps = await ctx.service.jobs.read_many(names, now=time.time())
    digests = ctx.redis.open_store(DigestMemory)
    lasts, runs = await asyncio.gather(
        asyncio.gather(*(digests.last(n) for n in names)), ctx.runs.recent(None, RECENT_RUNS)
    )
    watch = stats or WatchStats()
    state = GaugeMetricFamily("pitstop_job_state", "1 for the job's state now", labels=["job", "state"])
    incidents = Counter(snap.incident.kind.value for snap in snaps if snap.incident is not None)
    rates: dict[str, float] = {}
    for snap, last in zip(snaps, lasts, strict=True):
        now = snap.incident.kind.value if snap.incident is not None else "paused" if snap.paused else "ok"
        for name in JOB_STATES:
            state.add_metric([snap.name, name], 1.0 if name == now else 0.0)
        rate = json.loads(last).get("pipeline_tokens_per_s") if last else None
        if isinstance(rate, int | float):
            rates[snap.name] = float(rate)
    by_verdict = GaugeMetricFamily(
        "pitstop_runs_recent",
        f"restarts, starts and stops among the newest {RECENT_RUNS} runs, by verdict",
        labels=["job", "action", "verdict"],
    )
    counts = Counter((run.job, run.action, run.verdict.value if run.verdict else "none") for run in runs)
    for labels, count in sorted(counts.items()):
        by_verdict.add_metric(list(labels), count)
    expected = {snap.name: config.jobs[snap.name].processes for snap in snaps}
    seen = {snap.name: watch.seen[snap.name] for snap in snaps if watch.seen.get(snap.name) is not None}
    auto = {snap.name: snap.auto_restarts for snap in snaps}
    open_kinds = {kind.value: incidents[kind.value] for kind in IncidentKind}
    at = time.time()
    goods = await asyncio.gather(
        *(job_goodput(ctx.redis, n, config.jobs[n], runs, start=at - DAY_S, end=at) for n in names)
    )
    ratio = {n: r for n, g in zip(names, goods, strict=True) if (r := g.ratio) is not None}
    gpu_h = GaugeMetricFamily(
        "pitstop_gpu_hours_lost_total",
        "GPU-hours the job lost over the last 24 h, by cause (jobs with a known GPU count)",
        labels=["job", "cause"],
    )
    for n, g in zip(names, goods, strict=True):
        for cause, seconds in g.by_cause().items():
            if (hours := g.gpu_hours(seconds)) is not None:
                gpu_h.add_metric([n, cause.value], hours)
    families = [
        state,
        _by("job", "pitstop_job_processes_expected", "processes the job should run", expected),
        _by("job", "pitstop_job_processes_seen", "processes the last probe saw", seen),
        _by("job", "pitstop_job_auto_restarts", "automatic restarts within auto_restart.within", auto),
        _by("job", "pitstop_job_tokens_per_second", "the last scheduled digest's pipeline tokens/s", rates),
        _by("kind", "pitstop_incidents_open", "open incidents by kind", open_kinds),
        by_verdict,
        _by("job", "pitstop_goodput_ratio", "productive time over the job's time in the last 24 h", ratio),
        gpu_h,
    ]
    for attr, name, doc, kind in _HOSTS:
        values = {host: v for host, h in sorted(watch.hosts.items()) if (v := getattr(h, attr)) is not None}
        families.append(_by("host", name, doc, values, kind))
    queue = outbox.queue()
    families += [GaugeMetricFamily(name, doc, value=queue[key]) for key, name, doc in _QUEUE]
    return generate_latest(_Scrape(families))
