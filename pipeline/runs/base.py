"""What the run service tells, and to whom: :class:`RunEvent`, its listeners, the stores it opens once.

:class:`RunServiceBase` is the part every piece of :class:`~pipeline.runs.service.RunService`
shares: the stores, opened once, and the listeners it tells of each :class:`RunEvent` in order,
awaiting what a listener returns (:meth:`RunServiceBase.subscribe`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

from pipeline.engines.runner import Runner
from pipeline.state.events import EventKind, Events
from pipeline.state.jobstate import JobRecords, JobStore
from pipeline.state.locks import JobLock, Locks
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunRecord, VerifyQueue


class Told(StrEnum):
    """What a :class:`RunEvent` tells."""

    STEP = "step"  #: a step of the run's sequence changed
    ENDED = "ended"  #: its sequence ended: the run as it left it (with its verdict if it ended before verification)
    VERDICT = "verdict"  #: verification decided its verdict (or found it still PENDING: told once)
    INTERRUPTED = "interrupted"  #: taken over from its dead owner; ``line`` says what was found
    FOLLOWUP = "followup"  #: its throughput follow-up, ``line`` as recorded on the run; ``slow`` if slower


@dataclass(frozen=True)
class RunEvent:
    """One event of a run's life, as the run service tells its listeners."""

    kind: Told
    run: RunRecord  #: the run as it is now
    line: str | None = None  #: INTERRUPTED: what was found; FOLLOWUP: the follow-up line
    slow: bool = False  #: FOLLOWUP: under ``slow_after_restart`` of before (an alert)
    lock_lost: bool = False  #: STEP, ENDED: the run's lock expired or was forced free while it ran


#: told every :class:`RunEvent`; what it returns is awaited before the service goes on (return
#: None to keep a sequence from waiting: a surface queues its update and returns)
Listener = Callable[[RunEvent], Awaitable[None] | None]


class RunServiceBase:
    """The stores and listeners of the run service (one per process).

    :param restarter: the engine runner: every step, verification and look at a host; its
        ``config`` and ``runs`` (``owner``: this process) are the service's.
    :param instance: this process's id (claims, events).
    """

    def __init__(self, restarter: Runner, redis: RedisHandle, events: Events, instance: str) -> None:
        self.restarter, self.redis, self.events, self.instance = restarter, redis, events, instance
        self.config, self.runs = restarter.config, restarter.runs
        self.jobs = redis.open_store(JobStore, self.config)
        self.records = redis.open_store(JobRecords)
        self.locks = redis.open_store(Locks)
        self.queue = redis.open_store(VerifyQueue)
        self._listeners: list[Listener] = []
        self._held: dict[str, JobLock] = {}  #: run id → its lock, from request to execute

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Tell ``listener`` every :class:`RunEvent` of every run from now on.

        :returns: its unsubscriber.
        """
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def tell(self, event: RunEvent) -> None:
        """Tell every listener ``event``, in order, awaiting what each returns.

        :raises Exception: what a listener raised (a verdict whose posts failed is delivered again).
        """
        for listener in list(self._listeners):
            if (pending := listener(event)) is not None:
                await pending

    async def publish_verdict(self, run: RunRecord) -> None:
        """The ``verdict`` event of ``run`` in Redis, for ``pitstop say --wait`` and any other waiter."""
        data = dict(run_id=run.id, verdict=run.verdict.value if run.verdict else None, line=run.verdict_line)
        await self.events.publish(EventKind.VERDICT, run.job, **data, instance=self.instance)
