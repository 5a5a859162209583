"""The Redis connection: embedded server lifecycle and the configured URL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import Config, RedisSettings, StateSettings
from pipeline.errors import StateUnavailable
from pipeline.state.redisconn import RedisHandle, mask_url, open_redis


async def test_fresh_prefix_roundtrip(redis_handle: RedisHandle) -> None:
    """A value written under the test's prefix reads back on the same server."""
    key = redis_handle.prefix + "x"
    await redis_handle.client.set(key, "1")
    assert await redis_handle.client.get(key) == "1"


async def test_embedded_shared_and_shut_down_by_last_user(tmp_path: Path) -> None:
    """Two handles share one embedded server; it stops only when the last one closes."""
    config = Config(state=StateSettings(dir=tmp_path))
    first = await open_redis(config)
    second = await open_redis(config)
    await first.client.set("k", "v")
    assert await second.client.get("k") == "v"
    assert first.description.startswith("embedded")
    socket = str(first.embedded.socket_file)
    assert socket is not None and os.path.exists(socket)
    await first.aclose()
    assert await second.client.get("k") == "v"
    await second.aclose()
    assert not os.path.exists(socket)


SCRIPT = """
import asyncio, sys
from bot.cli import run_async
from pipeline.config import Config, StateSettings
from pipeline.state.redisconn import open_redis

async def main():
    handle = await open_redis(Config(state=StateSettings(dir=sys.argv[1])))
    print(handle.embedded.socket_file, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await handle.aclose()
    return 0

sys.exit(run_async(main))
"""


def test_embedded_server_gone_after_sigterm(tmp_path: Path) -> None:
    """A pitstop process holding the embedded server (the CLI's signal handling) leaves no
    redis-server behind after SIGTERM, and exits 5 (cancelled)."""
    with subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        socket = proc.stdout.readline().strip()
        assert os.path.exists(socket)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 5
    assert not os.path.exists(socket)


def test_mask_url_hides_password() -> None:
    """A password in a Redis URL is never shown."""
    assert mask_url("redis://u:secret@h:6379/0") == "redis://u:***@h:6379/0"
    assert mask_url("redis://h:6379") == "redis://h:6379"


async def test_a_redis_that_does_not_answer_is_state_unavailable(tmp_path: Path) -> None:
    """A configured URL nobody listens on fails as StateUnavailable (code state_unavailable), not redis's own error."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = Config(redis=RedisSettings(url=f"redis://127.0.0.1:{port}/0"), state=StateSettings(dir=tmp_path))
    with pytest.raises(StateUnavailable) as info:
        await open_redis(config)
    assert info.value.code == "state_unavailable" and info.value.detail
