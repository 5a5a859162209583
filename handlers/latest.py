"""Last state wins: a value delivered at the consumer's pace, never at the producer's (a restart's
steps change faster than Slack takes updates of one message; states that arrive meanwhile are
coalesced into one delivery of the last of them)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Latest(Generic[T]):
    """Deliver the newest value put, one delivery at a time, in a task of its own.

    :param deliver: awaited with the newest value; an exception it raises is logged and the
        next value is still delivered.
    :param what: names the deliveries in the log.
    """

    def __init__(self, deliver: Callable[[T], Awaitable[object]], what: str) -> None:
        self._deliver = deliver
        self._what = what
        self._next: list[T] = []  #: the value not delivered yet, if any
        self._task: asyncio.Task[None] | None = None

    def put(self, value: T) -> None:
        """Make ``value`` the next one delivered (replacing one not delivered yet); returns at once."""
        self._next = [value]
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self._next:
            value = self._next.pop()
            try:
                await self._deliver(value)
            except Exception:
                log.warning("could not deliver %s", self._what, exc_info=True)

    async def flush(self) -> None:
        """Wait until the newest value put so far was delivered."""
        if self._task is not None:
            await self._task
