"""The Slack :class:`~handlers.outbox.Outbox`: one headline per restart, claimed among replicas in
:class:`~pipeline.state.deliveries.Posts` and updated in place, its thread, grouped posts (alert
storms), and refusals told to a person with their fix, never silently dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from slack_sdk.web.async_client import AsyncWebClient

from bot.slack import blocks
from bot.slack.api import ERRORS, Delivery, Refused, SlackSender, detail_of, error_of
from bot.slack.people import People
from bot.text import refused_notice, slack_not_posted, slack_owner_note
from handlers.reply import Reply, Status, render_text
from pipeline.errors import UnknownRun
from pipeline.state.deliveries import CLAIM_LEASE, Posts, UndeliveredAlerts
from pipeline.state.runs import RunStore

log = logging.getLogger(__name__)

#: the refusal of a post with no channel configured (none, no announce, no fallback), and its fix
NO_CHANNEL, NO_CHANNEL_FIX = "no_channel", "set [slack] announce_channel"
CLAIM_WAIT = 5.0  #: seconds to wait for another replica's headline before posting our own
STORY_WAIT = 300.0  #: most seconds a member waits for a grouped post another replica has on its way
T = TypeVar("T")


def _keep(memo: dict[str, Any], key: str, value: Any) -> None:
    """``memo[key] = value``, the oldest entry forgotten past 1,000."""
    memo[key] = value
    if len(memo) > 1000:
        memo.pop(next(iter(memo)))


class SlackOutbox(SlackSender):
    """:class:`~handlers.outbox.Outbox` over the Slack Web API, as ``delivery`` says
    (:class:`~bot.slack.api.Delivery`: channels, pace, this process's id for claims).

    Until :meth:`bind` (once Redis is open) headline locations are kept in this process only.
    """

    def __init__(self, client: AsyncWebClient, delivery: Delivery, people: People | None = None) -> None:
        super().__init__(client, delivery)
        self.people = people or People(client)
        #: the newest alert refused in its channel: at, title, channel, error, told (for /healthz)
        self.last_undelivered: dict[str, Any] | None = None
        self._undelivered: UndeliveredAlerts | None = None
        self._rescued: dict[str, tuple[str, str]] = {}
        self.failures: list[str] = []  #: refused posts, as logged (for /healthz and tests)
        self.last_failure: dict[str, Any] | None = None  #: the newest refusal: at, where, error, line
        self._requesters: dict[str, str] = {}
        self._prompts: dict[str, Any] = {}
        self._posts: Posts | None = None
        self._runs: RunStore | None = None
        self._local: dict[str, tuple[str, str, str]] = {}  #: key → (channel, ts, thread ts), unbound
        self._locks: dict[str, asyncio.Lock] = {}
        self._pending: dict[str, tuple[Reply, str | None]] = {}
        self._for_thread: dict[object, tuple[str, float]] = {}  #: waiter → (channel, since): see announce_in

    def bind(self, posts: Posts, runs: RunStore, undelivered: UndeliveredAlerts | None = None) -> None:
        """Keep headline locations, runs' requesters and the last undelivered alert in Redis."""
        self._posts, self._runs, self._undelivered = posts, runs, undelivered

    def requested_by(self, key: str, user: str) -> None:
        """Remember who asked for ``key``'s run: a refused post about it is told to them."""
        _keep(self._requesters, key, user)

    async def where(self, key: str) -> tuple[str, str] | None:
        """``(channel, ts)`` of ``key``'s headline, or None if none was posted."""
        if self._posts is not None:
            return await self._posts.where(key)
        return self._local[key][:2] if key in self._local else None

    async def thread_of(self, key: str) -> tuple[str, str] | None:
        """``(channel, thread ts)`` where replies about ``key`` go, or None if nothing was posted."""
        if self._posts is not None:
            return await self._posts.thread_of(key)
        return (self._local[key][0], self._local[key][2]) if key in self._local else None

    async def _remember(self, key: str, channel: str, ts: str, parent: str | None = None) -> None:
        self._local[key] = (channel, ts, parent or ts)
        if self._posts is not None:
            await self._posts.remember(key, channel, ts, parent)

    async def _claim(self, key: str) -> bool:
        return self._posts is None or await self._posts.claim(key, self.delivery.instance)

    async def _wait_elsewhere(self, key: str, live_claim: bool = False) -> tuple[str, str] | None:
        """``key``'s headline once another replica posted it, waited for :data:`CLAIM_WAIT` s or,
        with ``live_claim``, while its claim's lease is live (at most :data:`STORY_WAIT` s)."""
        start = time.monotonic()
        while (waited := time.monotonic() - start) < STORY_WAIT:
            if (loc := await self.where(key)) is not None:
                return loc
            if waited >= CLAIM_WAIT and not (live_claim and self._posts and await self._posts.pending(key)):
                return None
            await asyncio.sleep(0.1)
        return None

    async def _renewing(self, key: str, sending: Awaitable[T]) -> T:
        """Await ``sending`` (``key``'s headline) while renewing our claim on it every third of
        :data:`~pipeline.state.deliveries.CLAIM_LEASE`, so waiting replicas see it on its way."""
        posts = self._posts
        if posts is None:
            return await sending

        async def renew() -> None:
            while True:
                await asyncio.sleep(CLAIM_LEASE / 3)
                try:
                    await posts.claim(key, self.delivery.instance)
                except Exception as exc:  # Redis trouble: the post goes on, the lease may lapse
                    log.warning("could not renew the claim on %s: %s", key, exc)

        renewal = asyncio.ensure_future(renew())
        try:
            return await sending
        finally:
            renewal.cancel()

    async def announce(self, key: str, reply: Reply, channel: str | None) -> None:
        """Post ``key``'s headline (``channel`` None: the default), or update it; the newest wins."""
        self._pending[key] = (reply, channel)
        async with self._locks.setdefault(key, asyncio.Lock()):
            pending = self._pending.pop(key, None)
            if pending is None:
                return  # a later call already sent a newer version
            await self._announce(key, *pending)

    async def _announce(self, key: str, reply: Reply, channel: str | None) -> None:
        loc = await self.where(key)
        if loc is None and not await self._claim(key):
            loc = await self._wait_elsewhere(key)
        if loc is not None:
            try:
                names = await self.people.names_for(reply)
                await self.update_payload(loc, blocks.message(reply, follow_ups=False, names=names))
                return
            except Refused as exc:
                if exc.error != "message_not_found":
                    await self._refused(key, reply, loc[0], exc)
                    self._rescued.pop(key, None)
                    return
        target = channel or self.delivery.default_channel or self.delivery.fallback_channel
        ts: str | None = None
        if target is None:  # nowhere to post: the rest of the chain (the requester, owners and admins by DM)
            await self._refused(key, reply, "", Refused(NO_CHANNEL, NO_CHANNEL_FIX))
        else:
            ts = await self._renewing(
                key, self._send(target, reply, thread_ts=None, follow_ups=False, key=key)
            )
        if target is None or ts is None:
            # the alert went to another channel: it lives there from now on
            if (rescued := self._rescued.pop(key, None)) is not None:
                await self._remember(key, *rescued)
            elif self._posts is not None:
                await self._posts.unclaim(key)
            return
        await self._remember(key, target, ts)
        await self._follow_ups(target, ts, reply, key, chart_ts=ts)
        for f in reply.attachments:  # a patch under review: its exact text, as a snippet in the thread
            await self.upload("", target, thread_ts=ts, title=f.title, content=f.content, filename=f.filename)

    async def announce_in(self, key: str, reply: Reply, story: str, channel: str | None) -> None:
        """Post ``key``'s headline as a reply in the thread of the grouped post ``story`` when
        ``channel`` (None: ``default_channel``) is the grouped post's, else as a message of its own;
        nothing when already posted.  While ``story``'s headline is on its way (here, or claimed by
        a live replica: at most :data:`STORY_WAIT` s) it waits, counted in :meth:`queue`."""
        target = channel or self.delivery.default_channel or self.delivery.fallback_channel
        if await self.where(key) is not None:
            return  # already told (by the story, or by what happened to its job since)
        parent = await self.where(story)
        if parent is None:
            me = object()
            self._for_thread[me] = (target or "", time.monotonic())
            try:
                async with self._locks.setdefault(story, asyncio.Lock()):  # held while it is posted
                    parent = await self.where(story)
                if parent is None and self._posts is not None:  # on its way from another replica?
                    parent = await self._wait_elsewhere(story, live_claim=True)
            finally:
                del self._for_thread[me]
        if parent is None or parent[0] != target:
            await self.announce(key, reply, channel)
            return
        async with self._locks.setdefault(key, asyncio.Lock()):
            if await self.where(key) is not None:
                return  # already told (an earlier call)
            if not await self._claim(key):
                await self._wait_elsewhere(key)  # another replica posts it: what follows goes in its thread
                return
            ts = await self._send(parent[0], reply, thread_ts=parent[1], follow_ups=True, key=key)
            if ts is not None:
                await self._remember(key, parent[0], ts, parent=parent[1])
            elif self._posts is not None:
                await self._posts.unclaim(key)

    def backlog(self) -> dict[str, tuple[int, float]]:
        """:meth:`SlackSender.backlog`, counting posts waiting for their grouped post's headline."""
        waiting = super().backlog()
        now = time.monotonic()
        for channel, since in self._for_thread.values():
            n, age = waiting.get(channel, (0, 0.0))
            waiting[channel] = (n + 1, max(age, now - since))
        return waiting

    async def thread(self, key: str, reply: Reply, channel: str | None) -> None:
        """Post ``reply`` in the thread of ``key``'s headline; with none yet, as the headline."""
        loc = await self.thread_of(key)
        if loc is None:
            async with self._locks.setdefault(key, asyncio.Lock()):
                loc = await self.thread_of(key)
                if loc is None:
                    await self._announce(key, reply, channel)
                    return
        ts = await self._send(loc[0], reply, thread_ts=loc[1], follow_ups=True, key=key)
        if ts is not None and reply.chart:
            await self.upload(reply.chart, loc[0], thread_ts=loc[1], title=reply.title)

    async def post(self, reply: Reply, channel: str | None) -> None:
        """Post ``reply`` on its own (digests); follow-ups go in its thread with their charts, the
        reply's own chart is uploaded to the channel."""
        target = channel or self.delivery.default_channel or self.delivery.fallback_channel
        if target is None:
            await self._refused(None, reply, "", Refused(NO_CHANNEL, NO_CHANNEL_FIX))
            return
        ts = await self._send(target, reply, thread_ts=None, follow_ups=False)
        if ts is not None:
            await self._follow_ups(target, ts, reply, None, chart_ts=None)

    async def _follow_ups(
        self, target: str, ts: str, reply: Reply, key: str | None, chart_ts: str | None
    ) -> None:
        """Follow-ups with their charts in the thread ``ts``; ``reply``'s chart to ``chart_ts``."""
        for follow in reply.follow_ups:  # an all-jobs digest: each job's digest and chart in the thread
            await self._send(target, follow, thread_ts=ts, follow_ups=True, key=key)
            if follow.chart:
                await self.upload(follow.chart, target, thread_ts=ts, title=follow.title)
        if reply.chart:
            await self.upload(reply.chart, target, thread_ts=chart_ts, title=reply.title)

    async def _send(
        self, channel: str, reply: Reply, *, thread_ts: str | None, follow_ups: bool, key: str | None = None
    ) -> str | None:
        """Post ``reply`` (if long, the rest in the thread); the first ts, or None if refused."""
        names = await self.people.names_for(reply)
        payloads = blocks.parts(reply, follow_ups=follow_ups, names=names, max_parts=10**6)
        if too_long := len(payloads) > blocks.MAX_PARTS:  # cut, the whole answer attached below
            payloads = blocks.parts(reply, follow_ups=follow_ups, names=names, attached=True)
        try:
            ts = await self.post_parts(channel, payloads, thread_ts=thread_ts)
        except Refused as exc:
            await self._refused(key, reply, channel, exc)
            return None
        if reply.owners:
            await self._tell_owners(channel, reply)
        if too_long:  # the whole answer, as text, in the thread
            text = render_text(blocks.humanise(reply, names))
            await self.upload("", channel, thread_ts=thread_ts or ts, title=reply.title, content=text)
        return ts

    async def _refused(self, key: str | None, reply: Reply, channel: str, exc: Refused) -> None:
        """Record a refused post (``channel`` "": it had none); tell the run's requester (DM), else
        another channel; an alert itself goes down the chain, ending with its owners and admins by DM."""
        what = reply.title.splitlines()[0] if reply.title else (key or "post")
        await self.record_failure(channel or key or "post", exc)
        notice = refused_notice(what, channel, exc.error)
        user = self._requesters.get(key or "")
        if user is None and key and key.startswith("run:") and self._runs is not None:
            with contextlib.suppress(UnknownRun, ValueError):  # no such run, or a record that does not read
                user = (await self._runs.get(key.removeprefix("run:"))).requested_by
                user = user if user.startswith(("U", "W")) else None
        if user is not None and await self.dm(user, Reply(title=notice, status=Status.WARNING)):
            return
        alert = bool(key and key.startswith("incident:"))
        told = await self._elsewhere(key if alert else None, what, reply, channel, [notice])
        if alert:
            self.last_undelivered = dict(
                at=time.time(), title=what, channel=channel, error=exc.error, told=told
            )
            if self._undelivered is not None:
                try:
                    await self._undelivered.record(what, channel, exc.error, told)
                except Exception as err:  # Redis trouble must not hide the alert itself
                    log.warning("could not store the last undelivered alert: %s", err)
        if not told:
            log.error("not told to anyone: %s", notice)

    async def _elsewhere(
        self, alert: str | None, what: str, reply: Reply, channel: str, notes: list[str]
    ) -> list[str]:
        """Tell a refusal of ``what`` in the announce, else fallback channel; an alert (key ``alert``)
        itself goes there after ``notes``, else by DM to its owners and admins.  Returns where it went."""
        channels = (self.delivery.default_channel, self.delivery.fallback_channel)
        for target in dict.fromkeys(c for c in channels if c):
            if target == channel:
                continue
            try:
                if alert is None:
                    await self.post_payload(target, blocks.text_message(notes[0]), thread_ts=None)
                else:
                    shown = replace(reply, lines=(*notes, *reply.lines), follow_ups=())
                    payloads = blocks.parts(shown, names=await self.people.names_for(shown))
                    self._rescued[alert] = (target, await self.post_parts(target, payloads, thread_ts=None))
            except Refused as again:
                await self.record_failure(target, again)
                notes.append(refused_notice(what, target, again.error))
                continue
            if alert is not None and reply.owners:  # owners outside the channel it landed in: by DM
                await self._tell_owners(target, reply)
            return [target]
        if alert is None:
            return []
        dm = replace(reply, lines=(*notes, *reply.lines), follow_ups=(), page=None)
        page_by_dm = self.delivery.page_by_dm
        owners = await self.people.expand(list(page_by_dm(alert)) if page_by_dm else [])
        return [user for user in owners if await self.dm(user, dm)]

    async def _tell_owners(self, channel: str, reply: Reply) -> None:
        """DM ``reply`` to each owning user not a member of ``channel`` (all of them if unknown)."""
        users = [u for u in reply.owners if u.startswith(("U", "W"))]
        if not users:
            return
        members = await self.people.members(channel)
        note = slack_owner_note(channel)
        for user in users:
            if members is None or user not in members:
                await self.dm(user, replace(reply, lines=(note, *reply.lines), page=None, owners=()))

    async def dm(self, user: str, reply: Reply) -> bool:
        """A direct message to ``user`` (needs ``im:write``), split if long; True if it was posted."""
        try:
            opened = await self.client.conversations_open(users=user)
            dm = str(opened["channel"]["id"])
            for payload in blocks.parts(reply, names=await self.people.names_for(reply)):
                await self.post_payload(dm, payload, thread_ts=None)
        except (*ERRORS, Refused, KeyError) as exc:
            log.warning(slack_not_posted(f"a direct message to {user}", str(exc)))
            return False
        return True

    async def tell(self, user: str, reply: Reply, prompt: str | None = None) -> None:
        """Tell ``user`` privately: replace the prompt ``prompt`` (:meth:`prompted`), else by DM."""
        respond = self._prompts.pop(prompt, None) if prompt else None
        if respond is not None:
            payload = blocks.message(reply, names=await self.people.names_for(reply))
            try:
                resp = await respond(**payload, response_type="ephemeral", replace_original=True)
                if getattr(resp, "status_code", 200) == 200:
                    return
            except Exception as exc:  # the prompt may be gone (response_url expired): DM instead
                log.info("replacing prompt %s failed: %s", prompt, exc)
        await self.dm(user, reply)

    def prompted(self, token: str, respond: Any) -> None:
        """Remember how to replace the confirmation prompt ``token`` (Bolt's ``respond``)."""
        _keep(self._prompts, token, respond)

    async def upload(
        self,
        path: str,
        channel: str,
        *,
        thread_ts: str | None,
        title: str | None = None,
        content: str | None = None,
        filename: str = "pitstop-answer.txt",
    ) -> bool:
        """Upload the file at ``path`` (or ``content`` as the text file ``filename``) with
        files_upload_v2, joining a public channel the bot is not in; False if refused (told to a person)."""
        file = Path(path)
        if content is not None:
            source: dict[str, Any] = {"content": content, "filename": filename}
        elif await asyncio.to_thread(file.is_file):
            source = {"file": str(file), "filename": file.name}
        else:
            await self.record_failure(channel, f"chart {path} does not exist")
            return False
        joined = False
        while True:
            await self.pacer.wait(channel)
            try:
                await self.client.files_upload_v2(
                    channel=channel,
                    thread_ts=thread_ts,
                    title=(title or source["filename"])[:250],
                    **source,
                )
                return True
            except (*ERRORS, OSError) as exc:
                error = error_of(exc)[0] if not isinstance(exc, OSError) else "file_unreadable"
                if error == "not_in_channel" and not joined:
                    joined = True
                    try:
                        await self.client.conversations_join(channel=channel)
                        continue
                    except ERRORS as again:
                        log.info("conversations.join %s: %s", channel, error_of(again)[0])
                refusal = Refused(error, detail_of(exc))
                await self._refused(None, Reply(title=title or source["filename"]), channel, refusal)
                return False

    async def record_failure(self, where: str, error: object) -> None:
        """Log a refused post and keep it as the last delivery failure (here and in Redis, for
        ``/healthz`` and ``status``)."""
        detail = detail_of(error)
        line = slack_not_posted(where, detail)
        self.failures.append(line)
        del self.failures[:-100]
        code = error.error if isinstance(error, Refused) else detail.split(" ", 1)[0]
        self.last_failure = {"at": time.time(), "where": where, "error": code, "line": line}
        log.warning(line)
        if self._posts is not None:
            try:
                await self._posts.record_failure({k: str(v) for k, v in self.last_failure.items()})
            except Exception as exc:  # Redis trouble must not hide the refusal itself
                log.warning("could not store the last delivery failure: %s", exc)
