"""The Slack :class:`~handlers.outbox.Outbox`: one message per restart, updated in place.

``announce(key)`` posts the headline of a restart or incident (``chat.postMessage``) and, on
later calls, edits it in place (``chat.update``) as steps complete.  Where it lives (channel,
ts) is kept in Redis under :func:`pipeline.keys.posts`, so any replica can update it or post
in its thread.  ``thread(key)`` posts under the headline (``thread_ts``); ``post()`` is a
standalone message; a reply's chart is uploaded with ``files_upload_v2`` (the
``files.getUploadURLExternal`` + ``files.completeUploadExternal`` flow).

Slack's limits are respected: every payload comes from :mod:`bot.blocks`; posts to one
channel are paced (``[slack] pace`` seconds apart, :class:`Pacer`); HTTP 429 is answered by
waiting ``Retry-After`` (:func:`web_client` adds slack_sdk's rate-limit retry handler).  A
post Slack refuses is logged and dropped — a team-visible message must never break the
restart that reports through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from bot import blocks
from handlers.reply import Reply
from pipeline import keys, messages

log = logging.getLogger(__name__)

POST_TTL = 30 * 86400  #: seconds a headline's location is kept
CLAIM_WAIT = 5.0  #: seconds to wait for another replica's headline before posting our own


def web_client(
    token: str,
    *,
    base_url: str | None = None,
    session: aiohttp.ClientSession | None = None,
    rate_limit_retries: int = 3,
) -> AsyncWebClient:
    """An ``AsyncWebClient`` that waits ``Retry-After`` on HTTP 429 and retries connection errors.

    :param base_url: the Web API base URL (``SLACK_API_URL``), default Slack's.
    :param session: a shared aiohttp session (closed by the caller), or None for one per call.
    :param rate_limit_retries: how many 429s in a row one call waits out.
    """
    kwargs: dict[str, Any] = {"token": token, "session": session}
    if base_url:
        kwargs["base_url"] = base_url if base_url.endswith("/") else base_url + "/"
    client = AsyncWebClient(**kwargs)
    client.retry_handlers = [
        AsyncConnectionErrorRetryHandler(max_retry_count=2),
        AsyncRateLimitErrorRetryHandler(max_retry_count=rate_limit_retries),
        AsyncServerErrorRetryHandler(max_retry_count=1),
    ]
    return client


class Pacer:
    """At most one post per ``interval`` seconds to one channel (Slack allows about 1/s).

    :param interval: minimum seconds between two posts to one channel (0 disables pacing).
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def wait(self, channel: str) -> None:
        """Return when a post to ``channel`` may go; reserves that slot."""
        if self.interval <= 0:
            return
        lock = self._locks.setdefault(channel, asyncio.Lock())
        async with lock:
            now = time.monotonic()
            due = self._next.get(channel, 0.0)
            if due > now:
                await asyncio.sleep(due - now)
                now = time.monotonic()
            self._next[channel] = now + self.interval


