"""Resume proof: verify reads where a new run started and flags one that ignored its checkpoint."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pipeline.config import Config
from pipeline.engines.runner import Runner
from pipeline.host.helper import checkpoint_info, start_step
from pipeline.host.remote import SSHPool
from pipeline.observe.evidence import Observation, decide
from pipeline.observe.resume import ResumePoint, check_resume
from pipeline.state.events import Events
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunRecord, RunStore
from pipeline.verdict import Verdict
from tests.fixtures.ssh import InProcessHost, JobFactory, JobSetup
from tests.test_restart import _ev, _run


def _decide(run: RunRecord, ev: Observation) -> tuple[Verdict, str]:
    verdict, line, _ = decide(run, ev)
    return verdict, line


def test_verdict_line_says_where_the_run_started() -> None:
    """Resumed → ``, resumed at step N``; from 0 with an older checkpoint → the ignored-checkpoint line."""
    assert _decide(_run(), _ev(start_step=12000)) == (
        Verdict.RUNNING,
        "RUNNING 8/8 processes pid 4242, resumed at step 12000",
    )
    old = ResumePoint("/w/ckpt/latest.json", 12000, age_s=60.0)  # written 50 s before the launch
    assert _decide(_run(), _ev(start_step=0, checkpoint=old)) == (
        Verdict.RUNNING,
        "RUNNING 8/8 processes pid 4242, started from step 0 although checkpoint step 12000 exists",
    )
    assert _decide(_run(), _ev(start_step=0))[1] == "RUNNING 8/8 processes pid 4242"
    assert _decide(_run(), _ev())[1] == "RUNNING 8/8 processes pid 4242"  # start not seen: nothing said
    assert _decide(_run(), _ev(start_step=0, checkpoint=old, count=5))[0] is Verdict.WRONG_COUNT


def test_a_checkpoint_written_after_the_launch_does_not_count() -> None:
    """Only a checkpoint that existed at the launch (older than the time since it) can be ignored."""
    mine = ResumePoint("/w/ckpt/latest.json", 20, age_s=3.0)
    assert check_resume(0, mine, since_launch_s=10.0) is None
    assert check_resume(0, mine, since_launch_s=2.0) == 20
    assert check_resume(0, ResumePoint("/w/ckpt/x.pt", None, 99.0), 10.0) is None  # no step known
    assert check_resume(20, mine, 2.0) == check_resume(20, None, 2.0)
    assert ResumePoint.from_helper({"step": 5, "mtime": 100.0, "file": "/c/latest.json"}, 130.0) == (
        ResumePoint("/c/latest.json", 5, 30.0)
    )
    assert ResumePoint.from_helper(None, 130.0) is None


def test_helper_reads_the_start_step_and_the_newest_checkpoint(tmp_path: Path) -> None:
    """start_step: the resume line, else the ranks' first metric steps; checkpoint_info: latest.json, else a name."""
    log = tmp_path / "train.log"
    old = b'{"step":7,"role":"drafter","rank":5}\n'
    log.write_bytes(
        old + b"dflash-main pid 1 targets=[cpu x5] drafters=[cpu x3] profile=tiny resume_step=40\n"
        b'{"ts":1,"event":"waiting","rank":1,"rank_role":"target","step":3,"on":"queue"}\n'
        b'{"ts":1,"event":"waiting","rank":2,"role":"target","step":90,"on":"queue"}\n'
        b'{"step":1,"role":"target","rank":0}\n{"step":41,"role":"drafter","rank":5}\n'
    )
    assert start_step(str(log), len(old)) == {"said": 40, "first": 40}
    log.write_bytes(old + b'{"step":1,"role":"target","rank":0}\n{"step":1,"role":"drafter","rank":5}\n')
    assert start_step(str(log), len(old)) == {"said": None, "first": 0}
    assert start_step(str(tmp_path / "missing.log"), 0) == {"said": None, "first": None}
    # a team's plain JSON lines (no role): a step and a rate or loss; other objects with a step are not
    log.write_bytes(old + b'{"step":3,"epoch":1}\n{"step":38,"tokens_per_s":900,"loss":1.0}\n')
    assert start_step(str(log), len(old)) == {"said": None, "first": 37}

    ckpt = tmp_path / "ckpt"
    assert checkpoint_info(str(ckpt)) is None
    ckpt.mkdir()
    (ckpt / "step_500.pt").write_bytes(b"x")
    assert checkpoint_info(str(ckpt))["step"] == 500  # type: ignore[index]
    (ckpt / "latest.json").write_text(json.dumps({"step": 12000}))
    info = checkpoint_info(str(ckpt))
    assert info is not None and info["step"] == 12000 and info["file"].endswith("latest.json")


