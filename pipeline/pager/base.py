"""The pager seam and its sender: what one kind of pager must do (:class:`PagerKind`), and the
sending written once for all of them (:class:`Pager`).

A :class:`PagerAlert` is one incident, its dedup key the incident's id (``incident:JOB:N``): the
pager keeps one alert per key, so a retry, a re-send or a second replica never pages twice.  Sends
run in the background, one key's in order, never holding the caller (a Slack post) back; an answer
the API says to retry (:class:`PagerRetry`: a 429, a 5xx, no answer) is retried with exponential
backoff, one it refuses (:class:`PagerRefused`: a 400) is not, and a pager that keeps refusing is
reported once through ``on_trouble`` until it accepts again (:attr:`Pager.refusing`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import aiohttp

from pipeline.errors import PitstopError

log = logging.getLogger(__name__)

TIMEOUT = 10.0  #: seconds one request may take
TRIES = 6  #: sends of one event before the pager counts as refusing
BACKOFF = 1.0  #: seconds before the first retry, doubled after each
MAX_BACKOFF = 60.0  #: the longest wait between two tries (s)


class Action(StrEnum):
    """What is asked of the pager about an alert (PagerDuty's ``event_action`` values)."""

    TRIGGER = "trigger"
    ACKNOWLEDGE = "acknowledge"
    RESOLVE = "resolve"


@dataclass(frozen=True)
class PagerAlert:
    """One incident as a pager sees it."""

    key: str  #: the dedup key: the incident's id, ``incident:JOB:N``
    job: str
    kind: str  #: the incident's kind (``dead``, ``stalled``, …)
    severity: str  #: ``critical`` or ``warning``
    summary: str  #: the alert's headline
    source: str  #: the host
    started_at: float  #: when the incident opened (unix s)


class PagerRetry(Exception):
    """An answer the pager's API says to retry (a 429, a 5xx): ``reason``, and the ``retry_after``
    seconds it asked for (None: the sender's backoff)."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class PagerRefused(PitstopError, code="pager_refused"):
    """The pager refused an event for good (a 400: not retried); ``message`` says what it answered."""


class PagerKind(Protocol):
    """How one kind of pager speaks its API (one module per kind)."""

    name: str  #: the ``[pager] kind``
    #: seconds between re-sends of an open alert (its API expects them), None: never re-sent
    resend_every: float | None

    async def acknowledged(self, session: aiohttp.ClientSession) -> dict[str, str]:
        """Dedup key → who acknowledged it, of the alerts acknowledged at the pager ({}: it cannot tell).

        :raises PagerRetry: for an answer to retry later.
        :raises PagerRefused: for a refusal.
        """

    async def send(
        self, session: aiohttp.ClientSession, action: Action, alert: PagerAlert, now: float
    ) -> None:
        """Send one event about ``alert`` (``now``: unix s, for an end time).

        :raises PagerRetry: for an answer the API says to retry.
        :raises PagerRefused: for a refusal not to retry.
        """


def iso(ts: float) -> str:
    """Unix seconds as an RFC 3339 UTC timestamp (``2026-12-04T17:00:00+00:00``)."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat()


def http_answer(status: int, body: str, retry_after: str | None) -> None:
    """Raise for an HTTP answer that is not a success: 429 and 5xx :class:`PagerRetry` (with its
    ``Retry-After`` seconds if given), any other 4xx :class:`PagerRefused`; 2xx returns."""
    if 200 <= status < 300:
        return
    said = f"HTTP {status}: {body.strip()[:300]}" if body.strip() else f"HTTP {status}"
    if status == 429 or status >= 500:
        after = float(retry_after) if retry_after and retry_after.isdigit() else None
        raise PagerRetry(said, after)
    raise PagerRefused(said)


class Pager:
    """Sends :class:`PagerAlert` events through ``kind`` in the background, retried as its API says.

    :param on_trouble: awaited with a line when a send is refused for good or its tries are spent,
        once until a send succeeds again.
    :param backoff: seconds before the first retry (doubled each time, at most :data:`MAX_BACKOFF`).
    :param clock: unix s now (re-sends, end times, polls).
    :param sync_every: seconds between two reads of the pager's acknowledgements.
    """

    def __init__(
        self,
        kind: PagerKind,
        *,
        on_trouble: Callable[[str], Awaitable[None]] | None = None,
        backoff: float = BACKOFF,
        tries: int = TRIES,
        clock: Callable[[], float] = time.time,
        sync_every: float = 30.0,
    ) -> None:
        self.kind = kind
        self.on_trouble = on_trouble
        self.backoff = backoff
        self.tries = tries
        self.clock = clock
        self.sync_every = sync_every
        self._synced: float | None = None  #: when acknowledgements were last read (:meth:`acknowledged`)
        #: the last refusal while the pager keeps refusing (None once it accepts): for a heartbeat
        self.refusing: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._sent: dict[str, float] = {}  #: key → when its trigger was last accepted (open alerts)
        self._tasks: set[asyncio.Task[None]] = set()

    def trigger(self, alert: PagerAlert) -> None:
        """Page ``alert`` (once per key at the pager, however often called)."""
        self._submit(Action.TRIGGER, alert)

    def acknowledge(self, alert: PagerAlert) -> None:
        """Acknowledge ``alert`` (a kind without acknowledgements ignores it)."""
        self._submit(Action.ACKNOWLEDGE, alert)

    def resolve(self, alert: PagerAlert) -> None:
        """Resolve ``alert``."""
        self._sent.pop(alert.key, None)
        self._submit(Action.RESOLVE, alert)

    def keep(self, alert: PagerAlert) -> None:
        """``alert`` is still open: re-send it if the kind's API expects that and it is time."""
        every, last = self.kind.resend_every, self._sent.get(alert.key)
        if every is not None and (last is None or self.clock() - last >= every):
            self._sent[alert.key] = self.clock()  # not twice while this one is on its way
            self._submit(Action.TRIGGER, alert)

    async def acknowledged(self) -> dict[str, str]:
        """Dedup key → who acknowledged it at the pager, read at most every ``sync_every`` s ({}
        between reads, for a kind that cannot tell, and when the read fails: logged, tried next time)."""
        now = self.clock()
        if self._synced is not None and now - self._synced < self.sync_every:
            return {}
        self._synced = now
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))
        try:
            return await self.kind.acknowledged(self._session)
        except (PagerRetry, PagerRefused, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("pager %s: reading acknowledgements failed: %s", self.kind.name, exc)
            return {}

    def _submit(self, action: Action, alert: PagerAlert) -> None:
        task = asyncio.get_running_loop().create_task(self._deliver(action, alert))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, action: Action, alert: PagerAlert) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))
        session, delay, why = self._session, self.backoff, ""
        async with self._locks.setdefault(alert.key, asyncio.Lock()):  # one key's events in order
            for attempt in range(1, self.tries + 1):
                try:
                    await self.kind.send(session, action, alert, self.clock())
                except PagerRefused as exc:
                    why = exc.message
                    break
                except (PagerRetry, aiohttp.ClientError, TimeoutError) as exc:
                    why = exc.reason if isinstance(exc, PagerRetry) else str(exc) or type(exc).__name__
                    wait = exc.retry_after if isinstance(exc, PagerRetry) and exc.retry_after else delay
                    log.info(
                        "pager %s: %s of %s: %s (try %d)", self.kind.name, action, alert.key, why, attempt
                    )
                    if attempt < self.tries:
                        await asyncio.sleep(min(wait, MAX_BACKOFF))
                        delay = min(delay * 2, MAX_BACKOFF)
                else:
                    if action is Action.TRIGGER:
                        self._sent[alert.key] = self.clock()
                    self.refusing = None
                    return
        line = pager_refusing(self.kind.name, action, alert.key, why)
        log.error(line)
        first, self.refusing = self.refusing is None, line
        if first and self.on_trouble is not None:
            try:
                await self.on_trouble(line)
            except Exception:
                log.exception("telling that the pager refuses failed")

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) for the sends on their way."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)

    async def aclose(self) -> None:
        """Cancel what is still on its way and close the HTTP session."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None


# --- text


def pager_refusing(kind: str, action: str, key: str, why: str) -> str:
    """The pager keeps refusing: what, and what to check."""
    return (
        f"the pager ({kind}) refuses incidents: {action} of {key}: {why} - "
        "check [pager] and its key; the incidents are in Slack only until it accepts"
    )