class SlackOutbox:
    """:class:`~handlers.outbox.Outbox` over the Slack Web API.

    :param client: the Web API client (bot token), e.g. from :func:`web_client`.
    :param default_channel: where posts go when the caller passes no channel (``announce_channel``).
    :param pace: minimum seconds between posts to one channel.
    :param instance: this process's id, used to claim a headline across replicas.

    Call :meth:`bind` once Redis is open so headline locations are shared; until then they
    are kept in this process only.
    """

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        default_channel: str | None,
        pace: float = 1.0,
        instance: str = "",
    ) -> None:
        self.client = client
        self.default_channel = default_channel
        self.pacer = Pacer(pace)
        self.instance = instance or "pitstop"
        self.failures: list[str] = []  #: refused posts, as logged (for /healthz and tests)
        self._redis: aioredis.Redis | None = None
        self._prefix = "pitstop:"
        self._local: dict[str, tuple[str, str]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._pending: dict[str, tuple[Reply, str | None]] = {}

    def bind(self, client: aioredis.Redis, prefix: str) -> None:
        """Keep headline locations in Redis (``keys.posts``) from now on."""
        self._redis = client
        self._prefix = prefix

    # --- where a headline lives ---------------------------------------------------------------

    async def where(self, key: str) -> tuple[str, str] | None:
        """``(channel, ts)`` of ``key``'s headline, or None if none was posted."""
        if self._redis is None:
            return self._local.get(key)
        got = await self._redis.hmget(keys.posts(self._prefix, key), ["channel", "ts"])
        if got and got[0] and got[1]:
            return str(got[0]), str(got[1])
        return None

    async def _remember(self, key: str, channel: str, ts: str) -> None:
        self._local[key] = (channel, ts)
        if self._redis is not None:
            name = keys.posts(self._prefix, key)
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(name, mapping={"channel": channel, "ts": ts})
                pipe.expire(name, POST_TTL)
                await pipe.execute()

    async def _claim(self, key: str) -> bool:
        """True if this process may post ``key``'s headline (no other replica is posting it)."""
        if self._redis is None:
            return True
        name = keys.posts(self._prefix, key)
        if await self._redis.hsetnx(name, "claim", self.instance):
            await self._redis.expire(name, POST_TTL)
            return True
        return bool(await self._redis.hget(name, "claim") == self.instance)

    async def _wait_elsewhere(self, key: str) -> tuple[str, str] | None:
        deadline = time.monotonic() + CLAIM_WAIT
        while time.monotonic() < deadline:
            loc = await self.where(key)
            if loc is not None:
                return loc
            await asyncio.sleep(0.1)
        return None

    # --- the Outbox protocol ------------------------------------------------------------------

    async def announce(self, key: str, reply: Reply, channel: str | None) -> None:
        """Post ``key``'s headline, or update it in place; the newest call's reply wins.

        :param channel: channel id; None → ``default_channel``.
        """
        self._pending[key] = (reply, channel)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            pending = self._pending.pop(key, None)
            if pending is None:
                return  # a later call already sent a newer version
            await self._announce(key, *pending)

    async def _announce(self, key: str, reply: Reply, channel: str | None) -> tuple[str, str] | None:
        loc = await self.where(key)
        if loc is None and not await self._claim(key):
            loc = await self._wait_elsewhere(key)
        if loc is not None:
            await self.pacer.wait(loc[0])
            try:
                await self.client.chat_update(
                    channel=loc[0], ts=loc[1], **blocks.message(reply, follow_ups=False)
                )
                return loc
            except SlackApiError as exc:
                if exc.response.get("error") != "message_not_found":
                    self._failed(f"{key} ({loc[0]})", exc)
                    return loc
        target = channel or self.default_channel
        if target is None:
            self._failed(key, "no channel: set [slack] announce_channel")
            return None
        ts = await self._send(target, reply, thread_ts=None, follow_ups=False)
        if ts is None:
            if self._redis is not None:
                await self._redis.hdel(keys.posts(self._prefix, key), "claim")
            return None
        await self._remember(key, target, ts)
        for follow in reply.follow_ups:
            await self._send(target, follow, thread_ts=ts, follow_ups=True)
        if reply.chart:
            await self.upload(reply.chart, target, thread_ts=ts, title=reply.title)
        return target, ts

    async def thread(self, key: str, reply: Reply, channel: str | None) -> None:
        """Post ``reply`` in the thread under ``key``'s headline; with no headline yet,
        ``reply`` becomes the headline."""
        loc = await self.where(key)
        if loc is None:
            lock = self._locks.setdefault(key, asyncio.Lock())
            async with lock:
                loc = await self.where(key)
                if loc is None:
                    await self._announce(key, reply, channel)
                    return
        ts = await self._send(loc[0], reply, thread_ts=loc[1], follow_ups=True)
        if ts is not None and reply.chart:
            await self.upload(reply.chart, loc[0], thread_ts=loc[1], title=reply.title)

    async def post(self, reply: Reply, channel: str | None) -> None:
        """Post ``reply`` on its own (digests); follow-ups go in its thread, the chart is uploaded
        to the channel."""
        target = channel or self.default_channel
        if target is None:
            self._failed("post", "no channel: set [slack] announce_channel")
            return
        ts = await self._send(target, reply, thread_ts=None, follow_ups=False)
        if ts is None:
            return
        for follow in reply.follow_ups:
            await self._send(target, follow, thread_ts=ts, follow_ups=True)
        if reply.chart:
            await self.upload(reply.chart, target, thread_ts=None, title=reply.title)

    # --- Web API calls ----------------------------------------------------------------------

    async def _send(
        self, channel: str, reply: Reply, *, thread_ts: str | None, follow_ups: bool
    ) -> str | None:
        """``chat.postMessage``; returns the message ts, or None if Slack refused it (logged)."""
        await self.pacer.wait(channel)
        try:
            resp = await self.client.chat_postMessage(
                channel=channel,
                thread_ts=thread_ts,
                unfurl_links=False,
                unfurl_media=False,
                **blocks.message(reply, follow_ups=follow_ups),
            )
        except (SlackApiError, SlackRequestError, aiohttp.ClientError, TimeoutError) as exc:
            self._failed(channel, exc)
            return None
        return str(resp["ts"])

    async def upload(
        self, path: str, channel: str, *, thread_ts: str | None, title: str | None = None
    ) -> bool:
        """Upload the file at ``path`` to ``channel`` (in a thread if ``thread_ts``) with files_upload_v2.

        :returns: True if Slack took it; False (logged) otherwise.
        """
        file = Path(path)
        if not await asyncio.to_thread(file.is_file):
            self._failed(channel, f"chart {path} does not exist")
            return False
        await self.pacer.wait(channel)
        try:
            await self.client.files_upload_v2(
                channel=channel,
                thread_ts=thread_ts,
                file=str(file),
                filename=file.name,
                title=(title or file.name)[:250],
            )
        except (SlackApiError, SlackRequestError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._failed(channel, exc)
            return False
        return True

    def _failed(self, where: str, error: object) -> None:
        if isinstance(error, SlackApiError):
            detail = str(error.response.get("error", error))
            extra = error.response.get("errors")
            if extra:
                detail += f" {extra}"
        else:
            detail = str(error) or type(error).__name__
        line = messages.slack_not_posted(where, detail)
        self.failures.append(line)
        del self.failures[:-100]
        log.warning(line)


async def close_client(client: AsyncWebClient) -> None:
    """Close a client's shared aiohttp session, if it has one."""
    session = getattr(client, "session", None)
    if isinstance(session, aiohttp.ClientSession):
        with contextlib.suppress(Exception):
            await session.close()
