"""One restart in flight per job (or per host): a refused acquire of :mod:`pipeline.state.locks`
becomes :class:`InFlight`, whose message names the holder."""

from __future__ import annotations

import time

from handlers.reply import who
from pipeline.errors import ExitCode, PitstopError
from pipeline.state import locks
from pipeline.state.locks import DEFAULT_TTL, Holder

__all__ = ["DEFAULT_TTL", "Holder", "InFlight", "JobLock", "in_flight"]


class InFlight(PitstopError):
    """Refused: another restart of the job (or on its host) holds the lock; ``holder`` None if its
    record could not be read in time."""

    code = "in_flight"
    exit_code = ExitCode.IN_FLIGHT

    def __init__(self, job: str, holder: Holder | None) -> None:
        self.job = job
        self.holder = holder
        h = holder or Holder("", job, "restart", "someone", "", "unknown", time.time())
        super().__init__(
            in_flight(h.action or "restart", h.job or job, h.user or "someone", h.age(), h.step or "unknown")
        )


class JobLock(locks.JobLock):
    """The restart lock as a request takes it: a refusal is :class:`InFlight` (exit 4)."""

    async def acquire(
        self, *, job: str, action: str, user: str, run_id: str = "", step: str = "queued"
    ) -> Holder:
        """Take the lock now (:meth:`pipeline.state.locks.JobLock.acquire`); :class:`InFlight`
        if someone else holds it (naming them)."""
        try:
            return await super().acquire(job=job, action=action, user=user, run_id=run_id, step=step)
        except locks.LockHeld as refused:
            raise InFlight(job, refused.holder) from None


# --- text ---------------------------------------------------------------------------------------


def in_flight(action: str, job: str, user: str, seconds: float, step: str) -> str:
    """A restart refused because another is in flight (the exact wording people learn to read)."""
    return (
        f"{action} of {job} already in flight - started by {who(user)} {int(seconds)} s ago, now at: {step}"
    )
