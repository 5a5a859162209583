"""Delivering a run's verdict: verify once, tell once, whichever process gets there first.

A launched run waits in the verification queue (:class:`pipeline.state.runs.VerifyQueue`), due at
launch + ``start_window`` (overdue after a restart of Pitstop: the first poll delivers it).  The
scheduler leader or ``pitstop say --wait`` calls :meth:`Verification.deliver`; the queue's claim
makes one of them verify and tell.  The claim lives ``CLAIM_TTL`` s unless renewed and is made
permanent only once the listeners took the verdict (the surfaces handed their posts to their
outbox), so a process that dies half-way leaves the run to be delivered again (never zero
times).  A ``PENDING`` run (a Slurm job still queued at its deadline) is told once and stays
queued; later deliveries tell only the real verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from pipeline.errors import IllegalTransition, PitstopError
from pipeline.runs.base import RunEvent, RunServiceBase, Told
from pipeline.state.runs import Claim, RunRecord, RunState
from pipeline.verdict import Verdict

log = logging.getLogger(__name__)

CLAIM_TTL = 30.0  #: seconds a claim lives without renewal while its holder verifies and tells
RETRY_AFTER = 15.0  #: seconds before a verification that failed to run is tried again


class Verification(RunServiceBase):
    """The verification claim and the verdict (part of :class:`~pipeline.runs.service.RunService`)."""

    async def deliver(self, run_id: str) -> RunRecord | None:
        """Verify a launched run (not again if it has a verdict), tell its VERDICT and publish the
        ``verdict`` event, unless another process claimed it.

        :returns: the verified run, or None if someone else claimed it, the run is unknown or was ended
            by its sequence (or a take-over, which told it), or verification could not run (it is retried
            after :data:`RETRY_AFTER` s; at the next poll when the run changed under it).
        :raises Exception: what a listener raised (the claim lapses: delivered again).
        """
        claim = await self.queue.claim(run_id, f"{self.instance}:{time.time():.3f}", CLAIM_TTL)
        if claim is None:
            return None
        renewal = asyncio.get_running_loop().create_task(self._renew_claim(claim))
        keep = False  # the claim is released (shielded) unless something was told
        try:
            run = await self.runs.find(run_id)
            # ended (and told) by its sequence or a take-over
            if run is None or RunState.of(run) is RunState.ENDED:
                await self.queue.drop(run_id)
                return None
            before = run.verdict
            try:
                if run.verdict is None or run.verdict is Verdict.PENDING:
                    run = await self.restarter.verify(run)
            except IllegalTransition as exc:  # another writer won: nothing told; the next poll tries again
                log.info("%s: verdict not recorded: %s", run_id, exc.message)
                await self.queue.requeue(run_id, time.time())
                return None
            except Exception as exc:
                text = exc.message if isinstance(exc, PitstopError) else f"{type(exc).__name__}: {exc}"
                log.warning(verdict_not_delivered(run_id, text), exc_info=not isinstance(exc, PitstopError))
                await self.queue.requeue(run_id, time.time() + RETRY_AFTER)
                return None
            keep = True  # from here a failure (a listener's) leaves the claim to lapse: delivered again
            if run.verdict is not Verdict.PENDING or before is not Verdict.PENDING:
                await self.tell(RunEvent(Told.VERDICT, run))  # still queued while the claim is held
                await self.publish_verdict(run)
            if run.verdict is Verdict.PENDING:  # still queued (Slurm): the engine re-queued the check
                await self.queue.release(claim)
                return run
            try:
                await self.queue.done(claim)
            except IllegalTransition as exc:  # the claim expired mid-post: its new holder finishes it
                log.warning("%s: %s", run_id, exc.message)
            return run
        finally:
            renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewal
            if not keep:
                await asyncio.shield(self.queue.release(claim))

    async def _renew_claim(self, claim: Claim) -> None:
        """Extend a held claim every ``ttl / 3`` s: a live verifier keeps it, a dead one loses it in ``ttl``."""
        while True:
            await asyncio.sleep(claim.ttl / 3)
            try:
                await self.queue.extend(claim)
            except Exception:
                log.warning("could not extend the verification claim of %s", claim.run_id, exc_info=True)

    async def deliver_due(self) -> list[RunRecord]:
        """Deliver every verification that is due now (concurrently, at most 100, oldest first);
        others' claims are skipped.

        :returns: the runs this process delivered.
        """

        async def one(run_id: str) -> RunRecord | None:
            try:
                return await self.deliver(run_id)
            except Exception as exc:
                log.error(verdict_not_delivered(run_id, repr(exc)), exc_info=exc)
                return None

        return [run for run in await asyncio.gather(*map(one, await self.queue.due())) if run is not None]


# --- text ---------------------------------------------------------------------------------------


def verdict_not_delivered(run_id: str, error: str) -> str:
    """A verification that failed to run (logged; retried later)."""
    return f"verification of {run_id} failed: {error} - retrying"
