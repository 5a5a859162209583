"""The reference pipeline restarted through Slurm: its 8 workers as Slurm tasks on two nodes; a
restart after a SIGKILL says the steps lost since the checkpoint it resumed from."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pipeline.config import Config, JobConfig
from pipeline.digest.stats import summarise
from pipeline.digest.window import read_window, remote_reader
from pipeline.engines.runner import Runner
from pipeline.engines.slurm import SlurmEngine, SlurmSettings
from pipeline.host.remote import SSHPool
from pipeline.observe.metrics import parse_metric_lines
from pipeline.state.events import Events
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunStore, Verdict
from pipeline.verdict import parse_line
from tests.fixtures.slurm import SlurmCluster
from tests.fixtures.ssh import InProcessHost
from tests.test_attempts import _drafter_steps, _until_steps
from tests.test_slurm import redis_handle, shared_redis_url  # noqa: F401  (the module's Redis)

DFLASH = Path(__file__).resolve().parent.parent / "pipeline" / "dflash"
WRAPPER = """\
#!/bin/bash
# the site's wrapper: the reference batch script with this deployment's arguments
exec bash slurm.sbatch --cpu --profile tiny --checkpoint-dir ckpt --metric-every 1 --checkpoint-every 10
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
    """dflash's slurm.sbatch: start → RUNNING 8/8 on 2 nodes; its tasks SIGKILLed mid-run, restart →
    a new job id, 8/8 again, and the verdict says exactly the steps lost since the checkpoint it
    resumed from (the log's and latest.json's numbers), as on ssh; metrics digest."""
    work = tmp_path / "dflash"
    shutil.copytree(DFLASH, work, ignore=shutil.ignore_patterns("__pycache__"))
    (work / "pitstop.sbatch").write_text(WRAPPER)
    for argv in (["git", "init", "-q"], ["git", "add", "-A"]):
        subprocess.run(argv, cwd=work, check=True, capture_output=True)
    log, ckpt = work / "train.log", work / "ckpt"
    job = JobConfig(
        host="login",
        engine="slurm",
        slurm=SlurmSettings(
            script=str(work / "pitstop.sbatch"),
            sbatch_args=["-N", "2", "--ntasks-per-node", "4", "-o", str(log), "--open-mode=append"],
            nodes=2,
            tasks_per_node=4,
        ).model_dump(),
        exec=[*slurm.exec_prefix, f"PYTHON={sys.executable}"],
        workdir=str(work),
        log=str(log),
        match="^dflash-worker ",
        start_window=40.0,  # the resume step is the drafters' first line: 11-14 s after launch at load 6
        stop_timeout=20.0,
        checkpoint_dir=str(ckpt),
    )
    config = Config(hosts={"login": ssh_server.host_config()}, jobs={"dflash": job})
    ssh = SSHPool(config)
    pool.append(ssh)
    runs = RunStore(redis_handle.client, redis_handle.prefix)
    restarter = Runner(config, ssh, runs, Events(redis_handle.client, redis_handle.prefix))
    restarter.verify_poll = 1.0

    first = await restarter.start(await runs.create("dflash", "U-tester", action="start"))
    assert first.verdict is None, (first.verdict_line, [s.detail for s in first.steps])
    first = await restarter.verify(first)
    assert first.verdict is Verdict.RUNNING, (first.verdict_line, first.evidence)
    assert first.verdict_line == f"RUNNING 8/8 processes job {first.slurm_job} on 2 nodes"

    await _until_steps(log, 0, 40)  # past the checkpoints of steps 10, 20, 30
    engine = restarter.engines["slurm"]
    assert isinstance(engine, SlurmEngine)
    tasks = await engine.client.node_tasks("dflash", first.slurm_job or 0, job.match)
    pids = [p for t in tasks for p in t.pids]
    assert len(pids) == 8, tasks
    for pid in pids:  # mid-run: the kernel's OOM killer, a kill -9 on every task
        os.kill(pid, signal.SIGKILL)
    # until every line they wrote is written and the job has left (the test's timeout bounds it): a
    # restart's stop then finds it ended, as after an OOM kill
    while any(_alive(pid) for pid in pids) or await _active(engine, first.slurm_job or 0):
        await asyncio.sleep(0.2)
    reached = max(_drafter_steps(log))
    resumed = json.loads((ckpt / "latest.json").read_text())["step"]
    assert resumed % 10 == 0 and reached >= resumed  # equal only if killed right after a checkpoint

    run = await restarter.restart(await runs.create("dflash", "U-tester"))
    assert run.verdict is None, (run.verdict_line, [s.detail for s in run.steps])
    assert run.slurm_job != first.slurm_job
    run = await restarter.verify(run)
    assert run.verdict is Verdict.RUNNING, run.evidence
    line = run.verdict_line or ""
    assert line.startswith(f"RUNNING 8/8 processes job {run.slurm_job} on 2 nodes, resumed at step "), line
    facts = parse_line(line)
    assert (facts.resumed_at, facts.reached, facts.lost, facts.lost_role) == (
        resumed,
        reached,
        reached - resumed,
        "drafter",
    ), line
    steps = "step" if reached - resumed == 1 else "steps"  # "1 drafter step" one step past a save
    assert f"— {reached - resumed:,} drafter {steps} lost" in line, line  # the words ssh writes
    assert (run.previous_run, run.lost) == (first.id, reached - resumed)

    window = await read_window(remote_reader(ssh, "dflash", job), None, scheduled=False)
    summary = summarise(parse_metric_lines(window.data, job.metrics))
    assert {r.role for r in summary.ranks} == {"target", "drafter"}, summary


async def _active(engine: SlurmEngine, job_id: int) -> bool:
    """Whether the cluster still lists Slurm job ``job_id`` as active."""
    j = await engine.client.one("dflash", job_id)
    return j is not None and j.active


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (a zombie counts as gone)."""
    try:
        return os.path.exists(f"/proc/{pid}") and "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
