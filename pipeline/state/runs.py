"""Run records: every restart is a run ``r-<n>`` kept in Redis with its steps (start, end, outcome,
detail: "where did it stop" always has an answer) and verdict (:mod:`pipeline.verdict`).

A run's record changes only through :class:`RunStore`'s named writes, each one compare-and-set on
the stored record: legal from the states in :data:`TRANSITIONS` (``finish``: its sequence ended it;
``decide``: verification set the verdict, re-runnable; step records...) and, for a caller's copy,
only at the revision it was read at, so two processes never both end one run and a stale copy
never overwrites a newer record.  Cancel requests live here too, and the throughput follow-up queue.

The verification queue (:class:`VerifyQueue`): launched runs awaiting their verdict, and the one
claim that delivers each.  A launched run is *queued* in ``keys.runs_unverified``, scored by its due
time (unix s).  Whoever comes first (the scheduler leader, ``pitstop say --wait``) *claims* it
(``SET NX`` with a short TTL its holder renews), verifies, posts, and marks it *done* (only the
claim's holder may, else :class:`~pipeline.errors.IllegalTransition`): dequeued, the claim kept as
``done:…`` for :data:`DONE_TTL` s so it is never delivered twice.  A *released* claim leaves the run
queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict
from redis.asyncio.client import Pipeline

from pipeline.errors import IllegalTransition, UnknownRun
from pipeline.state import keys
from pipeline.state.audit import Actor
from pipeline.state.redisconn import DELETE_IF_HELD, EXTEND_IF_HELD, Store, ms
from pipeline.verdict import Outcome, Step, Verdict

log = logging.getLogger(__name__)

OWNER_TTL = 30.0  #: seconds a run's owner heartbeat lives without renewal (the restart lock's TTL)
RECOVERY_LEASE = 120.0  #: seconds a claimed throughput follow-up is held before another process may post it

# KEYS[1] follow-up queue; ARGV[1] run id, ARGV[2] now, ARGV[3] the lease's end (unix s).  A due
# follow-up is claimed by moving its due time to the lease's end: 1, else 0 (not due, or held).
_CLAIM_RECOVERY = """local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not due or tonumber(due) > tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1]); return 1"""
# KEYS[1] follow-up queue; ARGV[1] run id, ARGV[2] the claim's lease end.  Dequeued only under it.
_RECOVERY_DONE = """local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not due or tonumber(due) ~= tonumber(ARGV[2]) then return 0 end
return redis.call('ZREM', KEYS[1], ARGV[1])"""


def identity(pid: int | None, slurm_job: int | None) -> str | None:
    """A run's process as a person reads it: ``Slurm job 42``, else ``pid 5151``; None if neither is known."""
    if slurm_job is not None:
        return f"Slurm job {slurm_job}"
    return None if pid is None else f"pid {pid}"


class RunState(StrEnum):
    """Where a run stands, read from its record (nothing more is stored)."""

    OPEN = "open"  #: its sequence runs, nothing launched yet
    AWAITING = "awaiting"  #: launched, its verdict not decided (or PENDING: queued by Slurm)
    DECIDED = "decided"  #: verified: a verdict from evidence (verification may run again)
    ENDED = "ended"  #: ended by its sequence (aborted, stopped, interrupted): final

    @classmethod
    def of(cls, run: RunRecord) -> RunState:
        """The state of ``run``."""
        if (run.verdict is None and run.finished_at is None) or run.verdict is Verdict.PENDING:
            launch = run.step(Step.LAUNCH)
            return cls.AWAITING if launch is not None and launch.outcome is Outcome.OK else cls.OPEN
        return cls.DECIDED if run.verdict in _DECIDED else cls.ENDED


#: verdicts that verification decides; the others end a sequence
_DECIDED = frozenset(
    {Verdict.STALE_RECORD, Verdict.EXITED, Verdict.ERROR_IN_LOG, Verdict.WRONG_COUNT, Verdict.NO_PROGRESS}
    | {Verdict.PENDING, Verdict.RUNNING}
)

