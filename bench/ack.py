"""How fast Pitstop acks Slack, side by side with a bare Bolt app that only acks.

Four child processes: one local stand-in for the Slack Web API (tests/fixtures/slack.py; it
also takes the ``response_url`` answers, as Slack does, outside the servers measured), Pitstop
as ``pitstop serve`` builds it (Bolt over aiohttp, the real dispatcher, embedded Redis, the
scheduler), a bare ``AsyncApp`` whose slash command listener only calls ``ack()`` (Bolt's
defaults), and the same bare app acking inline (``process_before_response=True``, the path
Pitstop uses).  This process sends signed slash commands over HTTP, 20 at a time, and measures
the time to the ack:

- ``help``: answered through ``response_url`` after the ack;
- ``restart``: a restart of a job on a host that refuses connections: "queued run …" (or the
  lock holder) follows through ``response_url`` while the remote part runs after the ack.

Pitstop acks before it parses, dedupes, reads roles or audits (:mod:`bot.slack.app`), so its
ack should cost what Bolt's does.  The load runs in rounds, the four series interleaved (each
round in a rotated order), and after each Pitstop round the benchmark waits until Slack has
received every answer, so one server's follow-up work never lands in another's round.  A
ratio is the median over rounds of a series' p99 over the bare app's p99 in the same round, so
a burst of load from elsewhere on the machine skews one round, not the result.

Target: Pitstop's p99 within 1.5x of the bare app's for both ``help`` and ``restart``.  Fails
(exit 1) when an ack is not HTTP 200, an answer does not arrive, or a p99 ratio exceeds 3x
(a regression: work before the ack again).  The last line is the summary:
``ack: help p99 X ms (R.RRx) restart p99 Y ms (S.SSx) vs bare p99 Z ms``.

Run: ``.venv/bin/python bench/ack.py [--requests 400] [--concurrency 20] [--rounds 4] [--quick]``.
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
from benchlib import Checks  # noqa: E402

from tests.fixtures.slack import BOT_TOKEN, SIGNING_SECRET, FakeSlack, form_body, sign, slash_command  # noqa: E402

READY = "READY "
TARGET = 1.5  #: the stated target: Pitstop's p99 within this many times the bare app's
BOUND = 3.0  #: beyond this the ack path has regressed (work before the ack again)


# --- the servers (child processes) -----------------------------------------------------------------


async def _serve_slack() -> None:
    """The Slack stand-in, with ``GET /bench/answers`` (how many response_url answers arrived) and
    ``GET /bench/urls?n=N`` (N fresh response_urls: the stand-in refuses URLs it did not issue)."""
    from aiohttp import web

    fake = FakeSlack()

    async def answers(_request: web.Request) -> web.Response:
        return web.json_response({"answers": len(await fake.calls("response_url", ok=True))})

    async def urls(request: web.Request) -> web.Response:
        return web.json_response({"urls": [fake.response_url() for _ in range(int(request.query["n"]))]})

    fake._app.router.add_get("/bench/answers", answers)
    fake._app.router.add_get("/bench/urls", urls)  # each command gets its own response_url, as from Slack
    async with fake:
        print(READY + json.dumps({"url": fake.url}), flush=True)
        await _until_stdin_closes()


async def _serve_pitstop(state_dir: str, slack: str) -> None:
    from bot.runtime.serve import http_app, open_runtime, start_http
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
    runtime = await open_runtime(
        config, bot_token=BOT_TOKEN, api_url=f"{slack}/api/", signing_secret=SIGNING_SECRET, scheduler=True
    )
    try:
        server = await start_http(http_app(runtime.surface, runtime.health), host="127.0.0.1", port=0)
        try:
            print(READY + json.dumps({"port": server.port}), flush=True)
            await _until_stdin_closes()
        finally:
            await server.close()
    finally:
        await runtime.close(drain=5)


async def _serve_bare(slack: str, *, inline: bool) -> None:
    from aiohttp import web
    from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
    from slack_bolt.async_app import AsyncApp
    from slack_sdk.web.async_client import AsyncWebClient

    app = AsyncApp(
        client=AsyncWebClient(token=BOT_TOKEN, base_url=f"{slack}/api/"),
        signing_secret=SIGNING_SECRET,
        process_before_response=inline,
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
        print(READY + json.dumps({"port": port}), flush=True)
        await _until_stdin_closes()
    finally:
        await runner.cleanup()


async def _until_stdin_closes() -> None:
    await asyncio.to_thread(sys.stdin.read)


# --- the load (this process) ---------------------------------------------------------------------


class Child:
    """A child process of this benchmark; :attr:`ready` is what it printed after READY."""

    def __init__(self, kind: str, state_dir: str, slack: str = "") -> None:
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", kind, "--state-dir", state_dir, "--slack", slack],
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
        self.ready: dict[str, Any] = json.loads(line[len(READY) :])

    @property
    def url(self) -> str:
        """The server's Slack request URL."""
        return f"http://127.0.0.1:{self.ready['port']}/slack/events"

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
    session: aiohttp.ClientSession, url: str, slack: str, text: str, total: int, concurrency: int
) -> list[float]:
    """Send ``total`` signed slash commands, ``concurrency`` at a time; returns ack times in ms.

    :raises RuntimeError: if an ack is not HTTP 200.
    """
    async with session.get(f"{slack}/bench/urls", params={"n": str(total)}) as resp:
        issued = (await resp.json())["urls"]
    bodies = [form_body(slash_command(text, response_url=u)) for u in issued]
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


