"""One job's state in Redis, read in one round trip: the owner of the ``job_current`` record.

A job's state is spread over several keys (:mod:`pipeline.state.keys`); :class:`JobStore` reads
all of them for one or many jobs in **one** pipelined round trip into a frozen
:class:`JobSnapshot`, and the watcher, ``status``, ``gpus``, the crash check and digests read a
job's state through it and nowhere else.  :class:`JobRecords` writes the ``job_current`` record
and the patches in effect (for the engines).  :func:`scope_of` is the one definition of a job's
lock scope.  :class:`DigestMemory` is what scheduled digests remember of a job between runs: where
the metric log was read to, the ranks seen so far, and the last digest's headline numbers (for the
±% change).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from pipeline.config import Config
from pipeline.state import keys
from pipeline.state.incidents import Incident, WatchState
from pipeline.state.redisconn import Store, as_float
from pipeline.state.runs import RunRecord

_PER_JOB = 9  #: commands per job in the pipelined read

# The newest run of a job, its record and whether it awaits verification, in one step of the
# pipeline.  KEYS: runs_of_job, runs_unverified; ARGV: the run key's prefix (keys.run(prefix, "")).
_LATEST_RUN = """
local ids = redis.call('ZREVRANGE', KEYS[1], 0, 0)
if #ids == 0 then return {false, false, false} end
local id = ids[1]
return {id, redis.call('GET', ARGV[1] .. id), redis.call('ZSCORE', KEYS[2], id)}
"""


def scope_of(config: Config, job: str) -> str:
    """The lock scope of a job's restarts: ``job:NAME``, or ``host:HOST`` with ``lock_scope = "host"``
    (as :func:`pipeline.state.keys.lock` takes it); KeyError if ``job`` is not configured."""
    spec = config.jobs[job]
    return f"host:{spec.host}" if spec.lock_scope == "host" else f"job:{job}"


@dataclass(frozen=True)
class JobSnapshot:
    """One job's state in Redis at one moment (read by :class:`JobStore`)."""

    name: str
    scope: str  #: its lock scope (:func:`scope_of`)
    #: the ``keys.job_current`` record as stored (``run_id``, ``pid``, ``start_time``, ``sid``, ``pgid``,
    #: ``launched_at``, ``log``, ``state``, ``patches``; Slurm jobs ``engine``, ``slurm_job``); empty
    #: when nothing was ever launched
    current: Mapping[str, str] = field(default_factory=dict)
    patches: tuple[str, ...] = ()  #: the patch names in effect in the workdir, sorted
    lock_held: bool = False
    lock_holder: Mapping[str, str] = field(default_factory=dict)  #: the hash beside the lock
    incident: Incident | None = None
    watch: WatchState = field(default_factory=WatchState)
    paused: bool = False  #: ``watch JOB off``
    auto_restarts: int = 0  #: automatic restarts within the job's ``auto_restart.within`` s before the read
    latest: RunRecord | None = None  #: the job's newest run
    unverified: bool = False  #: the newest run is launched and awaits its verification

    @property
    def stopped(self) -> bool:
        """The current record says the job was stopped (``stop JOB``)."""
        return self.current.get("state") == "stopped"

    @property
    def run_id(self) -> str | None:
        """The run that launched what runs now, or None."""
        return self.current.get("run_id") or None

    @property
    def pid(self) -> str:
        """The launched PID as recorded (a string, ``""`` when none or stopped)."""
        return "" if self.stopped else self.current.get("pid", "")

    @property
    def launched_at(self) -> float | None:
        """When the current run was launched (unix s), None if unknown or unreadable."""
        return as_float(self.current.get("launched_at"))

    def uptime(self, now: float) -> float | None:
        """Seconds the job has run at ``now``: from the current record's ``launched_at``, else (no
        record at all) from the newest run that was not a stop; None when stopped or unknown."""
        if self.stopped:
            return None
        launched = self.launched_at
        if launched is None and not self.current:
            run = self.latest
            launched = run.launched_at if run is not None and run.action != "stop" else None
        return max(0.0, now - launched) if launched is not None else None


