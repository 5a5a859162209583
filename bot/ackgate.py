"""Acks before follow-ups: work after a Slack ack waits for a lull in the acks still being made.

Slack gives an ack 3 s; the answer that follows on ``response_url`` has 30 minutes.  Under a
burst of requests (or a machine busy with other work) the follow-ups — parsing, Redis round
trips, audit, the answer's HTTP post — would otherwise take CPU from the acks queued behind
them.  :class:`AckGate` counts the requests being acked; a follow-up first waits for a lull —
none being acked for ``quiet`` seconds (clients under load send the next request as soon as
an ack returns, so "none right now" comes and goes within a burst) — or at most ``patience``
seconds, so it is delayed, never starved.  At most
``concurrency`` follow-ups run at once, so a burst released together queues rather than
opening a Redis connection each (redis-py's pool refuses the 101st).

Usage::

    gate = AckGate()
    with gate.acking():                  # around dispatching one request to Bolt
        response = await app.async_dispatch(request)
    ...
    async with gate.follow_up():         # around the work after the ack
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Iterator

PATIENCE = 0.5  #: seconds a follow-up waits at most for a lull in the acks
QUIET = 0.02  #: seconds with no request being acked that make a lull
CONCURRENCY = 16  #: follow-ups running at once


class AckGate:
    """The number of requests being acked, a wait for none, and slots for the work after them.

    :param patience: seconds :meth:`lull` waits at most.
    :param quiet: seconds with no request being acked that count as a lull.
    :param concurrency: follow-ups :meth:`follow_up` lets run at once.
    """

    def __init__(
        self, patience: float = PATIENCE, concurrency: int = CONCURRENCY, *, quiet: float = QUIET
    ) -> None:
        self.patience = patience
        self.quiet = quiet
        self.in_flight = 0
        self._last_ack = -math.inf  #: time.monotonic() when the last request finished being acked
        self._slots = asyncio.Semaphore(concurrency)
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def acking(self) -> Iterator[None]:
        """Count one request as being acked while the block runs."""
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            self._last_ack = time.monotonic()
            if self.in_flight == 0:
                self._idle.set()

    async def lull(self) -> None:
        """Return once no request was being acked for :attr:`quiet` seconds, or after
        :attr:`patience` seconds."""
        deadline = time.monotonic() + self.patience
        while (now := time.monotonic()) < deadline:
            if self.in_flight:
                try:
                    await asyncio.wait_for(self._idle.wait(), deadline - now)
                except TimeoutError:
                    return
                continue
            calm = now - self._last_ack
            if calm >= self.quiet:
                return
            await asyncio.sleep(min(self.quiet - calm, deadline - now))

    @contextlib.asynccontextmanager
    async def follow_up(self) -> AsyncIterator[None]:
        """Run the block after a lull (:meth:`lull`), holding one of the follow-up slots."""
        await self.lull()
        async with self._slots:
            yield
