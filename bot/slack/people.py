"""Who is who on Slack: people's names (``users.info``, cached), a channel's members
(``conversations.members``) and user groups expanded (``usergroups.list``); names let
:func:`bot.slack.blocks.humanise` show ``@name`` instead of a ping."""

from __future__ import annotations

import asyncio
import logging
import re
import time

from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.api import ERRORS, error_of
from handlers.reply import Reply, render_text

log = logging.getLogger(__name__)

TTL = 3600.0  #: seconds a resolved name is trusted
MISS_TTL = 600.0  #: seconds before a failed lookup is tried again
LOOKUPS = 20  #: most ids resolved for one reply
PAGES, PAGE = 20, 200  #: most pages of members one look-up reads, and members per page
_USER = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")


class People:
    """User id → display name, from ``users.info`` (``users:read``), at most :data:`LOOKUPS` per
    reply, each kept :data:`TTL` s (a failed one :data:`MISS_TTL` s, showing the id meanwhile)."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self._names: dict[str, tuple[str | None, float]] = {}

    async def names_for(self, reply: Reply) -> dict[str, str]:
        """Resolve the user ids ``reply`` mentions (those not cached), then return every known name
        (never raises: a failed look-up shows the id)."""
        now = time.monotonic()
        wanted = {u for u in _USER.findall(render_text(reply)) if self._names.get(u, (None, 0.0))[1] <= now}
        if wanted:
            await asyncio.gather(*(self._lookup(u) for u in sorted(wanted)[:LOOKUPS]))
        return {u: n for u, (n, until) in self._names.items() if n is not None and until > now}

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

    async def members(self, channel: str) -> set[str] | None:
        """The members of ``channel`` (user ids), page by page, or None when Slack would not say."""
        members: set[str] = set()
        cursor = ""
        for _ in range(PAGES):
            try:
                resp = await self.client.conversations_members(
                    channel=channel, limit=PAGE, cursor=cursor or None
                )
            except ERRORS as exc:
                log.info("conversations.members %s: %s", channel, error_of(exc)[0])
                return None
            members.update(str(m) for m in resp.get("members") or [])
            cursor = str((resp.get("response_metadata") or {}).get("next_cursor") or "")
            if not cursor:
                break
        return members

    async def expand(self, wanted: list[str]) -> list[str]:
        """``wanted`` (user ids ``U…``/``W…`` and user group ids ``S…``) as user ids, each once,
        groups expanded through ``usergroups.list`` (a group Slack will not list adds no one)."""
        groups: dict[str, list[str]] = {}
        if any(w.startswith("S") for w in wanted):
            try:
                resp = await self.client.usergroups_list(include_users=True)
                groups = {str(g.get("id")): list(g.get("users") or []) for g in resp.get("usergroups") or []}
            except ERRORS as exc:
                log.warning("usergroups.list: %s", error_of(exc)[0])
        users = [u for who in wanted for u in (groups.get(who, []) if who.startswith("S") else [who])]
        return [u for u in dict.fromkeys(users) if u.startswith(("U", "W"))]
