"""A run's life as the team sees it: what the run service tells (:mod:`pipeline.runs`), posted.

:class:`RunPosts` listens to the process's :class:`~pipeline.runs.service.RunService`: a run it
was asked to :meth:`~RunPosts.show` gets its live message, updated after every step at the
surface's own pace (:class:`Latest`: the sequence never waits for it), and once its
sequence ended the launch summary, the stop summary or its verdict in its thread.  A verdict
delivered by verification, a run taken over from a dead process and a throughput follow-up are
posted in the run's thread (a slower-since follow-up also in the job's channel, paging
``[slack] alert_mention``); those posts are handed to the outbox before the service goes on, so a
verdict's claim is done only once its posts are.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from handlers.outbox import Outbox
from handlers.reply import Reply, Status
from handlers.runs.view import run_note, run_reply, thread_key, verdict_reply
from handlers.text import launch_summary, mention, run_lock_lost, stop_summary
from pipeline.config import Config
from pipeline.runs.base import RunEvent, Told
from pipeline.state.runs import RunRecord
from pipeline.verdict import Step

log = logging.getLogger(__name__)

T = TypeVar("T")


class Latest(Generic[T]):
    """Deliver the newest value put, one delivery at a time, in a task of its own: last state wins,
    a value delivered at the consumer's pace, never at the producer's (a restart's steps change
    faster than Slack takes updates of one message; states that arrive meanwhile are coalesced
    into one delivery of the last of them).

    :param deliver: awaited with the newest value; an exception it raises is logged and the
        next value is still delivered.
    :param what: names the deliveries in the log.
    """

    def __init__(self, deliver: Callable[[T], Awaitable[object]], what: str) -> None:
        self._deliver = deliver
        self._what = what
        self._next: list[T] = []  #: the value not delivered yet, if any
        self._task: asyncio.Task[None] | None = None

    def put(self, value: T) -> None:
        """Make ``value`` the next one delivered (replacing one not delivered yet); returns at once."""
        self._next = [value]
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self._next:
            value = self._next.pop()
            try:
                await self._deliver(value)
            except Exception:
                log.warning("could not deliver %s", self._what, exc_info=True)

    async def flush(self) -> None:
        """Wait until the newest value put so far was delivered."""
        if self._task is not None:
            await self._task


class RunPosts:
    """The run service's listener that posts (one per process): live messages, summaries, verdicts,
    take-overs and follow-ups, each in the run's thread (``run:r-42``)."""

    def __init__(self, config: Config, outbox: Outbox) -> None:
        self.config, self.outbox = config, outbox
        self._live: dict[str, tuple[Latest[RunEvent], str | None]] = {}  #: run id → message, channel

    def show(self, run: RunRecord, channel: str | None) -> None:
        """Post ``run``'s live message in ``channel`` and keep it up to date until its sequence ends."""

        async def deliver(event: RunEvent) -> None:
            notes = (run_lock_lost(run.job),) if event.lock_lost else ()
            await self.outbox.announce(
                thread_key(run.id), run_reply(event.run, self.config, notes=notes), channel
            )

        message = Latest(deliver, f"run {run.id}")  # the live message, at the surface's pace
        message.put(RunEvent(Told.STEP, run))
        self._live[run.id] = (message, channel)

    def __call__(self, event: RunEvent) -> Awaitable[None] | None:
        """Take ``event``: a step is queued on its live message (nothing to await), anything else
        returns its posts to await."""
        run = event.run
        if event.kind is Told.STEP:
            if (live := self._live.get(run.id)) is not None:
                live[0].put(event)  # queued: the sequence does not wait for the surface
            return None
        if event.kind is Told.ENDED:
            live = self._live.pop(run.id, None)
            return self._ended(event, *live) if live is not None else None
        channel = self.config.channel_for(run.job) if run.job in self.config.jobs else None
        if event.kind is Told.VERDICT:  # a warning is flagged beside the verdict, which stays as it is
            warned = [run_note(run, run.warning, Status.WARNING)] if run.warning else []
            return self._post(channel, [verdict_reply(run), *warned], run_reply(run, self.config))
        if event.kind is Told.INTERRUPTED:
            take_over = run_note(run, event.line or "", Status.WARNING)
            return self._post(channel, [take_over], run_reply(run, self.config), what="take-over")
        reply = followup_reply(event)
        alert = [alert_copy(reply, self.config.slack.alert_mention)] if event.slow else []
        return self._post(channel, [reply, *alert], None)

    async def _post(
        self, channel: str | None, replies: list[Reply], head: Reply | None, what: str = ""
    ) -> None:
        """``replies`` in their run's thread, then its headline updated (``head``) or, a reply without
        a thread key, posted in the channel; with ``what``, a failure is logged (the service goes
        on), else raised."""
        try:
            for reply in replies:
                if reply.thread_key:
                    await self.outbox.thread(reply.thread_key, reply, channel)
                else:
                    await self.outbox.post(reply, channel)
            if head is not None and head.thread_key:
                await self.outbox.announce(head.thread_key, head, channel)
        except Exception:
            if not what:
                raise
            log.warning("could not post the %s of run:%s", what, replies[0].run_id, exc_info=True)

    async def _ended(self, event: RunEvent, message: Latest[RunEvent], channel: str | None) -> None:
        """The sequence ended: the headline as it left it, then its summary or verdict in its thread."""
        final = event.run
        message.put(event)
        await message.flush()  # the headline exists before anything is posted in its thread
        notes = (run_lock_lost(final.job),) if event.lock_lost else ()
        if final.verdict is not None:  # nobody else will post its verdict
            reply = verdict_reply(final)
        elif final.launched:
            window = self.config.jobs[final.job].start_window if final.job in self.config.jobs else 0.0
            title = launch_summary(final.id, final.job, final.launched_as, window)
            reply = run_note(final, title, Status.INFO, notes)
        elif final.action == "stop":
            stop = final.step(Step.STOP)
            lines = (stop.detail,) if stop is not None and stop.detail else ()
            reply = run_note(final, stop_summary(final.id, final.job), Status.OK, lines)
        else:
            return
        await self._post(channel, [reply], None, "summary")


def followup_reply(event: RunEvent) -> Reply:
    """A throughput follow-up (FOLLOWUP) as posted in its run's thread: a warning when slower."""
    return run_note(event.run, event.line or "", Status.WARNING if event.slow else Status.OK)


def alert_copy(reply: Reply, page: str | None) -> Reply:
    """The slower-since alert as a channel post of its own, paging ``page`` (``[slack] alert_mention``)."""
    see = f"the restart's thread ({reply.run_id or '?'}) has its verdict and patches"
    lines = (f"{mention(page)} {see}",) if page else ()
    return Reply(title=reply.title, status=reply.status, run_id=reply.run_id, page=page, lines=lines)
