"""Benchmark: request → verified verdict, Pitstop's restart against supervisord and the hand sequence.

The same light job (a Python process writing a log line every 0.2 s, which exits promptly on
SIGTERM), the same verification window, side by side in one run:

- **pitstop**: over SSH (the in-process asyncssh host on 127.0.0.1, commands in real bash):
  ``Restarter.restart`` then ``Restarter.verify`` (pre-flight, stop by recorded identity, launch
  detached, evidence polled until launch + ``start_window``);
- **supervisord** (from PyPI, run locally by this benchmark, ``startsecs`` = Pitstop's
  ``start_window``): ``stopProcess`` then ``startProcess`` over its XML-RPC socket, each
  waiting (``wait=True``) — its restart is "started" once the process stayed up ``startsecs``;
- **hand**: the sequence people typed, over the same SSH, as one ``bash -c``: a pattern kill
  (fixed so it cannot match its own shell: the character class in ``[d]flash-bench-…``),
  ``sleep 8``, ``nohup`` launch, the *same* window, then count the processes.

Then the same restart *typed*, ``--repeat`` times each way, interleaved, each waited to its verdict:

- **say**: ``restart bench`` through the dispatcher as ``pitstop say`` runs it (its outbox prints);
- **slack**: the signed slash command ``/train restart bench`` over HTTP to ``pitstop serve``'s
  app (Bolt, ack first, the same dispatcher), against the Slack stand-in
  (``tests/fixtures/slack.py``, its rate limits on) with ``[slack] pace`` at its default (1 s):
  the run's message, its updates and its thread go through the paced outbox.

Each prints its time from the request to the end of its launch step and its step durations (as
the run records them); the difference is what Slack costs a restart.  Target: Slack within
:data:`TYPED_TARGET` s of ``say``.

Pitstop and supervisord run ``--repeat`` times each, interleaved (median); the hand sequence
once.  The window is a job's default ``start_window`` (10 s) unless ``--window`` says otherwise.
Each prints one line with its fixed costs per step beside the window they all wait: the
costs beyond the window are what differs, and the ratio shrinks as the window grows.
Target: Pitstop within 1.1x of supervisord (local, no SSH).  Fails (exit 1) when a verdict is
not RUNNING, supervisord's program is not RUNNING, Pitstop takes over 1.5x supervisord's
time (a regression in the fixed costs), the run's message in Slack was not coalesced (as many
``chat.update`` as step changes) or was threaded before its headline, or typed in Slack the
launch comes over :data:`TYPED_BOUND` s after ``say``'s (a surface holding the sequence again).  ``--quick``: a 1 s window, a 1 s hand wait, one
repeat, no speed checks.  Ends with ONE summary line starting ``restart:``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import xmlrpc.client
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the stand-in Slack lives under tests/
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from benchlib import Checks  # noqa: E402
from supervisor.xmlrpc import SupervisorTransport  # noqa: E402

from bot.runtime.assembly import build_context, close_context  # noqa: E402
from bot.runtime.serve import http_app, open_runtime, start_http  # noqa: E402
from devhost.sshhost import start_local_ssh_host  # noqa: E402
from handlers.context import Context  # noqa: E402
from handlers.outbox import MemoryOutbox  # noqa: E402
from handlers.request.dispatch import Dispatcher, Request  # noqa: E402
from handlers.views.read import follow_run  # noqa: E402
from pipeline.config import AuthSettings, Config, JobConfig, RedisSettings, SlackSettings, StateSettings  # noqa: E402
from pipeline.engines.runner import Runner as Restarter  # noqa: E402
from pipeline.host.remote import SSHPool  # noqa: E402
from pipeline.state.events import EventKind, Events  # noqa: E402
from pipeline.state.redisconn import open_redis  # noqa: E402
from pipeline.state.runs import RunRecord, RunStore  # noqa: E402
from pipeline.verdict import Step  # noqa: E402
from tests.fixtures.slack import BOT_TOKEN, SIGNING_SECRET, FakeSlack, form_body, sign, slash_command  # noqa: E402

JOB = """\
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("started", flush=True)
i = 0
while True:
    i += 1
    print("step %d" % i, flush=True)
    time.sleep(0.2)
