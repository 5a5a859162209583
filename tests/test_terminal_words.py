"""Words made for a terminal (issue 38, part 6): `serve`'s start-up errors say whose fault they are and
name every missing secret at once; `help` examples name the config's own jobs."""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bot.console.chat import make_console, run_console
from bot.console.identity import CliIdentity
from bot.console.words import TerminalNames
from bot.runtime.serve import serve
from bot.slack.api import web_client
from bot.slack.people import People
from handlers.grammar.commands import Command
from handlers.views.read import help_command
from pipeline.config import Config
from pipeline.errors import ExitCode, SlackUnavailable
from tests.fixtures.slack import ANNOUNCE, BOT_TOKEN, FakeSlack, kill_matching, slack_config
from tests.fixtures.ssh import InProcessHost, JobFactory, JobSetup

ROOT = Path(__file__).resolve().parent.parent


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_serve_tells_a_network_failure_from_a_refused_token(
    fake_slack: FakeSlack, redis_config: Config, ssh_server: InProcessHost, job_factory: JobFactory
) -> None:
    """A Slack that cannot be reached is blamed on the network (the tokens unchecked); a token Slack refuses
    is blamed on the token."""
    config = slack_config(job_factory(ssh_server).config, redis_config)
    with pytest.raises(SlackUnavailable) as away:
        await serve(config, bot_token=BOT_TOKEN, api_url=f"http://127.0.0.1:{_closed_port()}/api/", host=None)
    assert away.value.unreachable and "Slack could not be reached" in away.value.message
    assert "SLACK_BOT_TOKEN" not in away.value.message
    with pytest.raises(SlackUnavailable) as refused:
        await serve(config, bot_token="xoxb-revoked", api_url=fake_slack.api_url, host=None)
    assert not refused.value.unreachable
    assert refused.value.message.startswith("Slack auth.test failed: invalid_auth - check SLACK_BOT_TOKEN")


