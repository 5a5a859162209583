"""Remote execution: argv quoting through ssh and exec wrappers, typed errors, host keys, the pool."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import pytest

from pipeline.config import Config, JobConfig
from pipeline.errors import (
    HostKeyRejected,
    HostUnreachable,
    RemoteCommandError,
    RemoteTimeout,
    UnknownHost,
)
from pipeline.host.quoting import command_line, job_argv
from pipeline.host.remote import RemoteResult, SSHPool
from tests.fixtures.ssh import BIN, HostUnderTest, InProcessHost

ECHO_ARGV = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]
NASTY = [
    "two words",
    "it's",
    '"double"',
    "$HOME",
    "${PATH}",
    "$(echo no)",
    "`echo no`",
    "a;b",
    "x & y",
    "p | q",
    "new\nline",
    "tab\there",
    "*",
    "~",
    "",
    "back\\slash",
    "-n",
    "ünïcödé",
]


def _config(host: HostUnderTest, **jobs: JobConfig) -> Config:
    return Config(hosts={"local": host.host_config()}, jobs=dict(jobs))


def _job(prefix: list[str]) -> JobConfig:
    return JobConfig(host="local", exec=prefix, workdir="/tmp", launch=["true"], log="/tmp/x.log", match="x")


@pytest.fixture
async def pool(any_ssh_host: HostUnderTest) -> AsyncIterator[SSHPool]:
    """A pool on the host under test with jobs behind each wrapper."""
    config = _config(
        any_ssh_host,
        plain=_job([]),
        pct=_job([str(BIN / "pct"), "exec", "200", "--"]),
        docker=_job([str(BIN / "docker"), "exec", "-i", "trainer"]),
        dockernoi=_job([str(BIN / "docker"), "exec", "trainer"]),
    )
    p = SSHPool(config)
    try:
        yield p
    finally:
        await p.close()


def test_command_line_round_trips_through_a_posix_shell() -> None:
    """shlex.join output, parsed again by bash, gives back exactly the argv."""
    import subprocess

    line = command_line([*ECHO_ARGV, *NASTY])
    out = subprocess.run(["/bin/bash", "-c", line], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == NASTY


def test_command_line_rejects_what_no_program_can_receive() -> None:
    """An empty argv or a NUL byte is refused before anything is sent."""
    with pytest.raises(ValueError):
        command_line([])
    with pytest.raises(ValueError):
        command_line(["echo", "a\0b"])
    assert job_argv(["pct", "exec", "1", "--"], ["ls"]) == ["pct", "exec", "1", "--", "ls"]


@pytest.mark.parametrize("job", ["plain", "pct", "docker"])
async def test_argv_arrives_exactly_through_ssh_and_wrappers(pool: SSHPool, job: str) -> None:
    """Spaces, quotes, $, ;, &, newlines reach the program unchanged, with or without a wrapper."""
    result = await pool.run_job(job, [*ECHO_ARGV, *NASTY], timeout=20)
    assert result.exit_status == 0, result.stderr
    assert json.loads(result.stdout) == NASTY


async def test_nonzero_exit_is_returned_with_output(pool: SSHPool) -> None:
    """A non-zero exit is a result (not an exception) with stdout, stderr and duration."""
    result = await pool.run("local", ["bash", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert isinstance(result, RemoteResult)
    assert (result.exit_status, result.exit_signal, result.ok) == (3, None, False)
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert result.duration > 0
    with pytest.raises(AttributeError):
        result.exit_status = 0  # type: ignore[misc]


async def test_control_shell_killed_by_a_signal_is_reported_as_such(pool: SSHPool) -> None:
    """A shell killed by SIGKILL comes back as exit_signal SIGKILL, never as empty success."""
    result = await pool.run("local", ["bash", "-c", "echo before; kill -KILL $$; echo after"], timeout=10)
    assert result.exit_signal == "SIGKILL"
    assert result.exit_status is None and not result.ok
    assert result.stdout == "before\n"


@pytest.mark.parametrize("job", ["plain", "pct", "docker"])
async def test_stdin_reaches_the_program(pool: SSHPool, job: str) -> None:
    """Text given as stdin arrives intact behind every wrapper that forwards stdin."""
    text = "line one\n$HOME 'quoted'\n" * 100
    result = await pool.run_job(job, ["cat"], timeout=10, stdin=text)
    assert result.stdout == text


async def test_docker_without_i_does_not_forward_stdin(pool: SSHPool) -> None:
    """Like the real docker exec, the stand-in gives the command no stdin without -i."""
    result = await pool.run_job("dockernoi", ["cat"], timeout=10, stdin="lost\n")
    assert result.ok and result.stdout == ""


async def test_timeout_keeps_partial_output(pool: SSHPool) -> None:
    """A command outliving its timeout raises RemoteTimeout with what it printed so far."""
    # connected first, so the timeout is the command's alone: with the SSH handshake inside a 1 s
    # timeout, a loaded machine once timed out before bash had printed anything
    assert (await pool.run("local", ["true"], timeout=30)).ok
    started = time.monotonic()
    with pytest.raises(RemoteTimeout) as info:
        await pool.run("local", ["bash", "-c", "echo partial; exec sleep 60"], timeout=3)
    assert time.monotonic() - started < 30
    assert info.value.stdout == "partial\n"
    assert "did not finish within 3 s" in info.value.message
    ok = await pool.run("local", ["true"], timeout=10)  # the pooled connection still works
    assert ok.ok


async def test_pct_stand_in_waits_for_every_holder_of_its_output(pool: SSHPool) -> None:
    """Like lxc-attach, the pct stand-in does not return while a background child holds stdout."""
    with pytest.raises(RemoteTimeout) as info:
        await pool.run_job("pct", ["bash", "-c", "sleep 3 & echo started"], timeout=1)
    assert "started" in info.value.stdout
    plain = await pool.run_job("plain", ["bash", "-c", "sleep 3 >/dev/null 2>&1 & echo started"], timeout=5)
    assert plain.stdout == "started\n"


async def test_unknown_host_is_a_named_error(pool: SSHPool) -> None:
    """A host name that is not configured is refused with the known names."""
    with pytest.raises(UnknownHost) as info:
        await pool.run("gpu9", ["true"], timeout=5)
    assert "local" in info.value.message


async def test_closed_port_is_unreachable_quickly(tmp_path: Path, ssh_server: InProcessHost) -> None:
    """Nothing listening: HostUnreachable naming the host, well within connect_timeout."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = Config(hosts={"dead": ssh_server.host_config(port=port, connect_timeout=3)})
    pool = SSHPool(config)
    try:
        started = time.monotonic()
        with pytest.raises(HostUnreachable) as info:
            await pool.run("dead", ["true"], timeout=5)
        assert time.monotonic() - started < 3
        assert info.value.host == "dead" and "host dead unreachable" in info.value.message
        with pytest.raises(HostUnreachable):
            await pool.check("dead")
    finally:
        await pool.close()


