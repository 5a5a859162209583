"""First contact with a host: `pitstop trust-host` shows and pins its key, an unknown key is told
apart from a changed one, and check-config names a missing client key (real OpenSSH sshd on
loopback and the in-process asyncssh host, the real CLI)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest

from pipeline.config import HostConfig, load_config
from pipeline.errors import ExitCode, HostKeyRejected
from pipeline.host.remote import SSHPool
from tests.fixtures.ssh import HostUnderTest, InProcessHost

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Done:
    """A finished CLI run."""

    code: int
    out: str
    err: str


async def pitstop(*args: str, stdin: str = "") -> Done:
    """Run ``python -m bot.cli ARGS`` (beside the event loop that serves the in-process host)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot.cli",
        *args,
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
    assert proc.returncode is not None
    return Done(proc.returncode, out.decode(), err.decode())


def write_config(path: Path, hc: HostConfig) -> Path:
    """A config file with ``hc`` as host ``local`` (TOML strings written as JSON ones)."""
    lines = ["[hosts.local]", f"address = {json.dumps(hc.address)}", f"port = {hc.port}"]
    lines += [f"user = {json.dumps(hc.user)}"] if hc.user else []
    lines += [f"known_hosts = {json.dumps(str(hc.known_hosts))}"]
    lines += [f"client_keys = {json.dumps([str(k) for k in hc.client_keys])}", ""]
    path.write_text("\n".join(lines))
    return path


def fingerprint_of(hc: HostConfig) -> str:
    """The SHA256 fingerprint of the key the fixture pinned for the host."""
    assert hc.known_hosts is not None
    words = hc.known_hosts.read_text().split()
    return asyncssh.import_public_key(f"{words[1]} {words[2]}").get_fingerprint("sha256")


async def connects(config_path: Path) -> bool:
    """True if a command runs on host ``local`` of the config (a real connection)."""
    pool = SSHPool(load_config(config_path))
    try:
        return (await pool.run("local", ["true"], timeout=20)).ok
    finally:
        await pool.close()


async def test_trust_host_yes_on_an_empty_known_hosts_then_connections_succeed(
    any_ssh_host: HostUnderTest, tmp_path: Path
) -> None:
    """`trust-host local --yes` on an empty known_hosts shows the key as ssh does, pins it in one
    line, and a connection then succeeds; a second run finds it already trusted."""
    real = any_ssh_host.host_config()
    known = tmp_path / "empty_known_hosts"
    known.write_text("")
    path = write_config(tmp_path / "pitstop.toml", real.model_copy(update={"known_hosts": known}))
    with pytest.raises(HostKeyRejected):
        await connects(path)
    done = await pitstop("trust-host", "local", "--yes", "--config", str(path))
    assert done.code == 0, done.err
    fp = fingerprint_of(real)
    where = f"[{real.address}]:{real.port}"
    assert done.out.splitlines() == [
        f"The authenticity of host 'local' ({where}) can't be established.",
        f"ED25519 key fingerprint is {fp}.",
        f"Added host local's key to {known}: Pitstop now connects to it.",
    ]
    assert known.read_text().count("\n") == 1 and known.read_text().startswith(f"{where} ssh-ed25519 ")
    assert await connects(path)
    again = await pitstop("trust-host", "local", "--yes", "--config", str(path))
    assert (again.code, again.out.strip()) == (
        0,
        f"host local's key {fp} is already trusted in {known} - nothing to do",
    )
    assert known.read_text().count("\n") == 1


