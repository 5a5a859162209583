"""Benchmark: Slurm's requeue → Pitstop's post, and → the requeue's verdict, in one run.

The figure a user asks: "when the cluster preempts my job, how soon does Pitstop say so, and
how soon does it say the job runs again?"  On the test cluster (:func:`tests.fixtures.slurm.start_cluster`:
Debian's Slurm, three nodes, ``low`` preemptable, ``high`` preempting), a light batch job of
2 × 4 tasks runs in ``low`` under Pitstop (the in-process SSH host as its login node, embedded
Redis, the watcher cycling every ``[jobs.NAME.watch] interval`` s and verifications delivered
every second, as the scheduler does).  A job of ``high`` then asks for all CPUs of one of its
nodes; the job stops on SIGTERM and its batch script asks for the requeue (as the reference
pipeline's does).  Measured, wall clock:

- **requeue**: the moment Slurm's ``Restarts`` grows (``scontrol`` polled every 0.1 s beside Pitstop);
- **post**: the requeue's post in the job's channel ("preempted by job N …");
- **verdict**: its verdict in that post's thread (``RUNNING 8/8 processes …``), which waits for
  Slurm's own delay before a requeued job may start (``BeginTime``) and ``start_window``.

The preempting job is submitted just after a watch cycle: the post's figure is the worst case, a
whole interval (a requeue lands anywhere in one: half of it on average).  Conditions: the post
names the preempting job and the verdict is RUNNING with every process (always); the post within
two watch intervals and 10 s (bound), within one interval and 2 s, the cycle's own time (target).
``--quick``: a 1 s interval, a 2 s ``start_window``, no speed checks.  Ends with ONE summary line
starting ``requeue:``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the test cluster lives under tests/
    sys.path.insert(0, str(ROOT))

from benchlib import Checks  # noqa: E402

from bot.runtime.assembly import build_context, close_context  # noqa: E402
from devhost.sshhost import start_local_ssh_host  # noqa: E402
from handlers.outbox import MemoryOutbox  # noqa: E402
from handlers.reply import Reply  # noqa: E402
from handlers.runs.view import thread_key  # noqa: E402
from handlers.watch.cycle import Watcher  # noqa: E402
from pipeline.config import Config, JobConfig, RedisSettings, StateSettings  # noqa: E402
from pipeline.config.jobs import WatchSettings  # noqa: E402
from pipeline.engines.slurm import SlurmSettings  # noqa: E402
from pipeline.host.slurm import expand_nodelist  # noqa: E402
from pipeline.verdict import Verdict  # noqa: E402
from tests.fixtures.slurm import HIGH, LOW, SlurmCluster, start_cluster, stop_cluster  # noqa: E402

TIMEOUT = 180.0  #: seconds for each phase (the job's start, the requeue, the post, the verdict)
#: the batch job: 4 tasks per node writing a line every 0.5 s, gone on SIGTERM; preempted, its
#: batch script asks for the requeue
SCRIPT = """#!/bin/bash
trap 'echo "stop requested"' TERM
srun bash -c 'exec -a requeue-bench-task {python} -u -c "import time
while True: print(\\"tick\\"); time.sleep(0.5)"' &
wait; wait
if scontrol show job -o "$SLURM_JOB_ID" | grep -q 'PreemptTime=[0-9]'; then scontrol requeue "$SLURM_JOB_ID"; fi
"""


class TimedOutbox(MemoryOutbox):
    """A :class:`MemoryOutbox` that notes when each headline and thread post came (unix s)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[tuple[float, str, str | None, Reply]] = []  #: (when, kind, key, reply)

    async def announce(self, key: str, reply: Reply, channel: str | None) -> None:
        """Record a headline, with its time."""
        self.at.append((time.time(), "announce", key, reply))
        await super().announce(key, reply, channel)

    async def thread(self, key: str, reply: Reply, channel: str | None) -> None:
        """Record a thread post, with its time."""
        self.at.append((time.time(), "thread", key, reply))
        await super().thread(key, reply, channel)

    def first(self, kind: str, key: str, starts: str = "") -> tuple[float, Reply] | None:
        """The first post of ``kind`` under ``key`` whose title starts with ``starts``."""
        return next(
            ((t, r) for t, k, at, r in self.at if k == kind and at == key and r.title.startswith(starts)),
            None,
        )


def _show(cluster: SlurmCluster, job_id: int) -> dict[str, str]:
    """``scontrol show job -o`` of ``job_id`` as a dict (the fields this benchmark reads)."""
    line = cluster.run("scontrol", "show", "job", "-o", str(job_id)).stdout
    return dict(f.split("=", 1) for f in line.split() if "=" in f)


T = TypeVar("T")


