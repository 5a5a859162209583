"""What Pitstop keeps of Slack deliveries: each delivery acted on once, where each headline was
posted, and the last post and alert Slack refused.

Slack redelivers an event it thinks was not acknowledged, and a person may click a button twice;
both arrive with the same delivery id (the event id, the slash command's or action's trigger id).
The first claims the id with ``SET NX EX``; every later one is a duplicate.  (Alerts are
de-duplicated by their incident: :mod:`pipeline.state.incidents`.)

A run's or incident's headline is posted by one replica, so any replica can update it: it *claims*
the key for a lease (unix s of each replica's clock, NTP-close next to :data:`CLAIM_LEASE`), renews
it while its post is on its way, and *remembers* ``(channel, ts)``; the others wait for the location
(:meth:`Posts.pending`), and a claim whose lease lapsed (its holder died) may be taken over.

The last alert Slack refused in its own channel (where it should have gone, why not, who got it
instead) is kept for ``/healthz`` and ``status``: written by the Slack outbox, read by ``status``.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel

from pipeline.state import keys
from pipeline.state.redisconn import Store

DEFAULT_TTL = 3600  #: seconds a delivery id is remembered (Slack retries within minutes)


class Deliveries(Store):
    """Claim delivery ids, each kept :data:`DEFAULT_TTL` s."""

    async def claim(self, delivery_id: str, owner: str = "1") -> bool:
        """Claim ``delivery_id`` for ``owner`` (the instance that acts on it): True for the first delivery,
        False for a repeat."""
        return bool(
            await self.client.set(keys.delivery(self.prefix, delivery_id), owner, nx=True, ex=DEFAULT_TTL)
        )

    async def seen(self, delivery_id: str) -> bool:
        """True when ``delivery_id`` was already claimed."""
        return bool(await self.client.exists(keys.delivery(self.prefix, delivery_id)))


POST_TTL = 30 * 86400  #: seconds a headline's location is kept
CLAIM_LEASE = 30.0  #: seconds a claim holds without renewal (its holder renews it every third of it)

# KEYS[1] the posts hash; ARGV[1] instance; ARGV[2] now (unix s); ARGV[3] lease s; ARGV[4] POST_TTL.
# 1 if ARGV[1] holds the claim afterwards: it was free, ARGV[1]'s already, or its lease lapsed.
_CLAIM = """
local holder = redis.call('HGET', KEYS[1], 'claim')
if holder and holder ~= ARGV[1] and tonumber(redis.call('HGET', KEYS[1], 'lease') or '0') > tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 'claim', ARGV[1], 'lease', tostring(tonumber(ARGV[2]) + tonumber(ARGV[3])))
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""


class Posts(Store):
    """Headline locations and the last refused post."""

    async def where(self, key: str) -> tuple[str, str] | None:
        """``(channel, ts)`` of ``key``'s headline, or None if none was posted."""
        got = await self.client.hmget(keys.posts(self.prefix, key), ["channel", "ts"])
        return (str(got[0]), str(got[1])) if got and got[0] and got[1] else None

    async def thread_of(self, key: str) -> tuple[str, str] | None:
        """``(channel, thread ts)`` where replies about ``key`` go: its headline's own thread, or,
        for a headline that is itself a reply (an incident told in a grouped post), its parent's."""
        got = await self.client.hmget(keys.posts(self.prefix, key), ["channel", "ts", "parent"])
        return (str(got[0]), str(got[2] or got[1])) if got and got[0] and got[1] else None

    async def remember(self, key: str, channel: str, ts: str, parent: str | None = None) -> None:
        """``key``'s headline is at ``(channel, ts)`` (kept :data:`POST_TTL` s), a reply in the
        thread of ``parent`` (a ts) if given."""
        name = keys.posts(self.prefix, key)
        fields = {"channel": channel, "ts": ts, **({"parent": parent} if parent else {})}
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(name, mapping=fields)  # type: ignore[arg-type]
            pipe.expire(name, POST_TTL)
            await pipe.execute()

    async def claim(self, key: str, instance: str, lease: float = CLAIM_LEASE) -> bool:
        """True if ``instance`` may post ``key``'s headline: no other replica's live claim on it.
        Taken, renewed (called again by its holder) or taken over (another's lease lapsed) for
        ``lease`` seconds."""
        name = keys.posts(self.prefix, key)
        return bool(await self.client.eval(_CLAIM, 1, name, instance, time.time(), lease, POST_TTL))

    async def pending(self, key: str) -> bool:
        """True while ``key``'s headline is on its way: claimed, its lease live, not posted yet."""
        got = await self.client.hmget(keys.posts(self.prefix, key), ["ts", "claim", "lease"])
        return not got[0] and bool(got[1]) and float(got[2] or 0) > time.time()

    async def unclaim(self, key: str) -> None:
        """Give the claim on ``key``'s headline up (the post failed)."""
        await self.client.hdel(keys.posts(self.prefix, key), "claim")

    async def record_failure(self, failure: dict[str, str]) -> None:
        """Keep the last post Slack refused (``at`` unix s, ``where``, ``error``, ``line``)."""
        await self.client.hset(keys.delivery_failure(self.prefix), mapping=failure)  # type: ignore[arg-type]

    async def last_failure(self) -> dict[str, str]:
        """The last post Slack refused, as :meth:`record_failure` kept it (empty if none)."""
        return await self.hash(keys.delivery_failure(self.prefix))


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
