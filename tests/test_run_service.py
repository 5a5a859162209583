"""One owner of a run's life: a Slurm restart typed in Slack and an ssh restart from ``pitstop say``
both go through the run service (:mod:`pipeline.runs`), which tells each step, the sequence's end
and the verdict."""

from __future__ import annotations

import io
from typing import Any

import pytest

from bot.console.identity import CliIdentity
from bot.console.say import say_main
from pipeline.config import Config
from pipeline.runs.base import RunEvent, RunServiceBase, Told
from pipeline.verdict import Verdict
from tests.support_handlers import handler_config
from tests.test_slurm import make_slurm, redis_handle, shared_redis_url  # noqa: F401 (fixtures)
from tests.test_slurm_dispatch import Serve, serve  # noqa: F401 (fixtures)

Seen = list[tuple[RunServiceBase, RunEvent]]


@pytest.fixture
def told(monkeypatch: pytest.MonkeyPatch) -> Seen:
    """Every event any run service tells, with the service that told it (the services are untouched)."""
    seen: Seen = []
    tell = RunServiceBase.tell

    async def counting(self: RunServiceBase, event: RunEvent) -> None:
        seen.append((self, event))
        await tell(self, event)

    monkeypatch.setattr(RunServiceBase, "tell", counting)
    return seen


def _life(told: Seen, run_id: str) -> list[Told]:
    """The kinds told of ``run_id``, repeated steps folded into one."""
    kinds = [e.kind for _, e in told if e.run.id == run_id]
    return [k for i, k in enumerate(kinds) if i == 0 or k is not kinds[i - 1]]


async def test_slurm_restart_typed_in_slack_goes_through_the_run_service(serve: Serve, told: Seen) -> None:  # noqa: F811
    """`/train restart trainer` on Slurm: its steps, its end and its verdict are told by the Slack process's run service."""
    served = await serve()
    answer = await served.command("restart trainer")
    assert answer.startswith("queued run r-1"), answer
    await served.thread("r-1", 2)  # the launch summary, then the verdict
    assert {service for service, _ in told} == {served.runtime.ctx.service}
    assert _life(told, "r-1") == [Told.STEP, Told.ENDED, Told.VERDICT]
    verdict = next(e.run for _, e in told if e.kind is Told.VERDICT)
    assert (
        verdict.verdict is Verdict.RUNNING and verdict.slurm_job is not None and verdict.action == "restart"
    )


async def test_ssh_restart_from_the_cli_goes_through_the_run_service(
    ssh_server: Any, job_factory: Any, redis_config: Config, told: Seen
) -> None:
    """``pitstop say "restart trainer" --wait`` over ssh: the same run service tells its steps, end and verdict."""
    config = job_factory(ssh_server).config.model_copy(
        update={
            "redis": redis_config.redis,
            "state": redis_config.state,
            "auth": handler_config().auth.model_copy(update={"operators": ["U0SAYER0001"]}),
        }
    )
    out, err = io.StringIO(), io.StringIO()
    try:
        code = await say_main(
            config,
            "restart trainer",
            who=CliIdentity("U0SAYER0001", "tester"),
            wait=True,
            as_json=True,
            out=out,
            err=err,
        )
        assert code == 0, out.getvalue() + err.getvalue()
        assert len({service for service, _ in told}) == 1
        assert _life(told, "r-1") == [Told.STEP, Told.ENDED, Told.VERDICT]
        verdict = next(e.run for _, e in told if e.kind is Told.VERDICT)
        assert verdict.verdict is Verdict.RUNNING and verdict.pid is not None and verdict.action == "restart"
    finally:
        await say_main(
            config,
            "stop trainer",
            who=CliIdentity("U0SAYER0001", "tester"),
            wait=False,
            as_json=False,
            out=out,
            err=err,
        )
