"""``pitstop serve``: the Slack surface on two listeners sharing :class:`SlackRuntime`.  The public
one (HTTP mode only) serves ``POST /slack/events`` and a bare ``GET /healthz``; the admin one
(loopback by default, the only one in Socket Mode) ``GET /healthz``, ``GET /healthz/details`` and
``GET /metrics``, from state read at most once per :data:`FRESH` s.  On shutdown answers in flight
are delivered (bounded), then everything is closed in reverse order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.runtime.assembly import build_context, close_context, new_instance_id
from bot.runtime.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from bot.runtime.metrics import render as metrics_page
from bot.runtime.scheduler import PitstopScheduler
from bot.runtime.settings import ADMIN_HOST, ADMIN_PORT, PUBLIC_HOST, PUBLIC_PORT
from bot.slack.api import ERRORS, Delivery, error_text, web_client
from bot.slack.app import SlackSurface, needs_groups
from bot.slack.outbox import SlackOutbox
from bot.slack.people import People
from bot.slack.socket_mode import CappedSocketModeHandler
from bot.text import (
    admin_listen_failed,
    listen_failed,
    serve_listening,
    serve_socket_connected,
    state_store_was_away,
)
from handlers.context import Context
from handlers.reply import Reply, Status
from handlers.request.dispatch import Dispatcher
from handlers.watch.alerts import page_by_dm
from pipeline import fmt
from pipeline.config import Config, WatchSettings, alerts_nowhere
from pipeline.errors import ConfigError, SlackUnavailable, StateUnavailable, UsageError
from pipeline.state.deliveries import Posts, UndeliveredAlerts
from pipeline.state.redisconn import Outage, StoreWatch

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
HEALTH_PATH = "/healthz"  #: bare: ``ok`` (200) or ``unavailable`` (503), on both listeners
DETAILS_PATH = "/healthz/details"  #: the health JSON, on the admin listener only
METRICS_PATH = "/metrics"  #: the Prometheus page, on the admin listener only
HEALTH_TTL = 30.0  #: seconds an ``auth.test`` result is reused by /healthz
FRESH = 1.0  #: seconds a health check or scrape reuses the state the last one read
DRAIN_TIMEOUT = 10.0  #: seconds given to answers and restarts in flight at shutdown
T = TypeVar("T")


class Fresh(Generic[T]):
    """``read()``'s outcome (value or exception) reused for ``ttl`` s; callers at once share one read.

    :param read: the reading (Redis, Slack…).
    :param ttl: seconds an outcome is reused.
    :param clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        read: Callable[[], Awaitable[T]],
        ttl: float = FRESH,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read, self.ttl, self._clock = read, ttl, clock
        self._lock = asyncio.Lock()
        self._at: float | None = None
        self._outcome: T | BaseException | None = None

    async def __call__(self) -> T:
        """The last outcome if younger than ``ttl`` s, else a new read's; :raises: what the read raised."""
        async with self._lock:
            if self._at is None or self._clock() - self._at >= self.ttl:
                try:
                    self._outcome = await self._read()
                except Exception as exc:
                    self._outcome = exc
                self._at = self._clock()
            outcome = self._outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # type: ignore[return-value]


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
    clock: Callable[[], float] = time.monotonic  #: monotonic s: the reuse of ``auth.test``, health, metrics
    #: :meth:`read_health` and :meth:`read_metrics` as the listeners read them: at most once per :data:`FRESH` s
    health: Callable[[], Awaitable[dict[str, Any]]] = field(init=False)
    metrics: Callable[[], Awaitable[bytes]] = field(init=False)

    def __post_init__(self) -> None:
        self.health = Fresh(self.read_health, clock=self.clock)
        self.metrics = Fresh(self.read_metrics, clock=self.clock)

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

    async def slack_check(self) -> dict[str, Any]:
        """:func:`auth_test`'s answer, reused for :data:`HEALTH_TTL` s (health, the heartbeat)."""
        if self.clock() - self._auth_at >= HEALTH_TTL:
            self.auth, self._auth_at = await auth_test(self.client), self.clock()
        return self.auth

    async def slack_health(self) -> dict[str, Any]:
        """``auth.test`` (:meth:`slack_check`) plus the Socket Mode connection state."""
        out = dict(await self.slack_check())
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

    async def read_metrics(self) -> bytes:
        """The ``/metrics`` page (:mod:`bot.runtime.metrics`); :raises StateUnavailable: if Redis does not answer."""
        stats = self.scheduler.watcher.stats if self.scheduler is not None else None
        return await metrics_page(self.ctx, stats, self.outbox)

    async def read_health(self) -> dict[str, Any]:
        """``{"ok": bool, "redis": {...}, "slack": {...}}`` (``/healthz/details``)."""
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
    """``auth.test``: ``{"ok": True, "team", "bot_user"}``, or ``{"ok": False, "error"}`` (Slack's code,
    or with ``"unreachable": True`` the connection error: Slack did not answer)."""
    try:
        resp = await client.auth_test()
    except ERRORS as exc:
        return {"ok": False, "error": error_text(exc)} | (
            {} if isinstance(exc, SlackApiError) else {"unreachable": True}
        )
    return {"ok": True, "team": resp.get("team"), "bot_user": resp.get("user_id")}