async def _answers(session: aiohttp.ClientSession, slack: str) -> int:
    async with session.get(f"{slack}/bench/answers") as resp:
        return int((await resp.json())["answers"])


async def _await_answers(session: aiohttp.ClientSession, slack: str, count: int, timeout: float) -> int:
    """Poll Slack (every 20 ms, at most ``timeout`` s) until ``count`` answers arrived; returns the count."""
    deadline = time.monotonic() + timeout
    got = await _answers(session, slack)
    while got < count and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        got = await _answers(session, slack)
    return got


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


async def _bench(total: int, concurrency: int, rounds: int, quick: bool) -> int:
    per_round = max(1, total // rounds)
    with tempfile.TemporaryDirectory(prefix="pitstop-bench-") as tmp:
        slack_child = Child("slack", tmp)
        slack = str(slack_child.ready["url"])
        children: list[Child] = []
        try:
            pitstop = Child("pitstop", tmp, slack)
            children.append(pitstop)
            bare = Child("bare", tmp, slack)
            children.append(bare)
            inline = Child("bare-inline", tmp, slack)
            children.append(inline)
            series = [
                ("pitstop help", pitstop, "help"),
                ("bare", bare, "help"),
                ("bare, ack inline", inline, "help"),
                ("pitstop restart", pitstop, "restart dflash"),
            ]
            results: dict[str, list[list[float]]] = {name: [] for name, _, _ in series}
            connector = aiohttp.TCPConnector(limit=concurrency + 2)
            async with aiohttp.ClientSession(connector=connector) as session:
                expected = 0
                for child in (pitstop, bare, inline):  # warm up: connections, auth.test, imports
                    await _load(session, child.url, slack, "help", 2 * concurrency, concurrency)
                expected += 2 * concurrency
                answered = await _await_answers(session, slack, expected, 30)
                for r in range(rounds):
                    for name, child, text in series[r % len(series) :] + series[: r % len(series)]:
                        results[name].append(
                            await _load(session, child.url, slack, text, per_round, concurrency)
                        )
                        if child is pitstop:
                            expected += per_round
                            answered = await _await_answers(session, slack, expected, 30)
        finally:
            for child in children:
                child.close()
            slack_child.close()
    pooled = {name: [t for r in rounds_of for t in r] for name, rounds_of in results.items()}
    bare_p99 = _pct(pooled["bare"], 99)
    print(f"{per_round * rounds} signed slash commands per series, {concurrency} at a time, over HTTP,")
    print(
        f"in {rounds} interleaved rounds (time to the ack; ratios: median over rounds of p99 / bare's p99):"
    )

    def ratio(name: str) -> float:
        """The median over rounds of the series' p99 over the bare app's p99 in the same round."""
        return statistics.median(
            _pct(a, 99) / _pct(b, 99) for a, b in zip(results[name], results["bare"], strict=True)
        )

    for name, values in pooled.items():
        p50, p99 = _pct(values, 50), _pct(values, 99)
        print(
            f"  {name:17s} p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  mean {statistics.fmean(values):6.1f} ms"
            f"  max {max(values):6.1f} ms  ratio p99 {ratio(name):4.2f}x"
        )
    help_p99, restart_p99 = _pct(pooled["pitstop help"], 99), _pct(pooled["pitstop restart"], 99)
    help_ratio, restart_ratio = ratio("pitstop help"), ratio("pitstop restart")
    checks = Checks(quick=quick)
    checks.correct(
        "every Pitstop request answered on response_url", answered >= expected, f"{answered}/{expected}"
    )
    for verb, got in (("help", help_ratio), ("restart", restart_ratio)):
        checks.bound(f"{verb} p99 within {BOUND:g}x of bare", got <= BOUND, f"{got:.2f}x")
        checks.target(f"{verb} p99 within {TARGET:g}x of bare", got <= TARGET, f"{got:.2f}x")
    print(
        checks.summary(
            f"ack: help p99 {help_p99:.1f} ms ({help_ratio:.2f}x) restart p99 {restart_p99:.1f} ms "
            f"({restart_ratio:.2f}x) vs bare p99 {bare_p99:.1f} ms"
        )
    )
    return checks.status


def main() -> int:
    """Run the benchmark (or, with ``--serve``, one of its servers)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=400, help="requests per series")
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds the requests are split into")
    p.add_argument(
        "--quick", action="store_true", help="20 requests per series, 5 at a time, no speed checks"
    )
    p.add_argument("--serve", choices=["slack", "pitstop", "bare", "bare-inline"], help=argparse.SUPPRESS)
    p.add_argument("--state-dir", help=argparse.SUPPRESS)
    p.add_argument("--slack", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve == "slack":
        asyncio.run(_serve_slack())
        return 0
    if args.serve == "pitstop":
        asyncio.run(_serve_pitstop(args.state_dir, args.slack))
        return 0
    if args.serve in ("bare", "bare-inline"):
        asyncio.run(_serve_bare(args.slack, inline=args.serve == "bare-inline"))
        return 0
    if args.quick:
        return asyncio.run(_bench(20, 5, 2, quick=True))
    return asyncio.run(_bench(args.requests, args.concurrency, args.rounds, quick=False))


if __name__ == "__main__":
    sys.exit(main())
