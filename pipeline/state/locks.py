"""One restart in flight per scope (a job, or a host): a redis-py asyncio ``Lock`` with its holder beside it.

:class:`JobLock` takes the lock without blocking, writes who holds it in a hash beside it
(:func:`pipeline.state.keys.lock_holder`), and renews both every ``ttl / 3`` s while a sequence
runs; if the process dies the lock frees itself within ``ttl``.  A refused acquire raises
:class:`InFlight` naming the holder.  :class:`Locks` reads and frees the locks of any scope.

Transitions: free → held (:meth:`JobLock.acquire`, once per object) → free (:meth:`JobLock.release`,
the TTL, or :meth:`Locks.force_release`); releasing a lock never taken raises
:class:`~pipeline.errors.IllegalTransition`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping

import redis.asyncio as aioredis
from pydantic import BaseModel, Field
from redis.asyncio.lock import Lock
from redis.exceptions import LockError, RedisError

from pipeline import fmt
from pipeline.config import Config
from pipeline.errors import ExitCode, IllegalTransition, PitstopError
from pipeline.state import keys
from pipeline.state.redisconn import Store, ms

log = logging.getLogger(__name__)

DEFAULT_TTL = 30.0  #: seconds
HOLDER_WAIT = 1.0  #: seconds a refused request waits for the holder's record to appear
RENEWAL_STOP_TIMEOUT = 5.0  #: seconds release waits for the renewal task to end


class Holder(BaseModel, frozen=True):
    """Who holds a lock: the record beside it (missing fields read as empty)."""

    scope: str = ""  #: ``job:dflash`` or ``host:gpu1`` (the lock's, not stored in the record)
    job: str = ""
    action: str = "restart"
    user: str = ""
    run_id: str = ""
    step: str = ""
    started_at: float = Field(default_factory=time.time)  #: unix s when the lock was taken

    @classmethod
    def from_hash(cls, scope: str, data: Mapping[str, str]) -> Holder:
        """A holder from its Redis hash."""
        return cls.model_validate({"started_at": 0.0, **data, "scope": scope})

    def age(self, now: float | None = None) -> float:
        """Seconds since the lock was taken."""
        return max(0.0, (time.time() if now is None else now) - self.started_at)


class InFlight(PitstopError):
    """Refused: another restart of ``job`` (or on its host) holds the lock; ``holder`` None if its
    record could not be read in time."""

    code = "in_flight"
    exit_code = ExitCode.IN_FLIGHT

    def __init__(self, job: str, holder: Holder | None) -> None:
        self.job = job
        self.holder = holder
        h = holder or Holder(job=job, user="someone", step="unknown")
        super().__init__(  # the exact wording people learn to read
            f"{h.action or 'restart'} of {h.job or job} already in flight - started by "
            f"{fmt.who(h.user or 'someone')} {int(h.age())} s ago, now at: {h.step or 'unknown'}"
        )


class Locks(Store):
    """The restart locks of every scope: who holds one, whether a job's are taken, freeing by force."""

    async def holder(self, scope: str) -> Holder | None:
        """The holder of ``scope``'s lock, or None when the lock is free (or its record is gone)."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.exists(keys.lock(self.prefix, scope))
            pipe.hgetall(keys.lock_holder(self.prefix, scope))
            exists, data = await pipe.execute()
        if not exists or not data:
            return None
        return Holder.from_hash(scope, data)

    async def force_release(self, scope: str) -> Holder | None:
        """Free ``scope``'s lock whoever holds it (``unlock``; the holder's renewal then finds it lost):
        returns who held it, or None if it was free."""
        holder = await self.holder(scope)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(keys.lock(self.prefix, scope))
            pipe.delete(keys.lock_holder(self.prefix, scope))
            deleted, _ = await pipe.execute()
        return holder if deleted else None

    async def any_held(self, config: Config, job: str) -> bool:
        """True when a restart of ``job`` could be in flight: its job lock or its host's lock is taken."""
        spec = config.jobs.get(job)
        scopes = [f"job:{job}"] + ([f"host:{spec.host}"] if spec is not None else [])
        return bool(await self.client.exists(*(keys.lock(self.prefix, scope) for scope in scopes)))


