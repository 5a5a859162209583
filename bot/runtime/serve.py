"""``pitstop serve``: the Slack surface over HTTP (``POST /slack/events``, ``GET /healthz``, ``GET
/metrics``) or Socket Mode (the last two only), sharing :class:`SlackRuntime`; on shutdown answers
in flight are delivered (bounded), then everything is closed in reverse order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_sdk.web.async_client import AsyncWebClient

from bot.runtime.assembly import build_context, close_context, new_instance_id
from bot.runtime.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from bot.runtime.metrics import render as metrics_page
from bot.runtime.scheduler import PitstopScheduler
from bot.slack.api import ERRORS, Delivery, error_text, web_client
from bot.slack.app import SlackSurface, needs_groups
from bot.slack.outbox import SlackOutbox
from bot.slack.people import People
from bot.slack.socket_mode import CappedSocketModeHandler
from bot.text import listen_failed, serve_listening, serve_socket_connected, state_store_was_away
from handlers.context import Context
from handlers.reply import Reply, Status
from handlers.request.dispatch import Dispatcher
from handlers.watch.alerts import page_by_dm
from pipeline import fmt
from pipeline.config import Config, WatchSettings
from pipeline.errors import SlackUnavailable, StateUnavailable, UsageError
from pipeline.state.deliveries import Posts, UndeliveredAlerts
from pipeline.state.redisconn import Outage, StoreWatch

EVENTS_PATH = "/slack/events"
HEALTH_PATH = "/healthz"
METRICS_PATH = "/metrics"
HEALTH_TTL = 30.0  #: seconds an ``auth.test`` result is reused by /healthz
DRAIN_TIMEOUT = 10.0  #: seconds given to answers and restarts in flight at shutdown


@dataclass
class SlackRuntime:
    """Everything one serving process holds; build with :func:`open_runtime`, end with :meth:`close`."""

    config: Config
    client: AsyncWebClient
    session: aiohttp.ClientSession
    outbox: SlackOutbox
    ctx: Context
    dispatcher: Dispatcher
    surface: SlackSurface
    scheduler: PitstopScheduler | None = None
    socket: CappedSocketModeHandler | None = None
    store_watch: StoreWatch | None = None
    auth: dict[str, Any] = field(default_factory=dict)
    _auth_at: float = 0.0
    _watching: asyncio.Task[None] | None = None

    def watch_store(self) -> None:
        """Start watching Redis: a dead embedded server is restarted, an outage longer than two
        watch intervals posted to the announce channel once Redis is back."""
        shortest = min(
            (job.watch.interval for job in self.config.jobs.values()), default=WatchSettings().interval
        )
        self.store_watch = StoreWatch(self.ctx.redis, grace=2 * shortest, on_back=self._store_back)
        self._watching = asyncio.get_running_loop().create_task(self.store_watch.run())

    async def _store_back(self, outage: Outage) -> None:
        words = state_store_was_away(outage.start, outage.end, self.config.scheduler.timezone)
        await self.outbox.post(Reply(words, Status.WARNING), None)

    async def slack_health(self) -> dict[str, Any]:
        """``auth.test`` (cached :data:`HEALTH_TTL` s) plus the Socket Mode connection state."""
        if time.monotonic() - self._auth_at > HEALTH_TTL:
            self.auth, self._auth_at = await auth_test(self.client), time.monotonic()
        out = dict(self.auth)
        if self.socket is not None:
            connected = await self.socket.client.is_connected()
            out["socket_mode"] = "connected" if connected else "reconnecting"
            if (refused := self.socket.client.health()) is not None:
                out["socket_mode"], out["socket_refused"] = "refused", refused
            out["ok"] = bool(out.get("ok")) and connected
        out["queue"] = self.outbox.queue()  #: posts and updates waiting for Slack's pace, with age
        out["refused_posts"] = len(self.outbox.failures)
        out["last_delivery_failure"] = self.outbox.last_failure
        out["last_undelivered_alert"] = self.outbox.last_undelivered
        return out

    async def redis_health(self) -> dict[str, Any]:
        """A PING round trip to Redis, in milliseconds."""
        since = self.store_watch.down_since if self.store_watch is not None else None
        try:
            ms = await self.ctx.redis.round_trip()
            kept = await self.ctx.redis.persistence()
        except StateUnavailable as exc:
            down = {"unreachable_since": fmt.clock(since, date=True)} if since is not None else {}
            return {"ok": False, "error": exc.detail, **down}
        return {
            "ok": True,
            "ms": round(ms, 2),
            "data": kept.where,
            "aof": kept.aof,
            "last_save": fmt.clock(kept.last_save, date=True),
            "persisted": "every second (append-only file)" if kept.aof and kept.aof_ok else "at snapshots",
        }

    async def metrics(self) -> bytes:
        """The ``/metrics`` page (:mod:`bot.runtime.metrics`); :raises StateUnavailable: if Redis does not answer."""
        stats = self.scheduler.watcher.stats if self.scheduler is not None else None
        return await metrics_page(self.ctx, stats, self.outbox)

    async def health(self) -> dict[str, Any]:
        """``{"ok": bool, "redis": {...}, "slack": {...}}``."""
        redis, slack = await asyncio.gather(self.redis_health(), self.slack_health())
        return {"ok": bool(redis["ok"] and slack["ok"]), "redis": redis, "slack": slack}

    async def close(self, drain: float = DRAIN_TIMEOUT) -> None:
        """Stop taking requests, let answers and restarts in flight finish (bounded), close all."""
        if self._watching is not None and self.store_watch is not None:
            self.store_watch.stop()
            await asyncio.wait([self._watching], timeout=drain)
        if self.socket is not None:
            with contextlib.suppress(Exception):
                await self.socket.close_async()  # type: ignore[no-untyped-call]
        if self.scheduler is not None:
            with contextlib.suppress(Exception):
                await self.scheduler.stop()
        try:
            await self.surface.drain(drain)
            await self.dispatcher.drain(drain)
        finally:
            try:
                await close_context(self.ctx)
            finally:
                await self.session.close()


async def auth_test(client: AsyncWebClient) -> dict[str, Any]:
    """``auth.test``: ``{"ok": True, "team", "bot_user"}``, or ``{"ok": False, "error"}`` (Slack's code)."""
    try:
        resp = await client.auth_test()
    except ERRORS as exc:
        return {"ok": False, "error": error_text(exc)}
    return {"ok": True, "team": resp.get("team"), "bot_user": resp.get("user_id")}


async def open_runtime(
    config: Config,
    *,
    bot_token: str,
    api_url: str | None,
    signing_secret: str | None = None,
    scheduler: bool = True,
) -> SlackRuntime:
    """Build the serving process: Web API client, outbox, Context, dispatcher, Bolt app, scheduler
    (``signing_secret``: None for Socket Mode), ``auth.test`` first, so a wrong token fails at
    once.  :raises SlackUnavailable: if ``auth.test`` fails."""
    session = aiohttp.ClientSession()
    ctx: Context | None = None
    try:
        client = web_client(bot_token, base_url=api_url, session=session)
        auth = await auth_test(client)
        if not auth["ok"]:
            raise SlackUnavailable("auth.test", auth["error"])
        delivery = Delivery(
            config.slack.announce_channel,
            config.slack.pace,
            new_instance_id(),
            fallback_channel=config.slack.fallback_channel,
            page_by_dm=functools.partial(page_by_dm, config),
        )
        outbox = SlackOutbox(client, delivery, People(client, group_roles=needs_groups(config)))
        ctx = await build_context(config, outbox, instance=delivery.instance, directory=outbox.people)
        outbox.bind(ctx.redis.open_store(Posts), ctx.runs, ctx.redis.open_store(UndeliveredAlerts))
        dispatcher = Dispatcher(ctx)
        surface = SlackSurface(dispatcher, signing_secret=signing_secret, outbox=outbox)
        runtime = SlackRuntime(
            config=config,
            client=client,
            session=session,
            outbox=outbox,
            ctx=ctx,
            dispatcher=dispatcher,
            surface=surface,
            auth=auth,
            _auth_at=time.monotonic(),
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(outbox.people.list_groups(), timeout=5.0)
        runtime.watch_store()
        if scheduler:
            runtime.scheduler = PitstopScheduler(ctx)
            await runtime.scheduler.start()
        return runtime
    except BaseException:
        if ctx is not None:
            with contextlib.suppress(Exception):
                await close_context(ctx)
        await session.close()
        raise


def http_app(
    surface: SlackSurface | None,
    health: Callable[[], Awaitable[dict[str, Any]]],
    metrics: Callable[[], Awaitable[bytes]] | None = None,
) -> web.Application:
    """The aiohttp application: ``POST /slack/events`` through Bolt (none when ``surface`` is None,
    Socket Mode), ``GET /healthz`` (``ok`` decides 200 or 503), with ``metrics`` ``GET /metrics``."""

    async def events(request: web.Request) -> web.Response:
        assert surface is not None
        with surface.acks.acking():  # work after an ack waits for these (bot.slack.app.AckGate)
            bolt_req = await to_bolt_request(request)
            bolt_resp = await surface.app.async_dispatch(bolt_req)
            return await to_aiohttp_response(bolt_resp)

    async def healthz(request: web.Request) -> web.Response:
        state = await health()
        return web.json_response(state, status=200 if state.get("ok") else 503)

    async def prometheus(request: web.Request) -> web.Response:
        assert metrics is not None
        try:
            page = await metrics()
        except StateUnavailable as exc:
            return web.Response(status=503, text=f"# state store unavailable: {exc.detail}\n")
        return web.Response(body=page, headers={"Content-Type": METRICS_CONTENT_TYPE})

    app = web.Application()
    if surface is not None:
        app.router.add_post(EVENTS_PATH, events)
    app.router.add_get(HEALTH_PATH, healthz)
    if metrics is not None:
        app.router.add_get(METRICS_PATH, prometheus)
    return app


@dataclass
class HttpServer:
    """A running HTTP listener."""

    runner: web.AppRunner
    url: str  #: its base URL, ``http://HOST:PORT`` (the address actually bound)
    port: int  #: the port bound (``port`` 0: a free one)

    async def close(self) -> None:
        """Stop listening and close open connections."""
        await self.runner.cleanup()


async def start_http(app: web.Application, *, host: str, port: int) -> HttpServer:
    """Listen on ``host:port`` (0 → a free port); close the server before the runtime.  Raises
    :class:`UsageError` if ``host:port`` cannot be bound, naming it and ``--port``."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise UsageError(listen_failed(host, port, exc)) from exc
    port = int(runner.addresses[0][1])  # the port bound (port 0: a free one)
    return HttpServer(runner, f"http://{host}:{port}", port)


async def connect_socket(surface: SlackSurface, *, app_token: str) -> CappedSocketModeHandler:
    """Connect ``surface``'s Bolt app over Socket Mode, through its Web API client (close the
    handler with ``close_async()``); raises :class:`SlackUnavailable` if Slack refuses the app token."""
    handler = CappedSocketModeHandler(surface.app, app_token, web_client=surface.client)
    try:
        # here, so a refused app token fails at once (the client itself would retry forever)
        handler.client.wss_uri = await handler.client.issue_new_wss_url()
    except ERRORS as exc:
        await handler.close_async()  # type: ignore[no-untyped-call]
        raise SlackUnavailable("apps.connections.open", error_text(exc)) from None
    await handler.connect_async()  # type: ignore[no-untyped-call]
    return handler


async def serve(
    config: Config,
    *,
    bot_token: str,
    api_url: str | None,
    signing_secret: str | None = None,
    app_token: str | None = None,
    host: str | None = None,
    port: int = 0,
) -> None:
    """Serve Slack until cancelled (SIGINT/SIGTERM): over Socket Mode with ``app_token``, else over
    HTTP (``POST /slack/events``, checked with ``signing_secret``); ``GET /healthz`` and ``GET
    /metrics`` on ``host:port`` unless ``host`` is None.

    :raises SlackUnavailable: if a token is refused.
    :raises UsageError: if the address cannot be bound.
    """
    runtime = await open_runtime(config, bot_token=bot_token, api_url=api_url, signing_secret=signing_secret)
    server: HttpServer | None = None
    try:
        if host is not None:  # first: a port taken opens no Socket Mode connection (an app has 10)
            app = http_app(None if app_token else runtime.surface, runtime.health, runtime.metrics)
            server = await start_http(app, host=host, port=port)
        if app_token:
            runtime.socket = await connect_socket(runtime.surface, app_token=app_token)
            print(serve_socket_connected(server.url if server else None), file=sys.stderr, flush=True)
        elif server is not None:
            print(serve_listening(server.url), file=sys.stderr, flush=True)
        await asyncio.Event().wait()
    finally:
        if server is not None:
            await server.close()
        await runtime.close()
