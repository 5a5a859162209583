"""How a run looks to people, and how it is posted.

The live restart message (:func:`run_reply`, ``run:r-42``, updated in place after every step) and
the verdict posted in its thread (:func:`verdict_reply`) are pure functions of the
:class:`~pipeline.state.runs.RunRecord`.

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
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from handlers.outbox import Outbox
from handlers.reply import Button, Reply, Status, StepLine
from handlers.text import SHOW_LOG_BUTTON, launch_summary, mention, run_headline, run_lock_lost, stop_summary
from pipeline.config import Config
from pipeline.errors import ExitCode
from pipeline.fmt import who
from pipeline.runs.base import RunEvent, Told
from pipeline.state.runs import RunRecord
from pipeline.verdict import Outcome, Step, Verdict

log = logging.getLogger(__name__)

_WARNING_VERDICTS = frozenset({Verdict.CANCELLED, Verdict.INTERRUPTED, Verdict.PENDING})


def thread_key(run_id: str) -> str:
    """The key of a run's headline message and thread (``run:r-42``)."""
    return f"run:{run_id}"


def run_note(run: RunRecord, title: str, status: Status, lines: tuple[str, ...] = ()) -> Reply:
    """A post in ``run``'s thread (``run:r-42``): a summary, a take-over, a follow-up, a warning."""
    return Reply(title=title, status=status, lines=lines, thread_key=thread_key(run.id), run_id=run.id)


def step_lines(run: RunRecord) -> tuple[StepLine, ...]:
    """The run's steps as :class:`StepLine` s, in order, plus ``verify: waiting`` for a run whose
    launch ended well but whose verify step is not recorded yet (and has no verdict)."""
    lines = [
        StepLine(
            label=rec.step.value,
            outcome=rec.outcome.value,
            seconds=None if rec.outcome in (Outcome.RUNNING, Outcome.WAITING) else rec.duration,
            detail=rec.detail,
        )
        for rec in run.steps
    ]
    if run.verdict is None and run.launched and run.step(Step.VERIFY) is None:
        lines.append(StepLine(label=Step.VERIFY.value, outcome=Outcome.WAITING.value))
    return tuple(lines)


def run_status(run: RunRecord) -> Status:
    """The tone of a run: ok once RUNNING, error for a failed verdict or step, warning when
    cancelled/interrupted, info while under way."""
    if run.verdict is not None:
        if run.verdict.ok:
            return Status.OK
        return Status.WARNING if run.verdict in _WARNING_VERDICTS else Status.ERROR
    if any(rec.outcome is Outcome.FAILED for rec in run.steps):
        return Status.ERROR
    return Status.INFO


def verdict_line(run: RunRecord) -> str | None:
    """The run's verdict line (a fallback built from the verdict when the record has none)."""
    if run.verdict_line:
        return run.verdict_line
    return f"{run.id}: {run.job} {run.verdict.value}" if run.verdict is not None else None


def run_reply(run: RunRecord, config: Config, *, notes: Sequence[str] = ()) -> Reply:
    """The live headline message of a run: ``r-42: restart of dflash by <@U1> with topk patch,
    fresh cache``, its steps, then ``notes`` (a lock-lost warning) and the verdict line, if any."""
    fields: list[tuple[str, str]] = []
    job = config.jobs.get(run.job)
    if job is not None:
        fields.append(("host", job.host))
    if run.pid is not None:
        fields.append(("pid", str(run.pid)))
    if run.approved_by is not None:  # the two-person rule: who approved, and the patch bytes they saw
        shown = ", ".join(f"{name} sha256 {sha[:12]}" for name, sha in sorted(run.approved_patches.items()))
        fields.append(("approved by", who(run.approved_by) + (f" ({shown})" if shown else "")))
    if run.break_glass is not None:
        fields.append(("break glass", run.break_glass))
    line = verdict_line(run)
    return Reply(
        title=run_headline(run),
        status=run_status(run),
        steps=step_lines(run),
        lines=(*notes, line) if line else tuple(notes),
        fields=tuple(fields),
        thread_key=thread_key(run.id),
        run_id=run.id,
    )


def verdict_reply(run: RunRecord) -> Reply:
    """The thread post carrying a run's verdict: the verdict line as title, the evidence (log tail)
    as the log; ok and exit code 0 for RUNNING, a warning for PENDING (exit code 6), else an error
    with a "Show log" button (``show_log``, value: the job), exit code 5 for CANCELLED and 1 for
    the others.  A run without a verdict reads as an error."""
    ok = run.verdict is not None and run.verdict.ok
    pending = run.verdict is Verdict.PENDING
    code = ExitCode.OK if ok else ExitCode.PENDING if pending else ExitCode.FAILED
    return Reply(
        title=verdict_line(run) or f"{run.id}: {run.job} no verdict",
        status=Status.OK if ok else Status.WARNING if pending else Status.ERROR,
        log=run.evidence or None,
        log_title=f"evidence from {run.job}" if run.evidence else "",
        thread_key=thread_key(run.id),
        run_id=run.id,
        buttons=() if ok or pending else (Button(SHOW_LOG_BUTTON, "show_log", run.job),),
        exit_code=ExitCode.CANCELLED if run.verdict is Verdict.CANCELLED else code,
    )


# --- posted: the run service's listener ---------------------------------------------------------

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
