"""Everything a handler needs, assembled once by ``bot/`` from the validated config and passed in
(arq's ctx pattern): ``handlers/`` never opens connections, and reaches a run's life only through
the run service (:attr:`Context.service`), other state through the stores of :mod:`pipeline.state`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from handlers.outbox import Outbox
from handlers.runs.view import RunPosts
from pipeline.config import Config
from pipeline.engines.runner import Runner
from pipeline.host.remote import RemoteHosts
from pipeline.pager import Pager
from pipeline.runs.service import RunService
from pipeline.state.events import Events
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunStore


class Directory(Protocol):
    """Who is in which Slack user group, read fresh (Slack's :class:`bot.slack.people.People`)."""

    async def fresh_groups(self, user: str) -> tuple[str, ...]:
        """The user groups ``user`` is in now (a listing at most its TTL old, read again if older).

        :raises pipeline.errors.GroupsUnknown: if no listing that recent can be had.
        """
        ...


@dataclass
class Context:
    """The shared, long-lived parts of one Pitstop process."""

    config: Config
    redis: RedisHandle  #: client + key prefix
    ssh: RemoteHosts  #: one connection per host
    runs: RunStore
    restarter: Runner  #: the restart sequence and ``verify``
    events: Events
    outbox: Outbox  #: where team-visible posts go (Slack, console, memory)
    instance: str  #: an id for this process (leader lease, claims, logs)
    #: user groups read fresh, for approvals (None: a surface without Slack, which reads none)
    directory: Directory | None = None
    pager: Pager | None = None  #: ``[pager]``, where escalation steps page (None: not configured)

    @cached_property
    def service(self) -> RunService:
        """The run service of this process (its stores opened once), :attr:`posts` listening."""
        service = RunService(self.restarter, self.redis, self.events, self.instance)
        service.subscribe(self.posts)
        return service

    @cached_property
    def posts(self) -> RunPosts:
        """What the run service tells, posted in the outbox (:meth:`RunPosts.show` a run's live message)."""
        return RunPosts(self.config, self.outbox)