async def _until(
    what: str, check: Callable[[], Awaitable[T | None]], timeout: float = TIMEOUT, every: float = 0.1
) -> T:
    """Await ``check()`` until it returns something (not None, not empty), at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (found := await check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        await asyncio.sleep(every)
    return found


async def run(args: argparse.Namespace) -> int:
    """Set up the cluster and Pitstop, preempt the job, print the figures; the exit status."""
    checks = Checks(quick=args.quick)
    tmp = Path(tempfile.mkdtemp(prefix="pitstop-bench-requeue-"))
    cluster = await asyncio.to_thread(start_cluster, tmp / "slurm")
    host = await start_local_ssh_host(tmp / "ssh")
    work = tmp / "work"
    work.mkdir()
    (work / "job.sbatch").write_text(SCRIPT.replace("{python}", sys.executable))
    sbatch = [
        "-p",
        LOW,
        "-N",
        "2",
        "--ntasks-per-node",
        "4",
        "-o",
        str(work / "out.log"),
        "--open-mode=append",
    ]
    job = JobConfig(
        host="login",
        engine="slurm",
        slurm=SlurmSettings(
            script=str(work / "job.sbatch"), sbatch_args=sbatch, nodes=2, tasks_per_node=4
        ).model_dump(),
        exec=cluster.exec_prefix,
        workdir=str(work),
        log=str(work / "out.log"),
        match="^requeue-bench-task ",
        start_window=args.window,
        watch=WatchSettings(interval=args.interval, stall_after=3600),
    )
    config = Config(
        hosts={"login": host.host_config()},
        jobs={"bench": job},
        redis=RedisSettings(prefix="bench-requeue:"),
        state=StateSettings(dir=tmp / "state"),
    )
    outbox = TimedOutbox()
    ctx = await build_context(config, outbox)
    tasks: list[asyncio.Task[None]] = []
    try:
        run = await ctx.service.request("bench", "start", "U0BENCH", lock_ttl=60)
        run = await ctx.service.execute(run)
        started = await _until("the job's start", lambda: ctx.service.deliver(run.id))
        assert started.verdict is Verdict.RUNNING, started
        job_id = run.slurm_job or 0
        watcher = Watcher(ctx)

        async def every(seconds: float, call: Callable[[], Awaitable[Any]]) -> None:
            while True:
                with contextlib.suppress(Exception):
                    await call()
                await asyncio.sleep(seconds)

        await watcher.cycle("login")  # seen running: the nodes it runs on are known
        tasks = [
            asyncio.create_task(every(args.interval, lambda: watcher.cycle("login"))),
            asyncio.create_task(every(1.0, ctx.service.deliver_due)),
        ]
        node = expand_nodelist(_show(cluster, job_id)["NodeList"])[0]  # all of its CPUs: preempted
        high = cluster.run(
            "sbatch",
            "--parsable",
            "-o",
            "/dev/null",
            "-p",
            HIGH,
            "-w",
            node,
            "-N1",
            "-n8",
            "--wrap",
            "sleep 600",
        )
        high_id = int(high.stdout.strip().split(";")[0])

        async def requeued() -> float | None:
            return time.time() if _show(cluster, job_id).get("Restarts", "0") != "0" else None

        at = await _until("Slurm's requeue", requeued)

        async def requeue_run() -> str | None:
            return next((r.id for r in await ctx.runs.recent("bench") if r.action == "requeue"), None)

        key = thread_key(await _until("the requeue's run", requeue_run, every=0.05))

        async def posted(kind: str, starts: str = "") -> tuple[float, Reply] | None:
            return outbox.first(kind, key, starts)

        post_at, post_reply = await _until("the post", lambda: posted("announce"), every=0.05)
        verdict_at, verdict_reply = await _until(
            "the verdict", lambda: posted("thread", "RUNNING"), every=0.05
        )
        shown = _show(cluster, job_id)
        delay = _seconds(shown.get("StartTime", ""), shown.get("SubmitTime", ""))
    finally:
        for t in tasks:
            t.cancel()
        await close_context(ctx)
        await asyncio.to_thread(stop_cluster, cluster)
        await host.close()
    to_post, to_verdict = post_at - at, verdict_at - at
    print(f"{'from Slurm requeue to':24s} {'seconds':>8s}")
    print(f"{'Pitstop post':24s} {to_post:8.1f}   (watch interval {args.interval:g} s)")
    print(
        f"{'verdict':24s} {to_verdict:8.1f}   (Slurm's BeginTime delay {delay:.0f} s, start_window {args.window:g} s)"
    )
    print(f"  post: {post_reply.title}")
    print(f"  verdict: {verdict_reply.title}")
    checks.correct(
        "the post names the preempting job",
        f"preempted by job {high_id} (partition {HIGH})" in post_reply.title,
        post_reply.title[:160],
    )
    checks.correct(
        "the verdict is RUNNING 8/8",
        verdict_reply.title.startswith("RUNNING 8/8 processes"),
        verdict_reply.title[:120],
    )
    checks.bound("post within 2 intervals + 10 s", to_post <= 2 * args.interval + 10, f"{to_post:.1f} s")
    checks.target("post within one watch interval + 2 s", to_post <= args.interval + 2, f"{to_post:.1f} s")
    line = (
        f"requeue: Slurm's requeue → Pitstop's post {to_post:.1f} s (watch interval {args.interval:g} s), "
        f"→ verdict {to_verdict:.1f} s (Slurm's BeginTime delay {delay:.0f} s + start_window {args.window:g} s)"
    )
    print(checks.summary(line))
    return checks.status


def _seconds(later: str, earlier: str) -> float:
    """Seconds between two of Slurm's ISO times (0 when either is unreadable)."""
    try:
        return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()
    except ValueError:
        return 0.0


def main() -> int:
    """Parse the arguments, run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="1 s watch interval, 2 s start_window, no speed checks"
    )
    parser.add_argument(
        "--interval", type=float, default=None, help="the watch interval, s (default 15: the key's default)"
    )
    parser.add_argument(
        "--window", type=float, default=None, help="start_window, s (default 10: the key's default)"
    )
    args = parser.parse_args()
    args.interval = args.interval or (1.0 if args.quick else 15.0)
    args.window = args.window or (2.0 if args.quick else 10.0)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
