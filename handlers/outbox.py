"""Where replies that are not answers go: the team-visible posts of restarts, alerts, digests.

``bot/`` implements :class:`Outbox` for Slack and the console; tests use :class:`MemoryOutbox`.
Keys name a headline message: ``run:r-42`` (a restart), ``incident:dflash:7`` (an alert),
``story:ID`` (a grouped post of an alert storm, :mod:`handlers.watch.alerts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from handlers.reply import Reply


class Outbox(Protocol):
    """The team-visible side of a surface."""

    async def announce(self, key: str, reply: Reply, channel: str | None) -> None:
        """Post the headline message for ``key``, or update it in place if already posted.

        :param channel: channel id; ``None`` → the surface's default (``announce_channel``).
        """

    async def thread(self, key: str, reply: Reply, channel: str | None) -> None:
        """Post ``reply`` in the thread under ``key``'s headline (posting one if none yet)."""

    async def announce_in(self, key: str, reply: Reply, story: str, channel: str | None) -> None:
        """Post ``key``'s headline as one member of the grouped post ``story`` (an alert storm).

        In ``story``'s channel it is a reply in ``story``'s thread (Slack threads have one level,
        so later :meth:`thread` posts about ``key`` go in that thread too); in another channel it
        is a message of its own there.  Later :meth:`announce` calls update it in place.  Nothing
        when ``key``'s headline is already posted; while ``story``'s headline is still on its way
        (from any replica) it waits for it.
        """

    async def post(self, reply: Reply, channel: str | None) -> None:
        """Post ``reply`` as a message of its own (digests), uploading ``reply.chart`` if set."""

    async def tell(self, user: str, reply: Reply, prompt: str | None = None) -> None:
        """Tell ``user`` privately, never the channel (an expired confirmation, say).

        :param prompt: the confirmation token whose prompt this settles: a surface that can
            replace that prompt does (its buttons go with it).
        """


@dataclass
class Posted:
    """One call recorded by :class:`MemoryOutbox`."""

    kind: str  #: "announce" | "announce_in" | "thread" | "post" | "tell"
    key: str | None
    reply: Reply
    channel: str | None
    under: str | None = None  #: "announce_in": the grouped post's key


@dataclass
class MemoryOutbox:
    """An :class:`Outbox` that records every call, for tests and ``pitstop say``."""

    posted: list[Posted] = field(default_factory=list)

    async def announce(self, key: str, reply: Reply, channel: str | None) -> None:
        """Record a headline post/update."""
        self.posted.append(Posted("announce", key, reply, channel))

    async def thread(self, key: str, reply: Reply, channel: str | None) -> None:
        """Record a thread reply."""
        self.posted.append(Posted("thread", key, reply, channel))

    async def announce_in(self, key: str, reply: Reply, story: str, channel: str | None) -> None:
        """Record a member headline of a grouped post."""
        self.posted.append(Posted("announce_in", key, reply, channel, story))

    async def post(self, reply: Reply, channel: str | None) -> None:
        """Record a plain post."""
        self.posted.append(Posted("post", None, reply, channel))

    async def tell(self, user: str, reply: Reply, prompt: str | None = None) -> None:
        """Record a private message: ``key`` is the prompt, ``channel`` the user."""
        self.posted.append(Posted("tell", prompt, reply, user))

    def of(self, kind: str) -> list[Posted]:
        """The recorded calls of one kind, in order."""
        return [p for p in self.posted if p.kind == kind]
