"""Confirmations: a job with ``confirm = true`` acts only when the same person confirms in time.

The request waits in Redis under a random token carried by the Confirm/Cancel buttons, so any
replica can take the click.  :meth:`Confirmations.take` settles it atomically (compare-and-set): one
of the requester's click, a double click and the expiry timer wins; someone else's click is
refused and leaves it waiting.
"""

from __future__ import annotations

import secrets
import time
from enum import StrEnum

from pydantic import BaseModel, Field
from redis.asyncio.client import Pipeline

from pipeline.state import keys
from pipeline.state.redisconn import Store, ms

DEFAULT_WINDOW = 60.0  #: seconds a confirmation waits
GRACE = 5.0  #: extra seconds the Redis record outlives the window (the timer settles first)


class Pending(BaseModel, frozen=True):
    """A request waiting for confirmation (kept as JSON: ``model_dump_json``)."""

    token: str = Field(default_factory=lambda: secrets.token_urlsafe(12))  #: the id the buttons carry
    user: str
    groups: tuple[str, ...]
    text: str
    command: str  #: the parsed command as JSON text
    channel: str | None
    surface: str
    created_at: float = Field(default_factory=time.time)  #: unix s
    window: float = DEFAULT_WINDOW  #: seconds it may wait


class Take(StrEnum):
    """What :meth:`Confirmations.take` found."""

    TAKEN = "taken"  #: this caller settled it
    GONE = "gone"  #: expired, or already settled by someone else
    NOT_YOURS = "not_yours"  #: another user's confirmation: left waiting
    EXPIRED = "expired"  #: found, but its window had passed (settled as expired)


class Confirmations(Store):
    """Pending confirmations in Redis."""

    async def add(self, pending: Pending) -> Pending:
        """Store ``pending`` for its ``window`` s (and :data:`GRACE`); returns it (its token goes on the buttons)."""
        key = keys.confirmation(self.prefix, pending.token)
        await self.client.set(key, pending.model_dump_json(), px=ms(pending.window + GRACE))
        return pending

    async def take(self, token: str, user: str | None) -> tuple[Take, Pending | None]:
        """Settle a confirmation clicked by ``user`` (None: the expiry timer, always allowed); returns the
        outcome and the pending request (None when gone)."""

        def settle(raw: str | bytes | None, pipe: Pipeline) -> tuple[Take, Pending | None]:
            pending = None if raw is None else Pending.model_validate_json(raw)
            if pending is None or (user is not None and user != pending.user):
                return (Take.GONE if pending is None else Take.NOT_YOURS), pending
            pipe.delete(key)
            late = user is not None and time.time() > pending.created_at + pending.window
            return (Take.EXPIRED if late else Take.TAKEN), pending

        key = keys.confirmation(self.prefix, token)
        return await self.swap(key, settle, f"confirmation {token}", "take")
