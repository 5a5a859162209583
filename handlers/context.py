"""Everything a handler needs, assembled once by ``bot/`` and passed in (arq's ctx pattern).

``handlers/`` never builds its own connections: the surface (Slack app, console, CLI, demo)
opens Redis and the SSH pool from the validated config, builds one :class:`Context`, and
passes it to every handler and scheduled job.  Handlers reach Redis only through the stores of
:mod:`pipeline.state` (:meth:`~pipeline.state.redisconn.RedisHandle.open_store`), never directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from handlers.outbox import Outbox
from pipeline.config import Config
from pipeline.engines.base import RestartService
from pipeline.host.remote import RemoteHosts
from pipeline.state.events import Events
from pipeline.state.jobstate import JobRecords, JobStore
from pipeline.state.locks import Locks
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunStore
from pipeline.state.verifications import VerifyQueue


@dataclass
class Context:
    """The shared, long-lived parts of one Pitstop process.

    :ivar config: the validated configuration.
    :ivar redis: the open Redis handle (client + key prefix).
    :ivar ssh: the SSH connection pool (one connection per host).
    :ivar runs: run records in Redis.
    :ivar restarter: the restart sequence and ``verify``.
    :ivar events: the awaitable event stream.
    :ivar outbox: where team-visible posts go (Slack, console, memory).
    :ivar instance: an id for this process (leader lease, claims, logs).
    """

    config: Config
    redis: RedisHandle
    ssh: RemoteHosts
    runs: RunStore
    restarter: RestartService
    events: Events
    outbox: Outbox
    instance: str

    @property
    def prefix(self) -> str:
        """The Redis key prefix (:mod:`pipeline.state.keys`)."""
        return self.redis.prefix

    @property
    def jobs(self) -> JobStore:
        """Jobs' state in Redis, one round trip per read (:class:`~pipeline.state.jobstate.JobStore`)."""
        return self.redis.open_store(JobStore, self.config)

    @cached_property
    def records(self) -> JobRecords:
        """Jobs' ``current`` records and patches in effect."""
        return self.redis.open_store(JobRecords)

    @cached_property
    def locks(self) -> Locks:
        """The restart locks (who holds one, freeing one by force)."""
        return self.redis.open_store(Locks)

    @cached_property
    def queue(self) -> VerifyQueue:
        """The verification queue and its delivery claims."""
        return self.redis.open_store(VerifyQueue)
