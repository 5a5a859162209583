"""The watcher's probe of Slurm jobs: one query per cluster per cycle, tasks counted on every node.

:func:`probe_cluster` covers every watched Slurm job whose login node is one host: one SSH call
asks ``squeue``/``scontrol``/``sacct`` about all their recorded job ids and sizes their output
files; then, for each job that is ``RUNNING``, the host helper counts its tasks on every node
(``srun --jobid=ID --overlap``).  The answer is a :class:`~pipeline.host.probe.JobProbe` per job
(the count summed over nodes, the output size) plus what the cluster says beside the count
(:class:`SlurmNote`): a job that left ``RUNNING`` with its ``State``, ``ExitCode`` and
``Reason``, and the nodes short of tasks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline.config import JobConfig
from pipeline.errors import RemoteError
from pipeline.host import slurm
from pipeline.host.probe import JobProbe
from pipeline.host.remote import RemoteHosts
from pipeline.host.slurm import SlurmClient, SlurmJob


@dataclass(frozen=True)
class SlurmNote:
    """What the cluster says about one job beside its process count.

    :ivar job: the Slurm job as queried (None if no job is recorded or the cluster forgot it).
    :ivar exit_cause: set when the job no longer runs: ``Slurm job 12 is CANCELLED (ExitCode 0:15, Reason None)``.
    :ivar short: node → (tasks seen, tasks expected) for nodes with fewer tasks than expected.
    """

    job: SlurmJob | None = None
    exit_cause: str | None = None
    short: Mapping[str, tuple[int, int]] | None = None

    @property
    def detail(self) -> str | None:
        """``n2 has 3/4 processes (Slurm job 12)`` when nodes are short of tasks, else None."""
        if not self.short or self.job is None:
            return None
        parts = [f"{node} has {seen}/{want} processes" for node, (seen, want) in sorted(self.short.items())]
        return f"{'; '.join(parts)} (Slurm job {self.job.id})"


def _job_id(current: Mapping[str, str] | None) -> int | None:
    value = (current or {}).get("slurm_job")
    return int(value) if value and value.isdigit() else None


async def probe_cluster(
    ssh: RemoteHosts, entries: Sequence[tuple[str, JobConfig, Mapping[str, str] | None]]
) -> dict[str, tuple[JobProbe, SlurmNote]]:
    """Probe Slurm jobs sharing one login node: one query for all, then tasks per running job.

    :param entries: ``(job name, config, keys.job_current)`` per job.
    :returns: job name → (probe, note); a probe with ``error`` set when the login node could
        not be asked.
    """
    if not entries:
        return {}
    first = entries[0][0]
    ids = {name: _job_id(cur) for name, _, cur in entries}
    paths = sorted({(cur or {}).get("log") or cfg.log for _, cfg, cur in entries})
    client = SlurmClient(ssh)
    try:
        jobs, sizes = await client.query_with_sizes(first, [i for i in ids.values() if i is not None], paths)
    except RemoteError as exc:
        return {name: (JobProbe(job=name, error=exc.message), SlurmNote()) for name, _, _ in entries}

    async def one(name: str, cfg: JobConfig, cur: Mapping[str, str] | None) -> tuple[JobProbe, SlurmNote]:
        job_id = ids[name]
        path = (cur or {}).get("log") or cfg.log
        size = sizes.get(path)
        j = jobs.get(job_id) if job_id is not None else None
        if j is None or j.state != "RUNNING":
            cause = None
            if j is not None:
                cause = slurm.state_cause(j)
            elif job_id is not None:
                cause = f"Slurm job {job_id} is no longer known to the cluster"
            return JobProbe(job=name, count=0, log_size=size), SlurmNote(j, cause)
        try:
            tasks = await client.node_tasks(name, j.id, j.nodes, cfg.match)
        except RemoteError as exc:
            return JobProbe(job=name, error=exc.message), SlurmNote(j)
        want = (cfg.slurm.tasks_per_node if cfg.slurm else None) or max(
            1, cfg.expected_processes // max(1, j.nodes)
        )
        seen = {t.node: t.count for t in tasks}
        short = {n: (seen.get(n, 0), want) for n in (j.nodelist or tuple(seen)) if seen.get(n, 0) < want}
        pids = tuple(sorted(p for t in tasks for p in t.pids))
        return JobProbe(job=name, pids=pids, count=len(pids), log_size=size), SlurmNote(j, None, short)

    results = await asyncio.gather(*(one(n, c, cur) for n, c, cur in entries))
    return {name: res for (name, _, _), res in zip(entries, results, strict=True)}