#: each write of a run → the states of the stored record it is legal from
TRANSITIONS: dict[str, frozenset[RunState]] = {
    "finish": frozenset({RunState.OPEN, RunState.AWAITING}),
    "decide": frozenset({RunState.OPEN, RunState.AWAITING, RunState.DECIDED}),
    "record a step": frozenset({RunState.OPEN, RunState.AWAITING, RunState.DECIDED}),
    "be interrupted": frozenset({RunState.OPEN, RunState.AWAITING}),
    "be handed over": frozenset({RunState.OPEN, RunState.AWAITING}),
    "be amended": frozenset(RunState),
}


class StepRecord(BaseModel):
    """One step of a run: start and end (unix s), outcome and a one-line detail."""

    model_config = ConfigDict(extra="ignore")

    step: Step
    started_at: float
    ended_at: float | None = None
    outcome: Outcome = Outcome.RUNNING
    detail: str = ""
    #: stop: the recorded pid belonged to another process (start time differs): nothing was
    #: signalled, the verdict is ``STALE_RECORD``
    stale: bool = False

    @property
    def duration(self) -> float | None:
        """Seconds the step took, or None while it runs."""
        return None if self.ended_at is None else self.ended_at - self.started_at


class Reach(BaseModel):
    """How far one attempt (a launched run) got, read from its metric lines
    (:func:`pipeline.observe.attempts.reach_of`); kept for the next restart and ``history --attempts``."""

    model_config = ConfigDict(extra="ignore")

    steps: dict[str, int] = {}  #: role → the highest step its ranks logged
    #: the role whose step counts across resumes (the one a checkpoint's step names: the reference
    #: pipeline's drafters; its targets count from 1 in every run), and its highest step and steps/s
    role: str | None = None
    step: int | None = None
    steps_per_s: float | None = None
    #: median throughput (tokens/s) over the last ``recovery_window`` (:func:`~pipeline.observe.attempts.median_throughput`)
    tokens_per_s: float | None = None
    last_at: float | None = None  #: the ``ts`` of its last metric line (unix s)
    first_at: float | None = None  #: the ``ts`` of its first metric line (unix s)
    ended: str | None = None  #: how it ended, as people read it (``nccl_timeout: …``, ``stopped by r-5``)


