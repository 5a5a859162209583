"""`pitstop check-slack` against the strict Slack stand-in: token, scopes, channels, command, --post."""

from __future__ import annotations

import asyncio
import io
import os
import sys
from pathlib import Path

from bot.slack.doctor import check_slack
from pipeline.config import load_config
from pipeline.errors import ExitCode
from tests.fixtures.slack import BOT_TOKEN, Channel, FakeSlack

ROOT = Path(__file__).resolve().parent.parent

CONFIG = """
[slack]
announce_channel = "C0ANNOUNCE"

[hosts.gpu1]
address = "127.0.0.1"

[jobs.dflash]
host = "gpu1"
workdir = "/srv/dflash"
launch = ["./run.sh"]
log = "/srv/dflash/train.log"
match = "^dflash-worker "
processes = 8
channel = "{channel}"
"""


def _config(tmp_path: Path, channel: str = "C0TEAM") -> Path:
    path = tmp_path / "pitstop.toml"
    path.write_text(CONFIG.format(channel=channel))
    return path


async def test_healthy_setup_passes_and_post_deletes_its_test_messages(
    fake_slack: FakeSlack, tmp_path: Path
) -> None:
    """With the manifest's scopes and the bot in both channels, every check is ok; --post leaves no message behind."""
    out = io.StringIO()
    code = await check_slack(
        load_config(_config(tmp_path)), bot_token=BOT_TOKEN, api_url=fake_slack.api_url, post=True, out=out
    )
    text = out.getvalue()
    assert code == 0, text
    assert "FAIL" not in text and "command: /train (as in slack-manifest.yml)" in text
    assert len(await fake_slack.calls("chat.delete", ok=True)) == 2 and fake_slack.messages == {}


async def test_problems_are_named_with_their_fix(tmp_path: Path) -> None:
    """A missing scope and a private channel the bot is not in each fail with a fix; exit 1."""
    scopes = frozenset({"commands", "chat:write", "channels:read", "groups:read", "files:write"})
    channels = [Channel("C0ANNOUNCE"), Channel("G0SECRET", public=False, member=False)]
    async with FakeSlack(scopes=scopes, channels=channels) as fake:
        out = io.StringIO()
        code = await check_slack(
            load_config(_config(tmp_path, "G0SECRET")), bot_token=BOT_TOKEN, api_url=fake.api_url, out=out
        )
    text = out.getvalue()
    assert code == ExitCode.FAILED
    assert "FAIL scopes: missing" in text and "users:read" in text
    assert "FAIL channel G0SECRET (dflash): channel_not_found" in text and "/invite @pitstop" in text


async def test_archived_channel_fails(fake_slack: FakeSlack, tmp_path: Path) -> None:
    """An archived job channel fails the check, saying to unarchive it or configure another."""
    fake_slack.add_channel(Channel("C0OLD", archived=True))
    out = io.StringIO()
    code = await check_slack(
        load_config(_config(tmp_path, "C0OLD")), bot_token=BOT_TOKEN, api_url=fake_slack.api_url, out=out
    )
    assert code == ExitCode.FAILED and "archived - unarchive it" in out.getvalue()


async def test_cli_verb_exits_by_the_usual_codes(fake_slack: FakeSlack, tmp_path: Path) -> None:
    """`pitstop check-slack` exits 0 when healthy, 1 with a bad token, 2 without SLACK_BOT_TOKEN."""
    config = _config(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}

    async def run(**extra: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot.cli",
            "check-slack",
            "--config",
            str(config),
            env={**env, "SLACK_API_URL": fake_slack.api_url, **extra},
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(proc.communicate(), 60)
        return int(proc.returncode or 0), output.decode()

    ok = await run(SLACK_BOT_TOKEN=BOT_TOKEN)
    assert ok[0] == 0, ok[1]
    bad = await run(SLACK_BOT_TOKEN="xoxb-wrong")
    assert bad[0] == ExitCode.FAILED and "invalid_auth" in bad[1]
    none = await run()
    assert none[0] == ExitCode.USAGE and "SLACK_BOT_TOKEN" in none[1]


async def test_restricted_channels_fail_without_posting_and_the_fallback_is_checked(
    fake_slack: FakeSlack, tmp_path: Path
) -> None:
    """A read-only job channel and an admins-only fallback channel each fail from conversations.info alone; nothing is posted."""
    fake_slack.add_channel(Channel("C0RO", name="ml-ops", read_only=True))
    fake_slack.add_channel(Channel("C0ADMINS", name="general", admins_only=True))
    path = _config(tmp_path, "C0RO")
    path.write_text(path.read_text().replace("[slack]\n", '[slack]\nfallback_channel = "C0ADMINS"\n'))
    out = io.StringIO()
    code = await check_slack(load_config(path), bot_token=BOT_TOKEN, api_url=fake_slack.api_url, out=out)
    text = out.getvalue()
    assert code == ExitCode.FAILED
    assert "FAIL channel #ml-ops (C0RO, dflash): posting is restricted (read-only)" in text
    assert "FAIL channel #general (C0ADMINS, fallback): posting is restricted (admins only)" in text
    assert "restricted_action" in text and await fake_slack.calls("chat.postMessage") == []
