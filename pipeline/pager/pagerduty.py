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
    :param reads: who acknowledged what, through the REST API (``[pager] sync_acks``).
    """

    name = "pagerduty"
    resend_every: float | None = None  #: PagerDuty keeps an alert open until it is resolved

    def __init__(self, url: str, routing_key: str, reads: AckReader | None = None) -> None:
        self.url = url
        self.routing_key = routing_key
        self.reads = reads  #: the REST API reader of acknowledgements (``sync_acks``), or None

    async def acknowledged(self, session: aiohttp.ClientSession) -> dict[str, str]:
        """Dedup key → who acknowledged it, of the alerts acknowledged in PagerDuty ({} without ``sync_acks``)."""
        return await self.reads.acknowledged(session) if self.reads is not None else {}

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


PAGE = 100  #: incidents asked per REST API page


class AckReader:
    """PagerDuty's REST API (``GET /incidents?statuses[]=acknowledged``): the incidents acknowledged
    there, by ``incident_key`` (the dedup key Pitstop sent), with who acknowledged each.

    :param api_url: the API base (``[pager] api_url``).
    :param token: a REST API key (``PAGERDUTY_API_TOKEN``), read access is enough.
    """

    def __init__(self, api_url: str, token: str) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token

    async def acknowledged(self, session: aiohttp.ClientSession) -> dict[str, str]:
        """Dedup key → the name of who acknowledged it last, every page read.

        :raises PagerRetry: for a 429 or 5xx.
        :raises PagerRefused: for another refusal (a 401: the key is wrong).
        """
        headers = {
            "Authorization": f"Token token={self.token}",
            "Accept": "application/vnd.pagerduty+json;version=2",
        }
        out: dict[str, str] = {}
        offset, more = 0, True
        while more:
            params = {"statuses[]": "acknowledged", "limit": str(PAGE), "offset": str(offset)}
            async with session.get(f"{self.api_url}/incidents", params=params, headers=headers) as resp:
                http_answer(
                    resp.status, "" if resp.ok else await resp.text(), resp.headers.get("Retry-After")
                )
                page = await resp.json()
            incidents = page.get("incidents") or []
            for inc in incidents:
                acks = inc.get("acknowledgements") or []
                who = (acks[-1].get("acknowledger") or {}).get("summary") if acks else None
                if key := inc.get("incident_key"):
                    out[str(key)] = str(who or "someone")
            more, offset = bool(page.get("more")) and bool(incidents), offset + len(incidents)
        return out
