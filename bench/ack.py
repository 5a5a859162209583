"""How fast Pitstop acks Slack, side by side with a bare Bolt app that only acks.

Two servers run as child processes, each beside its own local stand-in for the Slack Web API
(tests/fixtures/slack.py): Pitstop as ``pitstop serve`` builds it (Bolt over aiohttp, the
real dispatcher, embedded Redis, the scheduler), and a bare ``AsyncApp`` whose slash command
listener only calls ``ack()`` (Bolt's defaults).  This process sends 200 signed slash commands,
20 at a time, to each over HTTP and measures the time to the ack:

- ``help``: a fast read, answered in the ack itself;
- ``restart``: a restart-like command (a job on a host that refuses connections), acked with
  "queued run …" (or the lock holder) while the remote part runs after the ack.

A third row, the bare app with ``process_before_response=True`` (the listener's ``ack()`` is
the response), shows what Bolt's default path costs: it polls for the ack every 10 ms.
Pitstop uses the inline path and acks from the listener itself.

Targets: Pitstop's p99 under 50 ms on a 2-core machine and within 1.5x of the bare app.
The last line is the summary: ``ack: pitstop p50 X ms p99 Y ms | bare p50 … p99 … | ratio p99 Z.ZZx``.

Run: ``.venv/bin/python bench/ack.py [--requests 200] [--concurrency 20]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from tests.fixtures.slack import BOT_TOKEN, SIGNING_SECRET, FakeSlack, form_body, sign, slash_command  # noqa: E402

READY = "READY "


# --- the servers (child processes) -----------------------------------------------------------------


async def _serve_pitstop(state_dir: str) -> None:
    from bot.serve import http_app, open_runtime, start_http
    from pipeline.config import parse_config

    config = parse_config(
        {
            "slack": {"announce_channel": "C0BENCH", "pace": 0},
            "auth": {"operators": ["*"], "viewers": ["*"]},
            "state": {"dir": state_dir},
            "redis": {"prefix": f"bench{uuid.uuid4().hex[:8]}:"},
            "hosts": {"nowhere": {"address": "127.0.0.1", "port": 9, "connect_timeout": 2}},
            "jobs": {
                "dflash": {
                    "host": "nowhere",
                    "workdir": "/srv/dflash",
                    "launch": ["./run.sh"],
                    "log": "/srv/dflash/train.log",
                    "match": f"^bench-{uuid.uuid4().hex} ",
                }
            },
        }
    )
    async with FakeSlack() as fake:
        runtime = await open_runtime(
            config, bot_token=BOT_TOKEN, api_url=fake.api_url, signing_secret=SIGNING_SECRET, scheduler=True
        )
        try:
            server = await start_http(http_app(runtime.surface, runtime.health), host="127.0.0.1", port=0)
            try:
                print(READY + json.dumps({"port": server.port, "slack": fake.url}), flush=True)
                await _until_stdin_closes()
            finally:
                await server.close()
        finally:
            await runtime.close(drain=5)


async def _serve_bare(*, inline: bool) -> None:
    from aiohttp import web
    from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
    from slack_bolt.async_app import AsyncApp
    from slack_sdk.web.async_client import AsyncWebClient

    async with FakeSlack() as fake:
        app = AsyncApp(
            client=AsyncWebClient(token=BOT_TOKEN, base_url=fake.api_url), signing_secret=SIGNING_SECRET
        )

        @app.command("/train")
        async def only_ack(ack: Any) -> None:
            await ack()

        async def events(request: web.Request) -> web.Response:
            return await to_aiohttp_response(await app.async_dispatch(await to_bolt_request(request)))

        web_app = web.Application()
        web_app.router.add_post("/slack/events", events)
        runner = web.AppRunner(web_app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            print(READY + json.dumps({"port": port, "slack": fake.url}), flush=True)
            await _until_stdin_closes()
        finally:
            await runner.cleanup()


async def _until_stdin_closes() -> None:
    await asyncio.to_thread(sys.stdin.read)


# --- the load (this process) ---------------------------------------------------------------------


class Child:
    """A server child process; :attr:`url` once it printed READY."""

    def __init__(self, kind: str, state_dir: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", kind, "--state-dir", state_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith(READY) or not line:
                break
        if not line.startswith(READY):
            self.close()
            raise RuntimeError(f"{kind} server did not start (exit {self.proc.poll()})")
        ready = json.loads(line[len(READY) :])
        self.url = f"http://127.0.0.1:{ready['port']}/slack/events"
        self.slack = str(ready["slack"])

    def close(self) -> None:
        """Close its stdin (it shuts down cleanly), then wait for it."""
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def _load(
    session: aiohttp.ClientSession, child: Child, text: str, total: int, concurrency: int
) -> list[float]:
    """Send ``total`` signed slash commands, ``concurrency`` at a time; returns ack times in ms."""
    url = child.url
    bodies = [
        form_body(slash_command(text, response_url=f"{child.slack}/response/bench")) for _ in range(total)
    ]
    times: list[float] = []
    queue: asyncio.Queue[str] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)

    async def worker() -> None:
        while not queue.empty():
            body = queue.get_nowait()
            headers = {"Content-Type": "application/x-www-form-urlencoded", **sign(SIGNING_SECRET, body)}
            started = time.perf_counter()
            async with session.post(url, data=body.encode(), headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{url}: HTTP {resp.status}")
            times.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return times


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


async def _bench(total: int, concurrency: int) -> int:
    with tempfile.TemporaryDirectory(prefix="pitstop-bench-") as tmp:
        pitstop = Child("pitstop", tmp)
        bare = Child("bare", tmp)
        inline = Child("bare-inline", tmp)
        try:
            connector = aiohttp.TCPConnector(limit=concurrency)
            async with aiohttp.ClientSession(connector=connector) as session:
                for child in (pitstop, bare, inline):  # warm up: connections, auth.test, imports
                    await _load(session, child, "help", 40, concurrency)
                results: dict[str, list[float]] = {}
                results["pitstop help"] = await _load(session, pitstop, "help", total, concurrency)
                results["bare"] = await _load(session, bare, "help", total, concurrency)
                results["bare, ack inline"] = await _load(session, inline, "help", total, concurrency)
                results["pitstop restart"] = await _load(
                    session, pitstop, "restart dflash", total, concurrency
                )
        finally:
            for child in (pitstop, bare, inline):
                child.close()
    bare_p99 = _pct(results["bare"], 99)
    print(f"{total} signed slash commands, {concurrency} at a time, over HTTP (time to the ack):")
    for name, values in results.items():
        p50, p99 = _pct(values, 50), _pct(values, 99)
        print(
            f"  {name:17s} p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  mean {statistics.fmean(values):6.1f} ms"
            f"  max {max(values):6.1f} ms  ratio p99 {p99 / bare_p99:4.2f}x"
        )
    help_values = results["pitstop help"]
    print(
        f"ack: pitstop p50 {_pct(help_values, 50):.1f} ms p99 {_pct(help_values, 99):.1f} ms | "
        f"bare p50 {_pct(results['bare'], 50):.1f} ms p99 {bare_p99:.1f} ms | "
        f"ratio p99 {_pct(help_values, 99) / bare_p99:.2f}x"
    )
    return 0


def main() -> int:
    """Run the benchmark (or, with ``--serve``, one of its servers)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--serve", choices=["pitstop", "bare", "bare-inline"], help=argparse.SUPPRESS)
    p.add_argument("--state-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve == "pitstop":
        asyncio.run(_serve_pitstop(args.state_dir))
        return 0
    if args.serve in ("bare", "bare-inline"):
        asyncio.run(_serve_bare(inline=args.serve == "bare-inline"))
        return 0
    return asyncio.run(_bench(args.requests, args.concurrency))


if __name__ == "__main__":
    sys.exit(main())
