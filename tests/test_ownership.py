"""Run ownership: a Pitstop process SIGKILLed mid-run leaves a true record, and the waiter hides nothing.

The holder is a real ``pitstop say … --wait`` process, killed with SIGKILL; the job runs on a
real SSH host (the in-process asyncssh server) against real Redis (both backends).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.runtime.assembly import build_context, close_context
from bot.runtime.scheduler import PitstopScheduler
from handlers.context import Context
from handlers.outbox import MemoryOutbox
from handlers.runs.view import thread_key
from pipeline.config import Config
from pipeline.state import keys
from pipeline.state.events import EventKind
from pipeline.state.runs import OWNER_TTL, RunRecord
from pipeline.verdict import Verdict
from tests.fixtures.ssh import InProcessHost, JobFactory, JobSetup, kill_matching

ROOT = Path(__file__).resolve().parent.parent
ADMIN = "U0ADMIN"
#: the holder's heartbeat lapses within OWNER_TTL; the take-over comes within one tick after it
BOUND = OWNER_TTL + 30.0


def _toml(value: object) -> str:
    return json.dumps(str(value) if isinstance(value, Path) else value)


def write_config(path: Path, setup: JobSetup, redis: Config) -> Path:
    """The TOML a ``pitstop`` subprocess reads: the test's host, job and Redis."""
    host = setup.config.hosts["local"]
    job = setup.job
    lines = [
        "[auth]",
        f"admins = [{_toml(ADMIN)}]",
        "[redis]",
        f"prefix = {_toml(redis.redis.prefix)}",
        *([f"url = {_toml(redis.redis.url)}"] if redis.redis.url else []),
        "[state]",
        f"dir = {_toml(redis.state.dir)}",
        "[hosts.local]",
        f"address = {_toml(host.address)}",
        f"port = {host.port}",
        f"user = {_toml(host.user)}",
        f"known_hosts = {_toml(host.known_hosts)}",
        f"client_keys = [{', '.join(_toml(k) for k in host.client_keys)}]",
        f"[jobs.{setup.name}]",
        'host = "local"',
        f"workdir = {_toml(job.workdir)}",
        f"launch = [{', '.join(_toml(a) for a in job.launch)}]",
        f"log = {_toml(job.log)}",
        f"match = {_toml(job.match)}",
        f"processes = {job.processes}",
        f"start_window = {job.start_window}",
        f"stop_timeout = {job.stop_timeout}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def pitstop(config: Path, *args: str) -> list[str]:
    """The argv of a ``pitstop`` CLI call with this config."""
    return [sys.executable, "-m", "bot.cli", *args, "--config", str(config)]


@dataclass
class World:
    """A job on a real host, its config file, and an in-process Pitstop on the same Redis."""

    setup: JobSetup
    config_path: Path
    ctx: Context
    outbox: MemoryOutbox

    @property
    def job(self) -> str:
        """The job's name."""
        return self.setup.name

    async def start(self) -> RunRecord:
        """Start the job and verify it (in-process)."""
        run = await self.ctx.restarter.start(await self.ctx.runs.create(self.job, ADMIN, action="start"))
        return await self.ctx.restarter.verify(run)

    async def holder(self, text: str) -> asyncio.subprocess.Process:
        """``pitstop say TEXT --wait`` as a separate process (the holder to be killed)."""
        return await asyncio.create_subprocess_exec(
            *pitstop(self.config_path, "say", text, "--wait", "--as", ADMIN),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    async def cli(self, text: str) -> str:
        """``pitstop say TEXT``: a later, unrelated CLI call; its output."""
        proc = await asyncio.create_subprocess_exec(
            *pitstop(self.config_path, "say", text, "--as", ADMIN),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        return out.decode()

    async def await_step(self, after: str, step: str, outcome: str, timeout: float = 60) -> str:
        """The run id of the first STEP event ``step``/``outcome`` of the job after ``after``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        cursor = after
        while (left := deadline - loop.time()) > 0:
            event = await self.ctx.events.wait_for(EventKind.STEP, self.job, after=cursor, timeout=left)
            assert event is not None, f"no {step} {outcome} step within {timeout} s"
            cursor = event.id
            if event.data.get("step") == step and event.data.get("outcome") == outcome:
                return str(event.data["run_id"])
        raise AssertionError(f"no {step} {outcome} step within {timeout} s")


WorldFactory = Callable[..., AbstractAsyncContextManager[World]]


@pytest.fixture
def make_world(
    redis_config: Config, ssh_server: InProcessHost, job_factory: JobFactory, tmp_path: Path
) -> WorldFactory:
    """``async with make_world(opts=[...]) as world``: a job, its config file, an in-process Pitstop."""

    @contextlib.asynccontextmanager
    async def make(
        opts: Sequence[str] = (), stop_timeout: float = 10.0, start_window: float = 15.0
    ) -> AsyncIterator[World]:
        setup = job_factory(ssh_server, opts=opts, stop_timeout=stop_timeout, start_window=start_window)
        config = setup.config.model_copy(update={"redis": redis_config.redis, "state": redis_config.state})
        setup = JobSetup(config, setup.name, setup.token, setup.workdir, setup.log, setup.host)
        outbox = MemoryOutbox()
        ctx = await build_context(config, outbox)
        try:
            yield World(setup, write_config(tmp_path / "pitstop.toml", setup, redis_config), ctx, outbox)
        finally:
            await close_context(ctx)
            kill_matching(setup.token)

    return make


@pytest.fixture
async def world(make_world: WorldFactory) -> AsyncIterator[World]:
    """A SIGTERM-ignoring job (its stop waits 120 s for it before SIGKILL)."""
    async with make_world(opts=["ignore_term=1"], stop_timeout=120.0) as w:
        yield w


@pytest.fixture
async def plain_world(make_world: WorldFactory) -> AsyncIterator[World]:
    """A job that stops on SIGTERM."""
    async with make_world() as w:
        yield w


def _kill(proc: asyncio.subprocess.Process) -> None:
    os.kill(proc.pid, signal.SIGKILL)


@pytest.mark.timeout(300)
async def test_holder_killed_mid_stop_next_cli_call_says_what_the_host_shows(world: World) -> None:
    """SIGKILL mid-stop, no Pitstop running: the next CLI call records INTERRUPTED during stop with the old pid alive."""
    first = await world.start()
    after = await world.ctx.events.last_id()
    holder = await world.holder(f"restart {world.job}")
    try:
        run_id = await world.await_step(after, "stop", "running")
    finally:
        _kill(holder)
        await holder.wait()
    stuck = await world.ctx.runs.get(run_id)
    assert stuck.verdict is None and stuck.owner is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND
    while True:  # before the heartbeat lapses, a CLI call must leave the run alone
        out = await world.cli(f"history {world.job}")
        run = await world.ctx.runs.get(run_id)
        if run.verdict is not None:
            break
        assert loop.time() < deadline, out
        await asyncio.sleep(2)
    assert run.verdict is Verdict.INTERRUPTED
    assert run.verdict_line == (
        f"INTERRUPTED during stop: the old run (pid {first.pid}) is still alive, 1/1 processes"
    ), run.verdict_line
    assert run.verdict_line in out  # the call that took it over says so
    assert run.finished_at is not None and not await world.ctx.runs.client.sismember(
        keys.runs_open(world.ctx.runs.prefix), run.id
    )


@pytest.mark.timeout(300)
async def test_holder_killed_mid_stop_serve_replica_marks_it_without_a_cli_call(world: World) -> None:
    """SIGKILL mid-stop while a replica's scheduler runs: marked within TTL + one tick, and its thread is told."""
    first = await world.start()
    scheduler = PitstopScheduler(world.ctx, leader_ttl=3.0)
    await scheduler.start()
    try:
        after = await world.ctx.events.last_id()
        holder = await world.holder(f"restart {world.job}")
        try:
            run_id = await world.await_step(after, "stop", "running")
        finally:
            _kill(holder)
            await holder.wait()
        killed_at = asyncio.get_running_loop().time()
        event = await world.ctx.events.wait_for(EventKind.VERDICT, world.job, after=after, timeout=BOUND)
        assert event is not None and event.data["run_id"] == run_id
        assert (
            asyncio.get_running_loop().time() - killed_at <= OWNER_TTL + 2 * scheduler.lease.renew_every + 5
        )
    finally:
        await scheduler.stop()
    run = await world.ctx.runs.get(run_id)
    assert run.verdict_line == (
        f"INTERRUPTED during stop: the old run (pid {first.pid}) is still alive, 1/1 processes"
    )
    told = [p.reply.title for p in world.outbox.of("thread") if p.key == thread_key(run_id)]
    assert run.verdict_line in told


@pytest.mark.timeout(300)
async def test_holder_killed_after_launch_is_interrupted_and_verified_once(plain_world: World) -> None:
    """SIGKILL after the launch: the run says INTERRUPTED after launch, and its verification still happens, once."""
    await plain_world.start()
    after = await plain_world.ctx.events.last_id()
    holder = await plain_world.holder(f"restart {plain_world.job}")
    try:
        run_id = await plain_world.await_step(after, "launch", "ok", timeout=180)
    finally:
        _kill(holder)
        await holder.wait()
    launched = await plain_world.ctx.runs.get(run_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND + 60
    while True:
        await plain_world.cli(f"status {plain_world.job}")
        run = await plain_world.ctx.runs.get(run_id)
        if run.verdict is not None:
            break
        assert loop.time() < deadline, run
        await asyncio.sleep(2)
    assert run.interrupted == f"INTERRUPTED after launch: pid {launched.pid} running 1/1 (unverified)"
    assert run.verdict is Verdict.RUNNING and run.verdict_line == f"RUNNING 1/1 processes pid {launched.pid}"
    await plain_world.cli(f"status {plain_world.job}")  # a later call delivers nothing again
    verdicts, cursor = [], after
    while (
        event := await plain_world.ctx.events.wait_for(
            EventKind.VERDICT, plain_world.job, after=cursor, timeout=1
        )
    ) is not None:
        cursor = event.id
        verdicts += [event] if event.data.get("run_id") == run_id else []
    assert len(verdicts) == 1


async def test_waiter_is_not_counted_nor_killed_by_the_jobs_pattern(world: World) -> None:
    """`pgrep -f MATCH` counts the trainers only; `pkill -9 -f MATCH` leaves the waiter, whose record names SIGKILL."""
    setup = world.setup
    run = await world.ctx.restarter.start(await world.ctx.runs.create(world.job, ADMIN, action="start"))
    found = subprocess.run(["pgrep", "-f", setup.token], capture_output=True, text=True)
    assert [int(p) for p in found.stdout.split()] == [run.pid]
    waiters = subprocess.run(["pgrep", "-af", "^pitstop-waiter "], capture_output=True, text=True).stdout
    assert re.search(rf"^\d+ pitstop-waiter {world.job} {run.id}$", waiters, re.MULTILINE), waiters
    subprocess.run(["pkill", "-KILL", "-f", setup.token], check=False)  # a person's `pkill -9 -f`
    verified = await world.ctx.restarter.verify(run)
    assert verified.verdict is Verdict.EXITED
    assert verified.verdict_line is not None and verified.verdict_line.startswith("EXITED signal SIGKILL")


@pytest.mark.timeout(300)
async def test_say_wait_exits_without_a_warning(make_world: WorldFactory) -> None:
    """``pitstop say "restart JOB" --wait`` under ``-W error``: exit 0 with the verdict, and nothing on stderr
    (no ``coroutine … was never awaited`` at its exit)."""
    async with make_world(start_window=3.0) as w:
        await w.start()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-W", "error",
            *pitstop(w.config_path, "say", f"restart {w.job}", "--wait", "--as", ADMIN)[1:],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0 and "RUNNING" in out.decode(), (out.decode(), err.decode())
    assert err.decode() == ""


@pytest.mark.timeout(300)
async def test_say_wait_into_head_then_history_the_run_has_its_verdict(make_world: WorldFactory) -> None:
    """``pitstop say "restart JOB" --wait | head -1`` (a real pipe): the first line only, no traceback, and
    after a plain ``history`` the run has its verdict (a reader that leaves never aborts a run)."""
    async with make_world(start_window=3.0) as w:
        await w.start()
        say = " ".join(
            shlex.quote(a) for a in pitstop(w.config_path, "say", f"restart {w.job}", "--wait", "--as", ADMIN)
        )
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", f"set -o pipefail; {say} | head -1",
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 240)
        assert out.decode().startswith("queued run r-2") and out.decode().count("\n") == 1, out.decode()
        assert "Traceback" not in err.decode() and "went wrong" not in err.decode(), err.decode()
        assert proc.returncode == 0, err.decode()
        history = await w.cli(f"history {w.job}")
        run = await w.ctx.runs.get("r-2")
    assert run.verdict is Verdict.RUNNING, (run.verdict_line, history)
    assert run.verdict_line is not None and run.verdict_line in " ".join(history.split())


@pytest.mark.timeout(300)
async def test_any_cli_call_verifies_a_handed_over_run_that_is_due(plain_world: World) -> None:
    """A run handed over by a process that exited after its launch, its verification due, is verified by the
    next ``pitstop say`` of any verb (here ``history``), not left ``launched, awaiting verdict``."""
    w = plain_world
    gone = await build_context(w.ctx.config, MemoryOutbox())
    run = await gone.restarter.start(await gone.runs.create(w.job, ADMIN, action="start"))
    await close_context(gone)  # a clean exit: the launched run is handed over, still queued
    assert (await w.ctx.runs.get(run.id)).owner is None
    await w.ctx.service.queue.requeue(run.id, 0.0)  # its start window has passed
    history = await w.cli(f"history {w.job}")
    verified = await w.ctx.runs.get(run.id)
    assert verified.verdict is Verdict.RUNNING, history
    assert verified.verdict_line is not None and verified.verdict_line in " ".join(history.split())
    assert await w.ctx.service.queue.due_at(run.id) is None
