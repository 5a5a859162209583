"""`pitstop init` and a new user's first job: a commented config for one host and one job, checked
as check-config checks it; then, from an empty directory against the real OpenSSH sshd, trust-host,
check-config, `start --wait`, a SIGKILL, the console's alert and a restart verified RUNNING (the
real CLI as subprocesses)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path

from bot.runtime.settings import os_user
from pipeline.errors import ExitCode
from tests.fixtures.ssh import SshdHost, kill_matching

ROOT = Path(__file__).resolve().parent.parent
MARKUP = ("<@", "<#", "<!")
ADMIN = "U0ADMIN0001"
CALL_TIMEOUT = 120.0  #: seconds one CLI call may take (a start waits for its verdict)
ALERT_TIMEOUT = 120.0  #: seconds for the console's watcher to find the killed job
#: the job of a new user: a loop printing plain JSON metric lines (its uuid argument is its match)
TRAIN = """\
import json, sys, time
step = 0
while True:
    step += 1
    print(json.dumps({"step": step, "tokens_per_s": 900.0, "loss": 1.0}), flush=True)
    time.sleep(0.2)
"""


@dataclass
class Done:
    """A finished CLI run."""

    code: int
    out: str
    err: str


def _env() -> dict[str, str]:
    """The test's environment without Slack secrets nor a config path; this tree importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "PITSTOP_CONFIG"))}
    return env | {"PYTHONPATH": str(ROOT)}


async def pitstop(cwd: Path, *args: str) -> Done:
    """``pitstop ARGS`` run in ``cwd`` as a process beside this event loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", *args, cwd=cwd, env=_env(),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), CALL_TIMEOUT)
    assert proc.returncode is not None
    return Done(proc.returncode, out.decode(), err.decode())


def _init_args(**flags: str) -> list[str]:
    return ["init", *(x for k, v in flags.items() for x in (f"--{k.replace('_', '-')}", v))]


async def test_init_writes_a_commented_checked_config_and_never_overwrites(tmp_path: Path) -> None:
    """`init` writes host, job, [auth] and [auth.cli] (this OS user → the admin), the metric-line format
    in a comment, client_keys only for a key that exists; refuses to overwrite without --force; removes
    what it wrote when the config is invalid."""
    key = tmp_path / "id_ed25519"
    flags = dict(host="gpu1.example.com", user="ml", job="tj", launch="python3 train.py --lr 0.1")
    flags |= dict(log="/home/ml/tj/train.log", admin=ADMIN, key=str(key), channel="C0ANNOUNCE1")
    done = await pitstop(tmp_path, *_init_args(**flags))
    assert done.code == 0, done.err
    assert done.out.startswith("wrote pitstop.toml: host gpu1 (ml@gpu1.example.com:22), job tj")
    assert "pitstop trust-host gpu1" in done.out and 'pitstop say "start tj" --wait' in done.out
    written = (tmp_path / "pitstop.toml").read_text()
    config = tomllib.loads(written)
    assert config["auth"]["admins"] == [ADMIN] and config["auth"]["cli"] == {os_user(): ADMIN}
    assert config["slack"]["announce_channel"] == "C0ANNOUNCE1"
    job = config["jobs"]["tj"]
    assert job["launch"] == ["python3", "train.py", "--lr", "0.1"] and job["workdir"] == "/home/ml/tj"
    assert job["match"] == r"train\.py --lr 0\.1" and job["metrics"] == "jsonl"
    assert '#   {"step": 120, "tokens_per_s": 900.0, "loss": 1.93}' in written
    assert "client_keys" not in config["hosts"]["gpu1"] and "not found when this file was written" in written
    assert (await pitstop(tmp_path, "check-config")).code == 0

    again = await pitstop(tmp_path, *_init_args(**flags | {"job": "other"}))
    assert again.code == ExitCode.USAGE and "pitstop.toml exists - pass --force" in again.err
    assert (tmp_path / "pitstop.toml").read_text() == written
    key.write_text("not checked here, only that it is there\n")
    forced = await pitstop(tmp_path, *_init_args(**flags | {"job": "other"}), "--force")
    assert forced.code == 0, forced.err
    config = tomllib.loads((tmp_path / "pitstop.toml").read_text())
    assert list(config["jobs"]) == ["other"] and config["hosts"]["gpu1"]["client_keys"] == [str(key)]

    bad = await pitstop(tmp_path, *_init_args(**flags | {"admin": "maya"}), "--out", "bad.toml")
    assert bad.code == ExitCode.USAGE and "'maya' is not a Slack id" in bad.err
    assert not (tmp_path / "bad.toml").exists()


async def _read_until(stream: asyncio.StreamReader, seen: list[str], want: str, timeout: float) -> None:
    """Read ``stream``'s lines into ``seen`` until one contains ``want``; fail after ``timeout`` s."""

    async def scan() -> None:
        while True:
            line = await stream.readline()
            assert line, f"console output ended before {want!r}: {seen}"
            seen.append(line.decode().rstrip("\n"))
            if want in seen[-1]:
                return

    await asyncio.wait_for(scan(), timeout)


