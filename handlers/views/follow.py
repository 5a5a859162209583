"""``follow r-N``: a run's steps as they happen, then its verdict, from any process.

The verb answers with the run's message as it is (:func:`follow_command`); the surface then shows
what :func:`follow_run` yields, read from the run's own event stream
(:meth:`pipeline.state.events.Events.read_run`): ``pitstop say`` and the console print each step
change and the verdict, Slack keeps the run's message up to date.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from handlers.context import Context
from handlers.grammar.commands import ParseError, parse
from handlers.reply import Reply, StepLine
from handlers.runs.view import run_reply, step_lines
from pipeline.config import Config
from pipeline.state.events import BLOCK_S
from pipeline.state.runs import RunRecord

FOLLOW_SLACK = 420.0  #: seconds a follow waits beyond the job's stop timeout and start window


def followed(text: str, config: Config) -> str | None:
    """The run ``text`` asks to follow (``follow r-7`` → ``r-7``); None for anything else."""
    try:
        command = parse(text, config)
    except ParseError:
        return None
    return command.run_ref if command.verb == "follow" else None


def ended(run: RunRecord) -> bool:
    """The run has its verdict, or its sequence ended with nothing launched (a stop)."""
    return run.verdict is not None or (run.finished_at is not None and not run.launched)


def within(config: Config, job: str) -> float:
    """Seconds a follow of a run of ``job`` waits at most: its stop timeout, start window and :data:`FOLLOW_SLACK`."""
    spec = config.jobs.get(job)
    return FOLLOW_SLACK + (spec.stop_timeout + spec.start_window if spec else 0.0)


async def follow_command(ctx: Context, run_id: str) -> Reply:
    """``follow r-N``: the run's message as it is now.

    :raises UnknownRun: if there is no such run.
    """
    return run_reply(await ctx.runs.get(run_id), ctx.config)


def fresh(run: RunRecord, seen: set[StepLine]) -> list[StepLine]:
    """The run's step lines (:func:`~handlers.runs.view.step_lines`) not in ``seen``, now added to it."""
    steps = [s for s in step_lines(run) if s not in seen]
    seen.update(steps)
    return steps


async def follow_run(ctx: Context, run_id: str, *, deliver: bool = True) -> AsyncIterator[RunRecord]:
    """The run now and after each of its events (or a quiet wait of at most
    :data:`~pipeline.state.events.BLOCK_S` s, or until its verification is due), until it
    :func:`ended` or for at most :func:`within` s.

    :param deliver: deliver a verification due here (verify, post, publish) unless another process
        has it; False where this process's scheduler does (the console, whose posts it prints).

    :raises UnknownRun: if there is no such run.
    """
    run, cursor = await ctx.runs.get(run_id), "0-0"
    deadline = time.monotonic() + within(ctx.config, run.job)
    while True:
        yield run
        if ended(run) or time.monotonic() > deadline:
            return
        due = await ctx.service.queue.due_at(run_id)
        if not deliver or due is None or due > time.time() or await ctx.service.deliver(run_id) is None:
            wait = BLOCK_S if due is None or due <= time.time() else due - time.time()
            if events := await ctx.events.read_run(run_id, cursor, wait):
                cursor = events[-1].id
        run = await ctx.runs.get(run_id)
