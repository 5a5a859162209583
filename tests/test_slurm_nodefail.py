"""A crashed node on the real three-node Slurm cluster: the reference pipeline's job on two nodes
loses one (its ``slurmd`` and every process of the job there SIGKILLed, as a machine that loses
power); Slurm ends the job ``NODE_FAIL``, the node becomes suspect with that evidence, the
automatic restart leaves it out and the verdict names the nodes the job runs on now."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from handlers.outbox import MemoryOutbox
from handlers.request.dispatch import Dispatcher, Request
from handlers.watch.cycle import Watcher
from pipeline.config import AuthSettings, Config, JobConfig
from pipeline.config.jobs import AutoRestart, CrashClass, WatchSettings
from pipeline.engines.runner import Runner
from pipeline.engines.slurm import SlurmEngine, SlurmSettings
from pipeline.host.remote import SSHPool
from pipeline.observe.crashes import classify
from pipeline.state.events import Events
from pipeline.state.incidents import IncidentStore
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunStore
from pipeline.verdict import Verdict
from tests.fixtures.slurm import NODES, SLURMD_TIMEOUT, SlurmCluster
from tests.fixtures.ssh import InProcessHost
from tests.test_attempts import _until_steps
from tests.test_slurm import SlurmStack, context, recheck_until_decided, redis_handle, shared_redis_url  # noqa: F401
from tests.test_slurm_dflash import DFLASH, WRAPPER, pool  # noqa: F401 (a fixture)

ADMIN, VIEWER = "U0ADMIN1", "U0VIEWER1"


def test_a_job_slurm_ended_node_fail_is_node_fail_whatever_its_other_ranks_wrote() -> None:
    """The ranks a node's failure leaves behind die of its collateral (a lost peer); Slurm's word
    decides: ``node_fail``, restarted automatically by default."""
    lost_peer = (
        b"dflash-slurm job 12: 8 tasks on n1 n2\nTraceback (most recent call last):\n"
        b'  File "train.py", line 9, in <module>\nConnectionResetError: [Errno 104] Connection reset by peer\n'
        b"srun: error: Node failure on n2\n"
    )
    crash = classify(lost_peer, exit_signal=None, exit_code=0, pids=[], end_state="NODE_FAIL")
    assert (crash.kind, crash.evidence) == (CrashClass.NODE_FAIL, "Slurm ended the job NODE_FAIL")
    assert classify(lost_peer, exit_signal=None, exit_code=0, pids=[]).kind is CrashClass.PYTHON_EXCEPTION
    assert CrashClass.NODE_FAIL in AutoRestart().on


def _stack(
    slurm: SlurmCluster, host: InProcessHost, redis: RedisHandle, tmp_path: Path, pools: list[SSHPool]
) -> SlurmStack:
    """dflash's ``slurm.sbatch`` on 2 nodes × 4 tasks, ``--no-requeue`` (a node failure ends the job:
    Pitstop's automatic restart, not Slurm's requeue, brings it back), auto_restart on."""
    work = tmp_path / "dflash"
    shutil.copytree(DFLASH, work, ignore=shutil.ignore_patterns("__pycache__"))
    (work / "pitstop.sbatch").write_text(WRAPPER)
    for argv in (["git", "init", "-q"], ["git", "add", "-A"]):
        subprocess.run(argv, cwd=work, check=True, capture_output=True)
    log = work / "train.log"
    args = ["-N", "2", "--ntasks-per-node", "4", "-o", str(log), "--open-mode=append", "--no-requeue"]
    policy = AutoRestart(max=2, within=600, backoff=0.001)  # `on` as by default
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
        start_window=40.0,  # the resume step is the drafters' first line: 11-14 s after launch at load 6
        stop_timeout=20.0,
        checkpoint_dir=str(work / "ckpt"),
        watch=WatchSettings(auto_restart=policy, stall_after=600, degraded_after=600),
    )
    auth = AuthSettings(admins=[ADMIN], viewers=["*"])
    config = Config(hosts={"login": host.host_config()}, jobs={"dflash": job}, auth=auth)
    ssh = SSHPool(config)
    pools.append(ssh)
    runs = RunStore(redis.client, redis.prefix)
    restarter = Runner(config, ssh, runs, Events(redis.client, redis.prefix))
    restarter.verify_poll, restarter.pending_recheck = 1.0, 1.0
    engine = restarter.engines["slurm"]
    assert isinstance(engine, SlurmEngine)
    return SlurmStack(config, "dflash", "dflash-worker", work, slurm, ssh, runs, restarter, engine, redis)


@pytest.mark.timeout(420)
async def test_a_crashed_node_is_node_fail_suspect_and_left_out_by_the_automatic_restart(
    slurm: SlurmCluster,
    ssh_server: InProcessHost,
    redis_handle: RedisHandle,  # noqa: F811
    tmp_path: Path,
    pool: list[SSHPool],  # noqa: F811
) -> None:
    """The job's second node (n2) crashes: within about SlurmdTimeout the job is NODE_FAIL; the
    incident says so (class node_fail) and names n2 suspect with Slurm's word for it; the automatic
    restart runs `restart dflash excluding n2` and its verdict says it runs on n1, n3; `nodes`
    shows n2 down and why it is suspect.  n2 comes back idle afterwards."""
    stack = _stack(slurm, ssh_server, redis_handle, tmp_path, pool)
    first = await stack.start()
    outbox = MemoryOutbox()
    ctx = context(stack, outbox)
    watcher = Watcher(ctx)
    assert (await watcher.cycle("login"))["dflash"].condition == "ok"
    await _until_steps(stack.workdir / "train.log", 0, 12)  # past the checkpoint of step 10
    j = await stack.engine.client.one("dflash", first.slurm_job or 0)
    assert j is not None and len(j.nodelist) == 2, j
    victim = j.nodelist[1]
    others = tuple(n for n in NODES if n != victim)

    slurm.crash(victim)
    try:
        deadline = time.monotonic() + SLURMD_TIMEOUT * 3 + 120
        while not [r for r in await ctx.runs.recent("dflash") if r.id != first.id]:
            assert time.monotonic() < deadline, [p.reply.title for p in outbox.posted]
            await watcher.cycle("login")
        await watcher.drain(120)
        [auto] = [r for r in await ctx.runs.recent("dflash") if r.id != first.id]
        assert auto.exclude == [victim] and auto.requested_by != ADMIN, auto
        done = {s.step.value: s.outcome.value for s in auto.steps}
        assert done["stop"] == done["launch"] == "ok", [s.detail for s in auto.steps]
        ended = await stack.engine.client.one("dflash", first.slurm_job or 0)
        assert ended is not None and ended.state == "NODE_FAIL", ended
        inc = await ctx.redis.open_store(IncidentStore).incident("dflash")
        assert inc is not None and inc.crash_class == CrashClass.NODE_FAIL, inc
        assert inc.suspects and f"{victim} (NODE_FAIL (DOWN" in inc.suspects, inc.suspects

        run = await recheck_until_decided(ctx, stack, auto.id, timeout=180)
        assert run.verdict is Verdict.RUNNING, (run.verdict_line, run.evidence)
        line = run.verdict_line or ""
        assert line.startswith(
            f"RUNNING 8/8 processes job {run.slurm_job} on 2 nodes ({', '.join(others)})"
        ), line
        assert line in [p.reply.title for p in outbox.of("thread")], outbox.posted

        listed = await Dispatcher(ctx).handle(Request("nodes dflash", VIEWER))
        row = next(r for t in listed.tables for r in t.rows if r[0] == victim)
        assert row[1].startswith("DOWN") and "Not responding" in row[3], row
        assert row[-1].startswith("suspect until ") and "NODE_FAIL (DOWN" in row[-1], row
    finally:
        slurm.revive(victim)
    assert slurm.unhealthy() == {}
