"""A preemption on the real cluster: the reference pipeline in the preemptable partition, a job of
the high-priority partition takes its CPUs, Slurm requeues it; Pitstop tells why once ("preempted by
job N", read from what the cluster still shows: the test cluster has no accounting), then the
requeue's verdict like a restart's, and spends no automatic restart on it."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from handlers.outbox import MemoryOutbox
from handlers.request.dispatch import Dispatcher, Request
from handlers.runs.view import thread_key
from handlers.watch.cycle import Watcher
from pipeline.config import AuthSettings, Config, JobConfig
from pipeline.config.jobs import AutoRestart, CrashClass, WatchSettings
from pipeline.engines.runner import Runner
from pipeline.engines.slurm import SlurmEngine, SlurmSettings
from pipeline.host.remote import SSHPool
from pipeline.state.events import Events
from pipeline.state.incidents import IncidentStore
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunRecord, RunStore, Verdict
from pipeline.verdict import parse_line
from tests.fixtures.slurm import HIGH, LOW, SlurmCluster
from tests.fixtures.ssh import InProcessHost
from tests.support_handlers import make_context
from tests.test_attempts import _drafter_steps, _until_steps
from tests.test_slurm import redis_handle, shared_redis_url  # noqa: F401  (the module's Redis)
from tests.test_slurm_dflash import DFLASH, WRAPPER

VIEWER = "U0VIEWER1"


@pytest.mark.timeout(420)
async def test_a_preempted_pipeline_is_told_once_then_verified_with_no_step_lost_and_no_attempt_spent(
    slurm: SlurmCluster,
    ssh_server: InProcessHost,
    redis_handle: RedisHandle,  # noqa: F811
    tmp_path: Path,
) -> None:
    """dflash in ``low`` on two nodes; a ``high`` job asking for the 8 CPUs of its first preempts it: SIGTERM, the
    drafters checkpoint at the step they stop at, the batch script asks for the requeue.  The channel is told once
    "preempted by job N (partition high) on NODE"; when the job runs again, its verdict in that
    post's thread says 8/8 processes and 0 steps lost since the checkpoint; no incident, no
    automatic restart attempt spent, and ``history --attempts`` shows how the first attempt ended."""
    work = tmp_path / "dflash"
    shutil.copytree(DFLASH, work, ignore=shutil.ignore_patterns("__pycache__"))
    (work / "pitstop.sbatch").write_text(WRAPPER)
    for argv in (["git", "init", "-q"], ["git", "add", "-A"]):
        subprocess.run(argv, cwd=work, check=True, capture_output=True)
    log = work / "train.log"
    args = [
        "-p",
        LOW,
        "-N",
        "2",
        "--ntasks-per-node",
        "4",
        "-o",
        str(log),
        "--open-mode=append",
    ]
    policy = AutoRestart(max=3, within=600, backoff=0.001, on=list(CrashClass))
    job = JobConfig(
        host="login",
        engine="slurm",
        slurm=SlurmSettings(
            script=str(work / "pitstop.sbatch"), sbatch_args=args, nodes=2, tasks_per_node=4
        ).model_dump(),
        exec=[*slurm.exec_prefix, f"PYTHON={sys.executable}"],
        workdir=str(work),
        log=str(log),
        match="^dflash-worker ",
        start_window=30.0,  # the resume step is the drafters' first line
        stop_timeout=20.0,
        checkpoint_dir=str(work / "ckpt"),
        watch=WatchSettings(stall_after=600, auto_restart=policy),
    )
    config = Config(
        hosts={"login": ssh_server.host_config()},
        jobs={"dflash": job},
        auth=AuthSettings(viewers=["*"]),
    )
    ssh = SSHPool(config)
    try:
        runs = RunStore(redis_handle.client, redis_handle.prefix)
        restarter = Runner(config, ssh, runs, Events(redis_handle.client, redis_handle.prefix))
        restarter.verify_poll = 1.0
        outbox = MemoryOutbox()
        ctx = dataclasses.replace(
            make_context(config, redis_handle, restarter=restarter, outbox=outbox), ssh=ssh
        )
        first = await restarter.verify(
            await restarter.start(await runs.create("dflash", "U-tester", action="start"))
        )
        assert first.verdict is Verdict.RUNNING, (first.verdict_line, first.evidence)
        watcher = Watcher(ctx)
        assert (await watcher.cycle("login"))["dflash"].condition == "ok"  # seen running: its nodes known

        await _until_steps(log, 0, 15)  # past the checkpoint of step 10
        engine = restarter.engines["slurm"]
        assert isinstance(engine, SlurmEngine)
        held = await engine.client.one("dflash", first.slurm_job or 0)
        assert held is not None and len(held.nodelist) == 2, held
        node = held.nodelist[0]  # a high job asking for all of its 8 CPUs
        out = slurm.run(
            "sbatch",
            "--parsable",
            "-o",
            "/dev/null",
            "-p",
            HIGH,
            "-w",
            node,
            "-N1",
            "-n8",
            "--wrap",
            "sleep 600",
        ).stdout
        high = int(out.strip().split(";")[0])
        requeue = await _requeue_run(watcher, ctx.runs, first)
        reached = max(_drafter_steps(log))  # the preempted run's last step: it stopped there

        cause = f"preempted by job {high} (partition {HIGH}) on {node}"
        assert requeue.requeue_cause == cause and requeue.actor is not None and requeue.actor.user == "slurm"
        [told] = [p for p in outbox.of("announce") if p.key == thread_key(requeue.id)]
        assert told.reply.title.startswith(
            f"{requeue.id}: requeued: dflash (Slurm job {first.slurm_job}, restart 1): {cause} at "
        )
        for _ in range(3):  # told once, whatever the cycles after it see
            await watcher.cycle("login")
        assert [p.key for p in outbox.of("announce")] == [thread_key(requeue.id)]

        verified = await _verdict(ctx.service.deliver, requeue.id, lambda: _cluster(slurm))
        line = verified.verdict_line or ""
        assert line.startswith(f"RUNNING 8/8 processes job {first.slurm_job} on 2 nodes, resumed at step "), (
            line,
            verified.evidence,
        )
        facts = parse_line(line)
        assert (facts.resumed_at, facts.reached, facts.lost) == (reached, reached, 0), line
        assert [p.reply.title for p in outbox.of("thread") if p.key == thread_key(requeue.id)][-1] == line

        assert (await ctx.redis.open_store(IncidentStore).incident("dflash")) is None
        [view] = await ctx.service.jobs.read_many(["dflash"], now=time.time())
        assert view.auto_restarts == 0
        answer = await Dispatcher(ctx).handle(Request("history dflash --attempts", VIEWER))
        rows = {row[0]: row for table in answer.tables for row in table.rows}
        assert rows[first.id][5] == f"{cause} (requeued by the scheduler: {requeue.id})", rows
        assert rows[first.id][6] == "0" and rows[requeue.id][2] == f"{reached:,}", rows
    finally:
        await ssh.close()


async def _requeue_run(
    watcher: Watcher, runs: RunStore, first: RunRecord, timeout: float = 120.0
) -> RunRecord:
    """Watch cycles until the job's requeue is recorded as a run of its own (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        await watcher.cycle("login")
        found = [r for r in await runs.recent("dflash") if r.action == "requeue"]
        if found:
            return found[0]
        assert time.monotonic() < deadline, [(r.id, r.action) for r in await runs.recent("dflash")]
        await asyncio.sleep(0.5)  # the cluster's next look


async def _verdict(
    deliver: Callable[[str], Awaitable[RunRecord | None]],
    run_id: str,
    diagnose: Callable[[], str],
    timeout: float = 180.0,
) -> RunRecord:
    """Deliver the run's verification until its verdict is no longer PENDING (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        run = await deliver(run_id)
        if run is not None and run.verdict is not Verdict.PENDING:
            return run
        assert time.monotonic() < deadline, (run.verdict_line if run else None, diagnose())
        await asyncio.sleep(1.0)  # queued by Slurm: its next look


def _cluster(slurm: SlurmCluster) -> str:
    """The cluster's jobs and nodes, for a failure message."""
    jobs = slurm.run("squeue", "-h", "-t", "all", "-o", "%i|%T|%N|%r|%P").stdout
    nodes = slurm.run("sinfo", "-h", "-N", "-o", "%N|%T|%C").stdout
    shown = slurm.run("scontrol", "show", "job", "-o").stdout
    return f"{jobs}{nodes}{shown}"