class JobLock(Store):
    """The restart lock of one scope (:func:`pipeline.state.jobstate.scope_of`), with holder metadata and
    renewal every ``ttl / 3`` s; ``ttl``: seconds it lives without renewal."""

    def __init__(self, client: aioredis.Redis, prefix: str, scope: str, *, ttl: float = DEFAULT_TTL) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        super().__init__(client, prefix)
        self.scope = scope
        self.ttl = ttl
        self.name = keys.lock(prefix, scope)
        self.holder_key = keys.lock_holder(prefix, scope)
        self._lock: Lock = client.lock(
            self.name, timeout=ttl, blocking=False, thread_local=False, lock_class=Lock
        )
        self._held = self._taken = False
        self.lost = False  #: the lock expired or was forced free while this object held it
        self._renewal: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.holder: Holder | None = None

    @property
    def held(self) -> bool:
        """True between a successful :meth:`acquire` and :meth:`release`, unless lost."""
        return self._held and not self.lost

    async def acquire(
        self, *, job: str, action: str, user: str, run_id: str = "", step: str = "queued"
    ) -> Holder:
        """Take the lock now or refuse; never waits for it.

        :param action: ``restart`` | ``start`` | ``stop``.
        :param run_id: the run, when already known (set later with :meth:`update`).
        :param step: the step shown to refused requests.
        :returns: the holder record written beside the lock.
        :raises InFlight: if someone else holds it (naming them).
        :raises IllegalTransition: if this object took the lock before (locks are single-use).
        """
        if self._taken:
            raise IllegalTransition(f"lock {self.scope}", "taken by this object before", "acquire")
        deadline = time.monotonic() + HOLDER_WAIT
        while True:
            if await self._lock.acquire(token=uuid.uuid4().hex):
                break
            holder = await Locks(self.client, self.prefix).holder(self.scope)
            if holder is not None:
                raise InFlight(job, holder)
            if time.monotonic() >= deadline:
                raise InFlight(job, None)
            await asyncio.sleep(0.02)  # the holder writes its record right after taking the lock
        self._held = self._taken = True
        holder = Holder(scope=self.scope, job=job, action=action, user=user, run_id=run_id, step=step)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(self.holder_key)
            # a float is written as its repr: ``started_at`` reads back exactly
            pipe.hset(self.holder_key, mapping=holder.model_dump(exclude={"scope"}))  # type: ignore[arg-type]
            pipe.pexpire(self.holder_key, ms(self.ttl))
            await pipe.execute()
        self.holder = holder
        return holder

    async def update(self, *, run_id: str | None = None, step: str | None = None) -> None:
        """Change the holder record (the run id once created, the step as the sequence moves)."""
        fields = {k: v for k, v in (("run_id", run_id), ("step", step)) if v is not None}
        if not self.held or self.holder is None or not fields:
            return
        self.holder = self.holder.model_copy(update=fields)
        try:
            if await self._lock.owned():
                await self.client.hset(self.holder_key, mapping=fields)  # type: ignore[arg-type]
            else:
                self.lost = True
        except RedisError:
            log.warning("could not update the holder of %s", self.scope, exc_info=True)

    def start_renewal(self) -> None:
        """Extend the lock and its holder record every ``ttl / 3`` seconds until :meth:`release`."""
        if self._renewal is None and self._held:
            self._renewal = asyncio.get_running_loop().create_task(
                self._renew(), name=f"pitstop-lock-renewal:{self.scope}"
            )

    async def _renew(self) -> None:
        while True:
            try:  # a stop request ends the loop even when redis-py swallowed the task's cancel
                await asyncio.wait_for(self._stopping.wait(), self.ttl / 3)
                return
            except TimeoutError:
                pass
            try:
                await self._lock.extend(self.ttl, replace_ttl=True)
                await self.client.pexpire(self.holder_key, ms(self.ttl))
            except LockError:
                self.lost = True
                log.warning("lost the lock %s (expired or forced free)", self.scope)
                return
            except RedisError:
                log.warning("could not renew the lock %s; retrying", self.scope, exc_info=True)

    async def release(self) -> None:
        """Stop renewing and free the lock if this object still holds it.  Safe to call twice;
        IllegalTransition if this object never took the lock."""
        if not self._taken:
            raise IllegalTransition(f"lock {self.scope}", "not held by this object", "release")
        if self._renewal is not None:
            task, self._renewal = self._renewal, None
            self._stopping.set()
            task.cancel()
            # bounded: a cancel that redis-py's connection code swallows must not hang the release
            await asyncio.wait({task}, timeout=RENEWAL_STOP_TIMEOUT)
        if not self._held:
            return
        self._held = False
        try:
            if await self._lock.owned():
                await self.client.delete(self.holder_key)
                await self._lock.release()
            else:
                self.lost = True
        except LockError:
            self.lost = True
        except RedisError:
            log.warning("could not release the lock %s; it frees itself within %g s", self.scope, self.ttl)