async def test_trust_host_asks_and_pins_only_on_yes_or_the_fingerprint(
    ssh_server: InProcessHost, tmp_path: Path
) -> None:
    """Without --yes it asks: `no` (or end of input) changes nothing (exit 5); another word asks
    again; the fingerprint typed back pins the key, into a known_hosts it creates (private)."""
    real = ssh_server.host_config()
    known = tmp_path / "new" / "known_hosts"
    path = write_config(tmp_path / "pitstop.toml", real.model_copy(update={"known_hosts": known}))
    question = f"Trust it and add it to {known} (yes/no/[fingerprint])? "
    for answer in ("no\n", ""):
        done = await pitstop("trust-host", "LOCAL", "--config", str(path), stdin=answer)
        assert done.code == ExitCode.CANCELLED and question in done.out, done
        assert done.out.rstrip().endswith("not trusted - nothing was changed")
        assert not known.exists()
    fp = fingerprint_of(real)
    done = await pitstop("trust-host", "local", "--config", str(path), stdin=f"sure\n{fp}\n")
    assert done.code == 0, done.err
    assert "Please type 'yes', 'no' or the fingerprint: " in done.out
    assert (known.stat().st_mode & 0o777, known.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    assert await connects(path)


async def test_an_unknown_key_says_so_and_shows_the_fix(any_ssh_host: HostUnderTest, tmp_path: Path) -> None:
    """An empty or missing known_hosts, or one pinning only other hosts: the key is named unknown,
    with `pitstop trust-host NAME` as the fix, never as a key that changed."""
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()
    empty, elsewhere = tmp_path / "empty", tmp_path / "elsewhere"
    empty.write_text("")
    elsewhere.write_text(f"[10.9.9.9]:2222 {other[0]} {other[1]}\n")
    for known in (empty, elsewhere, tmp_path / "nope" / "known_hosts"):
        pool = SSHPool(
            load_config(write_config(tmp_path / "p.toml", any_ssh_host.host_config(known_hosts=known)))
        )
        try:
            with pytest.raises(HostKeyRejected) as info:
                await pool.run("local", ["true"], timeout=20)
        finally:
            await pool.close()
        fp = fingerprint_of(any_ssh_host.host_config())
        assert info.value.unknown and info.value.fingerprint == fp
        assert info.value.message.startswith(f"host local's key {fp} is unknown: {known}")
        assert "check the fingerprint and trust it with `pitstop trust-host local`" in info.value.message
        assert "does not match" not in info.value.message


async def test_a_changed_key_keeps_its_warning_and_is_never_pinned_over(
    any_ssh_host: HostUnderTest, tmp_path: Path
) -> None:
    """known_hosts pinning another key for the host: the connection gives today's changed-key
    warning, and trust-host refuses with the same warning (exit 1), the file untouched."""
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()
    real = any_ssh_host.host_config()
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"[{real.address}]:{real.port} {other[0]} {other[1]}\n")
    before = wrong.read_text()
    path = write_config(tmp_path / "pitstop.toml", real.model_copy(update={"known_hosts": wrong}))
    fp = fingerprint_of(real)
    warning = (
        f"host local presented key {fp}, which does not match {wrong} - refusing to connect; "
        "if the host was rebuilt, verify the key and update known_hosts"
    )
    with pytest.raises(HostKeyRejected) as info:
        await connects(path)
    assert not info.value.unknown and info.value.message == warning
    done = await pitstop("trust-host", "local", "--yes", "--config", str(path))
    assert (done.code, done.err.strip()) == (ExitCode.FAILED, warning)
    assert wrong.read_text() == before


async def test_check_config_names_a_missing_client_key(sshd_host: HostUnderTest, tmp_path: Path) -> None:
    """check-config refuses a client_keys file that does not exist (exit 2), naming its key and path;
    with the real key it passes."""
    real = sshd_host.host_config()
    missing = tmp_path / "no_such_key"
    bad = write_config(tmp_path / "bad.toml", real.model_copy(update={"client_keys": [missing]}))
    done = await pitstop("check-config", str(bad))
    assert done.code == ExitCode.USAGE
    assert done.err.strip() == (
        f"{bad}: invalid configuration\n"
        f"hosts.local.client_keys.0: {missing}: no such file - give a private key this user can read"
    )
    good = await pitstop("check-config", str(write_config(tmp_path / "good.toml", real)))
    assert good.code == 0, good.err
    assert os.path.exists(real.client_keys[0])
