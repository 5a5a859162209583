"""One message to Slack at most once, at Slack's pace: a post whose outcome is unknown (timeout,
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

from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.api import (
    ATTEMPTS,
    BACKOFF,
    ERRORS,
    TIER3,
    TRANSIENT,
    Budget,
    Pacer,
    Refused,
    detail_of,
    error_of,
)
from bot.text import slack_gave_up

PAGE = 200  #: messages per page of a look-up
METADATA_TYPE = "pitstop_post"  #: message metadata event_type carrying a post's id
SETTLE = 2.0  #: seconds to wait for a message Slack stored but does not list yet, before resending


def _failed_try(exc: BaseException) -> tuple[str, bool]:
    """:func:`~bot.slack.api.error_of` a try worth another (:data:`~bot.slack.api.TRANSIENT`, or
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