async def test_silent_host_times_out_within_connect_timeout(ssh_server: InProcessHost) -> None:
    """A TCP peer that never speaks SSH: HostUnreachable after connect_timeout, not a hang."""
    writers: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = SSHPool(Config(hosts={"mute": ssh_server.host_config(port=port, connect_timeout=1)}))
    try:
        started = time.monotonic()
        with pytest.raises(HostUnreachable) as info:
            await pool.run("mute", ["true"], timeout=5)
        elapsed = time.monotonic() - started
        assert 0.9 <= elapsed < 3.5
        assert "within 1 s" in info.value.message
    finally:
        await pool.close()
        for w in writers:
            w.close()
        server.close()
        await server.wait_closed()


async def test_changed_host_key_is_refused_with_its_fingerprint(
    any_ssh_host: HostUnderTest, tmp_path: Path
) -> None:
    """A known_hosts entry with another key: HostKeyRejected naming the host and the real fingerprint."""
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()
    port = any_ssh_host.host_config().port
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"[127.0.0.1]:{port} {other[0]} {other[1]}\n")
    pool = SSHPool(Config(hosts={"gpu1": any_ssh_host.host_config(known_hosts=wrong)}))
    try:
        with pytest.raises(HostKeyRejected) as info:
            await pool.run("gpu1", ["true"], timeout=5)
        assert info.value.host == "gpu1"
        assert info.value.fingerprint.startswith("SHA256:")
        assert info.value.fingerprint in info.value.message and "gpu1" in info.value.message
        assert str(wrong) in info.value.message
    finally:
        await pool.close()