# --- over SSH, on a real process ------------------------------------------------------------------


@pytest.fixture
async def pool_and_store(redis_handle: RedisHandle) -> AsyncIterator[tuple[list[SSHPool], RedisHandle]]:
    """SSH pools closed after the test, and the test's Redis."""
    pools: list[SSHPool] = []
    yield pools, redis_handle
    for pool in pools:
        await pool.close()


def _resuming_job(setup: JobSetup, said: str, ckpt: Path) -> JobSetup:
    """The loop job behind a launcher line ``resume_step=SAID``, with ``checkpoint_dir`` set."""
    wrapper = ["/bin/bash", "-c", 'echo "trainer resume_step=$0"; exec "$@"', said]
    return setup.with_job(launch=[*wrapper, *setup.job.launch], checkpoint_dir=str(ckpt), start_window=1.5)


@pytest.mark.parametrize("said", ["12000", "0"])
async def test_verify_reads_the_resume_step_and_flags_an_ignored_checkpoint(
    ssh_server: InProcessHost,
    job_factory: JobFactory,
    pool_and_store: tuple[list[SSHPool], RedisHandle],
    tmp_path: Path,
    said: str,
) -> None:
    """A run that says resume_step=12000 verifies 'resumed at step 12000'; one starting at 0 beside a
    step-12000 checkpoint verifies RUNNING with the ignored-checkpoint line and a thread warning."""
    pools, handle = pool_and_store
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "latest.json").write_text(json.dumps({"step": 12000}))
    os.utime(ckpt / "latest.json", (os.path.getmtime(ckpt) - 30,) * 2)  # written well before the launch
    setup = _resuming_job(job_factory(ssh_server), said, ckpt)
    ssh = SSHPool(setup.config)
    pools.append(ssh)
    runs = RunStore(handle.client, handle.prefix)
    restarter = Runner(setup.config, ssh, runs, Events(handle.client, handle.prefix))
    run = await restarter.start(await runs.create(setup.name, "U-tester", action="start"))
    assert run.pid is not None, run.steps
    run = await restarter.verify(run)
    assert run.verdict is Verdict.RUNNING, run.evidence
    if said == "12000":
        assert run.verdict_line == f"RUNNING 1/1 processes pid {run.pid}, resumed at step 12000"
        assert run.warning is None
    else:
        assert run.verdict_line == (
            f"RUNNING 1/1 processes pid {run.pid}, started from step 0 although checkpoint step 12000 exists"
        )
        assert run.warning is not None and "checkpoint step 12000" in run.warning
    assert f"checkpoint {ckpt / 'latest.json'}: step 12000, written" in run.evidence


async def test_a_flagged_run_gets_a_warning_beside_its_verdict(tmp_path: Path, redis_config: Config) -> None:
    """A RUNNING run that ignored its checkpoint: the verdict post, then a WARNING post in its thread."""
    from pipeline.state import keys
    from tests.test_watch import open_harness

    async with open_harness(tmp_path, redis_config, {"train": {"start_window": 1.0}}) as h:
        ctx = h.ctx
        run = await h.launch("train")  # verified RUNNING
        assert run.verdict is Verdict.RUNNING
        run.warning = "⚠ train started from step 0 although checkpoint step 12000 exists (/c/latest.json)"
        await ctx.runs.record_step(run)
        await ctx.redis.client.zadd(keys.runs_unverified(ctx.redis.prefix), {run.id: 0})
        assert [r.id for r in await ctx.service.deliver_due()] == [run.id]
        posts = [(p.key, p.reply.title, p.reply.status.value) for p in ctx.outbox.of("thread")]
        assert posts == [
            (f"run:{run.id}", run.verdict_line, "ok"),
            (f"run:{run.id}", run.warning, "warning"),
        ]
