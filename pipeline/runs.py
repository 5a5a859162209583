"""Run records: every restart is a run ``r-<n>`` kept in Redis with its steps and verdict.

A run's steps are one closed enum (:class:`Step`) with fixed labels, each recorded with
its start, end, outcome and detail, so "where did it stop" always has an answer.  The
verdict is one closed set (:class:`Verdict`), listed in precedence order: when several
apply, the first wins.
"""

from __future__ import annotations

import time
from enum import StrEnum

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict

from pipeline import keys
from pipeline.errors import UnknownRun


class Step(StrEnum):
    """The steps of the restart sequence, in order; the values are the labels people see."""

    PREFLIGHT = "preflight"
    STOP = "stop"
    CLEAR_CACHE = "clear_cache"
    PATCH = "patch"
    LAUNCH = "launch"
    VERIFY = "verify"


class Outcome(StrEnum):
    """How one step ended."""

    RUNNING = "running"  #: started, not finished yet
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"  #: nothing to do (no cache asked for, no patch change)
    WAITING = "waiting"  #: verify scheduled, not yet due


class Verdict(StrEnum):
    """The closed set of outcomes of a run, in precedence order (first applicable wins)."""

    PREFLIGHT_FAILED = "PREFLIGHT_FAILED"
    STOP_FAILED = "STOP_FAILED"
    LAUNCH_FAILED = "LAUNCH_FAILED"
    STALE_RECORD = "STALE_RECORD"
    CANCELLED = "CANCELLED"
    INTERRUPTED = "INTERRUPTED"
    EXITED = "EXITED"
    ERROR_IN_LOG = "ERROR_IN_LOG"
    WRONG_COUNT = "WRONG_COUNT"
    NO_PROGRESS = "NO_PROGRESS"
    PENDING = "PENDING"  #: still queued by the scheduler (Slurm) at the deadline; re-checked later
    RUNNING = "RUNNING"

    @property
    def ok(self) -> bool:
        """True only for ``RUNNING``."""
        return self is Verdict.RUNNING


VERDICT_ORDER: tuple[Verdict, ...] = tuple(Verdict)


class StepRecord(BaseModel):
    """One step of a run: start and end (unix s), outcome and a one-line detail."""

    model_config = ConfigDict(extra="ignore")

    step: Step
    started_at: float
    ended_at: float | None = None
    outcome: Outcome = Outcome.RUNNING
    detail: str = ""

    @property
    def duration(self) -> float | None:
        """Seconds the step took, or None while it runs."""
        return None if self.ended_at is None else self.ended_at - self.started_at


class RunRecord(BaseModel):
    """A restart (or start/stop) of a job, as stored in Redis.

    Times are unix seconds.  ``pid``/``start_time``/``pgid``/``sid`` identify the launched
    process (start time in clock ticks since boot, field 22 of ``/proc/PID/stat``).
    """

    model_config = ConfigDict(extra="ignore")

    id: str
    job: str
    action: str = "restart"  #: restart | start | stop | auto-restart
    requested_by: str
    created_at: float
    patches: list[str] = []  #: patch names in effect after this run
    fresh_cache: bool = False
    old_pid: int | None = None
    pid: int | None = None
    pgid: int | None = None
    sid: int | None = None
    start_time: int | None = None
    launched_at: float | None = None
    log_size_at_launch: int | None = None
    slurm_job: int | None = None  #: the Slurm job id launched (engine "slurm")
    old_slurm_job: int | None = None  #: the Slurm job id stopped (engine "slurm")
    steps: list[StepRecord] = []
    verdict: Verdict | None = None
    verdict_line: str | None = None
    evidence: str = ""  #: log tail or other evidence behind the verdict
    finished_at: float | None = None

    def step(self, step: Step) -> StepRecord | None:
        """The record of ``step``, or None if it has not started."""
        for rec in self.steps:
            if rec.step is step:
                return rec
        return None

    @property
    def current_step(self) -> Step | None:
        """The last step that started."""
        return self.steps[-1].step if self.steps else None


class RunStore:
    """Run records in Redis: create, save, read, list, and reconcile after a crash.

    :param client: an asyncio Redis client with ``decode_responses=True``.
    :param prefix: the key prefix (:mod:`pipeline.keys`).
    """

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    async def create(
        self,
        job: str,
        requested_by: str,
        *,
        action: str = "restart",
        patches: list[str] | None = None,
        fresh_cache: bool = False,
    ) -> RunRecord:
        """A new run ``r-<n>``, saved and marked open.

        :returns: the record; ``patches`` starts as the requested set.
        """
        n = await self.client.incr(keys.run_seq(self.prefix))
        now = time.time()
        run = RunRecord(
            id=f"r-{n}",
            job=job,
            action=action,
            requested_by=requested_by,
            created_at=now,
            patches=list(patches or []),
            fresh_cache=fresh_cache,
        )
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(keys.run(self.prefix, run.id), run.model_dump_json())
            pipe.zadd(keys.runs_of_job(self.prefix, job), {run.id: now})
            pipe.zadd(keys.runs_all(self.prefix), {run.id: now})
            pipe.sadd(keys.runs_open(self.prefix), run.id)
            await pipe.execute()
        return run

    async def save(self, run: RunRecord) -> None:
        """Write ``run`` back; a run with a verdict and ``finished_at`` leaves the open set."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(keys.run(self.prefix, run.id), run.model_dump_json())
            if run.finished_at is not None:
                pipe.srem(keys.runs_open(self.prefix), run.id)
            await pipe.execute()

    async def get(self, run_id: str) -> RunRecord:
        """The run with id ``run_id``.

        :raises UnknownRun: if there is none.
        """
        raw = await self.client.get(keys.run(self.prefix, run_id))
        if raw is None:
            raise UnknownRun(run_id)
        return RunRecord.model_validate_json(raw)

    async def recent(self, job: str | None = None, count: int = 10) -> list[RunRecord]:
        """Up to ``count`` runs, newest first, of one job or of all jobs."""
        key = keys.runs_of_job(self.prefix, job) if job else keys.runs_all(self.prefix)
        ids = await self.client.zrevrange(key, 0, max(count, 1) - 1)
        if not ids:
            return []
        raws = await self.client.mget([keys.run(self.prefix, str(i)) for i in ids])
        return [RunRecord.model_validate_json(r) for r in raws if r is not None]

    async def latest(self, job: str) -> RunRecord | None:
        """The job's newest run, or None."""
        runs = await self.recent(job, 1)
        return runs[0] if runs else None

    async def open_ids(self) -> set[str]:
        """Ids of runs whose sequence has not finished."""
        members = await self.client.smembers(keys.runs_open(self.prefix))
        return {str(m) for m in members}