async def test_unknown_host_key_and_missing_known_hosts_are_refused(
    ssh_server: InProcessHost, tmp_path: Path
) -> None:
    """An empty or missing known_hosts trusts nothing: the connection is refused, never accepted blindly."""
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    missing = tmp_path / "nope" / "known_hosts"
    for path in (empty, missing):
        pool = SSHPool(Config(hosts={"gpu1": ssh_server.host_config(known_hosts=path)}))
        try:
            with pytest.raises(HostKeyRejected) as info:
                await pool.run("gpu1", ["true"], timeout=5)
            assert info.value.fingerprint.startswith("SHA256:")
        finally:
            await pool.close()


async def test_pool_reuses_one_connection_and_reconnects_after_a_drop(ssh_server: InProcessHost) -> None:
    """Commands share one connection; when the host drops it, the next command reconnects."""
    pool = SSHPool(Config(hosts={"local": ssh_server.host_config()}))
    try:
        results = await asyncio.gather(*(pool.run("local", ["echo", str(i)], timeout=10) for i in range(12)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(12)]
        assert len(ssh_server.host._conns) == 1
        first = pool._conns["local"]
        for conn in list(ssh_server.host._conns):
            conn.close()
        await asyncio.wait_for(first.wait_closed(), 5)
        again = await pool.run("local", ["echo", "back"], timeout=10)
        assert again.stdout == "back\n"
        assert pool._conns["local"] is not first
    finally:
        await pool.close()


async def test_lost_connection_mid_command_is_a_named_error(ssh_server: InProcessHost) -> None:
    """The host dropping the connection while a command runs raises RemoteCommandError, not empty output."""
    pool = SSHPool(Config(hosts={"local": ssh_server.host_config()}))
    try:
        await pool.run("local", ["true"], timeout=5)
        task = asyncio.ensure_future(
            pool.run("local", ["bash", "-c", "echo begun; exec sleep 20"], timeout=20)
        )
        await asyncio.sleep(0.3)
        for conn in list(ssh_server.host._conns):
            conn.close()
        with pytest.raises(RemoteCommandError) as info:
            await asyncio.wait_for(task, 10)
        assert "connection lost" in info.value.message or "without an exit status" in info.value.message
    finally:
        await pool.close()


async def test_check_opens_a_fresh_connection(ssh_server: InProcessHost) -> None:
    """check() never reuses the pooled connection (so it can confirm a host is really down)."""
    pool = SSHPool(Config(hosts={"local": ssh_server.host_config()}))
    try:
        await pool.run("local", ["true"], timeout=5)
        pooled = pool._conns["local"]
        before = ssh_server.host.accepted
        await pool.check("local")
        assert ssh_server.host.accepted == before + 1
        assert pool._conns["local"] is pooled and not pooled.is_closed()
    finally:
        await pool.close()


async def test_jump_host_tunnels_through_the_bastion(any_ssh_host: HostUnderTest) -> None:
    """A host with jump = "bastion" is reached through the bastion's connection."""
    config = Config(
        hosts={
            "bastion": any_ssh_host.host_config(),
            "inner": any_ssh_host.host_config(jump="bastion"),
        }
    )
    pool = SSHPool(config)
    try:
        result = await pool.run("inner", [*ECHO_ARGV, "via bastion"], timeout=15)
        assert json.loads(result.stdout) == ["via bastion"]
        assert set(pool._conns) == {"bastion", "inner"}
        await pool.check("inner")
    finally:
        await pool.close()
