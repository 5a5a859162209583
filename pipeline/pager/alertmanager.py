"""Prometheus Alertmanager's API v2 (``POST /api/v2/alerts``).

Each incident is one alert, identified by its label set (``alertname``, ``job``, ``kind``,
``severity``, ``incident``: the incident's id), so a re-send joins it.  Alertmanager expects its
clients to re-send open alerts (it resolves one it has not heard of for ``resolve_timeout``, 5 min
by default): :attr:`Alertmanager.resend_every`.  A resolution is the same alert with ``endsAt``;
there are no acknowledgements (silences are Alertmanager's own).
"""

from __future__ import annotations

import aiohttp

from pipeline.pager.base import Action, PagerAlert, http_answer, iso

ALERTNAME = "PitstopIncident"  #: the ``alertname`` label of every alert
RESEND_S = 60.0  #: seconds between re-sends of an open alert (well under ``resolve_timeout``)


class Alertmanager:
    """:class:`~pipeline.pager.base.PagerKind` for Alertmanager's API v2.

    :param url: the alerts endpoint (``[pager] url``: ``http://alertmanager:9093/api/v2/alerts``).
    """

    name = "alertmanager"
    resend_every: float | None = RESEND_S

    def __init__(self, url: str) -> None:
        self.url = url

    @staticmethod
    def labels(alert: PagerAlert) -> dict[str, str]:
        """The alert's identity: its label set."""
        return {
            "alertname": ALERTNAME,
            "job": alert.job,
            "kind": alert.kind,
            "severity": alert.severity,
            "incident": alert.key,
        }

    def body(self, action: Action, alert: PagerAlert, now: float) -> list[dict[str, object]]:
        """The POSTed list of one alert (``endsAt`` set for a resolution)."""
        one: dict[str, object] = {
            "labels": self.labels(alert),
            "annotations": {"summary": alert.summary, "host": alert.source},
            "startsAt": iso(alert.started_at),
        }
        if action is Action.RESOLVE:
            one["endsAt"] = iso(max(now, alert.started_at))
        return [one]

    async def acknowledged(self, session: aiohttp.ClientSession) -> dict[str, str]:
        """Nothing: Alertmanager has no acknowledgements."""
        return {}

    async def send(
        self, session: aiohttp.ClientSession, action: Action, alert: PagerAlert, now: float
    ) -> None:
        """POST the alert (nothing for an acknowledgement); see :meth:`~pipeline.pager.base.PagerKind.send`."""
        if action is Action.ACKNOWLEDGE:
            return
        async with session.post(self.url, json=self.body(action, alert, now)) as resp:
            http_answer(resp.status, await resp.text(), resp.headers.get("Retry-After"))