async def test_a_new_users_job_from_an_empty_directory(
    sshd_host: SshdHost, embedded_state_dir: Path, tmp_path: Path
) -> None:
    """From an empty directory: init, trust-host --yes (an empty known_hosts), check-config,
    `say "start tj" --wait` (RUNNING), a SIGKILL of the job, the console's alert that tj is down, and
    `restart tj` there verified RUNNING before `bye`; no Slack markup anywhere."""
    token = f"pitstop-test-{uuid.uuid4().hex[:12]}"
    work = tmp_path / "tj"  # the user's job on the host
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    here = tmp_path / "empty"
    here.mkdir()
    flags = dict(host="127.0.0.1", port=str(sshd_host.port), user=sshd_host.user, name="local", job="tj")
    flags |= dict(launch=f"{sys.executable} -u train.py {token}", log=str(work / "train.log"))
    flags |= dict(admin=ADMIN, key=str(sshd_host.client_key), known_hosts=str(here / "known_hosts"))
    flags |= dict(channel="C0ANNOUNCE1", state_dir=str(embedded_state_dir))
    said: list[str] = []
    try:
        done = await pitstop(here, *_init_args(**flags))
        assert done.code == 0, done.err
        trusted = await pitstop(here, "trust-host", "local", "--yes")
        assert trusted.code == 0 and "Pitstop now connects to it" in trusted.out, trusted
        checked = await pitstop(here, "check-config")
        assert checked.code == 0 and checked.out.startswith("pitstop.toml: ok - 1 host(s), 1 job(s)"), checked
        started = await pitstop(here, "say", "start tj", "--wait")
        assert started.code == 0, started
        assert "RUNNING 1/1 processes pid" in started.out
        said += [started.out, started.err]

        assert kill_matching(token) == 1  # the job (the waiter carries nothing of its command line)
        console = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cli", "console", cwd=here, env=_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        assert console.stdin is not None and console.stdout is not None
        shown: list[str] = []
        try:
            await _read_until(console.stdout, shown, "tj is down: no processes left on local", ALERT_TIMEOUT)
            console.stdin.write(b"restart tj\n")
            console.stdin.close()
            rest = await asyncio.wait_for(console.stdout.read(), CALL_TIMEOUT)
            shown += rest.decode().splitlines()
            assert await asyncio.wait_for(console.wait(), 30) == 0
        finally:
            if console.returncode is None:
                console.kill()
                await console.wait()
        said += shown
        restarted = [line for line in shown if "✓ verify" in line or line.startswith("[run r-2] ↳ RUNNING")]
        assert any("RUNNING 1/1 processes pid" in line for line in restarted), shown
        assert shown[-1] == "bye", shown
    finally:
        kill_matching(token)
    assert not any(m in text for text in said for m in MARKUP), said