"""
HAND_SETTLE = 8.0  #: the hand sequence's fixed wait after the kill
DEFAULT_WINDOW = int(JobConfig.model_fields["start_window"].default)  #: a job's start_window unless set
TARGET = 1.1  #: the stated target: Pitstop within this many times supervisord's time
BOUND = 1.5  #: beyond this Pitstop's fixed costs have regressed
TYPED_TARGET = 0.5  #: the stated target: typed in Slack, the launch within this many s of ``say``'s
TYPED_BOUND = 2.0  #: beyond this a surface holds the sequence again (a paced post is 1 s)
ANNOUNCE = "C0ANNOUNCE"  #: the announce channel (one the stand-in has, the bot a member)
SUPERVISORD_CONF = """\
[unix_http_server]
file={sock}

[supervisord]
logfile={root}/supervisord.log
pidfile={root}/supervisord.pid
childlogdir={root}
nodaemon=true

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[program:bench]
command={command}
directory={workdir}
startsecs={startsecs}
startretries=0
autostart=true
autorestart=false
stopsignal=TERM
stopwaitsecs=10
redirect_stderr=true
stdout_logfile={workdir}/supervised.log
"""


class Supervisord:
    """supervisord as a child process of this benchmark, driven over its XML-RPC unix socket.

    :param root: a directory for its socket, config and logs.
    :param command: the program's command line.
    :param workdir: the program's working directory.
    :param startsecs: seconds the program must stay up to count as started (an integer).
    :raises RuntimeError: if it does not answer within 30 s.
    """

    def __init__(self, root: Path, command: str, workdir: Path, startsecs: int) -> None:
        sock = root / "supervisor.sock"
        conf = root / "supervisord.conf"
        conf.write_text(
            SUPERVISORD_CONF.format(
                sock=sock, root=root, command=command, workdir=workdir, startsecs=startsecs
            )
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            transport = SupervisorTransport(None, None, serverurl=f"unix://{sock}")
            self.rpc: Any = xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)
            try:
                if self.rpc.supervisor.getState()["statename"] == "RUNNING":
                    break
            except (OSError, xmlrpc.client.Fault, http.client.HTTPException):
                pass  # not listening yet: a fresh connection next time
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"supervisord did not start (see {root}/supervisord.log)")
            time.sleep(0.05)

    def state(self) -> str:
        """The program's state name (``RUNNING``, ``STARTING``, ``STOPPED``, …)."""
        return str(self.rpc.supervisor.getProcessInfo("bench")["statename"])

    def restart(self) -> tuple[float, float]:
        """``stopProcess`` then ``startProcess``, each waiting; returns the seconds of each."""
        t0 = time.monotonic()
        self.rpc.supervisor.stopProcess("bench", True)
        t1 = time.monotonic()
        self.rpc.supervisor.startProcess("bench", True)
        return t1 - t0, time.monotonic() - t1

    def close(self) -> None:
        """Stop supervisord (SIGTERM: it stops its program first), then wait for it."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def hand_script(token: str, workdir: Path, launch: list[str], log: Path, window: float, settle: float) -> str:
    """The hand sequence as one shell command line (what people typed, made not to kill itself)."""
    pattern = f"[{token[0]}]{token[1:]}"
    return (
        f"ps -eo pid=,args= | grep -e {shlex.quote(pattern)} | awk '{{print $1}}' | xargs -r kill -9; "
        f"sleep {settle:g}; "
        f"cd {shlex.quote(str(workdir))}; nohup {shlex.join(launch)} >> {shlex.quote(str(log))} 2>&1 & "
        f"sleep {window:g}; "
        f"ps -eo args= | grep -c -e {shlex.quote(pattern)}"
    )


def kill_token(token: str) -> None:
    """SIGKILL whatever still runs with ``token`` in its command line (clean-up; reads /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmd:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass


def write_job(workdir: Path, name: str, token: str) -> Path:
    """A launcher ``name`` in ``workdir`` running the light job with ``token`` in its arguments
    (the launcher's own command line does not hold the token)."""
    script = workdir / name
    script.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -u job.py {token}\n")
    script.chmod(0o755)
    return script


async def launched(ctx: Context, job: str, after: str, timeout: float) -> RunRecord:
    """The run whose launch step ends first after stream id ``after`` (its ``step`` events awaited).

    :param timeout: seconds to wait at most.
    :raises TimeoutError: if no launch ended within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        event = await ctx.events.wait_for(EventKind.STEP, job, after=after, timeout=left)
        if event is None:
            break
        after = event.id
        if event.data.get("step") == Step.LAUNCH.value and event.data.get("outcome") != "running":
            return await ctx.runs.get(str(event.data["run_id"]))
    raise TimeoutError(f"no launch of {job} ended within {timeout:g} s")


class Typed:
    """The same restart typed two ways, each awaited to its verdict: ``pitstop say``'s dispatcher
    (its printing outbox) and a signed slash command to ``pitstop serve``'s HTTP app against the
    Slack stand-in, with the configured ``[slack] pace``.

    Open with :meth:`open`, end with :meth:`close`.

    :param config: the benchmark's config, its ``[slack]`` and ``[auth]`` set.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.stack = contextlib.AsyncExitStack()
        self.fake = FakeSlack()
        self.say: Context | None = None
        self.dispatcher: Dispatcher | None = None
        self.runtime: Any = None
        self.url = ""
        self.http: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        """Start the Slack stand-in, the served app (no scheduler: verdicts are delivered here)
        and ``say``'s context."""
        await self.stack.enter_async_context(self.fake)
        self.say = await build_context(self.config, MemoryOutbox())
        self.stack.push_async_callback(close_context, self.say)
        self.dispatcher = Dispatcher(self.say)
        self.stack.push_async_callback(self.dispatcher.drain, 10.0)
        self.runtime = await open_runtime(
            self.config,
            bot_token=BOT_TOKEN,
            api_url=self.fake.api_url,
            signing_secret=SIGNING_SECRET,
            scheduler=False,
        )
        self.stack.push_async_callback(self.runtime.close, 30)
        server = await start_http(
            http_app(self.runtime.surface, self.runtime.health), host="127.0.0.1", port=0
        )
        self.stack.push_async_callback(server.close)
        self.url = f"{server.url}/slack/events"
        self.http = await self.stack.enter_async_context(aiohttp.ClientSession())

    async def close(self) -> None:
        """Close everything :meth:`open` started, in reverse order."""
        await self.stack.aclose()

    async def restart(self, how: str, timeout: float) -> tuple[float, RunRecord]:
        """``restart bench`` typed ``how`` (``say`` | ``slack``), awaited to its verdict.

        :param timeout: seconds allowed for the launch, and again for the verdict.
        :returns: seconds from the request to the end of the launch step, and the verified run.
        :raises RuntimeError: if Slack did not ack the command with HTTP 200.
        """
        ctx = self.say if how == "say" else self.runtime.ctx
        assert ctx is not None and self.dispatcher is not None and self.http is not None
        after = await ctx.events.last_id()
        started = time.time()
        if how == "say":
            request = Request(
                text="restart bench", user="bench", delivery_id=f"say:{uuid.uuid4().hex}", surface="say"
            )
            await self.dispatcher.handle(request)
        else:
            body = form_body(
                slash_command("restart bench", channel=ANNOUNCE, response_url=self.fake.response_url())
            )
            headers = {"Content-Type": "application/x-www-form-urlencoded", **sign(SIGNING_SECRET, body)}
            async with self.http.post(self.url, data=body.encode(), headers=headers) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"Slack's slash command was answered HTTP {resp.status}")
        run = await launched(ctx, "bench", after, timeout)
        launch = run.step(Step.LAUNCH)
        took = (launch.ended_at or started) - started if launch is not None else math.nan
        done = run
        async for done in follow_run(ctx, run.id):  # noqa: B007  (its verdict delivered here when due, as say --wait does)
            pass
        return took, done

    async def settled(self) -> tuple[int, int, bool]:
        """Once the served app's sequences ended: of the newest run message in Slack, its
        ``chat.update`` count and the step changes it could have shown, and whether its headline
        was posted before every reply in its thread."""
        await self.runtime.dispatcher.drain(30.0)
        (run,) = await self.runtime.ctx.runs.recent("bench", 1)
        where = await self.runtime.outbox.where(f"run:{run.id}")
        if where is None:
            return 0, 0, False
        _channel, ts = where
        updates = [c for c in await self.fake.calls("chat.update", ok=True) if c.args.get("ts") == ts]
        posts = await self.fake.calls("chat.postMessage", ok=True)
        head = next((i for i, c in enumerate(posts) if c.response.get("ts") == ts), None)
        replies = [i for i, c in enumerate(posts) if c.args.get("thread_ts") == ts]
        changes = 1 + sum(1 if s.ended_at is None else 2 for s in run.steps)
        return len(updates), changes, head is not None and all(i > head for i in replies)


