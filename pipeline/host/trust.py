"""First contact with a host: its key shown and pinned in its ``known_hosts`` (``pitstop trust-host``),
and the files a host's SSH settings name checked before any connection (``check-config``).

The key is read as OpenSSH's ``ssh`` reads it on first contact (its type and SHA256 fingerprint)
and pinned as ``ssh`` pins it: one ``known_hosts`` line, ``ADDRESS`` (``[ADDRESS]:PORT`` off port
22), the key's algorithm and base64 blob.  A key that differs from a pinned one is never pinned
over it: that is the changed-key warning, as for a connection.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipeline.config import Config, HostConfig
from pipeline.errors import ConfigError, HostKeyRejected
from pipeline.host.remote import SSHPool, known_hosts_path, pinned_keys


@dataclass(frozen=True)
class HostKey:
    """The key a host presents and where it stands in the host's ``known_hosts``."""

    host: str  #: the configured host name
    where: str  #: how ``known_hosts`` names it: ``ADDRESS`` or ``[ADDRESS]:PORT``
    key_type: str  #: as ``ssh`` names it: ``ED25519``, ``ECDSA``, ``RSA``…
    fingerprint: str  #: ``SHA256:…``
    known_hosts: Path  #: the host's ``known_hosts`` file (it may not exist yet)
    entry: str  #: the ``known_hosts`` line that pins this key (no newline)
    #: ``unknown``: no key is pinned for the host; ``trusted``: this one is; ``changed``: another is
    state: Literal["unknown", "trusted", "changed"]


def known_hosts_name(hc: HostConfig) -> str:
    """How ``known_hosts`` names the host: ``ADDRESS`` on port 22, else ``[ADDRESS]:PORT``."""
    return hc.address if hc.port == 22 else f"[{hc.address}]:{hc.port}"


def _key_type(algorithm: str) -> str:
    """``ssh-ed25519`` → ``ED25519``, ``ecdsa-sha2-nistp256`` → ``ECDSA``, ``rsa-sha2-512`` → ``RSA``."""
    name = algorithm.removeprefix("ssh-").split("-")[0]
    return {"dss": "DSA"}.get(name, name).upper()


class HostKeys:
    """The SSH trust of ``config``'s hosts: the key a host presents, pinning it, the client keys."""

    def __init__(self, config: Config) -> None:
        self.config = config

    async def presented(self, host: str) -> HostKey:
        """The key ``host`` (a configured name, case-insensitive) presents now, and its state.

        :raises UnknownHost: if ``host`` is not configured.
        :raises HostUnreachable: if the host gives no key (as :meth:`SSHPool.host_key`).
        :raises ConfigError: if the ``known_hosts`` file cannot be parsed.
        """
        pool = SSHPool(self.config)
        try:
            key = await pool.host_key(host)
        finally:
            await pool.close()
        name = self.config.host_name(host)
        hc = self.config.hosts[name]
        path = known_hosts_path(hc)
        try:
            pinned = pinned_keys(path, hc.address, "", hc.port) if path.is_file() else []
        except ValueError as exc:  # not a known_hosts file
            raise ConfigError([f"hosts.{name}.known_hosts: {path}: {exc}"], self.config.source) from None
        blob = key.public_data
        state: Literal["unknown", "trusted", "changed"] = (
            "trusted" if any(k.public_data == blob for k in pinned) else "changed" if pinned else "unknown"
        )
        algorithm = key.get_algorithm()
        words = key.export_public_key("openssh").decode().split()
        return HostKey(
            host=name,
            where=known_hosts_name(hc),
            key_type=_key_type(algorithm),
            fingerprint=key.get_fingerprint("sha256"),
            known_hosts=path,
            entry=f"{known_hosts_name(hc)} {words[0]} {words[1]}",
            state=state,
        )

    def trust(self, key: HostKey) -> None:
        """Pin ``key`` in its ``known_hosts`` (appended; the file and its folder made, private, if new).

        :raises HostKeyRejected: if another key is pinned for the host (``changed``): never replaced here.
        :raises OSError: if the file cannot be written.
        """
        if key.state == "changed":
            raise HostKeyRejected(key.host, key.fingerprint, str(key.known_hosts))
        if key.state == "trusted":
            return
        key.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(key.known_hosts, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "r+") as f:
            text = f.read()
            f.write(("\n" if text and not text.endswith("\n") else "") + key.entry + "\n")

    def check_client_keys(self) -> None:
        """Every ``client_keys`` file of every host exists and can be read (before a connection finds
        out as ``host … unreachable``).

        :raises ConfigError: one line per file that is missing or unreadable, naming its key.
        """
        problems = []
        for name, hc in self.config.hosts.items():
            for i, path in enumerate(hc.client_keys):
                full = path.expanduser()
                why = (
                    "no such file"
                    if not full.exists()
                    else "not a file"
                    if not full.is_file()
                    else "not readable by this user"
                    if not os.access(full, os.R_OK)
                    else None
                )
                if why:
                    problems.append(client_key_problem(name, i, str(full), why))
        if problems:
            raise ConfigError(problems, self.config.source)


# --- text


def client_key_problem(host: str, index: int, path: str, why: str) -> str:
    """A ``client_keys`` entry ``check-config`` refuses."""
    return f"hosts.{host}.client_keys.{index}: {path}: {why} - give a private key this user can read"
