"""Slurm runs as people meet them: typed in Slack (Bolt, the dispatcher, the fake Slack), cut off
after their launch, and taken over when the replica that ran them died — on the real two-node
cluster, its login node over real SSH."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from bot.runtime.serve import SlackRuntime, http_app, open_runtime, start_http
from handlers.outbox import MemoryOutbox
from handlers.text import launch_summary
from pipeline.config import Config
from pipeline.state import keys
from pipeline.state.events import EventKind
from pipeline.verdict import Outcome, Step, Verdict
from tests.fixtures.slack import (
    BOT_TOKEN,
    SIGNING_SECRET,
    FakeSlack,
    form_body,
    sign,
    slack_config,
    slash_command,
)
from tests.test_slurm import (  # noqa: F401 (fixtures)
    MakeSlurm,
    SlurmStack,
    context,
    make_slurm,
    redis_handle,
    shared_redis_url,
)

TIMEOUT = 90.0  #: seconds for a restart on the cluster to reach its verdict (2 cores, shared)


@dataclass
class Served:
    """``pitstop serve`` (HTTP) for one Slurm job, answering the fake Slack."""

    stack: SlurmStack
    fake: FakeSlack
    runtime: SlackRuntime
    url: str
    http: aiohttp.ClientSession

    async def command(self, text: str, user: str = "U0OPERATOR1") -> str:
        """A signed slash command by ``user``; the answer that follows its empty ack on the response_url."""
        response_url = self.fake.response_url()
        body = form_body(slash_command(text, user=user, response_url=response_url))
        headers = {"Content-Type": "application/x-www-form-urlencoded", **sign(SIGNING_SECRET, body)}
        async with self.http.post(f"{self.url}/slack/events", data=body.encode(), headers=headers) as resp:
            assert resp.status == 200 and await resp.text() == ""
        tag = response_url.rsplit("/", 1)[1]
        (call,) = await self.fake.wait_for("response_url", where=lambda c: c.path.endswith(tag))
        return str(call.args["text"])

    async def thread(self, run_id: str, count: int) -> list[str]:
        """The texts of the first ``count`` posts in a thread (waited for, bounded), all in the run's."""
        calls = await self.fake.wait_for(
            "chat.postMessage", count, TIMEOUT, where=lambda c: bool(c.args.get("thread_ts"))
        )
        headline = await self.runtime.outbox.where(f"run:{run_id}")
        assert headline is not None and {c.args["thread_ts"] for c in calls} == {headline[1]}
        return [str(c.args["text"]) for c in calls]


Serve = Callable[..., Awaitable[Served]]


@pytest.fixture
async def serve(
    make_slurm: MakeSlurm,  # noqa: F811
    fake_slack: FakeSlack,
    redis_config: Config,
) -> AsyncIterator[Serve]:
    """``await serve(scheduler=True, admins=(), **make_slurm_args)``: a Slurm job served over HTTP."""
    async with contextlib.AsyncExitStack() as exits:

        async def make(*, scheduler: bool = True, admins: tuple[str, ...] = (), **kw: Any) -> Served:
            stack = await make_slurm(**kw)
            config = slack_config(stack.config, redis_config, admins=admins)
            runtime = await open_runtime(
                config,
                bot_token=BOT_TOKEN,
                api_url=fake_slack.api_url,
                signing_secret=SIGNING_SECRET,
                scheduler=scheduler,
            )
            exits.push_async_callback(runtime.close, 30)
            server = await start_http(http_app(runtime.surface, runtime.health), host="127.0.0.1", port=0)
            exits.push_async_callback(server.close)
            http = await exits.enter_async_context(aiohttp.ClientSession())
            return Served(stack, fake_slack, runtime, server.url, http)

        yield make


async def test_slurm_restart_typed_in_slack_gets_its_launch_summary_then_its_verdict(serve: Serve) -> None:
    """`/train restart trainer` through Bolt and the dispatcher: the thread gets the launch summary naming the Slurm job, then RUNNING."""
    served = await serve()
    answer = await served.command("restart trainer")
    assert answer.startswith("queued run r-1"), answer
    posts = await served.thread("r-1", 2)
    run = await served.runtime.ctx.runs.get("r-1")
    assert run.slurm_job is not None and run.verdict is Verdict.RUNNING, (run.verdict_line, run.evidence)
    assert posts[0].startswith(launch_summary("r-1", "trainer", f"Slurm job {run.slurm_job}", 3.0)), posts
    assert run.verdict_line == f"RUNNING 8/8 processes job {run.slurm_job} on 2 nodes"
    assert posts[1].startswith(run.verdict_line), posts