async def bench(window: int, settle: float, repeat: int, quick: bool) -> int:
    """Run the three side by side; print one line each and the summary. :returns: exit status."""
    tmp = Path(tempfile.mkdtemp(prefix="pitstop-bench-restart-"))
    token = f"dflash-bench-{uuid.uuid4().hex[:10]}"
    sup_token = f"dflash-supervised-{uuid.uuid4().hex[:10]}"  # its own: Pitstop never matches it
    workdir = tmp / "work"
    workdir.mkdir()
    (workdir / "job.py").write_text(JOB)
    write_job(workdir, "run.sh", token)
    sup_run = write_job(workdir, "run_supervised.sh", sup_token)
    subprocess.run(["git", "init", "-q"], cwd=workdir, check=True)
    log = workdir / "train.log"
    launch = ["./run.sh"]
    checks = Checks(quick=quick)
    host = await start_local_ssh_host(tmp / "ssh")
    job = JobConfig(
        host="local",
        workdir=str(workdir),
        launch=launch,
        log=str(log),
        match=token,
        processes=1,
        start_window=float(window),
        stop_timeout=10,
    )
    config = Config(
        hosts={"local": host.host_config()},
        jobs={"bench": job},
        redis=RedisSettings(prefix="bench:"),
        state=StateSettings(dir=tmp / "state"),
        slack=SlackSettings(announce_channel=ANNOUNCE),  # pace: its default
        auth=AuthSettings(operators=["*"], viewers=["*"]),
    )
    redis = await open_redis(config)
    ssh = SSHPool(config)
    runs = RunStore(redis.client, redis.prefix)
    restarter = Restarter(config, ssh, runs, Events(redis.client, redis.prefix))
    sup: Supervisord | None = None
    typed = Typed(config)
    try:
        # supervisord starts its program (autostart) while Pitstop starts and verifies its own
        sup = await asyncio.to_thread(Supervisord, tmp, str(sup_run), workdir, window)
        first = await restarter.start(await runs.create("bench", "bench", action="start"))
        if first.pid is None:
            print(f"could not start the job: {first.verdict_line}")
            return 1
        await restarter.verify(first)
        deadline = time.monotonic() + window + 30
        while await asyncio.to_thread(sup.state) != "RUNNING" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

        p_times: list[float] = []
        p_steps: list[dict[str, float]] = []
        s_times: list[tuple[float, float]] = []
        verdicts: list[str] = []
        sup_states: list[str] = []
        for i in range(repeat):
            for who in ("pitstop", "supervisord") if i % 2 == 0 else ("supervisord", "pitstop"):
                if who == "pitstop":
                    started = time.monotonic()
                    run = await restarter.restart(await runs.create("bench", "bench"))
                    run = await restarter.verify(run)
                    p_times.append(time.monotonic() - started)
                    p_steps.append({s.step.value: s.duration or 0.0 for s in run.steps})
                    verdicts.append(run.verdict_line or "(no verdict)")
                else:
                    s_times.append(await asyncio.to_thread(sup.restart))
                    sup_states.append(await asyncio.to_thread(sup.state))

        started = time.monotonic()
        result = await ssh.run(
            "local", ["bash", "-c", hand_script(token, workdir, launch, log, window, settle)], timeout=60
        )
        hand = time.monotonic() - started
        counted = result.stdout.strip() or f"(no output; exit {result.exit_status or result.exit_signal})"

        await typed.open()
        t_times: dict[str, list[float]] = {"say": [], "slack": []}
        t_steps: dict[str, list[dict[str, float]]] = {"say": [], "slack": []}
        t_verdicts: list[str] = []
        for i in range(repeat):
            for how in ("say", "slack") if i % 2 == 0 else ("slack", "say"):
                took, run = await typed.restart(how, timeout=window + 60.0)
                t_times[how].append(took)
                t_steps[how].append({s.step.value: s.duration or 0.0 for s in run.steps})
                t_verdicts.append(f"{how}: {run.verdict_line or '(no verdict)'}")
        updates, changes, ordered = await typed.settled()

        pitstop = statistics.median(p_times)
        supervisord = statistics.median(sum(t) for t in s_times)
        step = {name: statistics.median(s[name] for s in p_steps if name in s) for name in p_steps[0]}
        fixed = ", ".join(f"{name} {secs:.2f}" for name, secs in step.items() if name != "verify")
        s_stop = statistics.median(t[0] for t in s_times)
        s_start = statistics.median(t[1] for t in s_times)
        print(f"window {window} s (Pitstop's start_window = supervisord's startsecs); median of {repeat}:")
        print(
            f"  pitstop     {pitstop:5.2f} s  over SSH: {fixed}, verify {step.get('verify', 0):.2f} s "
            f"-> fixed {pitstop - window:.2f} s beyond the window ({verdicts[-1]})"
        )
        print(
            f"  supervisord {supervisord:5.2f} s  local: stop {s_stop:.2f}, start {s_start:.2f} s "
            f"(startsecs {window}) -> fixed {supervisord - window:.2f} s beyond the window ({sup_states[-1]})"
        )
        print(
            f"  hand        {hand:5.2f} s  over SSH: kill, sleep {settle:g}, nohup, sleep {window} "
            f"-> fixed {hand - window:.2f} s beyond the window (count {counted})"
        )
        typed_at = {how: statistics.median(t) for how, t in t_times.items()}
        gap = typed_at["slack"] - typed_at["say"]
        print(
            f"typed: request -> end of launch (its steps as recorded, verify excluded); median of {repeat}:"
        )
        for how, label in (("say", "pitstop say"), ("slack", "slash command")):
            steps = t_steps[how]
            shown = ", ".join(
                f"{name} {statistics.median(s[name] for s in steps if name in s):.2f}"
                for name in steps[0]
                if name != "verify"
            )
            where = (
                "dispatcher, printing outbox" if how == "say" else "Bolt over HTTP, stand-in Slack, pace 1 s"
            )
            print(f"  {label:13s} {typed_at[how]:5.2f} s  ({where}): {shown}")
        print(
            f"  slack - say  {gap:+5.2f} s  (the run message: {updates} chat.update for {changes} step changes)"
        )
        ratio = pitstop / supervisord
        checks.correct(
            "every typed restart's verdict RUNNING",
            all(v.split(": ", 1)[1].startswith("RUNNING") for v in t_verdicts),
            "; ".join(t_verdicts),
        )
        checks.correct(
            "the run message coalesced in Slack, its headline before its thread",
            0 < updates < changes and ordered,
            f"{updates} updates for {changes} changes, headline first: {ordered}",
        )
        checks.bound(f"slack within {TYPED_BOUND:g} s of say", gap <= TYPED_BOUND, f"{gap:+.2f} s")
        checks.target(f"slack within {TYPED_TARGET:g} s of say", gap <= TYPED_TARGET, f"{gap:+.2f} s")
        checks.correct(
            "every Pitstop verdict RUNNING",
            all(v.startswith("RUNNING") for v in verdicts),
            "; ".join(verdicts),
        )
        checks.correct(
            "supervisord's program RUNNING after each restart",
            all(st == "RUNNING" for st in sup_states),
            ", ".join(sup_states),
        )
        checks.correct("the hand sequence counted one process", counted == "1", counted)
        checks.bound(f"pitstop within {BOUND:g}x of supervisord", ratio <= BOUND, f"{ratio:.2f}x")
        checks.target(f"pitstop within {TARGET:g}x of supervisord", ratio <= TARGET, f"{ratio:.2f}x")
        print(
            checks.summary(
                f"restart: pitstop {pitstop:.2f}s supervisord {supervisord:.2f}s hand {hand:.1f}s "
                f"(window {window}s; fixed {pitstop - window:.2f}s / {supervisord - window:.2f}s / "
                f"{hand - window:.1f}s) pitstop/supervisord {ratio:.2f}x hand/pitstop {hand / pitstop:.1f}x; "
                f"typed to launch: say {typed_at['say']:.2f}s slack {typed_at['slack']:.2f}s ({gap:+.2f}s)"
            )
        )
        return checks.status
    finally:
        await typed.close()
        if sup is not None:
            await asyncio.to_thread(sup.close)
        kill_token(token)
        kill_token(sup_token)
        await ssh.close()
        await redis.aclose()
        await host.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    """Parse ``--window`` and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--window",
        type=int,
        default=DEFAULT_WINDOW,
        help=f"start_window = startsecs, whole seconds (default {DEFAULT_WINDOW}: a job's default start_window)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="restarts each of Pitstop and supervisord")
    parser.add_argument("--quick", action="store_true", help="1 s window, 1 s hand wait, one repeat")
    args = parser.parse_args()
    if args.quick:
        return asyncio.run(bench(1, 1.0, 1, quick=True))
    return asyncio.run(bench(args.window, HAND_SETTLE, args.repeat, quick=False))


if __name__ == "__main__":
    sys.exit(main())
