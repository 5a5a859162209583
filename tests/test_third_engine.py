"""A third engine (tests/localengine.py, ``engine = "local"`` in the registry the runner is built
with) is driven by the runner, the verdict, status, the watcher and recovery with no change outside
its own module, and with no SSH host at all: every SSH call would be counted, and none is made."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import bot.runtime.assembly
from bot.runtime.assembly import build_context, close_context
from handlers.context import Context
from handlers.outbox import MemoryOutbox
from handlers.request.dispatch import Dispatcher, Request
from handlers.watch.cycle import Watcher
from pipeline.config import AuthSettings, Config, HostConfig, SlackSettings, load_config
from pipeline.engines import ENGINES
from pipeline.engines.base import check_engines
from pipeline.engines.runner import Runner
from pipeline.errors import ConfigError, HostUnreachable
from pipeline.host.remote import RemoteResult
from pipeline.state.runs import RunStore
from pipeline.verdict import Step, Verdict
from tests.localengine import LocalEngine
from tests.test_restart import processes
from tests.test_watch import MENTION, job_config, until

WITH_LOCAL = {**ENGINES, "local": LocalEngine}


@dataclass
class NoSSH:
    """The SSH pool of a Pitstop process whose job has no SSH host: every call is counted and refused."""

    config: Config
    calls: list[str] = field(default_factory=list)

    def _refuse(self, host: str, what: object) -> HostUnreachable:
        self.calls.append(f"{host}: {what}")
        return HostUnreachable(host, "no SSH in this test")

    async def run(self, host: str, argv: Sequence[str], **kw: Any) -> RemoteResult:
        """Refused."""
        raise self._refuse(host, argv)

    async def run_job(self, job: str, argv: Sequence[str], **kw: Any) -> RemoteResult:
        """Refused."""
        raise self._refuse(job, argv)

    async def check(self, host: str) -> None:
        """Refused."""
        raise self._refuse(host, "check")

    async def close(self) -> None:
        """Nothing to close."""


@dataclass
class Local:
    """A Pitstop process whose one job ``train`` runs on the local engine."""

    ctx: Context
    outbox: MemoryOutbox
    dispatcher: Dispatcher
    ssh: NoSSH

    async def say(self, text: str) -> str | None:
        """Dispatch ``text`` as the operator; wait for the sequence; the run id it started."""
        reply = await self.dispatcher.handle(Request(text=text, user="U0TEST", delivery_id=uuid.uuid4().hex))
        await self.dispatcher.drain(60)
        return reply.run_id


@pytest.fixture
async def local(
    tmp_path: Path, redis_config: Config, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Local]:
    """The job's worker script under ``tmp_path``, a context with the real runner and the local
    engine, and an SSH pool that refuses (and counts) every call: its host is a name only."""
    job = job_config(tmp_path / "jobs", "train", uuid.uuid4().hex, stall_after=30)
    pools: list[NoSSH] = []
    monkeypatch.setattr(
        bot.runtime.assembly, "SSHPool", lambda config: pools.append(NoSSH(config)) or pools[-1]
    )
    config = redis_config.model_copy(
        update={
            "hosts": {"local": HostConfig(address="no-ssh.invalid")},
            "jobs": {"train": job.model_copy(update={"engine": "local"})},
            "slack": SlackSettings(alert_mention="S0ONCALL", announce_channel="CANNOUNCE"),
            "auth": AuthSettings(operators=["U0TEST"], viewers=["*"]),
        }
    )
    outbox = MemoryOutbox()
    ctx = await build_context(config, outbox, instance="A", engines=WITH_LOCAL)
    assert isinstance(ctx.restarter, Runner)
    ctx.restarter.verify_poll = 0.1
    yield Local(ctx, outbox, Dispatcher(ctx), pools[0])
    await Local(ctx, outbox, Dispatcher(ctx), pools[0]).say("stop train")
    await close_context(ctx)


async def alerted(local: Local) -> bool:
    """An alert headline (with the on-call mention) was posted."""
    return any(MENTION in p.reply.lines[0] for p in local.outbox.of("announce") if p.reply.lines)


def test_config_accepts_a_registered_engine_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    """``engine = "local"`` passes the check of a registry that has it, whatever was imported before;
    ``engine = "k8s"`` is refused, naming the known ones; check-config knows the shipped ones only."""
    text = """[hosts.h]\naddress = "127.0.0.1"\nuser = "u"\n
[jobs.j]\nhost = "h"\nengine = "{}"\nworkdir = "/w"\nlaunch = ["x"]\nlog = "/w/l"\nmatch = "x"\n"""
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text(text.format("local"))
    bad.write_text(text.format("k8s"))
    check_engines(load_config(good), WITH_LOCAL)
    with pytest.raises(ConfigError) as refused:
        check_engines(load_config(bad), WITH_LOCAL)
    assert refused.value.problems == [
        'jobs.j.engine: unknown engine \'k8s\': use one of "local", "slurm", "ssh"'
    ]
    with pytest.raises(ConfigError, match="unknown engine 'local'"):
        check_engines(load_config(good), ENGINES)


async def test_restart_verify_status_watch_and_recovery_on_a_third_engine(local: Local) -> None:
    """start → RUNNING, status shows it, restart replaces the pid, a kill is alerted by the watcher,
    and runs of a dead owner are reconciled (before and after their launch) through the engine."""
    ctx, runner = local.ctx, local.ctx.restarter
    assert isinstance(runner, Runner)
    first = await ctx.service.deliver(await local.say("start train") or "")
    assert first is not None and first.verdict_line == f"RUNNING 1/1 processes pid {first.pid}", first
    assert first.evidence is not None and first.evidence.startswith(f"pid {first.pid}: alive")

    status = await local.dispatcher.handle(Request(text="status", user="U0TEST", delivery_id="s1"))
    row = dict(zip(status.tables[0].headers, status.tables[0].rows[0], strict=True))
    assert (row["state"], row["pid"], row["procs"]) == ("running", str(first.pid), "1/1"), row

    second = await ctx.service.deliver(await local.say("restart train") or "")
    assert second is not None and second.verdict is Verdict.RUNNING and second.old_pid == first.pid
    assert second.pid != first.pid and (await processes(runner, "train")).pids == (second.pid,)

    watcher = Watcher(ctx)
    await watcher.cycle("local", ["train"])
    assert not await alerted(local)
    os.killpg(second.pid or 0, signal.SIGKILL)
    assert await until(lambda: alerted(local), 10, lambda: watcher.cycle("local", ["train"]))

    dead = RunStore(ctx.redis.client, ctx.redis.prefix)  # a replica that died: no heartbeat behind its runs
    launched = await dead.create("train", "U0TEST", action="start")
    launched.owner = "replica-killed"
    launched = await runner.start(launched)
    cut = await dead.create("train", "U0TEST")
    cut.owner = "replica-killed"
    cut.old_pid = launched.pid
    await runner.runs.record_step(cut)
    await runner.steps.begin(cut, Step.STOP)  # its owner died in the stop
    found = {i.run.id: (i.line, i.launched) for i in await ctx.service.recover()}
    assert found == {
        launched.id: (f"INTERRUPTED after launch: pid {launched.pid} running 1/1 (unverified)", True),
        cut.id: (
            f"INTERRUPTED during stop: the old run (pid {launched.pid}) is still alive, 1/1 processes",
            False,
        ),
    }
    verified = await ctx.service.deliver(launched.id)
    assert verified is not None and verified.verdict_line == f"RUNNING 1/1 processes pid {launched.pid}"
    assert local.ssh.calls == []  # not one SSH call: the engine did everything
