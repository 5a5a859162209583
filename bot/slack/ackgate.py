"""Acks before follow-ups: work after a Slack ack (3 s) waits for a lull in the acks still being
made (none for ``quiet`` s) or at most ``patience`` s, and at most ``concurrency`` follow-ups run
at once (redis-py's pool refuses the 101st connection).  Wrap Bolt's dispatch in
:meth:`AckGate.acking` and the work after the ack in :meth:`AckGate.follow_up`.
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
    """The number of requests being acked, a wait for none, and slots for the work after them."""

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
        """Return once none was being acked for :attr:`quiet` s, or after :attr:`patience` s."""
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
