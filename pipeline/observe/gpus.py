"""GPU state from ``nvidia-smi``'s CSV interface (``--format=csv,noheader,nounits``): per-GPU
utilisation, memory and power; compute processes.

A field nvidia-smi cannot report (``[N/A]``, ``[Not Supported]``, ``N/A`` …) becomes ``None`` —
never 0, never an exception — so a digest can say "n/a".  ``nvidia-smi`` runs on the host itself
(not behind a job's container wrapper), so it reports host PIDs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.errors import GpuQueryFailed
from pipeline.observe.metrics import parse_number

if TYPE_CHECKING:
    from pipeline.host.remote import RemoteHosts

NVIDIA_SMI = "nvidia-smi"
GPU_FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total", "power.draw")
APP_FIELDS = ("pid", "used_memory")
FORMAT = "--format=csv,noheader,nounits"
QUERY_GPU_ARGV: tuple[str, ...] = (NVIDIA_SMI, "--query-gpu=" + ",".join(GPU_FIELDS), FORMAT)
QUERY_APPS_ARGV: tuple[str, ...] = (NVIDIA_SMI, "--query-compute-apps=" + ",".join(APP_FIELDS), FORMAT)
QUERY_TIMEOUT = 20.0  #: seconds (nvidia-smi can be slow on a busy 8-GPU host)


@dataclass(frozen=True)
class GpuStat:
    """One GPU as nvidia-smi reports it; ``None`` where it reports ``[N/A]`` or similar."""

    index: int  #: ``CUDA_VISIBLE_DEVICES`` numbering (PCI bus order)
    name: str  #: the product name (``NVIDIA H200``)
    utilization_pct: float | None  #: percent over nvidia-smi's last sample period
    memory_used_mib: float | None
    memory_total_mib: float | None
    power_w: float | None


@dataclass(frozen=True)
class ComputeApp:
    """A process holding GPU memory: host PID and MiB used (None if not reported)."""

    pid: int
    used_memory_mib: float | None


def csv_rows(text: str, count: int) -> Iterator[list[str]]:
    """The CSV rows of ``text`` with ``count`` fields whose first is a number (an index, a PID); a
    comma inside the name (field 2) is rejoined."""
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < count or not parts[0].isdigit():
            continue
        extra = len(parts) - count
        yield [parts[0], ", ".join(parts[1 : 2 + extra]), *parts[2 + extra :]] if extra else parts


def parse_query_gpu(text: str) -> list[GpuStat]:
    """One :class:`GpuStat` per GPU row of :data:`QUERY_GPU_ARGV`'s output, in order (e.g.
    ``0, NVIDIA H200, 97, 81234, 143771, 612.45``); other lines are skipped."""
    return [GpuStat(int(p[0]), p[1], *map(parse_number, p[2:6])) for p in csv_rows(text, len(GPU_FIELDS))]


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """Processes from :data:`QUERY_APPS_ARGV`'s output (``No running processes found``: none)."""
    return [ComputeApp(int(p[0]), parse_number(p[1])) for p in csv_rows(text, len(APP_FIELDS))]


async def query_csv(ssh: RemoteHosts, host: str, argv: tuple[str, ...], timeout: float) -> str:
    """The stdout of one ``nvidia-smi`` query (``argv``) on ``host``, within ``timeout`` seconds.

    :raises GpuQueryFailed: if nvidia-smi is missing (exit status 127) or fails.
    """
    result = await ssh.run(host, argv, timeout=timeout)
    if result.exit_status == 127:
        raise GpuQueryFailed(result.host, f"{NVIDIA_SMI} not found on the host")
    if not result.ok:
        why = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[0]
        status = f"exit status {result.exit_status}" if result.exit_signal is None else result.exit_signal
        raise GpuQueryFailed(result.host, f"{status}: {why}")
    return result.stdout


async def query_gpus(ssh: RemoteHosts, host: str, *, timeout: float = QUERY_TIMEOUT) -> list[GpuStat]:
    """Every GPU of ``host`` (one SSH call, ``timeout`` seconds).

    :raises GpuQueryFailed: if nvidia-smi is missing or fails; connection errors as ``SSHPool.run``.
    """
    return parse_query_gpu(await query_csv(ssh, host, QUERY_GPU_ARGV, timeout))


async def compute_apps(ssh: RemoteHosts, host: str, *, timeout: float = QUERY_TIMEOUT) -> list[ComputeApp]:
    """Processes holding GPU memory on ``host`` (host PIDs); raises as :func:`query_gpus`."""
    return parse_compute_apps(await query_csv(ssh, host, QUERY_APPS_ARGV, timeout))
