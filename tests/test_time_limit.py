"""Warned stops save work: ``[jobs.NAME.slurm] signal`` (sbatch ``--signal``) makes the reference
pipeline checkpoint before its time limit, a job ended at its time limit is told as such (the step
it reached, the checkpoint it left), and ``resubmit_on_timeout`` resubmits it, verified like a
restart — on the real test cluster."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from handlers.outbox import MemoryOutbox
from handlers.request.auth import SYSTEM_USER
from handlers.watch.cycle import Watcher
from pipeline.config import Config, JobConfig, WatchSettings, validation_problems
from pipeline.config.jobs import CrashClass
from pipeline.engines.runner import Runner
from pipeline.engines.slurm import SlurmEngine, SlurmSettings
from pipeline.host.remote import SSHPool
from pipeline.observe.crashes import at_time_limit, classify
from pipeline.state.events import Events
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunStore
from pipeline.verdict import Verdict, parse_line
from tests.fixtures.slurm import SlurmCluster
from tests.fixtures.ssh import InProcessHost
from tests.support_handlers import make_context
from tests.test_attempts import _drafter_steps
from tests.test_slurm import redis_handle, shared_redis_url  # noqa: F401  (the module's Redis)
from tests.test_slurm_dflash import DFLASH, pool  # noqa: F401 (a fixture)

WRAPPER = """\
#!/bin/bash
exec bash slurm.sbatch --cpu --profile tiny --checkpoint-dir ckpt --metric-every 1
"""
SAID = re.compile(r"drafter rank 5: checkpoint step (\d+) on SIGUSR1 in ")
#: seconds a ``--time=1`` job may run: Slurm checks time limits every 30 s, so it ends 60-90 s after
#: it started; its warning signal comes up to one such check (and 30 s more) before that, so
#: ``USR1@1`` comes one check before the limit
LIMIT_S = 100.0


def _problems(**fields: object) -> list[str]:
    """What the config says of ``[jobs.j.slurm]`` with ``fields``."""
    try:
        SlurmSettings.model_validate({"script": "/s", **fields})
    except ValidationError as exc:
        return validation_problems(exc, "jobs.j.slurm", SlurmSettings)
    return []


def test_signal_key_adds_sbatch_signal_and_refuses_what_slurm_or_the_job_would_not_take() -> None:
    """``signal`` becomes ``--signal=…`` after sbatch_args; B:, an unknown signal and bad seconds are named."""
    ok = SlurmSettings(script="/s", sbatch_args=["-N", "2"], signal="USR1@120")
    assert ok.submit_args == ["-N", "2", "--signal=USR1@120"]
    assert SlurmSettings(script="/s").submit_args == []
    assert [_problems(signal=s) for s in ("SIGUSR2", "10@0", "USR1")] == [[], [], []]
    assert _problems(signal="B:USR1@120") == [
        "jobs.j.slurm.signal: 'B:USR1@120': no B: here - B: sends the signal only to the batch shell, "
        "which does not pass it on to the training; write 'USR1@120' and every job step (the training's "
        "tasks) gets it"
    ]
    assert _problems(signal="USR9@60") == [
        "jobs.j.slurm.signal: 'USR9@60': 'USR9' is not a signal: write a name (USR1, TERM) or a number, "
        "then @SECONDS - did you mean USR2?"
    ]
    assert _problems(signal="USR1@70000") == [
        "jobs.j.slurm.signal: 'USR1@70000': '70000' after @ must be whole seconds before the time limit, "
        "0 to 65535"
    ]
    assert _problems(resubmit_on_timout=True)[0].endswith("did you mean resubmit_on_timeout?")


def test_a_time_limit_is_told_with_the_step_reached_and_the_checkpoint_left() -> None:
    """TIMEOUT: ``reached its time limit at step S, checkpoint at step C``; other crashes untouched."""
    log = b'{"role": "drafter", "rank": 5, "step": 41}\n{"role": "drafter", "rank": 5, "step": 42}\n'
    timeout = at_time_limit(classify(log, end_state="TIMEOUT"), 40)
    assert (timeout.kind, timeout.step) == (CrashClass.TIME_LIMIT, 42)
    assert (
        timeout.summary
        == "time_limit: reached its time limit at step 42, checkpoint at step 40 (Slurm: TIMEOUT)"
    )
    assert at_time_limit(classify(b"", end_state="TIMEOUT"), None).evidence == (
        "reached its time limit, no checkpoint (Slurm: TIMEOUT)"
    )
    preempted = classify(log, end_state="PREEMPTED")
    assert at_time_limit(preempted, 40) == preempted


def _free_port_pair() -> int:
    """A free TCP port P on loopback with P + 1 free too (the task-0 queue and the drafters' rendezvous)."""
    while True:
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return int(port)


async def _until(what: str, timeout: float, check: Callable[[], Awaitable[object]]) -> object:
    """Await ``check()`` until it is truthy, at most ``timeout`` s (the cluster's own pace)."""
    deadline = time.monotonic() + timeout
    while not (value := await check()):
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        await asyncio.sleep(0.3)
    return value


@pytest.mark.timeout(300)
async def test_time_limited_job_checkpoints_on_the_warning_is_told_and_resubmitted(
    slurm: SlurmCluster,
    ssh_server: InProcessHost,
    redis_handle: RedisHandle,  # noqa: F811
    tmp_path: Path,
    pool: list[SSHPool],  # noqa: F811
) -> None:
    """dflash with ``--time=1``, ``signal = "USR1@1"``, ``resubmit_on_timeout``: a checkpoint on
    SIGUSR1 while the job still runs; Slurm ends it TIMEOUT; the alert says the step it reached and
    the checkpoint it left; it is resubmitted (no auto_restart, no attempt spent) and the new job's
    verdict says it resumed at that checkpoint."""
    work = tmp_path / "dflash"
    shutil.copytree(DFLASH, work, ignore=shutil.ignore_patterns("__pycache__"))
    (work / "pitstop.sbatch").write_text(WRAPPER)
    for argv in (["git", "init", "-q"], ["git", "add", "-A"]):
        subprocess.run(argv, cwd=work, check=True, capture_output=True)
    log, ckpt = work / "train.log", work / "ckpt"
    # one node, n3: the session's other Slurm tests use n1 and n2 (on a machine several sessions share,
    # their tasks there carry the same node names and job ids)
    args = ["-N", "1", "-w", "n3", "--ntasks-per-node", "8", "--time=1", "-o", str(log), "--open-mode=append"]
    job = JobConfig(
        host="login",
        engine="slurm",
        slurm=SlurmSettings(
            script=str(work / "pitstop.sbatch"),
            sbatch_args=args,
            nodes=1,
            tasks_per_node=8,
            signal="USR1@1",
            resubmit_on_timeout=True,
        ).model_dump(),
        # its own queue port (not 20000 + job id: another cluster on this machine may hold that one)
        exec=[*slurm.exec_prefix, f"PYTHON={sys.executable}", f"MASTER_PORT={_free_port_pair()}"],
        workdir=str(work),
        log=str(log),
        match="^dflash-worker ",
        start_window=30.0,
        stop_timeout=20.0,
        checkpoint_dir=str(ckpt),
        watch=WatchSettings(interval=1, stall_after=600, degraded_after=600, warmup=600),
    )
    config = Config(hosts={"login": ssh_server.host_config()}, jobs={"dflash": job})
    ssh = SSHPool(config)
    pool.append(ssh)
    runs = RunStore(redis_handle.client, redis_handle.prefix)
    restarter = Runner(config, ssh, runs, Events(redis_handle.client, redis_handle.prefix))
    restarter.verify_poll = 1.0
    engine = restarter.engines["slurm"]
    assert isinstance(engine, SlurmEngine)
    outbox = MemoryOutbox()
    ctx = dataclasses.replace(make_context(config, redis_handle, restarter=restarter, outbox=outbox), ssh=ssh)

    first = await restarter.start(await runs.create("dflash", "U-tester", action="start"))
    assert first.verdict is None, (first.verdict_line, [s.detail for s in first.steps])
    job_id = first.slurm_job or 0
    first = await restarter.verify(first)  # the warning may come meanwhile: awaited in the log below
    assert first.verdict is Verdict.RUNNING, (first.verdict_line, first.evidence)
    submitted = await engine.client.one("dflash", job_id)
    assert submitted is not None

    async def warned() -> int | None:
        found = SAID.findall(log.read_text(errors="replace")) if log.exists() else []
        return int(found[0]) if found else None

    saved = await _until("the checkpoint on SIGUSR1", LIMIT_S, warned)
    assert isinstance(saved, int) and saved >= 1
    now = await engine.client.one("dflash", job_id)
    assert now is not None and now.state == "RUNNING", now  # saved before the limit
    assert (ckpt / f"step-{saved:06d}" / "manifest.json").exists()
    watcher = Watcher(ctx)
    await watcher.cycle("login")  # seen running: its end is news

    async def ended() -> str | None:
        j = await engine.client.one("dflash", job_id)
        return j.state if j is not None and not j.active else None

    assert await _until("the time limit", LIMIT_S, ended) == "TIMEOUT"
    lines = [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{") and '"step"' in ln]
    reached = max(rec["step"] for rec in lines)  # any rank's: what the log says the job reached
    drafted = max(_drafter_steps(log, first.log_size_at_launch or 0))
    kept = json.loads((ckpt / "latest.json").read_text())["step"]  # the warning's, or the stop's after it
    assert kept >= saved

    async def resubmitted() -> list[str]:
        await watcher.cycle("login")
        return [r.id for r in await runs.recent("dflash", 10) if r.requested_by == SYSTEM_USER]

    auto_ids = await _until("the resubmission", 60, resubmitted)
    assert isinstance(auto_ids, list) and len(auto_ids) == 1, auto_ids
    auto_id = auto_ids[0]
    alerts = [p.reply for p in outbox.of("announce") if (p.key or "").startswith("incident:")]
    assert len(alerts) == 1, [(p.key, p.reply.title) for p in outbox.posted]
    alert = alerts[0]
    told = f"time_limit: reached its time limit at step {reached}, checkpoint at step {kept} (Slurm: TIMEOUT)"
    assert f"detected cause: {told}" in alert.lines, alert.lines
    notes = [p.reply.title for p in outbox.of("thread")]
    assert any(
        n.startswith("resubmitted dflash after reaching its time limit (resubmit_on_timeout") for n in notes
    ), notes
    await watcher.drain(60)
    auto = await runs.get(auto_id)
    auto = await restarter.verify(auto) if auto.verdict is None else auto
    assert auto.auto and auto.slurm_job not in (None, job_id), auto.verdict_line
    assert auto.verdict is Verdict.RUNNING, (auto.verdict_line, auto.evidence)
    facts = parse_line(auto.verdict_line or "")
    assert (facts.resumed_at, facts.reached) == (kept, drafted), auto.verdict_line
    view = await ctx.service.jobs.read("dflash")
    assert view.auto_restarts == 0  # not an auto_restart attempt
