"""``[health] heartbeat_url``: a GET of the URL once every watch group had a cycle (``URL/fail``
if one raised or found its host unreachable), as Healthchecks.io and Cronitor expect."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import aiohttp

log = logging.getLogger(__name__)

PING_TIMEOUT = 10.0  #: seconds one ping may take


class Heartbeat:
    """Pings ``url`` once every group in ``groups`` (the scheduler's ``watch:…`` job ids) has
    reported a cycle; ``timeout``: seconds one ping may take."""

    def __init__(self, url: str, groups: Iterable[str], *, timeout: float = PING_TIMEOUT) -> None:
        self.url = url
        self.groups = frozenset(groups)
        self.timeout = timeout
        self._round: dict[str, bool] = {}
        self._session: aiohttp.ClientSession | None = None

    async def cycle_done(self, group: str, ok: bool) -> None:
        """Note one group's cycle (``ok``: False if it raised or could not probe its host); ping
        when the round is complete."""
        self._round[group] = self._round.get(group, True) and ok
        if self.groups <= set(self._round):
            fine = all(self._round.values())
            self._round.clear()
            await self.ping(fine)

    async def ping(self, ok: bool) -> None:
        """GET the URL (``URL/fail`` if not ``ok``); a failure is logged."""
        url = self.url if ok else self.url.rstrip("/") + "/fail"
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        try:
            async with self._session.get(url) as resp:
                if resp.status >= 400:
                    log.warning("heartbeat %s answered HTTP %d", url, resp.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("heartbeat %s failed: %s", url, str(exc) or type(exc).__name__)

    async def aclose(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
