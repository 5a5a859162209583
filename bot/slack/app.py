"""The Slack surface: a Bolt ``AsyncApp`` (slash command, mentions, DMs, buttons, App Home) over
:class:`handlers.request.dispatch.Dispatcher`.  Every listener acks first and works after the ack in a
tracked task, after a lull in the acks (:class:`AckGate`); a stable delivery id per request (``trigger_id``, ``event_id``) makes Slack's
retries no repeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError

from bot.slack import blocks
from bot.slack.api import error_text
from bot.slack.outbox import SlackOutbox
from bot.text import slack_bot_ignored, slack_home_no_role, slack_home_updated, slack_not_posted
from handlers.reply import Reply, Status
from handlers.request.auth import names_groups, role_of
from handlers.request.dispatch import Dispatcher, Request
from handlers.runs.view import run_reply, thread_key
from handlers.views.read import follow_run, followed
from pipeline import fmt
from pipeline.config import Config
from pipeline.errors import ExitCode, internal_error, new_incident_id

log = logging.getLogger(__name__)

HOME_TTL = 60.0  #: seconds the App Home's job listing is reused before the hosts are probed again
RESPONSE_PARTS = 5  #: a response_url takes at most 5 posts (within 30 minutes)
_MENTION = re.compile(r"<@[A-Z0-9]+(?:\|[^>]*)?>")
_CONFIRMING = frozenset({"confirm", "cancel"})
PATIENCE = 0.5  #: seconds a follow-up (work after a Slack ack) waits at most for a lull in the acks
QUIET = 0.02  #: seconds with no request being acked that make a lull
CONCURRENCY = 16  #: follow-ups running at once

Respond = Callable[..., Awaitable[Any]]


def needs_groups(config: Config) -> bool:
    """True when a role list (global or per job) or ``[approval] approvers`` names a group (``S…``)."""
    return names_groups(config)


def bot_ids(event: dict[str, Any]) -> list[str] | None:
    """The ids an Events API ``event`` from a bot carries (``bot_id``, ``app_id``, its
    ``bot_profile``'s ``id`` and ``app_id``; maybe none, for a bare ``bot_message``), or None for a
    person's event."""
    profile = event.get("bot_profile")
    fields = profile if isinstance(profile, dict) else {}
    found = (event.get("bot_id"), event.get("app_id"), fields.get("id"), fields.get("app_id"))
    ids = list(dict.fromkeys(str(i) for i in found if i))
    return ids if ids or profile or event.get("subtype") == "bot_message" else None


def response_type(reply: Reply) -> str:
    """``ephemeral`` for input errors, denials, confirmations and run acks (the team sees the
    run's own message); ``in_channel`` for the rest."""
    if reply.ephemeral or reply.run_id is not None or any(b.action in _CONFIRMING for b in reply.buttons):
        return "ephemeral"
    return "in_channel"


def mention_text(text: str, bot_user: str | None) -> str:
    """The command in a mention: the bot's ``<@U…>`` (or a leading mention) removed."""
    if bot_user:
        text = text.replace(f"<@{bot_user}>", " ")
    text = text.strip()
    if text.startswith("<@"):
        text = _MENTION.sub(" ", text, count=1)
    return " ".join(text.split())


def _quiet_token_warning(record: logging.LogRecord) -> bool:
    """Drop Bolt's notice that ``SLACK_BOT_TOKEN`` is unused beside our client (given deliberately)."""
    return not str(record.msg).startswith("As you gave `client` as well")


class AckGate:
    """Acks before follow-ups: the number of requests being acked, a wait for none, and slots for
    the work after them.  Work after a Slack ack (3 s) waits for a lull in the acks still being made
    (none for ``quiet`` s) or at most ``patience`` s, and at most ``concurrency`` follow-ups run at
    once (redis-py's pool refuses the 101st connection).  Wrap Bolt's dispatch in :meth:`acking` and
    the work after the ack in :meth:`follow_up`."""

    def __init__(
        self, patience: float = PATIENCE, concurrency: int = CONCURRENCY, *, quiet: float = QUIET
    ) -> None:
        self.patience = patience
        self.quiet = quiet
        self.in_flight = 0
        self._last_ack = -math.inf  #: time.monotonic() when the last request finished being acked
        self._slots = asyncio.Semaphore(concurrency)
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def acking(self) -> Iterator[None]:
        """Count one request as being acked while the block runs."""
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            self._last_ack = time.monotonic()
            if self.in_flight == 0:
                self._idle.set()

    async def lull(self) -> None:
        """Return once none was being acked for :attr:`quiet` s, or after :attr:`patience` s."""
        deadline = time.monotonic() + self.patience
        while (now := time.monotonic()) < deadline:
            if self.in_flight:
                try:
                    await asyncio.wait_for(self._idle.wait(), deadline - now)
                except TimeoutError:
                    return
                continue
            calm = now - self._last_ack
            if calm >= self.quiet:
                return
            await asyncio.sleep(min(self.quiet - calm, deadline - now))

    @contextlib.asynccontextmanager
    async def follow_up(self) -> AsyncIterator[None]:
        """Run the block after a lull (:meth:`lull`), holding one of the follow-up slots."""
        await self.lull()
        async with self._slots:
            yield


class SlackSurface:
    """The Bolt app over ``dispatcher`` (and its config) plus the state its listeners share (tasks
    after the ack, group cache).

    :param signing_secret: HTTP mode's signing secret; None for Socket Mode (no signature check).
    :param outbox: the Slack outbox: its Web API client, names and user groups (its ``people``), posts, a chart that
        comes with an answer, refusals.
    """

    def __init__(self, dispatcher: Dispatcher, *, signing_secret: str | None, outbox: SlackOutbox) -> None:
        self.config = config = dispatcher.ctx.config
        self.dispatcher = dispatcher
        self.client = client = outbox.client
        self.outbox = outbox
        self._tasks: set[asyncio.Task[Any]] = set()
        self._home: tuple[float, Reply] | None = None
        self._home_lock = asyncio.Lock()
        self.acks = AckGate()  #: the HTTP server counts requests being acked; follow-ups wait for a lull
        bolt_log = logging.getLogger("pitstop.bolt")
        bolt_log.addFilter(_quiet_token_warning)
        self.app = AsyncApp(
            name="pitstop",
            client=client,
            signing_secret=signing_secret or "",
            request_verification_enabled=signing_secret is not None,
            process_before_response=True,
            logger=bolt_log,
        )
        self.app.middleware(self._people_only)
        self.app.command(config.slack.command)(self._on_command)
        self.app.event("app_mention")(self._on_mention)
        self.app.event("message")(self._on_message)
        self.app.event("app_home_opened")(self._on_home)
        self.app.action(re.compile("^" + re.escape(blocks.ACTION_PREFIX)))(self._on_action)
        self.app.error(self._on_error)

    async def _people_only(self, req: AsyncBoltRequest, next: Callable[[], Awaitable[Any]]) -> Any:
        """Bolt middleware: an event from a bot (:func:`bot_ids`) not listed in ``[auth] bots`` is
        acked, logged and runs nothing (Pitstop's own events Bolt drops before this)."""
        event = req.body.get("event")
        if not isinstance(event, dict):
            return await next()  # a command, a button: people only
        ids = bot_ids(event)
        if ids is None or set(ids) & set(self.config.auth.bots):
            return await next()
        bot = ids[0] if ids else "bot_message"
        log.warning(slack_bot_ignored(bot, str(event.get("type")), str(event.get("channel") or "")))
        return await req.context.ack()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` after the ack, tracked so :meth:`drain` can wait for it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("Slack follow-up failed", exc_info=task.exception())

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) for answers still being delivered, then cancel the rest."""
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        await self.outbox.people.aclose()

    async def _handle(self, answer: Awaitable[Reply]) -> Reply:
        """``answer``'s reply; for an unexpected failure, what Slack shows (the traceback goes to the log)."""
        try:
            return await answer
        except Exception:
            incident = new_incident_id()
            log.exception("incident %s", incident)
            return Reply(title=internal_error(incident), status=Status.ERROR, ephemeral=True)

    async def _on_command(
        self, ack: Respond, body: dict[str, Any], respond: Respond, request: AsyncBoltRequest
    ) -> None:
        await ack()  # first: everything else (parse, dedupe, roles, audit, the answer) runs after it
        self.spawn(self._command(body, respond, retry=self._is_retry(request)))

    async def _command(self, body: dict[str, Any], respond: Respond, *, retry: bool = False) -> None:
        """Act on an acked slash command after a lull in the acks (:class:`AckGate`),
        then answer through its ``response_url`` outside the follow-up slot.  A second delivery of
        one ``trigger_id`` is Slack's redelivery: nobody acts on or answers it (nor audits a retry)."""
        user = str(body.get("user_id", ""))
        text = str(body.get("text", ""))
        channel = body.get("channel_id")
        trigger = body.get("trigger_id") or f"{user}:{channel}:{text}"
        async with self.acks.follow_up():
            reply = await self._first(text, user, f"cmd:{trigger}", channel, retry)
        if reply is None or reply.redelivery:
            return  # Slack's redelivery: the first delivery acted and answers
        await self._respond(respond, reply, user=user)
        self._after_answer(reply, channel, user, respond)

    async def _first(
        self, text: str, user: str, delivery: str, channel: str | None, retry: bool
    ) -> Reply | None:
        """The answer to ``text``; None for Slack's retry of a delivery already acted on."""
        groups = await self.outbox.people.groups_of(user)
        req = Request(
            text=text, user=user, groups=groups, delivery_id=delivery, channel=channel, surface="slack"
        )
        if retry and await self.dispatcher.seen(delivery):
            return None
        reply = await self._handle(self.dispatcher.handle(req))
        if reply.exit_code is ExitCode.OK and (run_id := followed(text, self.config)) is not None:
            self.spawn(self._follow(run_id, channel))
        return reply

    async def _follow(self, run_id: str, channel: str | None) -> None:
        """``follow r-N``, after its answer: the run's message (where it was posted, else in
        ``channel``) kept up to date until the run's verdict."""
        async for run in follow_run(self.dispatcher.ctx, run_id):
            await self.outbox.announce(thread_key(run_id), run_reply(run, self.config), channel)

    async def _respond(
        self,
        respond: Respond,
        reply: Reply,
        *,
        user: str,
        replace: bool = False,
        thread_ts: str | None = None,
    ) -> None:
        """Answer through the response_url (at most :data:`RESPONSE_PARTS` messages), else by DM."""
        payloads = blocks.parts(
            reply, names=await self.outbox.people.names_for(reply), max_parts=RESPONSE_PARTS
        )
        for i, payload in enumerate(payloads):
            try:
                resp = await respond(
                    **payload,
                    response_type=response_type(reply),
                    replace_original=replace and i == 0,
                    thread_ts=thread_ts,
                )
                status = getattr(resp, "status_code", 200)
                error = "" if status == 200 else f"HTTP {status} {getattr(resp, 'body', '')}".strip()
            except Exception as exc:
                error = str(exc) or type(exc).__name__
            if error:
                await self._undelivered(user, reply, "response_url", error)
                return

    async def _undelivered(self, user: str, reply: Reply, where: str, error: str) -> None:
        """An answer Slack refused: recorded (``/healthz``, ``status``) and sent to ``user`` by DM."""
        await self.outbox.record_failure(where, error)
        if user and not await self.outbox.dm(user, reply):
            log.error("answer to %s lost: %s", user, slack_not_posted(where, error))

    def _after_answer(
        self, reply: Reply, channel: object, user: str = "", respond: Respond | None = None
    ) -> None:
        """Upload an answer's chart (a response_url cannot carry files); remember who asked for a
        run (a refused post about it is told to them) and how to replace a confirmation prompt."""
        if isinstance(channel, str) and channel:
            for part in (reply, *reply.follow_ups):  # an all-jobs digest carries one chart per job
                if part.chart:
                    self.spawn(self.outbox.upload(part.chart, channel, thread_ts=None, title=part.title))
        if reply.run_id and user:
            self.outbox.requested_by(thread_key(reply.run_id), user)
        if respond is not None:
            for button in reply.buttons:
                if button.action == "confirm":
                    self.outbox.prompted(button.value, respond)

    @staticmethod
    def _is_retry(request: AsyncBoltRequest) -> bool:
        """True for Slack's redelivery (``X-Slack-Retry-Num`` ≥ 1, also in Socket Mode)."""
        raw = request.headers.get("x-slack-retry-num") or ["0"]  # Bolt's headers: name → values
        return str(raw[0]).isdigit() and int(raw[0]) > 0

    async def _on_mention(
        self, body: dict[str, Any], event: dict[str, Any], request: AsyncBoltRequest, context: Any
    ) -> None:
        text = mention_text(str(event.get("text", "")), getattr(context, "bot_user_id", None))
        self.spawn(self._converse(body, event, text, in_thread=True, retry=self._is_retry(request)))

    async def _on_message(
        self, body: dict[str, Any], event: dict[str, Any], request: AsyncBoltRequest
    ) -> None:
        if event.get("channel_type") != "im" or event.get("subtype") not in (None, "bot_message"):
            return  # edits, joins…; bots are refused before this unless [auth] bots lists them
        text = " ".join(str(event.get("text", "")).split())
        if text:
            self.spawn(self._converse(body, event, text, in_thread=False, retry=self._is_retry(request)))

    async def _converse(
        self, body: dict[str, Any], event: dict[str, Any], text: str, *, in_thread: bool, retry: bool
    ) -> None:
        user = str(event.get("user", ""))
        channel = str(event.get("channel", ""))
        event_id = body.get("event_id") or f"{channel}:{event.get('ts')}"
        reply = await self._first(text, user, f"ev:{event_id}", channel, retry)
        if reply is None:
            return  # Slack's retry of an event already acted on: the first delivery answers it
        thread_ts = event.get("thread_ts") or (event.get("ts") if in_thread else None)
        payloads = blocks.parts(reply, names=await self.outbox.people.names_for(reply))
        try:
            if reply.ephemeral:
                for payload in payloads:
                    await self.client.chat_postEphemeral(
                        channel=channel, user=user, thread_ts=thread_ts, **payload
                    )
            else:
                await self.outbox.post_parts(channel, payloads, thread_ts=thread_ts)
        except Exception as exc:  # SlackApiError, Refused, a network error: tell the asker directly
            await self._undelivered(user, reply, channel, error_text(exc))
            return
        self._after_answer(reply, channel, user)

    async def _on_action(
        self, ack: Respond, body: dict[str, Any], action: dict[str, Any], respond: Respond
    ) -> None:
        await ack()
        self.spawn(self._act(body, action, respond))

    async def _act(self, body: dict[str, Any], action: dict[str, Any], respond: Respond) -> None:
        """Act on an acked button click, and answer through its ``response_url``."""
        user = str((body.get("user") or {}).get("id", ""))
        name = blocks.action_of(str(action.get("action_id", "")))
        value = str(action.get("value", ""))
        delivery_id = "act:" + (body.get("trigger_id") or f"{action.get('action_ts')}:{user}")
        groups = await self.outbox.people.groups_of(user)  # roles may name user groups, as for typed commands
        reply = await self._handle(
            self.dispatcher.handle_action(name, value, user, delivery_id, groups=groups)
        )
        # "Show log" answers in the thread of the message it was clicked on (the run's thread)
        message = body.get("message") or {}
        container = body.get("container") or {}
        in_thread = message.get("thread_ts") or container.get("thread_ts") or message.get("ts")
        thread_ts = str(in_thread) if name == "show_log" and in_thread else None
        await self._respond(respond, reply, user=user, replace=name in _CONFIRMING, thread_ts=thread_ts)
        self._after_answer(reply, (body.get("channel") or {}).get("id"), user)

    async def _on_home(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        if event.get("tab", "home") != "home":
            return
        delivery = str(body.get("event_id") or uuid.uuid4().hex)
        self.spawn(self.publish_home(str(event.get("user", "")), delivery))

    async def publish_home(self, user: str, delivery: str) -> None:
        """Publish the App Home tab for ``user``: the ``status`` listing, shared by everyone who may
        see it and reused for :data:`HOME_TTL` s; a user without a role sees a line saying so."""
        groups = await self.outbox.people.groups_of(user)
        if role_of(self.config, user, groups) is None:
            reply = Reply(title=slack_home_no_role(), status=Status.INFO)
            at = time.time()
        else:
            async with self._home_lock:
                if self._home is None or time.time() - self._home[0] > HOME_TTL:
                    req = Request(
                        text="status",
                        user=user,
                        groups=groups,
                        delivery_id=f"home:{delivery}",
                        surface="home",
                    )
                    listing = await self._handle(self.dispatcher.handle(req))
                    self._home = (time.time(), listing)
                at, reply = self._home
        footer = slack_home_updated(fmt.clock(at, self.config.scheduler.timezone))
        try:
            view = blocks.home_view(reply, footer, names=await self.outbox.people.names_for(reply))
            await self.client.views_publish(user_id=user, view=view)
        except SlackApiError as exc:
            log.warning(slack_not_posted(f"App Home of {user}", error_text(exc)))

    async def _on_error(self, error: Exception, body: dict[str, Any]) -> None:
        log.error("incident %s: %s", new_incident_id(), error, exc_info=error)