class RunRecord(BaseModel):
    """A restart (or start/stop) of a job, as stored in Redis; times in unix s.  ``pid``/``start_time``/
    ``pgid``/``sid`` identify the launched process (start time in clock ticks since boot, ``/proc/PID/stat`` field 22)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    job: str
    action: str = "restart"  #: restart | start | stop | auto-restart | requeue (the scheduler's own)
    requested_by: str
    created_at: float
    patches: list[str] = []  #: patch names in effect after this run
    fresh_cache: bool = False
    exclude: list[str] = []  #: nodes the relaunch must leave out (``restart JOB excluding n2``; Slurm)
    from_step: int | None = None  #: the step ``restart JOB from step S`` asked to resume at
    auto: bool = False  #: Pitstop's own restart (auto_restart): it falls back to an intact checkpoint itself
    resume_step: int | None = None  #: the step handed to the launch through ``[jobs.NAME] resume_from``
    #: the checkpoint pre-flight verified (its step, and ``3 files, 2.30 GiB`` as the verdict says it)
    verified_step: int | None = None
    verified: str | None = None
    old_pid: int | None = None
    pid: int | None = None
    pgid: int | None = None
    sid: int | None = None
    start_time: int | None = None
    launched_at: float | None = None
    running_at: float | None = (
        None  #: when it started running, as verification saw it (a Slurm job left the queue)
    )
    log_size_at_launch: int | None = None
    metrics_size_at_launch: int | None = None  #: bytes of the job's ``metrics_log`` at the launch
    slurm_job: int | None = None  #: the Slurm job id launched (engine "slurm")
    old_slurm_job: int | None = None  #: the Slurm job id stopped (engine "slurm")
    steps: list[StepRecord] = []
    verdict: Verdict | None = None
    verdict_line: str | None = None
    evidence: str = ""  #: log tail or other evidence behind the verdict
    finished_at: float | None = None
    owner: str | None = None  #: instance id of the process executing the run (None: handed over)
    interrupted: str | None = None  #: ``INTERRUPTED after launch: …`` when its owner died after the launch
    warning: str | None = None  #: a flag for the thread beside a RUNNING verdict (a checkpoint ignored)
    #: the two-person rule (:mod:`pipeline.state.approvals`): who approved the run's request, and
    #: patch name → the SHA-256 approved, re-checked at pre-flight against the file's bytes
    approved_by: str | None = None
    approver: Actor | None = None  #: who approved, as their surface proved them
    actor: Actor | None = None  #: who asked for the run, as their surface proved them (None: older runs)
    approved_patches: dict[str, str] = {}
    break_glass: str | None = None  #: the reason an admin gave for acting without approval
    previous_run: str | None = None  #: the attempt this run followed (the job's previous launched run)
    resumed_at: int | None = None  #: the step it resumed at, as its verdict says (0: from scratch)
    lost: int | None = None  #: steps lost since the checkpoint it resumed from (its verdict's clause)
    lost_s: float | None = None  #: the training time those steps took (s), at the previous run's rate
    reach: Reach | None = None  #: how far it got, recorded once it ended (the next attempt read its log)
    #: a requeue by the scheduler (action ``requeue``): its post (``requeued: dflash (Slurm job 12,
    #: restart 1): … now PENDING, reason BeginTime``) and why (``preempted by job 13 (partition high) on n1``)
    requeued: str | None = None
    requeue_cause: str | None = None
    recovery: str | None = None  #: the throughput follow-up posted ``recovery_window`` after its verdict
    rev: int = 0  #: the record's revision, bumped by every write (a copy writes only at the stored one)

    def step(self, step: Step) -> StepRecord | None:
        """The record of ``step``, or None if it has not started."""
        return next((rec for rec in self.steps if rec.step is step), None)

    @property
    def current_step(self) -> Step | None:
        """The last step that started."""
        return self.steps[-1].step if self.steps else None

    @property
    def launched_as(self) -> str | None:
        """The launched run's identity (:func:`identity`): ``pid 5151`` or ``Slurm job 42``; None if none."""
        return identity(self.pid, self.slurm_job)

    @property
    def launched(self) -> bool:
        """The launch step ended OK and the run has a launched identity (a pid or a Slurm job id)."""
        rec = self.step(Step.LAUNCH)
        return rec is not None and rec.outcome is Outcome.OK and self.launched_as is not None


