"""The reference pipeline restarted through Slurm: its 8 workers as Slurm tasks on two nodes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pipeline.config import Config, JobConfig, SlurmSettings
from pipeline.digest.metrics import parse_metric_lines
from pipeline.digest.stats import summarise
from pipeline.digest.window import read_window, remote_reader
from pipeline.engines.runner import Runner
from pipeline.host.remote import SSHPool
from pipeline.state.events import Events
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunStore, Verdict
from tests.fixtures.slurm import SlurmCluster
from tests.fixtures.ssh import InProcessHost
from tests.test_slurm import redis_handle, shared_redis_url  # noqa: F401  (the module's Redis)

DFLASH = Path(__file__).resolve().parent.parent / "pipeline" / "dflash"
WRAPPER = """\
#!/bin/bash
# the site's wrapper: the reference batch script with this deployment's arguments
exec bash slurm.sbatch --cpu --profile tiny --checkpoint-dir ckpt
"""


@pytest.fixture
async def pool() -> AsyncIterator[list[SSHPool]]:
    """SSH pools to close after the test."""
    pools: list[SSHPool] = []
    yield pools
    for p in pools:
        await p.close()


@pytest.mark.timeout(420)
async def test_dflash_restarts_through_slurm_with_eight_tasks_on_two_nodes(
    slurm: SlurmCluster,
    ssh_server: InProcessHost,
    redis_handle: RedisHandle,  # noqa: F811
    tmp_path: Path,
    pool: list[SSHPool],
) -> None:
    """dflash's slurm.sbatch: start → RUNNING 8/8 on 2 nodes; restart → a new job id, 8/8 again; metrics digest."""
    work = tmp_path / "dflash"
    shutil.copytree(DFLASH, work, ignore=shutil.ignore_patterns("__pycache__"))
    (work / "pitstop.sbatch").write_text(WRAPPER)
    for argv in (["git", "init", "-q"], ["git", "add", "-A"]):
        subprocess.run(argv, cwd=work, check=True, capture_output=True)
    log = work / "train.log"
    job = JobConfig(
        host="login",
        engine="slurm",
        slurm=SlurmSettings(
            script=str(work / "pitstop.sbatch"),
            sbatch_args=["-N", "2", "--ntasks-per-node", "4", "-o", str(log), "--open-mode=append"],
            nodes=2,
            tasks_per_node=4,
        ),
        exec=[*slurm.exec_prefix, f"PYTHON={sys.executable}"],
        workdir=str(work),
        log=str(log),
        match="^dflash-worker ",
        start_window=60.0,
        stop_timeout=20.0,
    )
    config = Config(hosts={"login": ssh_server.host_config()}, jobs={"dflash": job})
    ssh = SSHPool(config)
    pool.append(ssh)
    runs = RunStore(redis_handle.client, redis_handle.prefix)
    restarter = Runner(config, ssh, runs, Events(redis_handle.client, redis_handle.prefix), verify_poll=1.0)

    first = await restarter.start(await runs.create("dflash", "U-tester", action="start"))
    assert first.verdict is None, (first.verdict_line, [s.detail for s in first.steps])
    first = await restarter.verify(first)
    assert first.verdict is Verdict.RUNNING, (first.verdict_line, first.evidence)
    assert first.verdict_line == f"RUNNING 8/8 processes job {first.slurm_job} on 2 nodes"

    run = await restarter.restart(await runs.create("dflash", "U-tester"))
    assert run.verdict is None, (run.verdict_line, [s.detail for s in run.steps])
    assert run.slurm_job != first.slurm_job
    run = await restarter.verify(run)
    assert run.verdict_line == f"RUNNING 8/8 processes job {run.slurm_job} on 2 nodes", run.evidence

    window = await read_window(remote_reader(ssh, "dflash", job), None, scheduled=False)
    summary = summarise(parse_metric_lines(window.data, job.metrics))
    assert {r.role for r in summary.ranks} == {"target", "drafter"}, summary