def test_serve_names_every_missing_secret_at_once() -> None:
    """`pitstop serve` with neither the bot token nor the signing secret names both, exit 2, no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}
    done = subprocess.run(
        [sys.executable, "-m", "bot.cli", "serve", "--config", "pitstop.example.toml"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert done.stderr.strip() == (
        "SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET are not set - export them (secrets are read from the environment only)"
    )


def test_help_examples_name_the_configs_own_jobs() -> None:
    """`help stop` shows `stop tj` for a config whose job is tj, and the reference `stop dflash` where dflash is
    a job (or none is configured)."""
    command = Command("help", options={"topic": "stop"})
    (mine,) = [
        line for line in help_command(command, jobs=["tj", "other"]).lines if line.startswith("examples")
    ]
    assert "`stop tj`" in mine and "dflash" not in mine
    (ref,) = [
        line for line in help_command(command, jobs=["eagle", "dflash"]).lines if line.startswith("examples")
    ]
    assert "`stop dflash`" in ref
    restart = help_command(Command("help", options={"topic": "restart"}), jobs=["tj"])
    assert "`restart tj with topk patch`" in " ".join(restart.lines)


# --- @name and #name, never Slack's markup --------------------------------------------------------

MARKUP = ("<@", "<#", "<!")
ADMIN = "U0ADMIN"


def _words_config(path: Path, setup: JobSetup, redis: Config) -> Path:
    """A config file for a ``pitstop`` subprocess: the test's host, job (owned by a person and a user
    group) and Redis, posts to the fake's announce channel."""
    host, job = setup.config.hosts["local"], setup.job
    toml = json.dumps
    lines = [
        "[slack]",
        f"announce_channel = {toml(ANNOUNCE)}",
        "pace = 0",
        "[auth]",
        f"admins = [{toml(ADMIN)}]",
        'viewers = ["*"]',
        "[redis]",
        f"prefix = {toml(redis.redis.prefix)}",
        *([f"url = {toml(redis.redis.url)}"] if redis.redis.url else []),
        "[state]",
        f"dir = {toml(str(redis.state.dir))}",
        "[hosts.local]",
        f"address = {toml(host.address)}",
        f"port = {host.port}",
        f"user = {toml(host.user)}",
        f"known_hosts = {toml(str(host.known_hosts))}",
        f"client_keys = {toml([str(k) for k in host.client_keys])}",
        f"[jobs.{setup.name}]",
        'host = "local"',
        f"workdir = {toml(str(job.workdir))}",
        f"launch = {toml(job.launch)}",
        f"log = {toml(str(job.log))}",
        f"match = {toml(job.match)}",
        f"start_window = {job.start_window}",
        f"stop_timeout = {job.stop_timeout}",
        f"owners = {toml(['U0OWNER01', 'S0ONCALL'])}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


async def _say(config: Path, text: str, *flags: str, slack: FakeSlack | None = None) -> tuple[int, str]:
    """``pitstop say TEXT --as ADMIN FLAGS`` as a process beside this event loop (which serves the SSH
    host and the fake Slack); with ``slack``, its token and URL in the environment. :returns: the exit
    code and stdout + stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}
    if slack is not None:
        env |= {"SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_API_URL": slack.api_url}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "say", text, "--as", ADMIN, *flags, "--config", str(config),
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_say_shows_names_from_slack_else_ids_never_markup(
    fake_slack: FakeSlack,
    redis_config: Config,
    ssh_server: InProcessHost,
    job_factory: JobFactory,
    tmp_path: Path,
) -> None:
    """A real `pitstop say`: with a bot token, people and channels are `@name` and `#name` from
    users.info / conversations.info; without one, `@U…` and `#C…`; never `<@`, `<#` nor `<!`."""
    setup = job_factory(ssh_server)
    config = _words_config(tmp_path / "pitstop.toml", setup, redis_config)
    code, started = await _say(config, f"start {setup.name}", "--wait", slack=fake_slack)
    assert code == 0, started
    assert "in #c0announce" in started and "RUNNING 1/1 processes" in started
    code, history = await _say(config, "history", slack=fake_slack)
    assert code == 0 and "@u0admin" in history, history
    code, status = await _say(config, f"status {setup.name}", slack=fake_slack)
    assert code == 0 and "@u0owner01, @S0ONCALL" in status, status
    assert await fake_slack.calls("users.info") and await fake_slack.calls("conversations.info")
    code, bare = await _say(config, f"status {setup.name}")
    assert code == 0 and "@U0OWNER01, @S0ONCALL" in bare, bare
    code, stopped = await _say(config, f"stop {setup.name}")
    assert code == 0 and f"in #{ANNOUNCE}" in stopped, stopped
    for said in (started, history, status, bare, stopped):
        assert not any(m in said for m in MARKUP), said


async def test_console_shows_names_never_markup(
    fake_slack: FakeSlack, redis_config: Config, ssh_server: InProcessHost, job_factory: JobFactory
) -> None:
    """The console's answers and its team posts (a run's live steps, its verdict) show `@name` and
    `#name` from Slack, never Slack's markup."""
    setup = job_factory(ssh_server, owners=["U0OWNER01", "S0ONCALL"])
    config = slack_config(setup.config, redis_config, admins=(ADMIN,))
    console = make_console(file=io.StringIO(), record=True, width=200)
    names = TerminalNames(People(web_client(BOT_TOKEN, base_url=fake_slack.api_url), group_roles=False))
    lines = [f"start {setup.name}", f"status {setup.name}", "history", f"stop {setup.name}"]
    try:
        code = await run_console(
            config, who=CliIdentity(ADMIN, "tester"), lines=lines, console=console, names=names
        )
    finally:
        kill_matching(setup.token)
    shown = console.export_text()
    assert code == 0
    assert "in #c0announce" in shown and "@u0owner01, @S0ONCALL" in shown and "@u0admin" in shown, shown
    assert not any(m in shown for m in MARKUP), shown
