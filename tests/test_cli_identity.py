"""The CLI acts as the OS user running it, as real OS users show: throwaway users (``useradd``) run
``pitstop say`` through ``runuser -u``, with ``$USER``/``$LOGNAME`` set to someone else.  With
``[auth.cli]``, each acts as their mapped Slack id, ``--as`` is an admin's only and recorded as
"admin as user", and the two-person rule compares real actors; without it, approve, deny and
break glass are refused from the CLI."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.state.approvals import Approvals, ApprovalState
from pipeline.state.audit import Actor, Audit, AuditOutcome
from pipeline.state.redisconn import open_redis

ROOT = Path(__file__).resolve().parents[1]
OPS, BOSS = "U0OPS", "U0BOSS"
CALL_TIMEOUT = 120.0  #: seconds one ``pitstop say`` may take


@dataclass(frozen=True)
class Users:
    """Three OS users made for the module: ``ops`` (an operator), ``boss`` (an admin), ``stranger`` (unmapped)."""

    ops: str
    boss: str
    stranger: str


@pytest.fixture(scope="module")
def users() -> Iterator[Users]:
    """Real OS users with unique names, removed afterwards."""
    if os.geteuid() != 0:
        pytest.fail("these tests create OS users: run them as root (CI does)")
    names = [f"ps{uuid.uuid4().hex[:10]}" for _ in range(3)]
    made: list[str] = []
    try:
        for name in names:
            subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name], check=True)
            made.append(name)
        yield Users(*names)
    finally:
        for name in made:
            subprocess.run(["userdel", name], check=False)


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """A directory every user may read (config files, Redis's socket): pytest's own is root's only."""
    path = Path(tempfile.mkdtemp(prefix="pitstop-cli-identity-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def redis_socket(shared_dir: Path) -> Iterator[Path]:
    """A redis-server on a unix socket any user may connect to."""
    sock = shared_dir / "redis.sock"
    proc = subprocess.Popen(
        [
            *("redis-server", "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "777"),
            *("--dir", str(shared_dir), "--save", "", "--appendonly", "no"),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        ping = ["redis-cli", "-s", str(sock), "--raw", "ping"]
        for _ in range(200):  # bounded: 200 × 50 ms
            if (
                sock.exists()
                and subprocess.run(ping, capture_output=True, text=True).stdout.strip() == "PONG"
            ):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("redis-server did not start within 10 s")
        yield sock
    finally:
        proc.terminate()
        proc.wait(10)


def _runs_pitstop(user: str, env: dict[str, str]) -> bool:
    """Whether OS user ``user`` can run this Python and import Pitstop from this tree."""
    probe = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in env.items())]
    probe += [sys.executable, "-c", "import bot.cli"]
    return subprocess.run(probe, capture_output=True, cwd="/").returncode == 0


@pytest.fixture(scope="module")
def interpreter(users: Users) -> Iterator[tuple[str, dict[str, str]]]:
    """This venv's Python and the environment that makes it import this tree, runnable by the
    throwaway users.  Checked first; when the interpreter lives under a directory they may not
    enter (``/root``, for a pyenv Python), that directory gets search permission for others (not
    read: nothing in it can be listed) for the module's tests, and its mode back afterwards."""
    env = {"PYTHONPATH": str(ROOT)}
    widened: list[tuple[Path, int]] = []
    if not _runs_pitstop(users.ops, env):
        for top in (Path(sys.executable).resolve(), Path(sysconfig.get_paths()["purelib"]).resolve()):
            for parent in reversed(top.parents):
                mode = parent.stat().st_mode
                if not mode & stat.S_IXOTH and parent not in [w for w, _ in widened]:
                    widened.append((parent, stat.S_IMODE(mode)))
                    parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    try:
        if not _runs_pitstop(users.ops, env):
            pytest.fail(f"user {users.ops} cannot run {sys.executable} importing {ROOT}")
        yield sys.executable, env
    finally:
        for parent, mode in reversed(widened):
            parent.chmod(mode)


@dataclass(frozen=True)
class Said:
    """One ``pitstop say`` as an OS user."""

    code: int
    out: str
    err: str


def _config(shared_dir: Path, redis_socket: Path, users: Users, *, cli: bool) -> Path:
    """A config readable by every user: job dflash (its restarts wait for an admin), roles by id,
    ``[auth.cli]`` mapping the users when ``cli``."""
    name = f"pitstop-{uuid.uuid4().hex[:8]}"
    mapping = f'[auth.cli]\n{users.ops} = "{OPS}"\n{users.boss} = "{BOSS}"\n' if cli else ""
    text = f"""
[auth]
admins = ["{BOSS}"]
operators = ["{OPS}"]
viewers = ["*"]
{mapping}
[redis]
url = "unix://{redis_socket}"
prefix = "{name}:"

[state]
dir = "{shared_dir / name}"

[hosts.gpu1]
address = "127.0.0.1"
port = 9

[jobs.dflash]
host = "gpu1"
workdir = "/srv/dflash"
launch = ["./run.sh"]
log = "/srv/dflash/train.log"
match = "^dflash "

[jobs.dflash.approval]
actions = ["restart"]
approvers = ["admin"]
"""
    path = shared_dir / f"{name}.toml"
    path.write_text(text)
    path.chmod(0o644)
    return path


def _say(
    interpreter: tuple[str, dict[str, str]], user: str, config: Path, *args: str, forged: str = "root"
) -> Said:
    """``pitstop say ARGS`` run by OS user ``user``, whose ``$USER`` and ``$LOGNAME`` claim ``forged``."""
    python, env = interpreter
    claims = [f"USER={forged}", f"LOGNAME={forged}", f"PITSTOP_CONFIG={config}"]
    argv = ["runuser", "-u", user, "--", "env", "-i", *claims, *(f"{k}={v}" for k, v in env.items())]
    argv += [python, "-m", "bot.cli", "say", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=CALL_TIMEOUT, cwd="/")
    return Said(done.returncode, done.stdout, done.stderr)


async def test_the_cli_acts_as_the_os_user_mapped_in_auth_cli(
    users: Users, shared_dir: Path, redis_socket: Path, interpreter: tuple[str, dict[str, str]]
) -> None:
    """Each OS user acts as their mapped id whatever $USER says; a stranger is refused with the fix;
    --as is an admin's only, recorded "admin as user", and never lets them approve what they asked."""
    config = _config(shared_dir, redis_socket, users, cli=True)
    stranger = _say(interpreter, users.stranger, config, "pending", forged=users.boss)
    assert stranger.code == 3 and f"OS user '{users.stranger}' is not in [auth.cli]" in stranger.err
    assert (_say(interpreter, users.ops, config, "pending", forged=users.boss)).code == 0
    lifted = _say(interpreter, users.ops, config, "--as", BOSS, "pending")
    assert lifted.code == 3 and "only an admin may act as someone else" in lifted.err

    asked = _say(interpreter, users.boss, config, "--as", OPS, "restart dflash")
    assert asked.code == 7, asked.out + asked.err
    rid = asked.out.split(":", 1)[0]
    own = _say(interpreter, users.boss, config, f"approve {rid}")
    assert own.code == 3 and "you asked for" in own.out, own.out + own.err
    as_ops = _say(interpreter, users.ops, config, f"approve {rid}")
    assert as_ops.code == 3 and "you asked for" in as_ops.out
    borrowed = _say(interpreter, users.boss, config, "--as", OPS, f"deny {rid}")
    assert borrowed.code == 3 and "never --as" in borrowed.out
    withdrawn = _say(interpreter, users.ops, config, f"deny {rid} not now")
    assert withdrawn.code == 0, withdrawn.out + withdrawn.err

    history = _say(interpreter, users.ops, config, "--json", "history dflash")
    assert history.code == 0, history.err
    tables = [f["tables"][0] for f in json.loads(history.out)["follow_ups"] if "two-person" in f["title"]]
    whos = {(row[2], row[3]) for row in tables[0]["rows"]}
    assert (f"<@{BOSS}> as <@{OPS}> (cli: {users.boss})", "awaiting_approval") in whos
    assert (f"<@{OPS}> (cli: {users.ops})", "rejected") in whos

    handle = await open_redis(load_config(config))
    try:
        request = await handle.open_store(Approvals).find(rid)
        assert request is not None and request.state is ApprovalState.DENIED
        assert request.actor == Actor(user=OPS, surface="say", by=BOSS, os_user=users.boss)
        assert request.decider == Actor(user=OPS, surface="say", os_user=users.ops)
        entries = await handle.open_store(Audit).recent(count=20)
        assert {e.os_user for e in entries} == {users.ops, users.boss}  # never the forged $USER
        refused = [e for e in entries if e.outcome is AuditOutcome.DENIED and e.by == BOSS]
        assert [e.text for e in refused] == [f"deny {rid}"]
    finally:
        await handle.aclose()


async def test_without_auth_cli_the_cli_may_not_approve_deny_nor_break_glass(
    users: Users, shared_dir: Path, redis_socket: Path, interpreter: tuple[str, dict[str, str]]
) -> None:
    """With no [auth.cli], --as still works for other verbs, but approve, deny and --break-glass are
    refused with the fix, and the OS user is on the record."""
    config = _config(shared_dir, redis_socket, users, cli=False)
    assert _say(interpreter, users.ops, config, "--as", BOSS, "pending").code == 0
    for text in ("approve r-1", "deny r-1", 'restart dflash --break-glass "fire"'):
        said = _say(interpreter, users.ops, config, "--as", BOSS, text)
        assert said.code == 3 and "map OS users to Slack ids in [auth.cli]" in said.out, said.out + said.err
    handle = await open_redis(load_config(config))
    try:
        entries = await handle.open_store(Audit).recent(count=10)
        assert {(e.user, e.os_user, e.surface) for e in entries} == {(BOSS, users.ops, "say")}
    finally:
        await handle.aclose()
