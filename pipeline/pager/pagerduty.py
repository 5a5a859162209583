"""PagerDuty's Events API v2 (``POST https://events.pagerduty.com/v2/enqueue``).

Each incident is one PagerDuty alert: ``dedup_key`` is the incident's id, so a trigger sent again
(a retry, a replica) joins the open alert; ``acknowledge`` and ``resolve`` name the same key.  The
API answers 202 for an accepted event, 400 for an invalid one (not retried), 429 when rate limited
and 5xx on its own trouble (both retried).
"""

from __future__ import annotations

import aiohttp

from pipeline.pager.base import Action, PagerAlert, http_answer, iso

CLIENT = "Pitstop"  #: the ``client`` PagerDuty shows for the events


class PagerDuty:
    """:class:`~pipeline.pager.base.PagerKind` for the Events API v2.

    :param url: the endpoint (``[pager] url``).
    :param routing_key: the service integration's key (``PAGERDUTY_ROUTING_KEY``).
    """

    name = "pagerduty"
    resend_every: float | None = None  #: PagerDuty keeps an alert open until it is resolved

    def __init__(self, url: str, routing_key: str) -> None:
        self.url = url
        self.routing_key = routing_key

    def event(self, action: Action, alert: PagerAlert) -> dict[str, object]:
        """The event's JSON body (a trigger with its ``payload``)."""
        body: dict[str, object] = {
            "routing_key": self.routing_key,
            "event_action": action.value,
            "dedup_key": alert.key,
        }
        if action is Action.TRIGGER:
            body["client"] = CLIENT
            body["payload"] = {
                "summary": alert.summary[:1024],
                "source": alert.source,
                "severity": alert.severity,
                "timestamp": iso(alert.started_at),
                "component": alert.job,
                "class": alert.kind,
                "custom_details": {"job": alert.job, "incident": alert.key},
            }
        return body

    async def send(
        self, session: aiohttp.ClientSession, action: Action, alert: PagerAlert, now: float
    ) -> None:
        """POST one event; see :meth:`~pipeline.pager.base.PagerKind.send`."""
        async with session.post(self.url, json=self.event(action, alert)) as resp:
            http_answer(resp.status, await resp.text(), resp.headers.get("Retry-After"))
