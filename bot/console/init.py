"""``pitstop init``: a commented config for one host and one job, written from a few flags and
checked as ``pitstop check-config`` checks a file (:func:`check_config`), then the next steps.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bot import text
from pipeline.config import Config, load_config
from pipeline.errors import UsageError

DEFAULT_OUT = Path("pitstop.toml")  #: where ``init`` writes, and where every verb looks, by default
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SPECIAL = re.compile(r"[.^$*+?{}\[\]\\|()]")  #: what has a meaning in a regular expression


def check_config(path: Path) -> Config:
    """The config at ``path``, loaded and checked as ``pitstop check-config`` does: the schema, each
    job's engine settings, every ``client_keys`` file.

    :raises ConfigError: if any of it is wrong (every problem named).
    """
    config = load_config(path)
    from pipeline.engines import ENGINES  # lazy: the engines load SSH
    from pipeline.engines.base import check_engines
    from pipeline.host.trust import HostKeys

    check_engines(config, ENGINES)
    HostKeys(config).check_client_keys()
    return config


@dataclass(frozen=True)
class InitRequest:
    """What ``pitstop init`` was asked for (its flags).

    :ivar address: the GPU host's address; :ivar port: its sshd's port; :ivar user: the SSH user.
    :ivar job: the job's name; :ivar launch: its command line (split as a shell would, never run by
        one); :ivar log: the training log on the host; :ivar workdir: where it runs (default: the
        log's directory).
    :ivar channel: the announce channel (``C…``); :ivar admin: the admin's Slack id (``U…``),
        also ``[auth.cli]``'s id for ``os_user``, the OS user running ``init``.
    :ivar key: a private key file (written only if it exists); :ivar known_hosts: the pinned keys'
        file; :ivar state_dir: Pitstop's local state; :ivar redis: a Redis URL (default embedded).
    """

    address: str
    job: str
    launch: str
    log: str
    os_user: str
    port: int = 22
    user: str | None = None
    workdir: str | None = None
    name: str | None = None
    match: str | None = None
    processes: int = 1
    channel: str | None = None
    admin: str | None = None
    key: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    state_dir: str | None = None
    redis: str | None = None

    @property
    def host(self) -> str:
        """The host's name in the config: ``--name``, else the address's first label (``gpu1`` of
        ``gpu1.example.com``), ``gpu`` for an IP address."""
        if self.name:
            return self.name
        try:
            ipaddress.ip_address(self.address)
        except ValueError:
            return self.address.split(".", 1)[0] or "gpu"
        return "gpu"


def _key(name: str) -> str:
    """A TOML key: bare when it can be, else quoted."""
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name)


def _match(argv: list[str]) -> str:
    """A regular expression for the processes ``argv`` starts: its arguments as written (the program
    itself may re-exec under another name: ``python3`` → ``python3.11``), else the program."""
    return _SPECIAL.sub(r"\\\g<0>", " ".join(argv[1:]) or argv[0])


def render_config(req: InitRequest) -> str:
    """The commented TOML for ``req`` (:data:`bot.text.INIT_CONFIG`).

    :raises UsageError: if ``--launch`` is no command.
    """
    try:
        argv = shlex.split(req.launch)
    except ValueError:
        argv = []
    if not argv:
        raise UsageError(text.init_bad_launch(req.launch))
    q = json.dumps
    key = Path(req.key).expanduser() if req.key else None
    return text.INIT_CONFIG.format(
        job=_key(req.job),
        address=req.address,
        address_value=q(req.address),
        channel=f"announce_channel = {q(req.channel)}" if req.channel else text.INIT_NO_CHANNEL,
        admins=f"admins = [{q(req.admin)}]" if req.admin else text.INIT_NO_ADMIN,
        cli=f"[auth.cli]\n{_key(req.os_user)} = {q(req.admin)}"
        if req.admin
        else text.init_cli_unmapped(req.os_user),
        state=f"dir = {q(req.state_dir)}" if req.state_dir else text.INIT_STATE_DEFAULT,
        redis=f"\n[redis]\nurl = {q(req.redis)}\n" if req.redis else "",
        host=_key(req.host),
        host_value=q(req.host),
        port=req.port,
        user=f"user = {q(req.user)}" if req.user else text.INIT_NO_USER,
        known_hosts=q(req.known_hosts),
        client_keys=(
            f"client_keys = [{q(req.key)}]"
            if key is not None and key.is_file()
            else text.init_no_client_key(q(req.key) if req.key else None)
        ),
        workdir=q(req.workdir or str(Path(req.log).parent)),
        launch=q(argv),
        log=q(req.log),
        match=q(req.match or _match(argv)),
        processes=req.processes,
    )


def init_main(req: InitRequest, out: Path, *, force: bool, stdout: IO[str] | None = None) -> int:
    """``pitstop init``: write ``req``'s config to ``out`` (never over a file without ``force``),
    check it as ``check-config`` does (an invalid one is removed again), print the next steps.

    :returns: 0.
    :raises UsageError: if ``out`` exists and not ``force``, or ``--launch`` is no command.
    :raises ConfigError: if the config is invalid (a flag's value: the error names its key).
    """
    if out.exists() and not force:
        raise UsageError(text.init_exists(str(out)))
    body = render_config(req)
    out.write_text(body)
    try:
        config = check_config(out)
    except Exception:
        out.unlink()
        raise
    stdout = stdout or sys.stdout
    host = config.hosts[req.host]
    where = f"{host.user + '@' if host.user else ''}{host.address}:{host.port}"
    print(text.init_written(str(out), req.host, where, req.job), file=stdout)
    if unalerted := config.unalerted():
        from pipeline.config import alerts_nowhere

        print(text.config_warning(alerts_nowhere(unalerted)), file=sys.stderr)
    flag = None if out == DEFAULT_OUT else str(out)
    print(text.init_next_steps(req.host, req.job, flag, not unalerted), file=stdout)
    return 0
