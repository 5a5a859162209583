"""One call to Slack's Web API: the client (:func:`web_client`), pacing per channel
(:class:`Pacer`) and per method (:class:`Budget`), failed calls named (:func:`error_of`), refusals
(:class:`Refused`) and their fixes (:func:`~bot.text.refused_notice`); and one message to Slack
at most once, at Slack's pace (:class:`SlackSender`): a post whose outcome is unknown (timeout,
reset, 5xx, ``fatal_error``/``internal_error``) is looked up by its metadata id, twice ``settle``
s apart, before it is sent again.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from bot.text import slack_gave_up

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
    """Slack refused a post for good (or its outcome stayed unknown): ``error`` is Slack's code,
    ``detail`` (what else is known) follows it in the text."""

    def __init__(self, error: str, detail: str = "") -> None:
        super().__init__(error if not detail or detail == error else f"{error} ({detail})")
        self.error = error


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


PAGE = 200  #: messages per page of a look-up
METADATA_TYPE = "pitstop_post"  #: message metadata event_type carrying a post's id
SETTLE = 2.0  #: seconds to wait for a message Slack stored but does not list yet, before resending


def _failed_try(exc: BaseException) -> tuple[str, bool]:
    """:func:`error_of` a try worth another (:data:`TRANSIENT`, or
    its outcome unknown); else raise Refused."""
    error, maybe = error_of(exc)
    if not maybe and error not in TRANSIENT:
        raise Refused(error, detail_of(exc)) from None
    return error, maybe


@dataclass(frozen=True)
class Delivery:
    """Where posts go and at what pace: the settings of a :class:`SlackSender` (and of its
    :class:`~bot.slack.outbox.SlackOutbox`).

    :param default_channel: where posts go when the caller passes no channel (``announce_channel``).
    :param pace: minimum seconds between posts to one channel, and between updates of one message.
    :param instance: this process's id, used to claim a headline across replicas.
    :param backoff: seconds before a call's second try (doubled each time).
    :param settle: seconds to wait before looking a post up a second time.
    :param fallback_channel: where an alert goes when its channel and ``default_channel`` refuse it.
    :param page_by_dm: an alert's key → the user and user-group ids it goes to by DM when no
        channel takes it (its job's owners, then the admins).
    """

    default_channel: str | None = None
    pace: float = 1.0
    instance: str = "pitstop"
    backoff: float = BACKOFF
    settle: float = SETTLE
    fallback_channel: str | None = None
    page_by_dm: Callable[[str], Sequence[str]] | None = None


class SlackSender:
    """Posts and updates of single messages, at most once each, at ``delivery``'s pace."""

    def __init__(self, client: AsyncWebClient, delivery: Delivery) -> None:
        self.client = client
        self.delivery = delivery
        self.pacer = Pacer(delivery.pace)  #: posts, per channel (chat.postMessage: about 1/s per channel)
        self.edits = Pacer(delivery.pace)  #: updates, per message: successive states fold into the newest
        self.updates = Budget(*TIER3)  #: ``chat.update``: Tier 3, per workspace

    def queue(self) -> dict[str, Any]:
        """What waits for Slack now (``/healthz`` ``slack.queue``, ``/metrics``): ``depth`` calls
        waiting, ``oldest_s`` seconds the oldest has waited, and the same per :meth:`backlog` key."""
        waiting = self.backlog()
        return {
            "depth": sum(n for n, _ in waiting.values()),
            "oldest_s": round(max((age for _, age in waiting.values()), default=0.0), 3),
            "channels": {k: {"depth": n, "oldest_s": round(age, 3)} for k, (n, age) in waiting.items()},
        }

    def backlog(self) -> dict[str, tuple[int, float]]:
        """Channel (updates by message ``CHANNEL/TS``, the Tier 3 budget as ``chat.update``) →
        (calls waiting, seconds the oldest has waited)."""
        waiting = {**self.pacer.backlog(), **self.edits.backlog()}
        budget = self.updates.backlog()
        if budget[0]:
            waiting["chat.update"] = budget
        return waiting

    async def post_payload(self, channel: str, payload: dict[str, Any], *, thread_ts: str | None) -> str:
        """``chat.postMessage`` of one rendered message at most once; its ts.  Transient errors are
        retried after ``delivery.backoff`` s (doubling), an unknown outcome looked up before another try.

        :raises Refused: if Slack refused it for good, or its outcome stayed unknown.
        """
        post_id = uuid.uuid4().hex
        metadata = {"event_type": METADATA_TYPE, "event_payload": {"post_id": post_id}}
        since = time.time() - 60  # Slack's clock may differ a little from ours
        unknown = False
        error = "unknown_error"
        for attempt in range(ATTEMPTS + 1):  # the last round only looks for a post of unknown outcome
            await self._backoff(attempt)
            if unknown and (found := await self._find(channel, thread_ts, post_id, since)):
                return found
            if attempt == ATTEMPTS:
                break
            await self.pacer.wait(channel)
            try:
                resp = await self.client.chat_postMessage(
                    channel=channel,
                    thread_ts=thread_ts,
                    unfurl_links=False,
                    unfurl_media=False,
                    metadata=metadata,
                    **payload,
                )
                return str(resp["ts"])
            except ERRORS as exc:
                error, maybe = _failed_try(exc)
                unknown = unknown or maybe
        raise Refused(error, slack_gave_up(ATTEMPTS))

    async def _backoff(self, attempt: int) -> None:
        """Wait before try ``attempt`` (0: the first, and :data:`ATTEMPTS`: the last look-up, go at
        once): ``delivery.backoff`` s, doubled each time."""
        if 0 < attempt < ATTEMPTS:
            await asyncio.sleep(self.delivery.backoff * 2 ** (attempt - 1))

    async def post_parts(self, channel: str, payloads: list[dict[str, Any]], *, thread_ts: str | None) -> str:
        """:meth:`post_payload` of each of ``payloads`` (:func:`bot.slack.blocks.parts`), the later
        ones in the first's thread unless ``thread_ts``; the first one's ts.

        :raises Refused: at the first one Slack refused.
        """
        ts = await self.post_payload(channel, payloads[0], thread_ts=thread_ts)
        for more in payloads[1:]:
            await self.post_payload(channel, more, thread_ts=thread_ts or ts)
        return ts

    async def _find(self, channel: str, thread_ts: str | None, post_id: str, since: float) -> str:
        """The ts of the message carrying ``post_id``, or ``""``, after looking twice ``settle`` s
        apart; a failed look-up raises Refused (``outcome_unknown``): sending again could post twice."""
        found = await self._look(channel, thread_ts, post_id, since)
        if not found and self.delivery.settle > 0:
            await asyncio.sleep(self.delivery.settle)
            found = await self._look(channel, thread_ts, post_id, since)
        return found

    async def _look(self, channel: str, thread_ts: str | None, post_id: str, since: float) -> str:
        """One look-up of ``post_id`` among the messages since ``since`` (unix s), page by page
        (slack_sdk follows the cursor)."""
        args: dict[str, Any] = dict(
            channel=channel, oldest=f"{since:.6f}", include_all_metadata=True, limit=PAGE
        )
        try:
            pages = await (
                self.client.conversations_replies(ts=thread_ts, **args)
                if thread_ts
                else self.client.conversations_history(**args)
            )
            async for resp in pages:
                for msg in resp.get("messages") or []:
                    meta = msg.get("metadata") or {}
                    ours = (meta.get("event_payload") or {}).get("post_id") == post_id
                    if ours and meta.get("event_type") == METADATA_TYPE:
                        return str(msg["ts"])
        except ERRORS as exc:
            raise Refused("outcome_unknown", f"looking it up failed: {error_of(exc)[0]}") from None
        return ""

    async def update_payload(self, loc: tuple[str, str], payload: dict[str, Any]) -> None:
        """``chat.update`` of the message at ``loc`` (``(channel, ts)``; safe to repeat), at most once
        per ``pace`` s per message and within the Tier 3 budget; :raises Refused: with Slack's code."""
        error = "unknown_error"
        for attempt in range(ATTEMPTS):
            await self._backoff(attempt)
            await self.edits.wait(f"{loc[0]}/{loc[1]}")
            await self.updates.wait()
            try:
                await self.client.chat_update(channel=loc[0], ts=loc[1], **payload)
                return
            except ERRORS as exc:
                error, _ = _failed_try(exc)
        raise Refused(error, slack_gave_up(ATTEMPTS))
