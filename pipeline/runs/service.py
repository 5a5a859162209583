"""The run service: the one owner of a run's life, from its request to its throughput follow-up.

:meth:`RunService.request` takes the job's lock (or raises
:class:`~pipeline.state.locks.InFlight`) and creates the run: the fast part, before the
requester's answer.  :meth:`RunService.execute` is the slow part, in a background task: the
engine runner's steps, each told as a STEP event (a listener queues it: the sequence never waits
for a surface) and kept in the lock's holder record; the lock is released as soon as the launch
step ends; the sequence's end is told as ENDED.  Verification and the verdict
(:mod:`pipeline.runs.verify`), the throughput follow-up and the no-progress rule
(:mod:`pipeline.runs.attempts`) and the runs of a dead process
(:mod:`pipeline.runs.orphans`, :meth:`RunService.recover`) are its other parts.  Surfaces
subscribe (:meth:`~pipeline.runs.base.RunServiceBase.subscribe`) and render what it tells.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from pipeline.errors import PitstopError, internal_error, new_incident_id
from pipeline.runs.attempts import Attempts
from pipeline.runs.base import RunEvent, Told
from pipeline.runs.orphans import Interruption, reconcile
from pipeline.runs.verify import Verification
from pipeline.state.approvals import ApprovalRequest
from pipeline.state.audit import Actor
from pipeline.state.jobstate import scope_of
from pipeline.state.locks import JobLock
from pipeline.state.runs import RunRecord, StepRecord
from pipeline.verdict import Outcome, Step, Verdict

log = logging.getLogger(__name__)

CANCEL_TTL = 3600  #: seconds a cancel request is kept
#: who a requeue by the cluster's scheduler is recorded as (its run's ``requested_by`` and actor)
REQUEUED_BY = Actor(user="slurm", surface="scheduler")


class RunService(Verification, Attempts):
    """Restart, start and stop, cancel, verification, follow-ups, the no-progress rule and orphans
    of one Pitstop process (built once, by :class:`~pipeline.runs.base.RunServiceBase`'s arguments)."""

    async def request(
        self,
        job: str,
        action: str,
        user: str,
        *,
        lock_ttl: float,
        patches: Sequence[str] = (),
        fresh_cache: bool = False,
        exclude: Sequence[str] = (),
        from_step: int | None = None,
        auto: bool = False,
        approval: ApprovalRequest | None = None,
        break_glass: str | None = None,
        actor: Actor | None = None,
    ) -> RunRecord:
        """Take the job's lock and create the run (no remote command); :meth:`execute` runs it.

        :param action: ``restart`` | ``start`` | ``stop``.
        :param lock_ttl: seconds the lock lives without renewal.
        :param exclude: nodes the relaunch leaves out (a Slurm job's ``--exclude``).
        :param from_step: the step to resume at (``restart JOB from step S``; pre-flight checks its
            checkpoint, the launch passes it through ``resume_from``).
        :param auto: Pitstop's own restart: a damaged newest checkpoint makes it fall back to the
            newest intact one instead of refusing.
        :param approval: the approved request (the two-person rule): the run takes its id, approver
            and patch hashes (re-checked at pre-flight).
        :param break_glass: an admin's reason for acting without approval, marked on the run.
        :param actor: who asks, as their surface proved them (kept on the run).
        :returns: the new run; its lock is held (renewing) until :meth:`execute` releases it.
        :raises InFlight: if another restart of the job (or on its host) holds the lock.
        """
        lock = self.redis.open_store(JobLock, scope_of(self.config, job), ttl=lock_ttl)
        await lock.acquire(job=job, action=action, user=user)
        try:
            lock.start_renewal()
            approved: dict[str, Any] = (
                {"run_id": approval.id, "approved_by": approval.decided_by, "approver": approval.decider}
                if approval
                else {}
            )
            run = await self.runs.create(
                job,
                user,
                action=action,
                patches=list(patches),
                fresh_cache=fresh_cache,
                exclude=list(exclude),
                from_step=from_step,
                auto=auto,
                break_glass=break_glass,
                actor=actor,
                approved_patches=approval.hashes if approval else {},
                **approved,
            )
            await lock.update(run_id=run.id)
        except BaseException:
            await asyncio.shield(lock.release())
            raise
        self._held[run.id] = lock
        return run

    async def requeued(self, job: str, line: str, cause: str) -> RunRecord:
        """Record a relaunch by the cluster's scheduler (Slurm requeued the job) as a run of its own,
        action ``requeue``, by :data:`REQUEUED_BY`: launched now (:meth:`Runner.requeued
        <pipeline.engines.runner.Runner.requeued>`), then verified and told like a restart (processes
        per node, where it resumed and the steps lost) by :meth:`deliver`; it spends no
        ``auto_restart`` attempt and takes no lock (Pitstop did not act).

        :param line: the requeue's post (``requeued: dflash (Slurm job 12, restart 1): …``).
        :param cause: why (``preempted by job 13 (partition high) on n1``).
        :returns: the run, launched (or ended by a failed launch step).
        """
        run = await self.runs.create(
            job,
            REQUEUED_BY.user,
            action="requeue",
            actor=REQUEUED_BY,
            requeued=line,
            requeue_cause=cause,
        )
        return await self.restarter.requeued(run)

    async def execute(self, run: RunRecord, *, remove: Sequence[str] = ()) -> RunRecord:
        """Run the sequence of a run :meth:`request` created (its ``action``, ``patches`` added and
        ``fresh_cache``), telling each STEP and then ENDED; a run that ended before verification
        also gets its ``verdict`` event.  A failure is recorded on the run, never raised.

        :param remove: patches to take out (``restart … without``).
        :returns: the run as the sequence left it.
        """
        lock = self._held.pop(run.id)

        async def on_step(current: RunRecord, rec: StepRecord) -> None:
            if current.id != run.id:
                return
            await self.tell(RunEvent(Told.STEP, current, lock_lost=lock.lost))
            await lock.update(step=rec.step.value)  # the lock is run state: kept in step with the run
            if rec.step is Step.LAUNCH and rec.outcome is not Outcome.RUNNING:
                await lock.release()  # the launch ended: verification must not hold the lock

        error: str | None = None
        final = run
        unsubscribe = self.restarter.subscribe(on_step)
        try:
            if run.action == "restart":
                final = await self.restarter.restart(
                    run, add=run.patches, remove=remove, fresh_cache=run.fresh_cache
                )
            else:
                final = await (self.restarter.start if run.action == "start" else self.restarter.stop)(run)
        except PitstopError as exc:
            error = exc.message
        except Exception:
            incident = new_incident_id()
            log.exception("incident %s: %s of %s (%s)", incident, run.action, run.job, run.id)
            error = internal_error(incident)
        finally:
            unsubscribe()
            await asyncio.shield(lock.release())
        try:
            await self.runs.clear_cancel(run.id)
        except Exception:
            log.debug("could not clear the cancel request of %s", run.id, exc_info=True)
        if error is not None:
            final = await self._record_failure(run, error)
        if final.verdict is not None:  # ended before verification: published now, not once Slack took it
            try:
                await self.publish_verdict(final)
            except Exception:
                log.warning("could not publish the verdict of %s", run.id, exc_info=True)
        await self.tell(RunEvent(Told.ENDED, final, lock_lost=lock.lost))
        return final

    async def _record_failure(self, run: RunRecord, error: str) -> RunRecord:
        """A sequence that raised: record the truth on the run (unless it already launched)."""
        try:
            final = await self.runs.get(run.id)
        except PitstopError:
            final = run
        if final.verdict is None and not final.launched:
            for rec in final.steps:
                if rec.outcome is Outcome.RUNNING:
                    rec.outcome, rec.ended_at, rec.detail = Outcome.FAILED, time.time(), rec.detail or error
            try:
                line = f"{final.id}: {final.job} failed - {error}"
                await self.runs.finish(final, Verdict.INTERRUPTED, line, error)
            except Exception:
                log.warning("could not record the failure of %s", run.id, exc_info=True)
        return final

    async def cancel(self, job: str, user: str) -> str | None:
        """Ask the job's in-flight sequence to stop at its next step boundary.

        :returns: the run's id, or None when nothing of the job is in flight.
        """
        holder = await self.locks.holder(scope_of(self.config, job))
        run_id = holder.run_id if holder is not None and holder.job == job and holder.run_id else None
        if run_id is None:  # not launched yet, nothing ended it
            fresh = [r for r in await self.runs.recent(job, 5) if r.finished_at is None and r.verdict is None]
            run_id = next((r.id for r in fresh if r.step(Step.LAUNCH) is None), None)
        if run_id is not None:
            await self.runs.request_cancel(run_id, user, CANCEL_TTL)
        return run_id

    async def recover(self, *, deliver: bool = False) -> list[Interruption]:
        """Take over runs whose owner died (:func:`pipeline.runs.orphans.reconcile`) and tell each
        (INTERRUPTED); one that ended before its launch also publishes its ``verdict`` event, one
        that launched is queued for verification.

        :param deliver: verify and tell here the launched ones, and every launched run that no live
            process owns (handed over by a process that exited) whose verification is due: a process
            without a scheduler (``pitstop say``, whatever its verb) leaves no run awaiting its verdict.
        :returns: the runs taken over.
        """
        found = await reconcile(self.restarter, instance=self.instance)
        for item in found:
            log.warning("%s: %s", item.run.id, item.line)
            await self.tell(RunEvent(Told.INTERRUPTED, item.run, line=item.line))
            if not item.launched:
                await self.publish_verdict(item.run)
            elif deliver:
                await self.deliver(item.run.id)
        if deliver:
            now = time.time()
            for run in await self.runs.unowned():
                due = await self.queue.due_at(run.id) if run.launched else None
                if due is not None and due <= now:
                    await self.deliver(run.id)
        return found
