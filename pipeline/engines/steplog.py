"""The record of a run's steps, shared by every engine, and the step details a person reads.

Every engine records a step the same way through one :class:`StepLog`: *begun* (saved, published as
a ``step`` event and handed to every in-process listener), then *ended* with an outcome and a
detail.  The job's ``current`` record and its patches in effect are written through here too, so
every engine leaves the same trace behind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from pipeline import verdict
from pipeline.errors import LaunchFailed, PreflightFailed, RunCancelled, SequenceAborted, StopFailed
from pipeline.state.events import EventKind, Events
from pipeline.state.jobstate import JobRecords
from pipeline.state.runs import RunRecord, RunStore, StepRecord, VerifyQueue
from pipeline.verdict import Outcome, Step, Verdict

log = logging.getLogger(__name__)

StepListener = Callable[[RunRecord, StepRecord], Awaitable[None] | None]
"""Told of every step change (the run as it is now, the step that changed).  A surface's listener
returns None and queues its work; one that keeps run state (the restart lock's step) may return
an awaitable, awaited before the sequence goes on: bounded, and never waiting for a surface."""
CancelCheck = Callable[[], Awaitable[bool]]


class StepLog:
    """Records (compare-and-set, :class:`RunStore`) and publishes the steps of runs (``runs``' Redis client and key prefix serve
    the job's ``current`` record, patches and the verification queue too)."""

    def __init__(self, runs: RunStore, events: Events) -> None:
        self.runs = runs
        self.events = events
        self._listeners: list[StepListener] = []
        self.queue = VerifyQueue(runs.client, runs.prefix)
        self.records = JobRecords(runs.client, runs.prefix)

    def subscribe(self, listener: StepListener) -> Callable[[], None]:
        """Tell ``listener`` of every step change of every run from now on, in the sequence's task
        right after the change was saved and published; an exception it raises is logged only.

        :returns: a function that unsubscribes it.
        """
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def begin(
        self, run: RunRecord, step: Step, outcome: Outcome = Outcome.RUNNING, detail: str = ""
    ) -> StepRecord:
        """Start ``step``: appended to the run, saved, published and reported.

        :raises IllegalTransition: if the stored run ended or changed since ``run`` was read
            (:meth:`RunStore.record_step`), as :meth:`end` and :meth:`verify_unreachable` do.
        """
        rec = StepRecord(step=step, started_at=time.time(), outcome=outcome, detail=detail)
        run.steps.append(rec)
        await self.runs.record_step(run)
        await self.emit(run, rec)
        return rec

    async def end(self, run: RunRecord, rec: StepRecord, outcome: Outcome, detail: str) -> None:
        """End ``rec`` with ``outcome`` and ``detail`` (one line a person reads); saved and reported."""
        rec.ended_at, rec.outcome, rec.detail = time.time(), outcome, detail
        await self.runs.record_step(run)
        await self.emit(run, rec)

    async def refuse(
        self, run: RunRecord, rec: StepRecord, name: str, check: str, detail: str, shown: str | None = None
    ) -> PreflightFailed:
        """End the pre-flight ``rec`` FAILED with ``detail``; the verdict line says ``shown`` (default
        ``detail``).  :returns: the :class:`PreflightFailed` for the engine to raise."""
        await self.end(run, rec, Outcome.FAILED, detail)
        line = verdict.preflight_failed(check, detail if shown is None else shown)
        return PreflightFailed(name, check, detail, line=line)

    async def stop_failed(
        self,
        run: RunRecord,
        rec: StepRecord,
        name: str,
        why: str,
        survivors: Sequence[int] = (),
        done: str = "",
    ) -> StopFailed:
        """End the stop ``rec`` FAILED with ``done`` (what it did first, if anything) and ``why``.

        :returns: the :class:`StopFailed` (``survivors``: pids still alive) for the engine to raise.
        """
        await self.end(run, rec, Outcome.FAILED, f"{done}; {why}" if done else why)
        return StopFailed(name, survivors, why, line=verdict.stop_failed(survivors, why))

    async def launch_failed(
        self, run: RunRecord, rec: StepRecord, name: str, why: str, done: str = "", shown: str | None = None
    ) -> LaunchFailed:
        """End ``rec`` (launch, or the cache or patch step before it) FAILED with ``done`` (what it did
        first, if anything) and ``why``; the verdict line says ``shown`` (default ``why``).

        :returns: the :class:`LaunchFailed` for the engine to raise.
        """
        await self.end(run, rec, Outcome.FAILED, f"{done}; {why}" if done else why)
        return LaunchFailed(name, why, line=verdict.launch_failed(why if shown is None else shown))

    async def emit(self, run: RunRecord, rec: StepRecord) -> None:
        """Publish ``rec`` on the stream and tell every listener."""
        await self.publish(run, rec)
        for listener in list(self._listeners):
            try:
                if (pending := listener(run, rec)) is not None:
                    await pending
            except Exception:  # a listener's failure is the surface's, never the sequence's
                log.exception("step listener failed for %s", run.id)

    async def publish(self, run: RunRecord, rec: StepRecord) -> None:
        """Publish ``rec`` as a ``step`` event of the run's job."""
        await self.events.publish(
            EventKind.STEP,
            run.job,
            run_id=run.id,
            step=rec.step.value,
            outcome=rec.outcome.value,
            detail=rec.detail,
        )

    async def launched(self, run: RunRecord, name: str, start_window: float, **fields: object) -> None:
        """The run launched now (``run.launched_at``): job ``name``'s ``current`` record becomes the
        run's (``run_id``, ``launched_at``, ``state`` running, ``patches`` and ``fields``, None as
        ""), its verification due ``start_window`` s on (:meth:`JobRecords.record_launch`)."""
        run.launched_at = time.time()
        fields |= {"run_id": run.id, "launched_at": run.launched_at, "state": "running"}
        fields["patches"] = ",".join(run.patches)
        current = {k: "" if v is None else str(v) for k, v in fields.items()}  # str(float) is repr(float)
        await self.records.record_launch(run.id, name, current, run.launched_at + start_window)

    async def await_verify(self, run: RunRecord, start_window: float) -> None:
        """Add the ``verify`` step, WAITING for ``start_window`` seconds after the launch."""
        await self.begin(run, Step.VERIFY, Outcome.WAITING, f"checking for {start_window:g} s after launch")

    def verify_step(self, run: RunRecord) -> StepRecord:
        """The run's ``verify`` step, set RUNNING (added if the run has none)."""
        rec = run.step(Step.VERIFY)
        if rec is None:
            rec = StepRecord(step=Step.VERIFY, started_at=time.time())
            run.steps.append(rec)
        rec.outcome, rec.ended_at = Outcome.RUNNING, None
        return rec

    async def verify_unreachable(self, run: RunRecord, rec: StepRecord, detail: str) -> None:
        """Record that the job could not be observed past its deadline (the run stays unverified)."""
        rec.outcome, rec.ended_at, rec.detail = Outcome.FAILED, time.time(), detail
        await self.runs.record_step(run)
        await self.publish(run, rec)

    async def verified(
        self,
        run: RunRecord,
        rec: StepRecord,
        decided: tuple[Verdict, str, str],
        *,
        recheck_at: float | None = None,
    ) -> None:
        """Save a decided verdict (``decided``: verdict, line, evidence): ``rec`` ends with the line;
        the run leaves the verification queue, or stays due at ``recheck_at`` (epoch s; PENDING).

        :raises IllegalTransition: if the run was ended by its sequence, or changed since ``run`` was
            read (another process won): nothing is written, queued or published.
        """
        verdict, line, _ = decided
        rec.ended_at, rec.detail = time.time(), line
        rec.outcome = Outcome.OK if verdict is Verdict.RUNNING else Outcome.FAILED
        if recheck_at is not None:
            rec.outcome = Outcome.WAITING
        await self.runs.decide(run, *decided)
        await (self.queue.settle(run.id) if recheck_at is None else self.queue.enqueue(run.id, recheck_at))
        await self.publish(run, rec)

    async def boundary(self, run: RunRecord, after: Step | None, cancelled: CancelCheck | None) -> None:
        """Between two steps: :raises RunCancelled: if someone asked (:meth:`RunStore.cancel_requested`)
        or ``cancelled()`` says so."""
        if await self.runs.cancel_requested(run.id) or (cancelled is not None and await cancelled()):
            after_step = after.value if after else None
            raise RunCancelled(run.job, run.id, after_step, line=verdict.cancelled(after_step))

    async def finish(self, run: RunRecord, aborted: SequenceAborted) -> RunRecord:
        """Finish a run that a step ended: its verdict, line and evidence, as ``aborted`` carries them."""
        return await self.runs.finish(
            run, Verdict(aborted.verdict), aborted.line, aborted.evidence or aborted.line
        )


def failed_checks(checks: Sequence[Mapping[str, Any]]) -> tuple[str, str, str] | None:
    """The host helper's failed pre-flight checks: the first's name, every failure in one
    detail, and the first's own detail (for the verdict line); None when all passed."""
    failed = [c for c in checks if not c.get("ok")]
    if not failed:
        return None
    return failed[0]["check"], "; ".join(f"{c['check']}: {c['detail']}" for c in failed), failed[0]["detail"]


def step_preflight_ok(checks: Sequence[str]) -> str:
    """All pre-flight checks passed (each named once)."""
    return "ok: " + ", ".join(dict.fromkeys(checks))


STOP_NOTHING = "nothing was running"  #: the stop step's detail when nothing of the job ran


def step_stopped(count: int, seconds: float, killed: Sequence[int], stop_timeout: float) -> str:
    """How the old run was stopped."""
    text = f"stopped {count} process{'es' if count != 1 else ''} in {seconds:.1f} s"
    if killed:
        pids = ", ".join(str(p) for p in killed)
        text += f" (SIGKILL after {stop_timeout:g} s to pid {pids}, which ignored SIGTERM)"
    else:
        text += " (SIGTERM)"
    return text


def stale_record(pid: int, recorded: int | None, found: int | None) -> str:
    """The recorded pid now belongs to another process: it is not signalled."""
    return (
        f"stale record: pid {pid} now belongs to another process (start time {found}, recorded {recorded}) "
        "- not signalled"
    )
