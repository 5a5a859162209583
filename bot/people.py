"""People's names for Slack messages: ``users.info`` (``users:read``), cached.

Replies name people by id (``<@U012AB>``); :func:`bot.blocks.humanise` shows each as ``@name``
so that a table or a log line never pings anyone.  :class:`People` resolves the ids a reply
mentions, at most :data:`LOOKUPS` at a time, and remembers each answer for :data:`TTL`
seconds (a failed lookup for :data:`MISS_TTL` seconds, showing the id meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

from slack_sdk.web.async_client import AsyncWebClient

from handlers.reply import Reply, render_text

log = logging.getLogger(__name__)

TTL = 3600.0  #: seconds a resolved name is trusted
MISS_TTL = 600.0  #: seconds before a failed lookup is tried again
LOOKUPS = 20  #: most ids resolved for one reply
_USER = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")


class People:
    """User id → display name, from ``users.info``.

    :param client: the Web API client (needs ``users:read``).
    """

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self._names: dict[str, tuple[str | None, float]] = {}

    def cached(self) -> dict[str, str]:
        """The names known now (id → name), without asking Slack."""
        now = time.monotonic()
        return {u: n for u, (n, until) in self._names.items() if n is not None and until > now}

    async def names_for(self, reply: Reply) -> dict[str, str]:
        """Resolve the user ids ``reply`` mentions (those not cached), then return every known name."""
        now = time.monotonic()
        wanted = {u for u in _USER.findall(render_text(reply)) if self._names.get(u, (None, 0.0))[1] <= now}
        if wanted:
            await asyncio.gather(*(self._lookup(u) for u in sorted(wanted)[:LOOKUPS]))
        return self.cached()

    async def _lookup(self, user: str) -> None:
        try:
            resp = await self.client.users_info(user=user)
        except Exception as exc:  # a name is a nicety: show the id, try again later
            log.info("users.info %s failed: %s", user, exc)
            self._names[user] = (None, time.monotonic() + MISS_TTL)
            return
        info = resp.get("user") or {}
        profile = info.get("profile") or {}
        name = profile.get("display_name") or profile.get("real_name") or info.get("name") or user
        self._names[user] = (str(name), time.monotonic() + TTL)
