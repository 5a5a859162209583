"""nvidia-smi: parsing recorded real output ([N/A] / [Not Supported] → None) and querying over SSH."""

from __future__ import annotations

from pathlib import Path

import pytest

from devhost.sshhost import start_local_ssh_host
from pipeline.config import Config
from pipeline.errors import GpuQueryFailed
from pipeline.host.helper import ns_identity
from pipeline.host.remote import SSHPool
from pipeline.observe.gpus import (
    QUERY_APPS_ARGV,
    QUERY_GPU_ARGV,
    ComputeApp,
    GpuStat,
    compute_apps,
    parse_compute_apps,
    parse_number,
    parse_query_gpu,
    query_gpus,
)
from tests.fixtures.ssh import NVIDIA, InProcessHost


def test_query_arguments_are_nvidia_smis_stable_csv_interface() -> None:
    """The queries ask exactly the documented fields in csv,noheader,nounits form."""
    assert QUERY_GPU_ARGV == (
        "nvidia-smi",
        "--query-gpu=index,name,utilization.gpu,memory.used,memory.total,power.draw",
        "--format=csv,noheader,nounits",
    )
    assert QUERY_APPS_ARGV == (
        "nvidia-smi",
        "--query-compute-apps=pid,used_memory",
        "--format=csv,noheader,nounits",
    )


def test_parses_eight_h200s() -> None:
    """A normal 8×H200 recording parses into eight GPUs with every number."""
    gpus = parse_query_gpu((NVIDIA / "h200_query_gpu.txt").read_text())
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0] == GpuStat(0, "NVIDIA H200", 97.0, 81234.0, 143771.0, 612.45)
    assert all(g.power_w is not None and g.utilization_pct is not None for g in gpus)
    assert (gpus[5].memory_used_mib, gpus[5].memory_total_mib) == (64410.0, 143771.0)


def test_na_power_is_none_not_zero() -> None:
    """[N/A] power reads as None (unknown), while a real 0 % stays 0."""
    gpus = parse_query_gpu((NVIDIA / "h200_query_gpu_power_na.txt").read_text())
    assert gpus[0].power_w is None and gpus[1].power_w is None
    assert gpus[2].power_w == pytest.approx(620.03)
    assert gpus[7].utilization_pct == 0.0 and gpus[7].memory_used_mib == 0.0


def test_not_supported_fields_are_none() -> None:
    """[Not Supported] power and [N/A] utilisation (MIG) on H100s read as None, never raising."""
    gpus = parse_query_gpu((NVIDIA / "h100_query_gpu_not_supported.txt").read_text())
    assert len(gpus) == 8
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert all(g.power_w is None for g in gpus)
    assert [g.utilization_pct for g in gpus[5:]] == [None, None, None]
    assert (gpus[5].memory_used_mib, gpus[5].memory_total_mib) == (41230.0, 81559.0)


@pytest.mark.parametrize("text", ["[N/A]", "[Not Supported]", "N/A", "", "  ", "[Unknown Error]", "abc"])
def test_unreadable_numbers_are_none(text: str) -> None:
    """Every placeholder nvidia-smi prints for a missing value parses as None."""
    assert parse_number(text) is None


def test_compute_apps_and_empty_answers() -> None:
    """Compute-app rows parse; empty output or 'No running processes found' means none."""
    apps = parse_compute_apps((NVIDIA / "h200_query_compute_apps.txt").read_text())
    assert apps[0] == ComputeApp(2301412, 81220.0)
    assert len(apps) == 8
    assert parse_compute_apps("") == []
    assert parse_compute_apps("No running processes found\n") == []
    assert parse_compute_apps("4242, [N/A]\n") == [ComputeApp(4242, None)]


def test_a_comma_in_a_name_does_not_shift_fields() -> None:
    """A product name holding a comma keeps the numeric fields in place."""
    (gpu,) = parse_query_gpu("3, NVIDIA Weird, Inc GPU, 50, 10, 100, [N/A]\n")
    assert (gpu.index, gpu.name, gpu.utilization_pct, gpu.power_w) == (3, "NVIDIA Weird, Inc GPU", 50.0, None)


async def test_query_over_ssh_replays_the_recording(ssh_server: InProcessHost) -> None:
    """query_gpus/compute_apps run nvidia-smi on the host (stand-in on PATH) and parse its answer."""
    (ssh_server.nvidia_dir / "query-gpu.txt").write_text(
        (NVIDIA / "h100_query_gpu_not_supported.txt").read_text()
    )
    (ssh_server.nvidia_dir / "query-compute-apps.txt").write_text("4242, 79000\n")
    pool = SSHPool(Config(hosts={"gpu1": ssh_server.host_config()}))
    try:
        gpus = await query_gpus(pool, "gpu1")
        assert len(gpus) == 8 and gpus[0].power_w is None
        assert await compute_apps(pool, "gpu1") == [ComputeApp(4242, 79000.0)]
    finally:
        await pool.close()


async def test_missing_nvidia_smi_is_a_named_error(tmp_path: Path) -> None:
    """A host without nvidia-smi raises GpuQueryFailed saying so."""
    host = await start_local_ssh_host(tmp_path / "bare", env={"PATH": "/usr/bin:/bin"})
    pool = SSHPool(Config(hosts={"bare": host.host_config()}))
    try:
        with pytest.raises(GpuQueryFailed) as info:
            await query_gpus(pool, "bare")
        assert "nvidia-smi not found" in info.value.message
    finally:
        await pool.close()
        await host.close()


def test_host_pid_maps_to_its_innermost_namespace_pid() -> None:
    """NSpid mapping: a process outside any container maps to itself, with its start time."""
    import os

    pid, start = ns_identity(os.getpid())
    assert pid == os.getpid() and isinstance(start, int)
    assert ns_identity(2**22 + 12345) == (2**22 + 12345, None)