async def test_error_after_the_slurm_launch_leaves_the_run_awaiting_its_verdict(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception once the Slurm job is launched (publishing its verify step): verify WAITING, queued, not INTERRUPTED."""
    served = await serve(scheduler=False)
    ctx = served.runtime.ctx
    publish = ctx.events.publish

    async def failing(kind: EventKind, job: str, /, **data: Any) -> str:
        if kind is EventKind.STEP and data.get("step") == "verify":
            raise RuntimeError("injected after the launch")
        return await publish(kind, job, **data)

    monkeypatch.setattr(ctx.events, "publish", failing)
    await served.command("restart trainer")
    (summary,) = await served.thread("r-1", 1)
    run = await ctx.runs.get("r-1")
    assert run.verdict is None and run.finished_at is None, run.verdict_line
    assert summary.startswith(launch_summary("r-1", "trainer", f"Slurm job {run.slurm_job}", 3.0)), summary
    verify = run.step(Step.VERIFY)
    assert verify is not None and verify.outcome is Outcome.WAITING
    assert await ctx.redis.client.zscore(keys.runs_unverified(ctx.redis.prefix), "r-1") is not None
    monkeypatch.undo()
    final = await ctx.service.deliver("r-1")
    assert final is not None and final.verdict is Verdict.RUNNING, final and (
        final.verdict_line,
        final.evidence,
    )


async def _wait_state(stack: SlurmStack, job_id: int, want: Callable[[str | None], bool]) -> None:
    """Poll the cluster (bounded) until the job's state satisfies ``want`` (None: unknown to it)."""
    deadline = time.monotonic() + 60
    while not want(None if (j := await stack.engine.client.one(stack.name, job_id)) is None else j.state):
        assert time.monotonic() < deadline, j
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("cluster", ["running", "pending", "gone"])
async def test_run_of_a_killed_replica_after_the_launch_is_reconciled_with_the_cluster(
    make_slurm: MakeSlurm,  # noqa: F811
    cluster: str,
) -> None:
    """Owner gone after the Slurm launch: the take-over says what the cluster shows and verification still decides."""
    stack = await make_slurm(start_window=1.0)
    if cluster == "pending":
        stack.cluster.run("sbatch", "-N2", "--ntasks-per-node=8", "-o", "/dev/null", "--wrap", "sleep 600")
    run = await stack.run()
    run.owner = "replica-killed"  # its heartbeat never renewed: as if that process died after the launch
    run = await stack.restarter.restart(run)
    assert run.launched and run.slurm_job is not None and run.verdict is None, run.verdict_line
    job = run.slurm_job
    if cluster == "running":
        await _wait_state(stack, job, lambda s: s == "RUNNING")
        deadline = time.monotonic() + 60
        while sum(t.count for t in await stack.engine.client.node_tasks(stack.name, job, stack.token)) < 8:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
    elif cluster == "gone":
        stack.cluster.run("scancel", str(job))
        await _wait_state(stack, job, lambda s: s is None or s == "CANCELLED")
    outbox = MemoryOutbox()
    ctx = context(stack, outbox)
    found = await ctx.service.recover()
    line = {
        "running": f"INTERRUPTED after launch: job {job} running 8/8 (unverified)",
        "pending": f"INTERRUPTED after launch: job {job} pending (unverified)",
        "gone": f"INTERRUPTED after launch: job {job} gone, 0/8 (unverified)",
    }[cluster]
    assert [(i.run.id, i.line, i.launched) for i in found] == [(run.id, line, True)]
    assert [p.reply.title for p in outbox.of("thread")] == [line]
    taken = await stack.runs.get(run.id)
    assert taken.owner is None and taken.interrupted == line and taken.verdict is None
    assert await ctx.service.recover() == []  # taken over once
    final = await ctx.service.deliver(run.id)
    assert final is not None, run.id
    if cluster == "running":
        assert final.verdict_line == f"RUNNING 8/8 processes job {job} on 2 nodes", final.evidence
    elif cluster == "pending":
        assert final.verdict is Verdict.PENDING and f"job {job} queued" in (final.verdict_line or "")
    else:
        assert final.verdict is Verdict.EXITED and f"job {job} ended CANCELLED" in final.evidence, (
            final.evidence
        )


async def test_run_of_a_killed_replica_during_the_slurm_stop_is_interrupted_naming_the_old_job(
    make_slurm: MakeSlurm,  # noqa: F811
) -> None:
    """Owner gone mid-stop: INTERRUPTED during stop, naming the old Slurm job the cluster still runs."""
    stack = await make_slurm()
    first = await stack.start()
    run = await stack.run()
    run.owner = "replica-killed"
    run.old_slurm_job = first.slurm_job
    await stack.restarter.steps.begin(run, Step.STOP)  # the replica died here
    found = await context(stack, MemoryOutbox()).service.recover()
    line = f"INTERRUPTED during stop: the old run (Slurm job {first.slurm_job}) is still alive, 8/8 processes"
    assert [(i.line, i.launched) for i in found] == [(line, False)]
    taken = await stack.runs.get(run.id)
    assert taken.verdict is Verdict.INTERRUPTED and taken.verdict_line == line
