"""The last alert Slack refused in its own channel: where it should have gone, why not, and who
got it instead — for ``/healthz`` and ``status``.  Written by the Slack outbox, read by ``status``."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel

from pipeline.state import keys
from pipeline.state.redisconn import Store


class UndeliveredAlert(BaseModel):
    """One alert refused in its channel."""

    at: float  #: unix s of the refusal
    title: str  #: the alert's headline (``dflash is down: …``)
    channel: str  #: where it should have gone
    error: str  #: Slack's error code there
    told: list[str] = []  #: where it went instead (a channel id, user ids), empty when it reached no one


class UndeliveredAlerts(Store):
    """The store of the last undelivered alert (``keys.undelivered_alert``)."""

    async def record(self, title: str, channel: str, error: str, told: list[str]) -> UndeliveredAlert:
        """Keep this alert as the last undelivered one; returns what was stored."""
        alert = UndeliveredAlert(at=time.time(), title=title, channel=channel, error=error, told=told)
        await self.client.set(keys.undelivered_alert(self.prefix), alert.model_dump_json())
        return alert

    async def last(self) -> UndeliveredAlert | None:
        """The last undelivered alert, or None when there was none (or it is unreadable)."""
        raw: Any = await self.client.get(keys.undelivered_alert(self.prefix))
        if not raw:
            return None
        try:
            return UndeliveredAlert.model_validate_json(raw)
        except ValueError:
            return None
