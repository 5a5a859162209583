"""Socket Mode's 10-connection cap, kept: a connection Slack refuses (``too_many_websockets``)
is retried with a backoff (:func:`wait_after`) instead of at once, logged once and shown in
``/healthz`` until one is accepted."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import suppress
from typing import Any

from aiohttp import WSMessage, WSMsgType
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.web.async_client import AsyncWebClient

from bot.text import too_many_websockets

log = logging.getLogger(__name__)

MAX_WAIT = 60.0  #: seconds between connection tries at most while Slack refuses them
REFUSED = "too_many_websockets"  #: the ``disconnect`` reason of a connection over Slack's cap


def wait_after(refusals: int) -> float:
    """Seconds before the next try after ``refusals`` refused ones: 2, 4, 8, … up to :data:`MAX_WAIT`."""
    return min(MAX_WAIT, 2.0 ** min(refusals, 16))


class CappedSocketModeClient(SocketModeClient):
    """slack_sdk's aiohttp :class:`SocketModeClient` that backs off when Slack refuses a connection
    for having too many: every reconnection (the ``disconnect``'s and the close's) waits for the
    backoff and goes one at a time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refusals = 0  #: refused connections since the last accepted one
        self.refused_at: float | None = None  #: unix s of the last refusal; None once one is accepted
        self._next_try = 0.0  # time.monotonic() before which no new connection is tried
        self._one_at_a_time = asyncio.Lock()
        self.on_message_listeners.append(self._note)

    async def _note(self, message: WSMessage) -> None:
        if message.type != WSMsgType.TEXT or not isinstance(message.data, str):
            return
        if REFUSED in message.data:
            with suppress(ValueError):
                parsed = json.loads(message.data)
                if parsed.get("type") == "disconnect" and parsed.get("reason") == REFUSED:
                    self.refusals += 1
                    self.refused_at = time.time()
                    self._next_try = time.monotonic() + wait_after(self.refusals)
                    if self.refusals == 1:
                        log.error(too_many_websockets(MAX_WAIT))
        elif '"hello"' in message.data:
            self.refusals, self.refused_at, self._next_try = 0, None, 0.0

    async def connect_to_new_endpoint(self, force: bool = False) -> None:
        """Reconnect as slack_sdk does, after a refusal's backoff and one caller at a time."""
        async with self._one_at_a_time:
            wait = self._next_try - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                if self.closed or await self.is_connected():
                    return
            await super().connect_to_new_endpoint(force)

    def health(self) -> dict[str, Any] | None:
        """``{"refused": "too_many_websockets", "since": unix s, "tries": n}`` while refused, else None."""
        if self.refused_at is None:
            return None
        return {"refused": REFUSED, "since": self.refused_at, "tries": self.refusals}


class CappedSocketModeHandler(AsyncSocketModeHandler):
    """Bolt's :class:`AsyncSocketModeHandler` on a :class:`CappedSocketModeClient` (a ping every 10 s)."""

    client: CappedSocketModeClient

    def __init__(self, app: AsyncApp, app_token: str, *, web_client: AsyncWebClient) -> None:
        self.app = app
        self.app_token = app_token
        self.client = CappedSocketModeClient(
            app_token=app_token, logger=app.logger, web_client=web_client, ping_interval=10.0
        )
        self.client.socket_mode_request_listeners.append(self.handle)  # type: ignore[arg-type]
