"""Everything a handler needs, assembled once by ``bot/`` from the validated config and passed in
(arq's ctx pattern): ``handlers/`` never opens connections, and reaches Redis only through the
stores of :mod:`pipeline.state`."""

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
    """The shared, long-lived parts of one Pitstop process."""

    config: Config
    redis: RedisHandle  #: client + key prefix
    ssh: RemoteHosts  #: one connection per host
    runs: RunStore
    restarter: RestartService  #: the restart sequence and ``verify``
    events: Events
    outbox: Outbox  #: where team-visible posts go (Slack, console, memory)
    instance: str  #: an id for this process (leader lease, claims, logs)

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