class RunStore(Store):
    """Run records in Redis: create, change (compare-and-set), read, list, and who owns each open run.

    A run is *owned* by the process executing it: :meth:`create` records this store's ``owner``
    (None: no heartbeat, for tools and tests) on the run and sets its heartbeat (``keys.run_owner``,
    TTL :data:`OWNER_TTL` s), renewed every third of it until the run is finished
    or :meth:`aclose` hands it over.  A dead process's runs' heartbeats lapse within
    :data:`OWNER_TTL` s and :meth:`unowned` finds them (see :mod:`pipeline.runs.orphans`).
    """

    def __init__(self, client: aioredis.Redis, prefix: str, *, owner: str | None = None) -> None:
        super().__init__(client, prefix)
        self.owner = owner
        self._owned: set[str] = set()
        self._heartbeat: asyncio.Task[None] | None = None

    async def create(
        self, job: str, requested_by: str, *, run_id: str | None = None, **fields: Any
    ) -> RunRecord:
        """A new run of ``job``, saved and marked open, owned by this store's ``owner``.

        :param run_id: one reserved by an approval request, else a new ``r-<n>``.
        :param fields: the rest of the run as :class:`RunRecord` names it (``action``, ``patches``,
            ``fresh_cache``, the two-person rule's ``approved_by``, ``approved_patches``, ``break_glass``).
        :raises IllegalTransition: if ``run_id`` already names a run.
        """
        if run_id is None:
            run_id = f"r-{await self.client.incr(keys.run_seq(self.prefix))}"
        elif await self.client.exists(keys.run(self.prefix, run_id)):
            raise IllegalTransition(f"run {run_id}", "created", "create")
        now = time.time()
        run = RunRecord(
            id=run_id, job=job, requested_by=requested_by, created_at=now, owner=self.owner, **fields
        )
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(keys.run(self.prefix, run.id), run.model_dump_json())
            pipe.zadd(keys.runs_of_job(self.prefix, job), {run.id: now})
            pipe.zadd(keys.runs_all(self.prefix), {run.id: now})
            pipe.sadd(keys.runs_open(self.prefix), run.id)
            if self.owner is not None:
                pipe.set(keys.run_owner(self.prefix, run.id), self.owner, px=ms(OWNER_TTL))
            await pipe.execute()
        if self.owner is not None:
            self._owned.add(run.id)
            if self._heartbeat is None or self._heartbeat.done():
                self._heartbeat = asyncio.get_running_loop().create_task(
                    self._beat(), name="pitstop-run-heartbeat"
                )
        return run

    async def record_step(self, run: RunRecord) -> None:
        """Write ``run`` as its sequence or verification changed it (a step begun or ended, what it
        launched); ``run.rev`` moves on.  :raises IllegalTransition: if the stored run ended, or was
        written since ``run`` was read."""
        await self._put(run, "record a step")

    async def finish(
        self,
        run: RunRecord,
        verdict: Verdict | None = None,
        line: str | None = None,
        evidence: str | None = None,
    ) -> RunRecord:
        """End ``run``'s sequence now, with ``verdict`` (None: a stop that succeeded) and ``evidence``
        (None: kept); saved and returned.  IllegalTransition if the run already ended or was verified,
        or was written since ``run`` was read (another process won)."""
        evidence = run.evidence if evidence is None else evidence
        return await self._put(
            run, "finish", verdict=verdict, verdict_line=line, evidence=evidence, finished_at=time.time()
        )

    async def decide(self, run: RunRecord, verdict: Verdict, line: str, evidence: str) -> RunRecord:
        """Record the verdict verification decided (``finished_at`` now); saved.  IllegalTransition if the
        run was ended by its sequence (nothing to verify), or was written since ``run`` was read."""
        return await self._put(
            run, "decide", verdict=verdict, verdict_line=line, evidence=evidence, finished_at=time.time()
        )

    async def interrupt_after_launch(self, run: RunRecord, line: str) -> RunRecord:
        """A launched run whose owner died: ``interrupted`` is ``line``, it has no owner now; saved.
        IllegalTransition if it ended or was verified, or was written since ``run`` was read."""
        return await self._put(run, "be interrupted", interrupted=line, owner=None)

    async def amend(self, run_id: str, **fields: object) -> RunRecord | None:
        """Set ``fields`` on the stored run, whatever its state (no other write lost): ``reach`` (how far an
        attempt got, a :class:`Reach`), ``recovery`` (the throughput follow-up's line).

        :returns: the run as saved, None if there is none.
        """
        with contextlib.suppress(UnknownRun):
            return await self._write(run_id, "be amended", lambda stored: stored.model_copy(update=fields))
        return None

    async def _put(self, run: RunRecord, wanted: str, **fields: object) -> RunRecord:
        """Write the caller's copy ``run`` with ``fields`` if the store still has it at ``run.rev``;
        ``run`` is changed (and returned) only once written."""
        new = await self._write(run.id, wanted, lambda _: run.model_copy(update=fields), rev=run.rev)
        for name in (*fields, "rev"):
            setattr(run, name, getattr(new, name))
        return run

    async def _write(
        self, run_id: str, wanted: str, change: Callable[[RunRecord], RunRecord], *, rev: int | None = None
    ) -> RunRecord:
        """The one write of a run record, a compare-and-set under WATCH: ``change(stored)`` is written,
        its revision bumped, if the stored run's state allows ``wanted`` (:data:`TRANSITIONS`) and, with
        ``rev``, it is still at revision ``rev``.  A finished run leaves the open set and its heartbeat;
        one whose owner is cleared leaves its heartbeat.

        :returns: the record as written.
        :raises UnknownRun: if there is no such run.
        :raises IllegalTransition: naming the stored state, if it refuses ``wanted``, or it is past
            ``rev`` (another writer won), or it kept changing under concurrent writes.
        """
        key = keys.run(self.prefix, run_id)

        def write(raw: str | bytes | None, pipe: Pipeline) -> RunRecord:
            if raw is None:
                raise UnknownRun(run_id)
            stored = RunRecord.model_validate_json(raw)
            state = RunState.of(stored)
            if state not in TRANSITIONS[wanted] or rev not in (None, stored.rev):
                at = "" if rev in (None, stored.rev) else f" at revision {stored.rev} (read at {rev})"
                raise IllegalTransition(f"run {run_id}", state.value + at, wanted)
            new = change(stored).model_copy(update={"rev": stored.rev + 1})
            pipe.set(key, new.model_dump_json())
            if new.finished_at is not None:
                pipe.srem(keys.runs_open(self.prefix), run_id)
            if new.finished_at is not None or (stored.owner is not None and new.owner is None):
                pipe.delete(keys.run_owner(self.prefix, run_id))
            return new

        new = await self.swap(key, write, f"run {run_id}", wanted)
        if new.finished_at is not None:
            self._owned.discard(run_id)
        return new

    async def attempts(
        self, job: str, count: int = 10, *, before: RunRecord | None = None
    ) -> list[RunRecord]:
        """Up to ``count`` of the job's attempts (runs that launched something, created ``before`` a
        run if given), newest first."""
        runs = await self.recent(job, max(count, 1) * 3 + 10)
        return [
            r
            for r in runs
            if r.launched_at is not None
            and r.launched_as is not None
            and (before is None or (r.created_at < before.created_at and r.id != before.id))
        ][:count]

    # --- the throughput follow-up: claimed under a lease, then done; a lapsed claim is claimed again

    async def schedule_recovery(self, run_id: str, due: float) -> None:
        """Queue ``run_id``'s throughput follow-up, due at ``due`` (unix s)."""
        await self.client.zadd(keys.runs_recovery(self.prefix), {run_id: due})

    async def due_recoveries(self, now: float, limit: int = 100) -> list[str]:
        """Ids of runs whose follow-up is due by ``now`` (unix s), oldest first."""
        found = await self.client.zrangebyscore(
            keys.runs_recovery(self.prefix), "-inf", now, start=0, num=limit
        )
        return [str(i) for i in found]

    async def claim_recovery(self, run_id: str, *, now: float, lease: float = RECOVERY_LEASE) -> float | None:
        """Claim a follow-up due by ``now`` (unix s) for ``lease`` s: its due time moves to the lease's
        end, so it is due again if its claimant dies before :meth:`recovery_done` (posted at least once).

        :returns: the claim (the lease's end, unix s), or None when not due, held, or done.
        """
        end = now + lease
        key = keys.runs_recovery(self.prefix)
        return end if await self.client.eval(_CLAIM_RECOVERY, 1, key, run_id, repr(now), repr(end)) else None

    async def recovery_done(self, run_id: str, claim: float) -> bool:
        """The claimed follow-up is posted (or had nothing to post): it leaves the queue for good.  False
        when the ``claim`` had lapsed and another process claimed it since (it posts too)."""
        key = keys.runs_recovery(self.prefix)
        return bool(await self.client.eval(_RECOVERY_DONE, 1, key, run_id, repr(claim)))

    # --- cancel requests ---------------------------------------------------------------------------

    async def request_cancel(self, run_id: str, user: str, ttl: float) -> None:
        """Ask ``run_id``'s sequence to stop at its next step boundary (the request lives ``ttl`` s)."""
        await self.client.set(keys.cancel_request(self.prefix, run_id), user, ex=max(1, int(ttl)))

    async def cancel_requested(self, run_id: str) -> bool:
        """True when someone asked to cancel ``run_id`` (read once per step boundary)."""
        return bool(await self.client.exists(keys.cancel_request(self.prefix, run_id)))

    async def clear_cancel(self, run_id: str) -> None:
        """Forget a cancel request once the sequence ended."""
        await self.client.delete(keys.cancel_request(self.prefix, run_id))

    # --- ownership ------------------------------------------------------------------------------

    async def _beat(self) -> None:
        while self._owned:
            await asyncio.sleep(OWNER_TTL / 3)
            try:
                await self.renew()
            except Exception:  # a Redis hiccup must not end the heartbeat: the next beat retries
                log.warning("could not renew the heartbeat of runs %s", sorted(self._owned), exc_info=True)

    async def renew(self) -> None:
        """Renew the heartbeat of every run this store owns, and forget finished ones and those another
        process took over."""
        ids = sorted(self._owned)
        if not ids or self.owner is None:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for run_id in ids:
                pipe.eval(EXTEND_IF_HELD, 1, keys.run_owner(self.prefix, run_id), self.owner, ms(OWNER_TTL))
                pipe.sismember(keys.runs_open(self.prefix), run_id)
            answers = await pipe.execute()
        for run_id, renewed, still_open in zip(ids, answers[::2], answers[1::2], strict=True):
            if not still_open or not renewed:
                if still_open:
                    log.warning("run %s: its heartbeat lapsed and another process took it over", run_id)
                self._owned.discard(run_id)

    async def claim_orphan(self, run_id: str, instance: str) -> bool:
        """Claim an open run whose owner is gone, for :data:`OWNER_TTL` s (``SET NX`` on its lapsed
        heartbeat, ``recovering:INSTANCE``); False if its owner came back or another claimed it first."""
        key = keys.run_owner(self.prefix, run_id)
        return bool(await self.client.set(key, f"recovering:{instance}", nx=True, px=ms(OWNER_TTL)))

    async def unclaim(self, run_id: str) -> None:
        """Drop the claim of :meth:`claim_orphan` (the take-over is recorded)."""
        await self.client.delete(keys.run_owner(self.prefix, run_id))

    async def hand_over(self, run_id: str) -> None:
        """Give up ownership of a launched run (the verification queue has it now): ``owner`` cleared,
        heartbeat deleted, so it is not taken for a dead process's.  A finished or unknown run is left."""
        self._owned.discard(run_id)
        with contextlib.suppress(UnknownRun, IllegalTransition):
            await self._write(
                run_id, "be handed over", lambda stored: stored.model_copy(update={"owner": None})
            )

    async def aclose(self) -> None:
        """Stop the heartbeat and hand every run still owned over (a clean exit: a run mid-sequence was
        cancelled and saved finished by its caller, what is left awaits verification)."""
        task, self._heartbeat = self._heartbeat, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for run_id in sorted(self._owned):
            try:
                await self.hand_over(run_id)
            except Exception:
                log.warning("could not hand run %s over; it is reconciled as interrupted", run_id)

    async def unowned(self) -> list[RunRecord]:
        """Open runs no live process heartbeats: their owner died, or they have none (handed over, or
        created by a store without one).  Runs already finished leave the open set here."""
        ids = sorted(str(m) for m in await self.client.smembers(keys.runs_open(self.prefix)))
        if not ids:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for run_id in ids:
                pipe.get(keys.run(self.prefix, run_id))
                pipe.exists(keys.run_owner(self.prefix, run_id))
            answers = await pipe.execute()
        out: list[RunRecord] = []
        for run_id, raw, beating in zip(ids, answers[::2], answers[1::2], strict=True):
            if raw is None or (run := RunRecord.model_validate_json(raw)).finished_at is not None:
                await self.client.srem(keys.runs_open(self.prefix), run_id)
            elif not beating:
                out.append(run)
        return out

    async def find(self, run_id: str) -> RunRecord | None:
        """The run ``run_id``, or None if there is none."""
        raw = await self.client.get(keys.run(self.prefix, run_id))
        return None if raw is None else RunRecord.model_validate_json(raw)

    async def get(self, run_id: str) -> RunRecord:
        """The run ``run_id`` (:class:`~pipeline.errors.UnknownRun` if there is none)."""
        if (run := await self.find(run_id)) is None:
            raise UnknownRun(run_id)
        return run

    async def recent(self, job: str | None = None, count: int = 10) -> list[RunRecord]:
        """Up to ``count`` runs, newest first, of one job or of all jobs."""
        key = keys.runs_of_job(self.prefix, job) if job else keys.runs_all(self.prefix)
        ids = await self.client.zrevrange(key, 0, max(count, 1) - 1)
        if not ids:
            return []
        raws = await self.client.mget([keys.run(self.prefix, str(i)) for i in ids])
        return [RunRecord.model_validate_json(r) for r in raws if r is not None]


