"""An SSH host inside this process: asyncssh's server on 127.0.0.1, running each command in a
real ``/bin/bash -c`` — for tests and ``pitstop demo``, reached through the same
:class:`~pipeline.host.remote.SSHPool` code path as a GPU host.

It behaves like OpenSSH's ``sshd`` where Pitstop depends on it:

- host keys are real (fresh ed25519 keys under ``state_dir``) and pinned in a
  ``known_hosts`` file written in OpenSSH's ``[127.0.0.1]:PORT ssh-ed25519 AAAA…`` form;
  only the generated client key is accepted;
- the command line is parsed by ``bash -c`` (as sshd hands it to the user's shell), in a new
  session (sshd calls ``setsid`` for every session), in the user's home directory;
- the channel closes only once the command has exited **and** every holder of its stdout and
  stderr has closed them (so ``cmd &`` that keeps the output open hangs the channel, exactly as
  with OpenSSH); the exit status, or the signal that killed the shell, is sent back.

Unlike sshd it tidies up after itself: when a client closes a channel early (a timeout), the
command's process group is sent SIGKILL, and :meth:`LocalSSHHost.close` does the same for
every command still running.  Processes that left the command's session (``setsid``, as
Pitstop's launcher does) are never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from pipeline.config import HostConfig

_CHUNK = 65536


@dataclass
class LocalSSHHost:
    """A running in-process SSH host.

    :ivar address: always ``127.0.0.1``.
    :ivar port: the TCP port it listens on (chosen by the kernel).
    :ivar user: the user name it accepts (commands run as the current user).
    :ivar known_hosts: the file pinning its host key.
    :ivar client_key: the private key it accepts (OpenSSH format, mode 0600).
    :ivar host_key: its private host key file.
    :ivar env: the environment every command starts with.
    :ivar accepted: how many SSH connections it has accepted so far.
    :ivar commands: how many commands it has been asked to run so far (one per helper call).
    """

    address: str
    port: int
    user: str
    known_hosts: Path
    client_key: Path
    host_key: Path
    env: dict[str, str]
    accepted: int = 0
    commands: int = 0
    _acceptor: Any = field(repr=False, default=None)
    _conns: set[Any] = field(repr=False, default_factory=set)
    _children: set[asyncio.subprocess.Process] = field(repr=False, default_factory=set)
    _tasks: set[asyncio.Task[Any]] = field(repr=False, default_factory=set)
    _closed: bool = field(repr=False, default=False)

    def host_config(self, **overrides: Any) -> HostConfig:
        """A :class:`~pipeline.config.HostConfig` that reaches this host.

        :param overrides: other HostConfig fields (``connect_timeout``, ``jump``…).
        """
        fields: dict[str, Any] = {
            "address": self.address,
            "port": self.port,
            "user": self.user,
            "known_hosts": self.known_hosts,
            "client_keys": [self.client_key],
            **overrides,
        }
        return HostConfig(**fields)

    async def close(self) -> None:
        """Stop listening, close every connection, SIGKILL commands still running; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
        for child in list(self._children):
            _kill_group(child)
        for conn in list(self._conns):
            conn.close()
        for conn in list(self._conns):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), 5)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- serving ---------------------------------------------------------------------------

    async def _serve(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._run_command(process)
        finally:
            self._tasks.discard(task)

    async def _run_command(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        command = process.command or ""
        self.commands += 1
        try:
            child = await asyncio.create_subprocess_exec(
                "/bin/bash",
                "-c",
                command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.env,
                cwd=self.env.get("HOME", "/"),
                start_new_session=True,
            )
        except OSError as exc:
            process.stderr.write(f"cannot start /bin/bash: {exc}\n".encode())
            process.exit(127)
            return
        self._children.add(child)
        assert child.stdin is not None and child.stdout is not None and child.stderr is not None
        feed = asyncio.ensure_future(_feed(process.stdin, child.stdin))
        outputs = asyncio.gather(
            _pump(child.stdout, process.stdout),
            _pump(child.stderr, process.stderr),
            child.wait(),
        )
        closed = asyncio.ensure_future(process.wait_closed())
        both: list[asyncio.Future[Any]] = [outputs, closed]
        try:
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
            if not outputs.done():  # the client went away first (timeout, lost connection)
                _kill_group(child)
                outputs.cancel()
                with contextlib.suppress(BaseException):
                    await outputs
                await child.wait()
                return
            code = child.returncode
            assert code is not None
            if code < 0:
                process.exit_with_signal(signal.Signals(-code).name.removeprefix("SIG"))
            else:
                process.exit(code)
        finally:
            feed.cancel()
            with contextlib.suppress(BaseException):
                await feed
            if child.returncode is None:
                _kill_group(child)
                await child.wait()
            transport = getattr(child, "_transport", None)
            if transport is not None:
                transport.close()  # pipes still held by an escaped process
            self._children.discard(child)
            if not closed.done():
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(closed, 5)
            closed.cancel()
            with contextlib.suppress(BaseException):
                await closed


async def _feed(source: asyncssh.SSHReader[bytes], sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()
    except (OSError, asyncssh.Error):
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.close()


async def _pump(source: asyncio.StreamReader, sink: asyncssh.SSHWriter[bytes]) -> None:
    while data := await source.read(_CHUNK):
        with contextlib.suppress(OSError, asyncssh.Error):
            sink.write(data)
            await sink.drain()


def _kill_group(child: asyncio.subprocess.Process) -> None:
    if child.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)


class _Server(asyncssh.SSHServer):
    def __init__(self, host: LocalSSHHost) -> None:
        self._host = host
        self._conn: Any = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._host._conns.add(conn)
        self._host.accepted += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._host._conns.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> bool:
        return True  # act as a bastion: forward TCP connections (jump hosts)


async def start_local_ssh_host(
    state_dir: Path,
    *,
    user: str | None = None,
    path_prepend: Sequence[str | Path] = (),
    env: dict[str, str] | None = None,
) -> LocalSSHHost:
    """Start an SSH host on ``127.0.0.1`` (a free port) running commands as the current user.

    Fresh host and client keys (ed25519) and the pinned ``known_hosts`` are written under
    ``state_dir``.  Close it with :meth:`LocalSSHHost.close`.

    :param state_dir: directory for the keys and ``known_hosts`` (created if missing).
    :param user: the user name clients log in as (default: the current user).
    :param path_prepend: directories put in front of ``PATH`` for every command (shims).
    :param env: extra environment variables for every command.
    :returns: the running host.
    """
    await asyncio.to_thread(state_dir.mkdir, parents=True, exist_ok=True)
    user = user or getpass.getuser()
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519", comment="pitstop-test-client")
    host_key_path = state_dir / "ssh_host_ed25519_key"
    client_key_path = state_dir / "id_ed25519"
    authorized = state_dir / "authorized_keys"
    host_key.write_private_key(str(host_key_path))
    client_key.write_private_key(str(client_key_path))
    client_key.write_public_key(str(client_key_path) + ".pub")
    os.chmod(host_key_path, 0o600)
    os.chmod(client_key_path, 0o600)
    client_key.write_public_key(str(authorized))

    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_")) and k != "PWD"}
    base_env["USER"] = base_env["LOGNAME"] = user
    base_env.setdefault("HOME", str(Path.home()))
    prefix = [str(p) for p in path_prepend]
    base_env["PATH"] = os.pathsep.join([*prefix, base_env.get("PATH", "/usr/bin:/bin")])
    base_env.update(env or {})

    host = LocalSSHHost(
        address="127.0.0.1",
        port=0,
        user=user,
        known_hosts=state_dir / "known_hosts",
        client_key=client_key_path,
        host_key=host_key_path,
        env=base_env,
    )
    acceptor = await asyncssh.listen(
        "127.0.0.1",
        0,
        server_host_keys=[host_key],
        authorized_client_keys=str(authorized),
        server_factory=lambda: _Server(host),
        process_factory=host._serve,
        encoding=None,
        allow_scp=False,
        sftp_factory=True,
    )
    host._acceptor = acceptor
    host.port = acceptor.get_port()
    public = host_key.export_public_key("openssh").decode().split()
    host.known_hosts.write_text(f"[127.0.0.1]:{host.port} {public[0]} {public[1]}\n")
    return host
