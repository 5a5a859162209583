"""Incidents, once each: what is wrong with a job, kept in Redis and changed only by compare-and-set.

This is where an alert is de-duplicated: a job has at most one open :class:`Incident`, opened
only if none is, and every later change is a compare-and-set on its revision ``rev``, so of two
processes deciding the same transition one applies it and posts.  Beside each incident the store
keeps the watcher's memory of the job (:class:`WatchState`; :func:`pipeline.observe.watch.assess`
decides the transitions).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator
from redis.asyncio.client import Pipeline

from pipeline.errors import IllegalTransition
from pipeline.state import keys
from pipeline.state.redisconn import Store

LOG_LINES = 30  #: log lines shown in an alert
HISTORY_S = 8 * 86400.0  #: seconds a resolved incident is kept for goodput (a week's windows and a day)


class IncidentKind(StrEnum):
    """What is wrong with a job; the values are the ``kind`` of ALERT events."""

    DEAD = "dead"
    DEGRADED = "degraded"
    STALLED = "stalled"
    STUCK_RANK = "stuck_rank"
    UNREACHABLE = "unreachable"
    CRASH_LOOP = "crash_loop"
    IDLE_GPUS = "idle_gpus"  #: a running job's GPUs under ``idle_gpu_below`` for ``idle_gpu_for``
    LOSS_NAN = "loss_nan"  #: a rank logged a NaN or infinite loss (:mod:`pipeline.observe.loss`)
    LOSS_SPIKE = "loss_spike"  #: a rank's loss stayed above ``loss_spike`` × its rolling median
    #: requeued by the scheduler (a preemption) and PENDING for ``[jobs.NAME.watch] pending_after`` s
    QUEUED = "queued"


class _Stored(BaseModel):
    """A model kept as a Redis hash of strings (None fields are absent)."""

    model_config = ConfigDict(extra="ignore")

    def to_hash(self) -> dict[str, str]:
        """Field → string, leaving out None (bools as ``1``/``0``, dicts as JSON)."""
        dumped = self.model_dump(mode="json", exclude_none=True).items()
        return {
            k: str(int(v)) if isinstance(v, bool) else json.dumps(v) if isinstance(v, dict) else str(v)
            for k, v in dumped
        }


class WatchState(_Stored):
    """The watcher's memory of a job between cycles (``keys.watch_state``); times in unix s."""

    last_alive_at: float | None = None  #: when a process of the job was last seen
    last_pid: int | None = None  #: the launched PID seen then
    last_count: int | None = None  #: how many processes were seen then
    log_size: int | None = None  #: the log size at the last cycle (bytes)
    progress_at: float | None = None  #: when the log last grew
    degraded_since: float | None = None  #: since when fewer than ``processes`` but more than zero run
    exit_cause: str | None = None  #: the last exit cause the host reported
    probe_failures: int | None = None  #: consecutive cycles the host could not be reached
    unreachable_since: float | None = None  #: when the first of them was
    #: GPU index → since when it has been under ``idle_gpu_below`` (:func:`pipeline.observe.idle.idle_since`)
    idle_gpus_since: dict[int, float] | None = None
    probe_s: float | None = None  #: seconds the last probe of the host took (status names slow hosts)

    @field_validator("idle_gpus_since", mode="before")
    @classmethod
    def _json(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value


class Incident(_Stored):
    """A job's open incident (``keys.incident``); deleted when it resolves.  Times in unix s."""

    n: int = 0  #: the job's incident number (thread key ``incident:JOB:N``)
    rev: int = 0  #: revision, bumped by every change (compare-and-set)
    job: str
    host: str
    kind: IncidentKind
    opened_at: float
    changed_at: float | None = None
    notified_at: float  #: when the alert or the last reminder was posted
    count: int = 0
    expected: int = 1
    last_pid: int | None = None
    last_alive_at: float | None = None
    exit_cause: str | None = None
    cause: str | None = None
    log: str | None = None  #: the log tail shown in the alert
    error: str | None = None
    acked_by: str | None = None
    acked_at: float | None = None
    next_auto_at: float | None = None  #: when the next automatic restart is due, if one is
    auto_restarts: int = 0  #: automatic restarts made during this incident
    gave_up: bool = False
    resolved_at: float | None = None
    resolution: str | None = None  #: why it resolved: running | stopped | reachable
    rank: int | None = (
        None  #: a stuck rank (or a loss incident's rank): its global rank, role, last step and pid
    )
    rank_role: str | None = None
    rank_step: int | None = None
    rank_pid: int | None = None
    crash_class: str | None = None  #: a dead job: the class of its failure (pipeline.observe.crashes)
    crash_evidence: str | None = None
    crash_exc_type: str | None = None
    crash_message: str | None = None
    last_actor: str | None = None  #: who started or restarted the job last (``notify_last_actor``)
    crash_rank: int | None = None
    crash_step: int | None = None
    no_auto: str | None = None  #: why no automatic restart follows (the give-up alert's text)
    loss_value: str | None = None  #: a loss incident: the loss shown (``NaN``, ``Inf``, ``41.3``)
    loss_step: int | None = None  #: the first step of its trouble
    #: the newest checkpoint step before ``loss_step`` (:func:`pipeline.observe.loss.checkpoint_before`)
    rollback_step: int | None = None
    #: nodes its evidence made suspect and why (``n2: Xid 79``), told in the alert (:mod:`handlers.watch.suspects`)
    suspects: str | None = None
    idle_gpus: str | None = None  #: idle GPUs: their indices, comma-separated (``cause`` names them)
    story: str | None = None  #: the outbox key of the grouped post it was told in (an alert storm), if any
    paged: bool = (
        False  #: an escalation step sent it to the pager (``[pager]``): its resolution goes there too
    )
    #: escalation steps taken (all of them once ``watch JOB off`` ended it), :mod:`handlers.watch.escalate`
    escalated: int = 0

    @property
    def thread_key(self) -> str:
        """The outbox key of the incident's alert message: ``incident:JOB:N``."""
        return f"incident:{self.job}:{self.n}"


class IncidentSpan(BaseModel):
    """An incident's kind and when it was open (unix s; ``resolved_at`` None: open still), for goodput."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    n: int
    kind: str  #: an :class:`IncidentKind` value (kinds other engineers add are kept by name)
    opened_at: float
    resolved_at: float | None = None


# --- Redis storage -------------------------------------------------------------------------------


def _opened(incident: Incident, wanted: str) -> None:
    if incident.n < 1:
        raise IllegalTransition(f"incident of {incident.job}", "never opened", wanted)


REQUEUE_TOLD_S = 7 * 86400  #: seconds a requeue is remembered as told


class IncidentStore(Store):
    """Incidents and watcher memory in Redis, changed only by compare-and-set (:meth:`Store.swap`)."""

    async def incident(self, job: str) -> Incident | None:
        """The job's open incident, or None."""
        raw = await self.client.hgetall(keys.incident(self.prefix, job))
        return Incident.model_validate(raw) if raw else None

    async def open(self, incident: Incident) -> Incident | None:
        """Open ``incident`` if the job has none open: returns it at rev 1, numbered after the job's
        last (``incident_seq`` in its watch state, raised in the same transaction: no gaps), or None
        if one was open."""
        key, state = keys.incident(self.prefix, incident.job), keys.watch_state(self.prefix, incident.job)

        async def read(pipe: Pipeline) -> tuple[int, str | bytes | None]:
            return await pipe.exists(key), await pipe.hget(state, "incident_seq")

        def write(found: tuple[int, str | bytes | None], pipe: Pipeline) -> Incident | None:
            if found[0]:
                return None
            opened = incident.model_copy(update={"n": int(found[1] or 0) + 1, "rev": 1})
            pipe.hset(key, mapping=opened.to_hash())  # type: ignore[arg-type]
            pipe.hset(state, "incident_seq", opened.n)
            return opened

        return await self.swap(key, write, f"incident of {incident.job}", "open", read=read, watch=(state,))

    async def update(self, expected: Incident, new: Incident) -> Incident | None:
        """Replace the open incident ``expected`` (same ``n`` and ``rev``) by ``new``: returns ``new`` with its
        revision bumped, None if it changed meanwhile; IllegalTransition if ``expected`` was never opened."""
        _opened(expected, "change")
        changed = new.model_copy(update={"n": expected.n, "rev": expected.rev + 1})
        return changed if await self._replace(expected, "change", changed) else None

    async def close(self, expected: Incident, *, at: float | None = None) -> bool:
        """Delete the open incident ``expected`` (same ``n`` and ``rev``), keeping its span (resolved
        ``at``, unix s; default its ``resolved_at``, else the clock) for :data:`HISTORY_S` s: False if
        it changed or closed meanwhile; IllegalTransition if ``expected`` was never opened."""
        _opened(expected, "resolve")
        at = (
            at
            if at is not None
            else expected.resolved_at
            if expected.resolved_at is not None
            else time.time()
        )
        return await self._replace(expected, "resolve", None, resolved_at=at)

    async def history(self, job: str, *, since: float) -> list[IncidentSpan]:
        """The job's incidents resolved at or after ``since`` (unix s), oldest first."""
        raw = await self.client.zrangebyscore(keys.incident_history(self.prefix, job), since, "+inf")
        return [IncidentSpan.model_validate_json(str(item)) for item in raw]

    async def _replace(
        self, expected: Incident, wanted: str, new: Incident | None, *, resolved_at: float | None = None
    ) -> bool:
        """The compare-and-set of an open incident: if it is still ``expected`` (same ``n`` and ``rev``),
        it becomes ``new`` (None: deleted, its span kept as resolved at ``resolved_at``) and True is
        returned, else False."""
        key = keys.incident(self.prefix, expected.job)
        done = keys.incident_history(self.prefix, expected.job)

        def write(raw: dict[str, str], pipe: Pipeline) -> bool:
            if raw.get("n") != str(expected.n) or raw.get("rev") != str(expected.rev):
                return False
            pipe.delete(key)
            if new is not None:
                pipe.hset(key, mapping=new.to_hash())  # type: ignore[arg-type]
            if resolved_at is not None:
                kind = raw.get("kind", expected.kind.value)
                span = IncidentSpan(
                    n=expected.n, kind=kind, opened_at=expected.opened_at, resolved_at=resolved_at
                )
                pipe.zadd(done, {span.model_dump_json(): resolved_at})
                pipe.zremrangebyscore(done, "-inf", resolved_at - HISTORY_S)
            return True

        return await self.swap(
            key, write, f"incident of {expected.job}", wanted, read=lambda p: p.hgetall(key)
        )

    async def save_states(self, states: dict[str, WatchState]) -> None:
        """Write the watcher memory of many jobs in one round trip (fields that became None are
        removed; a job with nothing to store yet is left alone)."""
        async with self.client.pipeline(transaction=False) as pipe:
            for job, state in states.items():
                key, fields = keys.watch_state(self.prefix, job), state.to_hash()
                if fields:
                    pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
                if gone := [name for name in WatchState.model_fields if name not in fields]:
                    pipe.hdel(key, *gone)
            await pipe.execute()

    async def pause(self, job: str, user: str, seconds: int) -> None:
        """``watch JOB off``: no watching of ``job`` for ``seconds``."""
        await self.client.set(keys.watch_off(self.prefix, job), user, ex=max(1, seconds))

    async def resume(self, job: str) -> bool:
        """``watch JOB on``: watch again, forgetting the progress memory of before the pause; returns
        whether watching was paused."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(keys.watch_off(self.prefix, job))
            pipe.hdel(keys.watch_state(self.prefix, job), "progress_at", "degraded_since", "log_size")
            was_off, _ = await pipe.execute()
        return bool(was_off)

    async def count_auto_restart(self, incident: Incident, now: float, within: float | None) -> None:
        """Count an automatic restart of the incident's job at ``now`` (unix s) for the crash-loop
        bound, forgetting those older than ``within`` seconds (None: keep all)."""
        key = keys.auto_restarts(self.prefix, incident.job)
        await self.client.zadd(key, {f"{now!r}:{incident.n}": now})
        if within is not None:
            await self.client.zremrangebyscore(key, "-inf", now - within)

    async def claim_requeue(self, job: str, slurm_job: int, restarts: int) -> bool:
        """Whether this process is the one to tell Slurm's requeue number ``restarts`` of
        ``slurm_job`` (True once, for a week: it is told once whoever watches)."""
        key = keys.requeue_told(self.prefix, job, slurm_job, restarts)
        return bool(await self.client.set(key, "1", nx=True, ex=REQUEUE_TOLD_S))

    async def last_crash(self, job: str) -> dict[str, str]:
        """The job's last classified crash (``crash_*`` fields, ``run_id``, ``repeat``; empty if none)."""
        return await self.hash(keys.last_crash(self.prefix, job))

    async def remember_crash(self, job: str, fields: dict[str, str]) -> None:
        """Replace the job's last classified crash."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(keys.last_crash(self.prefix, job))
            pipe.hset(keys.last_crash(self.prefix, job), mapping=fields)  # type: ignore[arg-type]
            await pipe.execute()

    async def progress(self, jobs: Sequence[str]) -> dict[str, str | None]:
        """The per-rank progress of ``jobs`` as stored, in one round trip: job → JSON
        (:class:`pipeline.observe.progress.ProgressState`), None when none is stored."""
        if not jobs:
            return {}
        raw = await self.client.mget([keys.rank_progress(self.prefix, job) for job in jobs])
        return {job: None if value is None else str(value) for job, value in zip(jobs, raw, strict=True)}

    async def save_progress(self, states: Mapping[str, str]) -> None:
        """Store the per-rank progress of many jobs in one round trip (job → JSON)."""
        if states:
            await self.client.mset({keys.rank_progress(self.prefix, job): raw for job, raw in states.items()})
