"""One call to Slack's Web API: the client (:func:`web_client`), pacing per channel
(:class:`Pacer`) and per method (:class:`Budget`), failed calls named (:func:`error_of`), refusals
(:class:`Refused`) and their fixes (:func:`~bot.text.refused_notice`).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

ATTEMPTS = 4  #: tries of one post (transient errors and unknown outcomes)
BACKOFF = 0.5  #: seconds before the second try; doubled each time
#: errors worth another try: Slack's own transient answers, a connection not made, and 429s past
#: the client's own retries (each of those waited ``Retry-After``)
TRANSIENT = frozenset(
    {
        "internal_error",
        "fatal_error",
        "service_unavailable",
        "request_timeout",
        "connection_failed",
        "ratelimited",
    }
)
#: HTTP 200 errors after which "some aspect of the operation may have succeeded" (Slack's
#: words): the outcome is unknown, as after a timeout
AMBIGUOUS = frozenset({"internal_error", "fatal_error"})
#: what a failed Web API call raises
ERRORS = (SlackApiError, SlackRequestError, aiohttp.ClientError, TimeoutError)


def web_client(
    token: str,
    *,
    base_url: str | None = None,
    session: aiohttp.ClientSession | None = None,
) -> AsyncWebClient:
    """An ``AsyncWebClient`` that waits ``Retry-After`` on up to 3 HTTP 429s in a row and retries a
    connection that could not be made (nothing that may have reached Slack is retried here);
    ``session``: shared (closed by the caller), or None for one per call."""
    base_url = base_url.rstrip("/") + "/" if base_url else AsyncWebClient.BASE_URL
    client = AsyncWebClient(token=token, session=session, base_url=base_url)
    client.retry_handlers = [
        AsyncConnectionErrorRetryHandler(max_retry_count=2, error_types=[aiohttp.ClientConnectorError]),
        AsyncRateLimitErrorRetryHandler(max_retry_count=3),
    ]
    return client


class Refused(Exception):
    """Slack refused a post for good (or its outcome stayed unknown): ``error`` is Slack's code."""

    def __init__(self, error: str, detail: str = "") -> None:
        super().__init__(error if not detail or detail == error else f"{error} ({detail})")
        self.error = error
        self.detail = detail


def error_of(exc: BaseException) -> tuple[str, bool]:
    """``(error code, outcome unknown?)`` of a failed call: unknown after a timeout, a reset, a
    5xx, or Slack's HTTP 200 ``fatal_error`` / ``internal_error`` (:data:`AMBIGUOUS`)."""
    if isinstance(exc, SlackApiError):
        status = getattr(exc.response, "status_code", 200)
        if status >= 500:
            return f"http_{status}", True
        if status == 429:
            return "ratelimited", False
        error = str(exc.response.get("error", "unknown_error"))
        return error, error in AMBIGUOUS
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connection_failed", False
    if isinstance(exc, TimeoutError):
        return "timeout", True
    return type(exc).__name__, True


class Pacer:
    """At most one post per ``interval`` seconds (0: no pacing) to one channel, in the order they
    asked; what waits is the channel's queue (:meth:`backlog`, shown in ``/healthz``)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, dict[object, float]] = {}  #: channel → waiter → when it asked (monotonic s)

    async def wait(self, channel: str) -> None:
        """Return when a post to ``channel`` may go, reserving that slot (first come, first served)."""
        if self.interval <= 0:
            return
        me, queue = object(), self._waiting.setdefault(channel, {})
        queue[me] = time.monotonic()
        lock = self._locks.setdefault(channel, asyncio.Lock())
        try:
            async with lock:
                now = time.monotonic()
                due = self._next.get(channel, 0.0)
                if due > now:
                    await asyncio.sleep(due - now)
                    now = time.monotonic()
                self._next[channel] = now + self.interval
                if len(self._next) > 10_000:  # keys of messages long since updated
                    self._next = {k: v for k, v in self._next.items() if v > now}
                    self._locks = {k: v for k, v in self._locks.items() if k in self._next or v.locked()}
        finally:
            queue.pop(me, None)

    def backlog(self) -> dict[str, tuple[int, float]]:
        """Channel → (posts waiting for their slot, seconds the oldest has waited)."""
        now = time.monotonic()
        return {ch: (len(q), now - min(q.values())) for ch, q in self._waiting.items() if q}


class Budget:
    """A token bucket for a Web API method limited per workspace (Slack's tiers): ``burst`` calls
    back to back, then ``rate`` per second; callers wait their turn in order."""

    def __init__(self, burst: float, rate: float) -> None:
        self.burst = burst
        self.rate = rate
        self._tokens = burst
        self._at = time.monotonic()
        self._lock = asyncio.Lock()
        self._waiting: dict[object, float] = {}  #: waiter → when it asked (monotonic s)

    async def wait(self) -> None:
        """Return when one call may go; takes its token."""
        me = object()
        self._waiting[me] = time.monotonic()
        try:
            async with self._lock:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
                self._at = now
                if self._tokens < 1:
                    await asyncio.sleep((1 - self._tokens) / self.rate)
                    self._tokens, self._at = 1.0, time.monotonic()
                self._tokens -= 1
        finally:
            self._waiting.pop(me, None)

    def backlog(self) -> tuple[int, float]:
        """(calls waiting for a token, seconds the oldest has waited)."""
        if not self._waiting:
            return 0, 0.0
        return len(self._waiting), time.monotonic() - min(self._waiting.values())


#: :class:`Budget` ``(burst, rate)`` of Tier 3 (``chat.update``): Slack allows 50 calls per minute
#: (https://api.slack.com/apis/rate-limits), kept at 45 (calls reach Slack in another order than they
#: left) after a burst of 40, below one minute's allowance (a 429 beyond it is waited out)
TIER3 = (40, 45 / 60)


def error_text(error: object) -> str:
    """Slack's error code of a failed call, else the error's text (its type's name if it has none)."""
    if isinstance(error, SlackApiError):
        return str(error.response.get("error", "unknown_error"))
    return str(error) or type(error).__name__


def detail_of(error: object) -> str:
    """:func:`error_text`, with Slack's ``errors`` list when it has one."""
    extra = error.response.get("errors") if isinstance(error, SlackApiError) else None
    return f"{error_text(error)} {extra}" if extra else error_text(error)
