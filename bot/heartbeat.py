"""A watcher for the watcher: ``[health] heartbeat_url`` pinged after each watch round.

The convention Healthchecks.io, Cronitor and Dead Man's Snitch share: an HTTP GET of the URL per
successful round, of ``URL/fail`` for a failed one; the service pages the team when the pings
stop.  A round is done once every watch group (host and interval) has had a cycle since the last
ping; it failed if any of those cycles raised or found its host unreachable.  A ping that fails
is logged, never raised: the watch goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import aiohttp

log = logging.getLogger(__name__)

PING_TIMEOUT = 10.0  #: seconds one ping may take


class Heartbeat:
    """Pings ``url`` once every group in ``groups`` has reported a cycle.

    :param url: the heartbeat URL (http or https).
    :param groups: the watch groups that make up a round (the scheduler's ``watch:…`` job ids).
    :param timeout: seconds one ping may take.
    """

    def __init__(self, url: str, groups: Iterable[str], *, timeout: float = PING_TIMEOUT) -> None:
        self.url = url
        self.groups = frozenset(groups)
        self.timeout = timeout
        self._round: dict[str, bool] = {}
        self._session: aiohttp.ClientSession | None = None

    async def cycle_done(self, group: str, ok: bool) -> None:
        """Note one group's cycle; ping when the round is complete.

        :param group: the group's id.
        :param ok: False if the cycle raised or could not probe its host.
        """
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
