"""Remote execution over SSH: one pooled asyncssh connection per host, commands as argv.

:meth:`SSHPool.run` returns a :class:`RemoteResult` (a non-zero exit or a signal is returned)
and raises :class:`~pipeline.errors.HostUnreachable` (refused, DNS, no answer within
``connect_timeout``; :class:`~pipeline.errors.HostAuthRejected`: login refused),
:class:`~pipeline.errors.HostKeyRejected` (the key is not the one pinned in ``known_hosts``:
``unknown`` when no key is pinned for the host),
:class:`~pipeline.errors.RemoteTimeout` (partial output kept) or
:class:`~pipeline.errors.RemoteCommandError` (connection lost, or no exit status).

Host keys are always verified (``known_hosts`` from the host's config, else
``~/.ssh/known_hosts``; a missing file trusts nothing); ``~/.ssh/config`` is not read.  A host
with ``jump = "bastion"`` is reached through the bastion's pooled connection.  An argv is quoted
once for the remote login shell (:mod:`pipeline.host.quoting`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import asyncssh

from pipeline import errors
from pipeline.config import Config, HostConfig
from pipeline.errors import (
    CommandOutput,
    HostAuthRejected,
    HostKeyRejected,
    HostUnreachable,
    RemoteCommandError,
    RemoteTimeout,
    UnknownHost,
)
from pipeline.host.quoting import command_line, job_argv

log = logging.getLogger(__name__)

KEEPALIVE_INTERVAL = 15.0  #: seconds between SSH keepalive requests
KEEPALIVE_COUNT_MAX = 3  #: unanswered keepalives before the connection counts as dropped
MAX_CHANNELS = 8  #: concurrent commands per host connection
CLOSE_WAIT = 1.0  #: seconds to wait for the host to confirm a channel closed


@dataclass(frozen=True)
class RemoteResult:
    """A finished remote command (the analogue of asyncssh's ``SSHCompletedProcess``)."""

    host: str  #: the configured host name
    argv: tuple[str, ...]  #: the argv that ran on the host (with any ``exec`` prefix)
    exit_status: int | None  #: None if a signal ended the command
    exit_signal: str | None  #: the signal's name (``"SIGKILL"``) if one ended the command
    stdout: str  #: UTF-8, undecodable bytes replaced
    stderr: str
    duration: float  #: seconds from sending the command to its end

    @property
    def ok(self) -> bool:
        """True if the command exited with status 0."""
        return self.exit_status == 0

    def error(self, argv: Sequence[str], message: str) -> RemoteCommandError:
        """A :class:`RemoteCommandError` saying ``message`` that keeps this result's exit status,
        signal and output; ``argv``: the command as the error names it."""
        out = {key: getattr(self, key) for key in CommandOutput.__annotations__}
        return RemoteCommandError(self.host, argv, message, **out)


class RemoteHosts(Protocol):
    """What Pitstop needs from its connections to the hosts: :class:`SSHPool` in production,
    a stand-in in tests that never reach a host; every method raises the errors
    :class:`SSHPool`'s does."""

    async def run(
        self,
        host: str,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: str | None = None,
        display: Sequence[str] | None = None,
    ) -> RemoteResult:
        """Run ``argv`` on ``host`` (``timeout`` in seconds); a non-zero exit is returned, not raised."""

    async def run_job(
        self,
        job: str,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: str | None = None,
        display: Sequence[str] | None = None,
    ) -> RemoteResult:
        """Run ``argv`` on the job's side: its host, behind its ``exec`` prefix."""

    async def check(self, host: str) -> None:
        """Return if ``host`` can be reached now (a fresh connection); raise if not."""

    async def close(self) -> None:
        """Close every connection; idempotent."""


class _Client(asyncssh.SSHClient):
    """Records the fingerprint and peer address of a host key that known_hosts does not trust."""

    def __init__(self, pool: SSHPool, host: str) -> None:
        self.pool = pool
        self.host = host
        self.conn: asyncssh.SSHClientConnection | None = None
        self.rejected_fingerprint: str | None = None
        self.rejected_addr = ""

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self.conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.pool._forget(self.host, self.conn)

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.rejected_fingerprint, self.rejected_addr = key.get_fingerprint("sha256"), addr
        return False


class SSHPool:
    """One reused SSH connection per configured host of ``config`` (implements :class:`RemoteHosts`)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._conns: dict[str, asyncssh.SSHClientConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._closed = False

    async def run(
        self,
        host: str,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: str | None = None,
        display: Sequence[str] | None = None,
    ) -> RemoteResult:
        """Run ``argv`` (exactly as the program must receive it) on ``host`` (a configured host
        name, case-insensitive) and collect its output.

        :param timeout: seconds the command may take (after the connection is opened, within the
            host's ``connect_timeout``).
        :param stdin: text sent to the command's stdin, then EOF (default: EOF at once).
        :param display: how errors name the command (default ``argv``; for long generated argv).
        :raises UnknownHost: if ``host`` is not configured; else as the module docstring says.
        """
        name = self._host_name(host)
        command = command_line(argv)
        args = tuple(argv if display is None else display)
        started = time.monotonic()
        async with self._slots.setdefault(name, asyncio.Semaphore(MAX_CHANNELS)):
            proc = await self._open_process(name, command)
            try:
                if stdin:
                    proc.stdin.write(stdin)
                proc.stdin.write_eof()
                done = await proc.wait(timeout=timeout)
            except asyncssh.TimeoutError as exc:
                with contextlib.suppress(Exception):
                    proc.send_signal("KILL")  # honoured by OpenSSH >= 7.9 and the test host
                raise RemoteTimeout(
                    name, args, timeout, stdout=_text(exc.stdout), stderr=_text(exc.stderr)
                ) from None
            except (asyncssh.Error, OSError) as exc:
                out, err = proc.collect_output()
                self._drop_if_closed(name)
                text = errors.connection_lost(name, args, _reason(exc))
                raise RemoteCommandError(name, args, text, stdout=_text(out), stderr=_text(err)) from None
            finally:
                proc.close()
                with contextlib.suppress(Exception):  # a host may keep a hung channel open: don't wait long
                    await asyncio.wait_for(proc.wait_closed(), CLOSE_WAIT)
        duration = time.monotonic() - started
        signal_name = "SIG" + done.exit_signal[0].removeprefix("SIG") if done.exit_signal else None
        status = done.exit_status if signal_name is None else None
        stdout, stderr = _text(done.stdout), _text(done.stderr)
        if status is None and signal_name is None:
            why = errors.channel_closed(name, args)
            if self._drop_if_closed(name):
                why = errors.connection_lost(name, args, "the connection closed")
            raise RemoteCommandError(name, args, why, stdout=stdout, stderr=stderr)
        log.debug("%s: %s -> %s in %.3f s", name, command[:200], status or signal_name, duration)
        return RemoteResult(name, tuple(argv), status, signal_name, stdout, stderr, duration)

    async def run_job(
        self,
        job: str,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: str | None = None,
        display: Sequence[str] | None = None,
    ) -> RemoteResult:
        """:meth:`run` on the job's side (``job``: a configured job name, case-insensitive): on its
        host, behind its ``exec`` prefix.  :raises KeyError: if ``job`` is not configured."""
        spec = self.config.job(job)
        shown = job_argv(spec.exec, display) if display is not None else None
        return await self.run(
            spec.host, job_argv(spec.exec, argv), timeout=timeout, stdin=stdin, display=shown
        )

    async def check(self, host: str) -> None:
        """Open and close a *fresh* connection (never the pooled one): is the host reachable now?
        Raises :class:`HostUnreachable` or :class:`HostKeyRejected` if not."""
        name = self._host_name(host)
        fresh = SSHPool(self.config)  # a pool of its own: new connections to the host and its bastions
        try:
            await fresh._connection(name)
        finally:
            await fresh.close()

    async def host_key(self, host: str) -> asyncssh.SSHKey:
        """The key ``host`` presents, trusting nothing of it (to show and pin it: ``trust-host``);
        its bastion, if any, is reached and verified as for :meth:`run`.

        :raises UnknownHost: if ``host`` is not configured.
        :raises HostUnreachable: if it gives no key within its ``connect_timeout``, or cannot be reached.
        :raises HostKeyRejected: if its bastion's key is not trusted.
        """
        name = self._host_name(host)
        hc = self.config.hosts[name]
        tunnel = await self._connection(hc.jump) if hc.jump else ()
        try:
            key = await asyncio.wait_for(
                asyncssh.get_server_host_key(hc.address, hc.port, tunnel=tunnel, config=None),
                hc.connect_timeout,
            )
        except TimeoutError:
            raise HostUnreachable(name, f"no SSH answer within {hc.connect_timeout:g} s") from None
        except (asyncssh.Error, OSError) as exc:
            raise HostUnreachable(name, _reason(exc)) from None
        if key is None:
            raise HostUnreachable(name, "it presented no host key")
        return key

    async def close(self) -> None:
        """Close every pooled connection (targets before their bastions); idempotent."""
        self._closed = True
        conns = list(self._conns.items())
        self._conns.clear()
        for jumped in (True, False):
            group = [c for n, c in conns if bool(self.config.hosts[n].jump) is jumped]
            for conn in group:
                conn.close()
            for conn in group:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.wait_closed(), 5)

    def _host_name(self, host: str) -> str:
        try:
            return self.config.host_name(host)
        except KeyError:
            raise UnknownHost(host, list(self.config.hosts)) from None

    def _forget(self, name: str, conn: asyncssh.SSHClientConnection) -> None:
        if self._conns.get(name) is conn:
            del self._conns[name]

    def _drop_if_closed(self, name: str) -> bool:
        conn = self._conns.get(name)
        if conn is not None and conn.is_closed():
            del self._conns[name]
            return True
        return conn is None

    async def _connection(
        self, name: str, seen: frozenset[str] = frozenset()
    ) -> asyncssh.SSHClientConnection:
        """The pooled connection to ``name`` (through its bastion's), opened (again) if needed.
        :raises HostUnreachable: if the pool is closed; else as :meth:`run`'s connection errors."""
        if self._closed:
            raise HostUnreachable(name, "the SSH pool is closed")
        async with self._locks.setdefault(name, asyncio.Lock()):
            conn = self._conns.get(name)
            if conn is not None and not conn.is_closed():
                return conn
            hc = self.config.hosts[name]
            if hc.jump in seen:
                raise HostUnreachable(name, f"jump host loop through {hc.jump}")
            tunnel = await self._connection(hc.jump, seen | {name}) if hc.jump else ()
            known_path = known_hosts_path(hc)
            found = await asyncio.to_thread(known_path.is_file)
            known = str(known_path) if found else asyncssh.import_known_hosts("")  # trusts nothing
            client = _Client(self, name)
            try:
                conn = await asyncio.wait_for(
                    asyncssh.connect(
                        hc.address,
                        client_factory=lambda: client,
                        port=hc.port,
                        known_hosts=known,
                        config=None,
                        connect_timeout=hc.connect_timeout,
                        keepalive_interval=KEEPALIVE_INTERVAL,
                        keepalive_count_max=KEEPALIVE_COUNT_MAX,
                        username=hc.user or (),  # (): asyncssh's default
                        client_keys=[str(k.expanduser()) for k in hc.client_keys] or (),
                        tunnel=tunnel,
                    ),
                    hc.connect_timeout + 2,
                )
            except asyncssh.HostKeyNotVerifiable:
                known_label = str(known_path) if found else f"{known_path} (file not found)"
                where = (known_path, hc.address, client.rejected_addr, hc.port)
                pinned = await asyncio.to_thread(pinned_keys, *where) if found else []
                fingerprint = client.rejected_fingerprint or "unknown"
                raise HostKeyRejected(name, fingerprint, known_label, unknown=not pinned) from None
            except asyncssh.PermissionDenied as exc:
                user = hc.user or "the local user"
                raise HostAuthRejected(name, user, exc.reason or "permission denied") from None
            except TimeoutError:
                raise HostUnreachable(name, f"no SSH answer within {hc.connect_timeout:g} s") from None
            except asyncssh.ChannelOpenError as exc:  # the bastion could not reach it
                raise HostUnreachable(name, f"via {hc.jump}: {exc.reason}") from None
            except (asyncssh.DisconnectError, OSError) as exc:
                raise HostUnreachable(name, _reason(exc)) from None
            except ValueError as exc:  # unreadable key or known_hosts file
                raise HostUnreachable(name, f"SSH configuration problem: {exc}") from None
            self._conns[name] = conn
            return conn

    async def _open_process(self, name: str, command: str) -> asyncssh.SSHClientProcess[str]:
        """A channel running ``command``; retried once on a fresh connection if the pooled one is stale."""
        for attempt in (1, 2):
            conn = await self._connection(name)
            try:
                return await conn.create_process(command, encoding="utf-8", errors="replace")
            except (asyncssh.ChannelOpenError, asyncssh.DisconnectError, OSError) as exc:
                self._forget(name, conn)
                conn.close()
                if attempt == 2:
                    raise HostUnreachable(name, _reason(exc)) from None
        raise AssertionError("unreachable")  # pragma: no cover


def known_hosts_path(hc: HostConfig) -> Path:
    """The ``known_hosts`` file a host's key is checked against: its own, else ``~/.ssh/known_hosts``."""
    return (hc.known_hosts or Path("~/.ssh/known_hosts")).expanduser()


def pinned_keys(known_hosts: Path, address: str, addr: str, port: int) -> list[asyncssh.SSHKey]:
    """The keys (and CA keys) ``known_hosts`` pins for a host at ``address`` (its configured name
    or IP; ``addr``: the IP it answered from, or "") and ``port``, as asyncssh matches them (an
    entry without a port counts for any); [] if none.

    :raises ValueError: if the file cannot be parsed (as asyncssh's connect raises it).
    """
    found = asyncssh.match_known_hosts(
        str(known_hosts), address, addr or address, port if port != 22 else None
    )
    return [*found[0], *found[1]]


def _text(data: Any) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else "" if data is None else str(data)


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    if reason:
        return str(reason)
    if isinstance(exc, OSError) and exc.strerror:
        if exc.filename:  # a local file (a client key), not the network
            return f"{exc.strerror}: {exc.filename} (check client_keys in the host's config)"
        return exc.strerror
    return str(exc) or type(exc).__name__
