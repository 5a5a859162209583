"""The Slurm parts of ``status`` and ``gpus``: a Slurm job's id, state, nodes and elapsed time,
and the GPUs of each of its nodes.

``status`` asks each cluster once for all its jobs (:func:`pipeline.observe.slurmwatch.probe_cluster`,
the watcher's probe); ``gpus JOB`` for a Slurm job runs the same ``nvidia-smi`` query as
``gpus HOST`` on every node of the job, inside its allocation (``srun --overlap``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from handlers.context import Context
from handlers.reply import Reply, Status, Table
from pipeline import fmt
from pipeline.errors import PitstopError, RemoteError
from pipeline.host import slurm
from pipeline.host.probe import JobProbe
from pipeline.host.slurm import SlurmClient
from pipeline.observe.gpus import QUERY_GPU_ARGV, parse_query_gpu
from pipeline.observe.slurmwatch import SlurmNote, probe_cluster


@dataclass(frozen=True)
class StatusBits:
    """One Slurm job's cells of the status table, and a line with its nodes."""

    state: str
    pid: str
    procs: str
    uptime: str
    line: str | None
    healthy: bool


async def slurm_probes(
    ctx: Context, names: Sequence[str], currents: Mapping[str, Mapping[str, str]]
) -> dict[str, tuple[JobProbe, SlurmNote]]:
    """Probe Slurm jobs ``names``: one query per login node (cluster)."""
    by_host: dict[str, list[str]] = {}
    for name in names:
        by_host.setdefault(ctx.config.jobs[name].host, []).append(name)
    parts = await asyncio.gather(
        *(
            probe_cluster(ctx.ssh, [(n, ctx.config.jobs[n], currents.get(n) or None) for n in members])
            for members in by_host.values()
        )
    )
    out: dict[str, tuple[JobProbe, SlurmNote]] = {}
    for part in parts:
        out.update(part)
    return out


def status_bits(ctx: Context, name: str, probe: JobProbe, note: SlurmNote) -> StatusBits:
    """The status cells of a Slurm job: state (Slurm's, lower case), ``job ID``, processes seen on
    all nodes / expected, elapsed time; the line names the nodes (and a pending reason)."""
    spec = ctx.config.jobs[name]
    expected = spec.expected_processes
    if probe.error is not None:
        line = status_probe_failed(name, spec.host, probe.error)
        return StatusBits("unknown", "-", "?", "-", line, False)
    j = note.job
    if j is None:
        return StatusBits("stopped", "-", f"0/{expected}", "-", None, True)
    elapsed = fmt.duration(j.elapsed) if j.elapsed else "-"
    line = slurm.status_line(name, j)
    healthy = j.state == "RUNNING" and probe.count == expected and not note.short
    return StatusBits(j.state.lower(), f"job {j.id}", f"{probe.count}/{expected}", elapsed, line, healthy)


async def job_gpus(ctx: Context, name: str) -> Reply:
    """``gpus JOB`` for a Slurm job: the GPUs of each node it runs on, one table per node.

    :returns: an error reply when the job is not running or no node answered.
    """
    spec = ctx.config.jobs[name]
    client = SlurmClient(ctx.ssh)
    current = (await ctx.jobs.read(name)).current
    try:
        probes = await slurm_probes(ctx, [name], {name: dict(current)})
        j = probes[name][1].job
        if j is None or j.state != "RUNNING":
            why = f"Slurm job {j.id} is {j.state}" if j is not None else "no Slurm job is recorded"
            return Reply(title=slurm.gpus_not_running(name, why), status=Status.WARNING)
        texts = await client.node_gpus(name, j.id, j.nodes, QUERY_GPU_ARGV)
    except RemoteError as exc:
        return Reply(title=gpus_unavailable(spec.host, exc.message), status=Status.ERROR)
    tables: list[Table] = []
    lines: list[str] = []
    for node, text in texts.items():
        try:
            gpus = parse_query_gpu(text)
        except PitstopError as exc:
            lines.append(f"{node}: {exc.message}")
            continue
        rows = tuple(
            (
                node,
                str(g.index),
                g.name,
                fmt.number(g.utilization_pct, "{:.0f}", "%"),
                fmt.number(g.memory_used_mib, "{:,.0f}", " MiB"),
                fmt.number(g.power_w, "{:.0f}", " W"),
            )
            for g in gpus
        )
        tables.append(Table(("node", "gpu", "name", "util", "memory", "power"), rows))
    count = sum(len(t.rows) for t in tables)
    return Reply(
        title=slurm.gpus_title(name, j.id, len(texts), count),
        status=Status.OK if not lines else Status.WARNING,
        lines=tuple(lines),
        tables=tuple(tables),
    )


# --- text shared with status and gpus (handlers/views.py, handlers/reports.py) ----------------


def status_probe_failed(job: str, host: str, error: str) -> str:
    """A job whose host could not be probed for ``status``."""
    return f"{job}: state unknown - {host}: {error}"


def gpus_unavailable(host: str, detail: str) -> str:
    """``gpus HOST`` when the host gave no GPU data."""
    return f"no GPU data from {host}: {detail}"