async def open_runtime(
    config: Config,
    *,
    bot_token: str,
    api_url: str | None,
    signing_secret: str | None = None,
    scheduler: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> SlackRuntime:
    """Build the serving process: Web API client, outbox, Context, dispatcher, Bolt app, scheduler
    (``signing_secret``: None for Socket Mode), ``auth.test`` first, so a wrong token fails at
    once; ``clock`` (monotonic s) times the health and metrics reuse (:class:`Fresh`).

    :raises SlackUnavailable: if ``auth.test`` fails."""
    session = aiohttp.ClientSession()
    ctx: Context | None = None
    try:
        client = web_client(bot_token, base_url=api_url, session=session)
        auth = await auth_test(client)
        if not auth["ok"]:
            raise SlackUnavailable("auth.test", auth["error"], unreachable=bool(auth.get("unreachable")))
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
            _auth_at=clock(),
            clock=clock,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(outbox.people.list_groups(), timeout=5.0)
        runtime.watch_store()
        if scheduler:
            runtime.scheduler = PitstopScheduler(ctx, slack_check=runtime.slack_check)
            await runtime.scheduler.start()
        return runtime
    except BaseException:
        if ctx is not None:
            with contextlib.suppress(Exception):
                await close_context(ctx)
        await session.close()
        raise


Health = Callable[[], Awaitable[dict[str, Any]]]


def _bare_health(health: Health) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``GET /healthz``: ``ok`` (200) or ``unavailable`` (503), as ``health()["ok"]`` says; nothing else."""

    async def healthz(request: web.Request) -> web.Response:
        try:
            ok = bool((await health()).get("ok"))
        except Exception:
            log.exception("health check failed")
            ok = False
        return web.Response(status=200 if ok else 503, text="ok" if ok else "unavailable")

    return healthz


def http_app(surface: SlackSurface | None, health: Health) -> web.Application:
    """The public listener: ``POST /slack/events`` through Bolt (none when ``surface`` is None) and
    the bare ``GET /healthz``."""

    async def events(request: web.Request) -> web.Response:
        assert surface is not None
        with surface.acks.acking():  # work after an ack waits for these (bot.slack.app.AckGate)
            bolt_req = await to_bolt_request(request)
            bolt_resp = await surface.app.async_dispatch(bolt_req)
            return await to_aiohttp_response(bolt_resp)

    app = web.Application()
    if surface is not None:
        app.router.add_post(EVENTS_PATH, events)
    app.router.add_get(HEALTH_PATH, _bare_health(health))
    return app


def admin_app(health: Health, metrics: Callable[[], Awaitable[bytes]]) -> web.Application:
    """The admin listener: the bare ``GET /healthz``, ``GET /healthz/details`` (``health()``'s JSON;
    ``ok`` decides 200 or 503) and ``GET /metrics`` (503 while Redis does not answer)."""

    async def details(request: web.Request) -> web.Response:
        state = await health()
        return web.json_response(state, status=200 if state.get("ok") else 503)

    async def prometheus(request: web.Request) -> web.Response:
        try:
            page = await metrics()
        except StateUnavailable as exc:
            return web.Response(status=503, text=f"# state store unavailable: {exc.detail}\n")
        return web.Response(body=page, headers={"Content-Type": METRICS_CONTENT_TYPE})

    app = web.Application()
    app.router.add_get(HEALTH_PATH, _bare_health(health))
    app.router.add_get(DETAILS_PATH, details)
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


async def start_http(
    app: web.Application, *, host: str, port: int, flags: str = "--host/--port"
) -> HttpServer:
    """Listen on ``host:port`` (0 → a free port); close the server before the runtime.  Raises
    :class:`UsageError` if ``host:port`` cannot be bound, naming it and the options ``flags``."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise UsageError(listen_failed(host, port, exc, flags)) from exc
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
        raise SlackUnavailable(
            "apps.connections.open", error_text(exc), unreachable=not isinstance(exc, SlackApiError)
        ) from None
    await handler.connect_async()  # type: ignore[no-untyped-call]
    return handler


async def serve(
    config: Config,
    *,
    bot_token: str,
    api_url: str | None,
    signing_secret: str | None = None,
    app_token: str | None = None,
    host: str = PUBLIC_HOST,
    port: int = PUBLIC_PORT,
    admin_host: str | None = ADMIN_HOST,
    admin_port: int = ADMIN_PORT,
) -> None:
    """Serve Slack until cancelled (SIGINT/SIGTERM): over Socket Mode with ``app_token``, else over
    HTTP on ``host:port`` (``POST /slack/events``, checked with ``signing_secret``, and a bare ``GET
    /healthz``).  The admin listener (:func:`admin_app`) on ``admin_host:admin_port`` (none when
    ``admin_host`` is None); one that cannot be bound is logged and Slack is served without it.
    Port 0: a free one.

    :raises ConfigError: if a job's alerts would reach no channel (:meth:`Config.unalerted`).
    :raises SlackUnavailable: if a token is refused.
    :raises UsageError: if ``host:port`` cannot be bound (HTTP mode).
    """
    if unalerted := config.unalerted():  # alerts to nobody, with everything green: refused at start
        raise ConfigError([alerts_nowhere(unalerted)], config.source)
    runtime = await open_runtime(config, bot_token=bot_token, api_url=api_url, signing_secret=signing_secret)
    servers: list[HttpServer] = []
    try:
        public: HttpServer | None = None
        if not app_token:  # first: a port taken fails before anything listens
            public = await start_http(http_app(runtime.surface, runtime.health), host=host, port=port)
            servers.append(public)
        admin: HttpServer | None = None
        if admin_host is not None:
            app = admin_app(runtime.health, runtime.metrics)
            try:
                admin = await start_http(
                    app, host=admin_host, port=admin_port, flags="--admin-host/--admin-port"
                )
                servers.append(admin)
            except UsageError as exc:
                log.error(admin_listen_failed(exc.message))
        admin_url = admin.url if admin is not None else None
        if app_token:
            runtime.socket = await connect_socket(runtime.surface, app_token=app_token)
            print(serve_socket_connected(admin_url), file=sys.stderr, flush=True)
        elif public is not None:
            print(serve_listening(public.url, admin_url), file=sys.stderr, flush=True)
        await asyncio.Event().wait()
    finally:
        for server in reversed(servers):
            await server.close()
        await runtime.close()