# --- the verification queue ----------------------------------------------------------------------

DONE_TTL = 7 * 86400.0  #: seconds a delivered claim is remembered

# KEYS[1] claim, KEYS[2] queue; ARGV[1] holder, ARGV[2] done ttl in ms, ARGV[3] run id.
_DONE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], 'done:' .. ARGV[1], 'PX', ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[3])
return 1
"""

# KEYS[1] claim, KEYS[2] queue; ARGV[1] run id.  Dequeues unless a delivery holds the claim.
_SETTLE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
return redis.call('ZREM', KEYS[2], ARGV[1])
"""


@dataclass(frozen=True)
class Claim:
    """A held claim on delivering one run's verdict."""

    run_id: str
    holder: str  #: the value stored in the claim (instance id and time)
    ttl: float  #: seconds the claim lives without :meth:`VerifyQueue.extend`


class VerifyQueue(Store):
    """Launched runs awaiting verification, and the claims that deliver them."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        super().__init__(client, prefix)
        self.key = keys.runs_unverified(prefix)

    async def enqueue(self, run_id: str, due: float, *, keep: bool = False) -> None:
        """Queue ``run_id``, due at ``due`` (unix s); with ``keep`` one already queued keeps its due time."""
        await self.client.zadd(self.key, {run_id: due}, nx=keep)

    async def requeue(self, run_id: str, due: float) -> None:
        """Move a queued run's due time to ``due`` (unix s); a run not queued stays out."""
        await self.client.zadd(self.key, {run_id: due}, xx=True)

    async def due_at(self, run_id: str) -> float | None:
        """When ``run_id``'s verification is due (unix s), or None if it is not queued."""
        score = await self.client.zscore(self.key, run_id)
        return None if score is None else float(score)

    async def due(self, limit: int = 100) -> list[str]:
        """Ids of queued runs due now, oldest first."""
        return [str(i) for i in await self.client.zrangebyscore(self.key, "-inf", time.time(), 0, limit)]

    async def claim(self, run_id: str, holder: str, ttl: float) -> Claim | None:
        """Claim delivering ``run_id``'s verdict for ``ttl`` s; None if another delivery holds it (or did it)."""
        name = keys.verify_claim(self.prefix, run_id)
        return (
            Claim(run_id, holder, ttl) if await self.client.set(name, holder, nx=True, px=ms(ttl)) else None
        )

    async def extend(self, claim: Claim) -> bool:
        """Extend a held claim by its TTL; False if it was lost (expired, taken by another)."""
        name = keys.verify_claim(self.prefix, claim.run_id)
        return bool(await self.client.eval(EXTEND_IF_HELD, 1, name, claim.holder, ms(claim.ttl)))

    async def release(self, claim: Claim) -> None:
        """Give a claim up, leaving the run as it is in the queue (delivered again when due)."""
        await self.client.eval(DELETE_IF_HELD, 1, keys.verify_claim(self.prefix, claim.run_id), claim.holder)

    async def done(self, claim: Claim) -> None:
        """The verdict is delivered: the run leaves the queue and its claim is kept as done
        (IllegalTransition if this holder no longer holds the claim)."""
        name = keys.verify_claim(self.prefix, claim.run_id)
        if not await self.client.eval(_DONE, 2, name, self.key, claim.holder, ms(DONE_TTL), claim.run_id):
            raise IllegalTransition(
                f"verification of {claim.run_id}", "not claimed by this holder", "be done"
            )

    async def settle(self, run_id: str) -> None:
        """A verdict was decided: dequeue the run unless a delivery holds its claim (it will, when done)."""
        await self.client.eval(_SETTLE, 2, keys.verify_claim(self.prefix, run_id), self.key, run_id)

    async def drop(self, run_id: str) -> None:
        """Forget a queued run that no longer exists."""
        await self.client.zrem(self.key, run_id)
