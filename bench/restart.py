"""Benchmark: request → verified verdict, Pitstop's restart against the hand sequence it replaces.

Same host (the in-process asyncssh SSH host on 127.0.0.1, commands in real bash), same SSH
connection pool, same light job (a Python process writing a log line every 0.2 s, which exits
promptly on SIGTERM), side by side in one run:

- **pitstop**: ``Restarter.restart`` then ``Restarter.verify`` (pre-flight, stop by recorded
  identity, launch detached, evidence polled until launch + start_window);
- **hand**: the sequence people typed, over the same SSH, as one ``bash -c``: a pattern kill
  (fixed so it cannot match its own shell: the character class in ``[d]flash-bench-…``),
  ``sleep 8``, ``nohup`` launch, then the *same* verification window as Pitstop's
  ``start_window``, then count the processes.

Prints both times and the ratio, and ends with ONE summary line starting ``restart:``.
Target: Pitstop at least 2x faster to a verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from pipeline.config import Config, JobConfig, RedisSettings, StateSettings
from pipeline.events import Events
from pipeline.redisconn import open_redis
from pipeline.remote import SSHPool
from pipeline.restart import Restarter
from pipeline.runs import RunStore
from pipeline.testhost import start_local_ssh_host

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


def hand_script(token: str, workdir: Path, launch: list[str], log: Path, window: float) -> str:
    """The hand sequence as one shell command line (what people typed, made not to kill itself)."""
    pattern = f"[{token[0]}]{token[1:]}"
    return (
        f"ps -eo pid=,args= | grep -e {shlex.quote(pattern)} | awk '{{print $1}}' | xargs -r kill -9; "
        f"sleep {HAND_SETTLE:g}; "
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


async def bench(window: float) -> int:
    """Run both sequences once each; print the comparison. :returns: exit status (0 ok)."""
    tmp = Path(tempfile.mkdtemp(prefix="pitstop-bench-restart-"))
    token = f"dflash-bench-{uuid.uuid4().hex[:10]}"
    workdir = tmp / "work"
    workdir.mkdir()
    (workdir / "job.py").write_text(JOB)
    run_sh = workdir / "run.sh"  # the launcher people start: its own line does not hold the token
    run_sh.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -u job.py {token}\n")
    run_sh.chmod(0o755)
    subprocess.run(["git", "init", "-q"], cwd=workdir, check=True)
    log = workdir / "train.log"
    launch = ["./run.sh"]
    host = await start_local_ssh_host(tmp / "ssh")
    job = JobConfig(
        host="local",
        workdir=str(workdir),
        launch=launch,
        log=str(log),
        match=token,
        processes=1,
        start_window=window,
        stop_timeout=10,
    )
    config = Config(
        hosts={"local": host.host_config()},
        jobs={"bench": job},
        redis=RedisSettings(prefix="bench:"),
        state=StateSettings(dir=tmp / "state"),
    )
    redis = await open_redis(config)
    ssh = SSHPool(config)
    runs = RunStore(redis.client, redis.prefix)
    restarter = Restarter(config, ssh, runs, Events(redis.client, redis.prefix))
    try:
        first = await restarter.start(await runs.create("bench", "bench", action="start"))
        if first.pid is None:
            print(f"could not start the job: {first.verdict_line}")
            return 1
        await restarter.verify(first)

        started = time.monotonic()
        run = await restarter.restart(await runs.create("bench", "bench"))
        run = await restarter.verify(run)
        pitstop = time.monotonic() - started
        steps = ", ".join(f"{s.step.value} {s.duration or 0:.2f} s" for s in run.steps)
        print(f"pitstop: {pitstop:.2f} s to `{run.verdict_line}` ({steps})")

        started = time.monotonic()
        result = await ssh.run(
            "local", ["bash", "-c", hand_script(token, workdir, launch, log, window)], timeout=60
        )
        hand = time.monotonic() - started
        counted = result.stdout.strip() or f"(no output; exit {result.exit_status or result.exit_signal})"
        print(
            f"hand:    {hand:.2f} s to a count of {counted} process(es) (sleep {HAND_SETTLE:g} + window {window:g} s)"
        )

        ratio = hand / pitstop if pitstop > 0 else float("inf")
        print(
            f"restart: pitstop {pitstop:.1f}s hand {hand:.1f}s ratio {ratio:.1f}x (verdict {run.verdict_line})"
        )
        return 0 if run.verdict_line and run.verdict_line.startswith("RUNNING") else 1
    finally:
        kill_token(token)
        await ssh.close()
        await redis.aclose()
        await host.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    """Parse ``--window`` and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--window", type=float, default=2.0, help="start_window / verification window, s")
    args = parser.parse_args()
    return asyncio.run(bench(args.window))


if __name__ == "__main__":
    sys.exit(main())
