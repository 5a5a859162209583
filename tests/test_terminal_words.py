"""Words made for a terminal (issue 38, part 6): `serve`'s start-up errors say whose fault they are and
name every missing secret at once; `help` examples name the config's own jobs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bot.runtime.serve import serve
from handlers.grammar.commands import Command
from handlers.views.read import help_command
from pipeline.config import Config
from pipeline.errors import ExitCode, SlackUnavailable
from tests.fixtures.slack import BOT_TOKEN, FakeSlack, slack_config
from tests.fixtures.ssh import InProcessHost, JobFactory

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
