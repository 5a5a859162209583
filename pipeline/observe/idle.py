"""Idle GPUs: a running job's GPUs under ``idle_gpu_below`` percent for ``idle_gpu_for`` seconds.

Watched are the job's ``gpus`` roles; a job that names none watches the GPUs its processes hold
(``nvidia-smi``'s compute processes whose PID is one of the job's, placed by GPU UUID).  A reading
of ``[N/A]`` (a MIG-enabled GPU…) is no reading: it never counts as idle and ends an idle stretch.
The rules are pure (time passed in); :func:`read_watched` reads one host's GPUs for every watched
job in at most three ``nvidia-smi`` calls.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline import fmt
from pipeline.config import JobConfig
from pipeline.errors import PitstopError
from pipeline.observe.gpus import FORMAT, NVIDIA_SMI, QUERY_TIMEOUT, GpuStat, csv_rows, query_csv, query_gpus

if TYPE_CHECKING:
    from pipeline.host.probe import JobProbe
    from pipeline.host.remote import RemoteHosts

QUERY_UUID_ARGV: tuple[str, ...] = (NVIDIA_SMI, "--query-gpu=index,uuid", FORMAT)
QUERY_HELD_ARGV: tuple[str, ...] = (NVIDIA_SMI, "--query-compute-apps=pid,gpu_uuid", FORMAT)


@dataclass(frozen=True)
class GpuReading:
    """One watched GPU of a job in one cycle."""

    index: int
    role: str | None  #: ``target``/``drafter`` from the job's ``gpus``; None: found by its processes
    utilization_pct: float | None  #: percent; None for ``[N/A]`` or a GPU nvidia-smi does not list


def watched(cfg: JobConfig, stats: Sequence[GpuStat], held: Collection[int] = ()) -> tuple[GpuReading, ...]:
    """The GPUs the idle rule watches for ``cfg`` (its ``gpus`` roles, else ``held``: the indices
    its processes hold), read from ``stats``: by role then index."""
    util = {g.index: g.utilization_pct for g in stats}
    if cfg.gpus is not None and cfg.gpus.all:
        roles = [(i, "target") for i in cfg.gpus.target] + [(i, "drafter") for i in cfg.gpus.drafter]
        return tuple(GpuReading(i, role, util.get(i)) for i, role in roles)
    return tuple(GpuReading(i, None, util.get(i)) for i in sorted(set(held)))


def idle_since(
    readings: Sequence[GpuReading], below: float, before: Mapping[int, float], now: float
) -> dict[int, float]:
    """Index → idle start (unix s) of the GPUs under ``below`` percent now: kept from ``before``
    (the previous cycle's map) while one stays idle, ``now`` when it became so."""
    return {
        r.index: before.get(r.index, now)
        for r in readings
        if r.utilization_pct is not None and r.utilization_pct < below
    }


def idle_facts(
    idle: Sequence[GpuReading], watched_count: int, since: Mapping[int, float], below: float, now: float
) -> dict[str, Any]:
    """The incident fields ``idle_gpus`` (indices, comma-separated) and ``cause``
    (``GPU 1 (target) 0%, GPU 6 (drafter) 3% (2 of 8 watched) under 5% for 10 min``)."""
    names = ", ".join(
        f"GPU {r.index}" + (f" ({r.role})" if r.role else "") + f" {fmt.number(r.utilization_pct)}%"
        for r in idle
    )
    longest = max((now - since[r.index] for r in idle), default=0.0)
    cause = (
        f"{names} ({len(idle)} of {watched_count} watched) under {fmt.number(below, '{:g}')}% "
        f"for {fmt.duration(longest)}"
    )
    return {"idle_gpus": ",".join(str(r.index) for r in idle), "cause": cause}


async def read_watched(
    ssh: RemoteHosts, host: str, jobs: Sequence[tuple[str, JobConfig, JobProbe]]
) -> dict[str, tuple[GpuReading, ...] | None]:
    """The watched GPUs of the jobs on ``host`` (``jobs``: name, config, this cycle's probe) that
    set ``idle_gpu_below``, have processes and have their GPUs on ``host`` (``probe.host_gpus``):
    name → readings, or None for each when nvidia-smi fails or the host cannot be reached."""
    wanted = [
        (name, cfg, {*probe.pids, *probe.session_pids})
        for name, cfg, probe in jobs
        if cfg.watch.idle_gpu_below is not None and probe.host_gpus and not probe.error and probe.count > 0
    ]
    if not wanted:
        return {}
    try:
        stats = await query_gpus(ssh, host)
        held: dict[str, set[int]] = {}
        by_process = [(n, pids) for n, cfg, pids in wanted if cfg.gpus is None or not cfg.gpus.all]
        if by_process:
            uuids = await query_csv(ssh, host, QUERY_UUID_ARGV, QUERY_TIMEOUT)
            index = {p[1]: int(p[0]) for p in csv_rows(uuids, 2)}  # GPU UUID → index
            apps = csv_rows(await query_csv(ssh, host, QUERY_HELD_ARGV, QUERY_TIMEOUT), 2)
            gpu_of = [(int(p[0]), index[p[1]]) for p in apps if p[1] in index]  # (pid, GPU index)
            held = {n: {gpu for pid, gpu in gpu_of if pid in pids} for n, pids in by_process}
    except PitstopError:
        return {name: None for name, _, _ in wanted}
    return {name: watched(cfg, stats, held.get(name, ())) for name, cfg, _ in wanted}
