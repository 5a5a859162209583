"""Who is who on Slack: people's and channels' names (``users.info``, ``conversations.info``, cached),
a channel's members (``conversations.members``) and user groups expanded (``usergroups.list``); names
let :func:`bot.slack.blocks.humanise` show ``@name`` instead of a ping, and a terminal show ``@name``
and ``#name`` (:func:`bot.slack.blocks.terminal`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable

from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.api import ERRORS, error_of
from handlers.reply import Reply, render_text
from pipeline.errors import GroupsUnknown

log = logging.getLogger(__name__)

TTL = 3600.0  #: seconds a resolved name is trusted
GROUPS_TTL = 60.0  #: seconds a user-group listing is trusted
MISS_TTL = 600.0  #: seconds before a failed lookup is tried again
LOOKUPS = 20  #: most ids resolved for one reply
PAGE = 200  #: members per page of a look-up
_USER = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")
_CHANNEL = re.compile(r"<#([CG][A-Z0-9]+)(?:\|[^>]*)?>")


class People:
    """User id → display name, from ``users.info`` (``users:read``), at most :data:`LOOKUPS` per
    reply, each kept :data:`TTL` s (a failed one :data:`MISS_TTL` s, showing the id meanwhile); the
    user groups, from ``usergroups.list`` (``usergroups:read``), listed at most every
    :data:`GROUPS_TTL` s for :meth:`groups_of` (a staler listing is served while a refresh runs),
    and read fresh for approvals by :meth:`fresh_groups`, which fails closed once the listing has
    failed for longer than :data:`GROUPS_TTL` s (a failed listing keeps the last good one and its
    time: it is never taken for a fresh one).

    :param group_roles: False → :meth:`groups_of` puts every user in no group and never asks Slack
        (no role names a group).
    :param clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self, client: AsyncWebClient, *, group_roles: bool = True, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.client = client
        self.group_roles = group_roles
        self.clock = clock
        self._names: dict[str, tuple[str | None, float]] = {}
        self._groups: dict[str, list[str]] | None = None  #: group id → its user ids, as last listed
        self._listed_at: float | None = None  #: monotonic s of the last listing Slack answered
        self._tried_at = 0.0  #: monotonic s of the last listing asked for
        self._listing: asyncio.Task[None] | None = None

    async def names_for(self, reply: Reply, *, channels: bool = False) -> dict[str, str]:
        """Resolve the user ids ``reply`` mentions (with ``channels``, the channel ids it links too:
        ``conversations.info``, ``channels:read``), those not cached, at most :data:`LOOKUPS`; then
        return every known name, id → name (never raises: a failed look-up shows the id)."""
        text = render_text(reply)
        now = time.monotonic()
        refs = _USER.findall(text) + (_CHANNEL.findall(text) if channels else [])
        wanted = {ref for ref in refs if self._names.get(ref, (None, 0.0))[1] <= now}
        if wanted:
            await asyncio.gather(*(self._lookup(ref) for ref in sorted(wanted)[:LOOKUPS]))
        return {u: n for u, (n, until) in self._names.items() if n is not None and until > now}

    async def _lookup(self, ref: str) -> None:
        try:
            if ref.startswith(("C", "G")):
                channel = (await self.client.conversations_info(channel=ref)).get("channel") or {}
                name = channel.get("name") or ref
            else:
                info = (await self.client.users_info(user=ref)).get("user") or {}
                profile = info.get("profile") or {}
                name = profile.get("display_name") or profile.get("real_name") or info.get("name") or ref
        except Exception as exc:  # a name is a nicety: show the id, try again later
            log.info("looking up %s failed: %s", ref, exc)
            self._names[ref] = (None, time.monotonic() + MISS_TTL)
            return
        self._names[ref] = (str(name), time.monotonic() + TTL)

    async def members(self, channel: str) -> set[str] | None:
        """The members of ``channel`` (user ids), page by page, or None when Slack would not say."""
        members: set[str] = set()
        try:
            async for resp in await self.client.conversations_members(channel=channel, limit=PAGE):
                members.update(str(m) for m in resp.get("members") or [])
        except ERRORS as exc:
            log.info("conversations.members %s: %s", channel, error_of(exc)[0])
            return None
        return members

    async def groups_of(self, user: str) -> tuple[str, ...]:
        """The user groups ``user`` is in, from the last listing (listed first if there is none)."""
        if not self.group_roles:
            return ()
        if self._groups is None:
            await self.list_groups()
        elif self.clock() - self._tried_at > GROUPS_TTL:
            self._list()
        return tuple(group for group, users in (self._groups or {}).items() if user in users)

    async def fresh_groups(self, user: str) -> tuple[str, ...]:
        """The user groups ``user`` is in, from a listing at most :data:`GROUPS_TTL` s old (listed
        again now if older): what approvals trust.

        :raises GroupsUnknown: if Slack will not list them and the last listing is older than that
            (the lookup fails closed, saying since when).
        """
        if not self.group_roles:
            return ()
        if self._age() > GROUPS_TTL:
            await self.list_groups()
        if (age := self._age()) > GROUPS_TTL:
            raise GroupsUnknown(None if self._listed_at is None else age)
        return tuple(group for group, users in (self._groups or {}).items() if user in users)

    def _age(self) -> float:
        """Seconds since the last good listing (infinite if none)."""
        return float("inf") if self._listed_at is None else self.clock() - self._listed_at

    async def list_groups(self) -> None:
        """List the user groups now, if a role names one (one request at a time; callers share it)."""
        if self.group_roles:
            await asyncio.shield(self._list())

    def _list(self) -> asyncio.Task[None]:
        if self._listing is None or self._listing.done():
            self._listing = asyncio.get_running_loop().create_task(self._load_groups())
        return self._listing

    async def _load_groups(self) -> None:
        self._tried_at = self.clock()
        try:
            resp = await self.client.usergroups_list(include_users=True)
        except Exception as exc:  # a failed listing must not fail the request: the last one, retry later
            log.warning("usergroups.list failed: %s", exc)
            self._groups = self._groups or {}
            return
        listed = resp.get("usergroups") or []
        self._groups = {str(g.get("id")): [str(u) for u in g.get("users") or []] for g in listed}
        self._listed_at = self.clock()

    async def expand(self, wanted: list[str]) -> list[str]:
        """``wanted`` (user ids ``U…``/``W…`` and user group ids ``S…``) as user ids, each once,
        groups expanded through a fresh ``usergroups.list`` (a group Slack will not list adds no one)."""
        if any(w.startswith("S") for w in wanted):
            await asyncio.shield(self._list())
        groups = self._groups or {}
        users = [u for who in wanted for u in (groups.get(who, []) if who.startswith("S") else [who])]
        return [u for u in dict.fromkeys(users) if u.startswith(("U", "W"))]

    async def aclose(self) -> None:
        """Cancel a listing in flight."""
        if self._listing is not None and not self._listing.done():
            self._listing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listing
