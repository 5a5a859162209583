"""``follow r-N``: a run's steps as they happen, then its verdict, in a process that did not start it.

The follower is a real ``pitstop say "follow r-N"`` process; the restart runs in the test's own
process, on a real SSH host (the in-process asyncssh server) against real Redis, and holds after
its stop until the follower has printed it.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable

import pytest

from pipeline.state.runs import RunRecord, StepRecord
from pipeline.verdict import Outcome, Step
from tests import test_ownership
from tests.test_ownership import ADMIN, ROOT, World, pitstop

make_world, plain_world = test_ownership.make_world, test_ownership.plain_world  # its fixtures, here too

WAIT = 60.0  #: seconds any one awaited line or exit may take


async def say(world: World, text: str) -> asyncio.subprocess.Process:
    """``pitstop say TEXT`` as a separate process, its stdout (and stderr) piped."""
    return await asyncio.create_subprocess_exec(
        *pitstop(world.config_path, "say", text, "--as", ADMIN),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


async def line_with(proc: asyncio.subprocess.Process, text: str) -> str:
    """The next line ``proc`` prints that holds ``text`` (the lines before it are passed over)."""

    async def read() -> str:
        assert proc.stdout is not None
        while line := (await proc.stdout.readline()).decode():
            if text in line:
                return line.rstrip("\n")
        raise AssertionError(f"the follower ended before printing {text!r}")

    return await asyncio.wait_for(read(), WAIT)


async def finish(proc: asyncio.subprocess.Process) -> tuple[list[str], int]:
    """The rest of ``proc``'s output, as lines, and its exit code."""
    out, _ = await asyncio.wait_for(proc.communicate(), WAIT)
    return out.decode().splitlines(), await proc.wait()


@pytest.mark.timeout(240)
async def test_follow_from_another_process_shows_stop_launch_and_verdict_as_they_happen(
    plain_world: World,
) -> None:
    """A second process following a restart prints its stop and its launch as they happen, then the verdict line, and exits 0."""
    world = plain_world
    await world.start()
    run = await world.ctx.runs.create(world.job, ADMIN, action="restart")
    stop_shown = asyncio.Event()

    def hold(current: RunRecord, rec: StepRecord) -> Awaitable[bool] | None:
        if current.id == run.id and rec.step is Step.STOP and rec.outcome is Outcome.OK:
            return asyncio.wait_for(
                stop_shown.wait(), WAIT
            )  # the restart goes on once the follower showed it
        return None

    unsubscribe = world.ctx.restarter.subscribe(hold)
    follower = await say(world, f"follow {run.id}")
    try:
        assert (await line_with(follower, f"{run.id}: restart of {world.job}")).startswith(run.id)
        restart = asyncio.get_running_loop().create_task(world.ctx.restarter.restart(run))
        assert (await line_with(follower, "✓ stop")).startswith("✓ stop ")
        assert not restart.done()  # held after its stop: the follower printed it as it happened
        stop_shown.set()
        assert (await line_with(follower, "✓ launch")).startswith("✓ launch ")
        await asyncio.wait_for(restart, WAIT)
        assert (await world.ctx.runs.get(run.id)).verdict is None  # the launch was shown before any verdict
        done = await world.ctx.service.deliver(run.id)
        assert done is not None and done.verdict_line is not None and "RUNNING" in done.verdict_line
        lines, code = await finish(follower)
        assert done.verdict_line in lines, lines
        assert code == 0
    finally:
        unsubscribe()
        if follower.returncode is None:
            follower.kill()
            await follower.wait()


@pytest.mark.timeout(120)
async def test_follow_of_an_ended_run_prints_its_steps_and_verdict_at_once(plain_world: World) -> None:
    """Following a run that already has its verdict prints its steps and verdict line and exits with the verdict's code."""
    run = await plain_world.start()
    assert run.verdict_line is not None
    lines, code = await finish(await say(plain_world, f"follow {run.id}"))
    assert any(line.startswith("✓ launch ") for line in lines), lines
    assert run.verdict_line in lines, lines
    assert code == 0


@pytest.mark.timeout(120)
async def test_follow_of_an_unknown_run_is_a_usage_error(plain_world: World) -> None:
    """An unknown run, a mistyped verb and a malformed run id are clear errors with exit code 2."""
    lines, code = await finish(await say(plain_world, "follow r-999"))
    assert (lines, code) == (["no run r-999"], 2)
    lines, code = await finish(await say(plain_world, "folow r-1"))
    assert code == 2 and "did you mean 'follow'?" in lines[0], lines
    lines, code = await finish(await say(plain_world, "follow dflash"))
    assert code == 2 and "is not a run id" in lines[0] and "`follow r-7`" in lines[0], lines


def test_a_cancelled_run_ends_a_follow_with_exit_code_5() -> None:
    """A CANCELLED verdict answers with the cancel exit code (5), as the restart that was cancelled did, not 1."""
    from handlers.runs.view import verdict_reply
    from pipeline.errors import ExitCode
    from pipeline.state.runs import RunRecord
    from pipeline.verdict import Verdict

    run = RunRecord(id="r-7", job="slow", requested_by="U0ADMIN", created_at=0.0, verdict=Verdict.CANCELLED)
    assert verdict_reply(run).exit_code is ExitCode.CANCELLED
    failed = run.model_copy(update={"verdict": Verdict.EXITED})
    assert verdict_reply(failed).exit_code is ExitCode.FAILED