class JobStore(Store):
    """Reads jobs' state (:class:`JobSnapshot`) from Redis, one pipelined round trip per call (``config``:
    lock scopes, automatic-restart windows)."""

    def __init__(self, client: aioredis.Redis, prefix: str, config: Config) -> None:
        super().__init__(client, prefix)
        self.config = config

    async def read(self, name: str, *, now: float | None = None) -> JobSnapshot:
        """One job's snapshot (:meth:`read_many`)."""
        return (await self.read_many([name], now=now))[0]

    async def read_many(self, names: Sequence[str], *, now: float | None = None) -> list[JobSnapshot]:
        """Several jobs' snapshots, in the order of ``names``, in one round trip; automatic restarts are
        counted back from ``now`` (unix s).  KeyError if a name is not configured."""
        if not names:
            return []
        when = time.time() if now is None else now
        p = self.prefix
        scopes = [scope_of(self.config, name) for name in names]
        async with self.client.pipeline(transaction=False) as pipe:
            for name, scope in zip(names, scopes, strict=True):
                auto = self.config.jobs[name].watch.auto_restart
                within = auto.within if auto else 0.0
                pipe.hgetall(keys.job_current(p, name))
                pipe.smembers(keys.job_patches(p, name))
                pipe.exists(keys.lock(p, scope))
                pipe.hgetall(keys.lock_holder(p, scope))
                pipe.hgetall(keys.incident(p, name))
                pipe.hgetall(keys.watch_state(p, name))
                pipe.exists(keys.watch_off(p, name))
                pipe.zcount(keys.auto_restarts(p, name), when - within, "+inf")
                pipe.eval(_LATEST_RUN, 2, keys.runs_of_job(p, name), keys.runs_unverified(p), keys.run(p, ""))
            raw = await pipe.execute()
        out = []
        for i, (name, scope) in enumerate(zip(names, scopes, strict=True)):
            current, patches, held, holder, incident, watch, paused, auto, latest = raw[
                i * _PER_JOB : (i + 1) * _PER_JOB
            ]
            _, run_json, score = latest or (None, None, None)
            out.append(
                JobSnapshot(
                    name=name,
                    scope=scope,
                    current={str(k): str(v) for k, v in (current or {}).items()},
                    patches=tuple(sorted(str(m) for m in patches or ())),
                    lock_held=bool(held),
                    lock_holder={str(k): str(v) for k, v in (holder or {}).items()},
                    incident=Incident.model_validate(incident) if incident else None,
                    watch=WatchState.model_validate(watch or {}),
                    paused=bool(paused),
                    auto_restarts=int(auto or 0),
                    latest=RunRecord.model_validate_json(run_json) if run_json else None,
                    unverified=score is not None,
                )
            )
        return out


class JobRecords(Store):
    """The writer of a job's ``current`` record and of the patches in effect in its workdir."""

    async def current(self, name: str) -> dict[str, str]:
        """The job's ``current`` record (empty when none)."""
        return await self.hash(keys.job_current(self.prefix, name))

    async def record_launch(self, run_id: str, name: str, current: Mapping[str, str], due: float) -> None:
        """Replace the job's ``current`` record with the launched run's and queue its verification
        at ``due`` (epoch seconds), in one transaction."""
        key = keys.job_current(self.prefix, name)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping=dict(current))  # type: ignore[arg-type]
            pipe.zadd(keys.runs_unverified(self.prefix), {run_id: due})
            await pipe.execute()

    async def mark_stopped(self, name: str, run_id: str) -> None:
        """The job's ``current`` record says stopped (by ``run_id``), its process identity removed."""
        key = keys.job_current(self.prefix, name)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(key, "pid", "start_time", "sid", "pgid")
            pipe.hset(
                key, mapping={"state": "stopped", "stopped_at": repr(time.time()), "stopped_by": run_id}
            )
            await pipe.execute()

    async def store_patches(self, name: str, in_effect: Sequence[str]) -> None:
        """Record the patch names in effect in the job's workdir (``keys.job_patches``)."""
        key = keys.job_patches(self.prefix, name)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            if in_effect:
                pipe.sadd(key, *in_effect)
            await pipe.execute()

    async def stored_patches(self, name: str) -> set[str]:
        """The patch names last recorded in effect for the job."""
        return {str(m) for m in await self.client.smembers(keys.job_patches(self.prefix, name))}


class DigestMemory(Store):
    """Digest bookkeeping in Redis (stored as the digest modules write it)."""

    async def offset(self, job: str) -> dict[str, str]:
        """The last scheduled digest's log offset fields (empty if none)."""
        return await self.hash(keys.digest_offset(self.prefix, job))

    async def ranks(self, job: str) -> dict[str, str]:
        """Every rank a digest saw → its JSON ``{"role", "last_ts"}``."""
        return await self.hash(keys.digest_ranks(self.prefix, job))

    async def add_ranks(self, job: str, fields: dict[str, str]) -> None:
        """Record ranks seen (rank → JSON)."""
        await self.client.hset(keys.digest_ranks(self.prefix, job), mapping=fields)  # type: ignore[arg-type]

    async def last(self, job: str) -> str | None:
        """The last scheduled digest's headline (JSON), or None."""
        raw = await self.client.get(keys.digest_last(self.prefix, job))
        return None if raw is None else str(raw)

    async def save(self, job: str, offset: dict[str, str], last: str | None) -> None:
        """A scheduled digest is done: its log offset, and its headline when it had metric lines."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(keys.digest_offset(self.prefix, job), mapping=offset)  # type: ignore[arg-type]
            if last is not None:
                pipe.set(keys.digest_last(self.prefix, job), last)
            await pipe.execute()
