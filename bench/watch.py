"""Benchmark: Pitstop's CPU per watch cycle for 50, 100 and 200 jobs, against one ``ssh`` per check.

Four SSH hosts run on 127.0.0.1, each an in-process asyncssh server
(:func:`devhost.sshhost.start_local_ssh_host`) in **its own subprocess**, so their CPU is not
counted.  Every job is a real process (``sleep 9NNNNN``, matched by ``^sleep 9NNNNN$``) with a
log file; jobs are spread round-robin over the hosts.

- **pitstop**: one :class:`~handlers.watching.Watcher` cycle per host, the hosts concurrently,
  exactly as the scheduler runs them: Redis reads (embedded Redis, its own process), one probe
  per host covering all its jobs over a pooled SSH connection, the state machine, Redis writes.
  Cycles run back to back; ``time.process_time()`` of this process around ``--cycles`` cycles.
- **ssh-per-check**: the naive watcher — one OpenSSH ``ssh`` client per job per cycle running
  ``pgrep -fc PATTERN; stat -c %s LOG``; the CPU of the ``ssh`` children
  (``getrusage(RUSAGE_CHILDREN)``) plus this process's own spawning overhead.

Target: 200 jobs cost under 10 % of one core at the default 10 s interval (a bound: exit 1
beyond it, as when a job is not seen healthy).  ``--quick``: 2 hosts, 8 jobs, one cycle each,
no speed checks.  Ends with ONE line:
``watch: 200 jobs X.XXX cpu-s/cycle (Y.Y% of a core at 10 s) vs ssh-per-check Z.ZZZ cpu-s/cycle ratio W.Wx``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchlib import Checks

from bot.assembly import build_context, build_watcher, close_context
from handlers.outbox import MemoryOutbox
from pipeline.config import Config, HostConfig, JobConfig, RedisSettings, StateSettings, WatchSettings

HOSTS = 4
SIZES = (50, 100, 200)
INTERVAL = 10.0  #: seconds: the watch interval the percentage is quoted at


# --- the SSH hosts, each in its own process -------------------------------------------------------


async def _serve(state_dir: str) -> None:
    from devhost.sshhost import start_local_ssh_host

    host = await start_local_ssh_host(Path(state_dir))
    info = {
        "port": host.port,
        "user": host.user,
        "known_hosts": str(host.known_hosts),
        "client_key": str(host.client_key),
    }
    print(json.dumps(info), flush=True)
    await asyncio.to_thread(sys.stdin.read)  # until the benchmark closes our stdin
    await host.close()


def start_hosts(root: Path, count: int) -> tuple[list[subprocess.Popen[str]], list[dict[str, Any]]]:
    """Start ``count`` SSH host subprocesses; return them and their connection details."""
    procs, infos = [], []
    for i in range(count):
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(root / f"host{i}")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        procs.append(proc)
        infos.append(json.loads(proc.stdout.readline()))
    return procs, infos


def stop_hosts(procs: list[subprocess.Popen[str]]) -> None:
    """Close the hosts' stdin so they shut down; kill any that linger."""
    for proc in procs:
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# --- the jobs ---------------------------------------------------------------------------------------


def make_config(root: Path, infos: list[dict[str, Any]], jobs: int) -> Config:
    """``jobs`` jobs spread over the hosts, each matching one sleeping process, with a log."""
    hosts = {
        f"h{i}": HostConfig(
            address="127.0.0.1",
            port=info["port"],
            user=info["user"],
            known_hosts=Path(info["known_hosts"]),
            client_keys=[Path(info["client_key"])],
        )
        for i, info in enumerate(infos)
    }
    specs = {
        f"job{j:03d}": JobConfig(
            host=f"h{j % len(infos)}",
            workdir=str(root),
            launch=["sleep"],
            log=str(root / "logs" / f"job{j:03d}.log"),
            match=f"^sleep 9{j:05d}$",
            watch=WatchSettings(interval=INTERVAL, stall_after=3600, degraded_after=3600),
        )
        for j in range(jobs)
    }
    return Config(
        hosts=hosts,
        jobs=specs,
        redis=RedisSettings(prefix=f"bench{uuid.uuid4().hex[:8]}:"),
        state=StateSettings(dir=root / "state"),
    )


def start_sleepers(root: Path, jobs: int) -> list[subprocess.Popen[bytes]]:
    """One sleeping process and one small log per job, each running inside the jobs' workdir.

    Without a recorded session a job's processes are the matching ones whose working directory
    is the job's ``workdir`` (:mod:`pipeline.host.probe`), so the sleepers start there.
    """
    (root / "logs").mkdir(exist_ok=True)
    out = []
    for j in range(jobs):
        (root / "logs" / f"job{j:03d}.log").write_text('{"step": 1, "tokens_per_s": 1000.0}\n')
        out.append(subprocess.Popen(["sleep", f"9{j:05d}"], cwd=root, start_new_session=True))
    return out


# --- the two watchers ---------------------------------------------------------------------------------


async def pitstop_cpu(config: Config, cycles: int) -> tuple[float, float, str]:
    """CPU seconds and wall seconds per cycle of Pitstop's watcher over every host, and what
    the watcher saw before measuring (``N/N healthy``, else the conditions it found)."""
    ctx = await build_context(config, MemoryOutbox(), instance="bench")
    try:
        watcher = build_watcher(ctx)
        hosts = sorted({j.host for j in config.jobs.values()})

        async def cycle() -> dict[str, Any]:
            results = await asyncio.gather(*(watcher.cycle(h) for h in hosts))
            merged: dict[str, Any] = {}
            for r in results:
                merged.update(r)
            return merged

        decisions = await cycle()  # connect, learn the jobs (seen alive)
        decisions = await cycle()
        healthy = sum(1 for d in decisions.values() if d.condition == "ok")
        seen = f"{healthy}/{len(config.jobs)} healthy"
        if healthy != len(config.jobs):
            seen += f" (conditions: {', '.join(sorted({d.condition for d in decisions.values()}))})"
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(cycles):
            await cycle()
        return (time.process_time() - cpu0) / cycles, (time.perf_counter() - wall0) / cycles, seen
    finally:
        await close_context(ctx)


async def ssh_per_check_cpu(config: Config, cycles: int, concurrency: int) -> tuple[float, float]:
    """CPU seconds (ssh children + this process) and wall seconds per cycle of one ssh per job."""
    gate = asyncio.Semaphore(concurrency)

    async def check(job: JobConfig) -> None:
        host = config.hosts[job.host]
        argv = [
            "ssh",
            "-F", "/dev/null",
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={host.known_hosts}",
            "-o", "IdentitiesOnly=yes",
            "-o", "LogLevel=ERROR",
            "-i", str(host.client_keys[0]),
            "-p", str(host.port),
            f"{host.user}@{host.address}",
            f"pgrep -fc {shlex.quote(job.match)}; stat -c %s {shlex.quote(job.log)}",
        ]  # fmt: skip
        async with gate:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            out, err = await proc.communicate()
        lines = out.decode().split()
        if proc.returncode != 0 or not lines or lines[0] != "1":
            raise SystemExit(f"ssh-per-check failed for {job.match}: {out!r} {err!r}")

    def children() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    child0, cpu0, wall0 = children(), time.process_time(), time.perf_counter()
    for _ in range(cycles):
        await asyncio.gather(*(check(j) for j in config.jobs.values()))
    cpu = (children() - child0) + (time.process_time() - cpu0)
    return cpu / cycles, (time.perf_counter() - wall0) / cycles


async def run(args: argparse.Namespace) -> int:
    """Measure every size; print the table and the summary line."""
    hosts, sizes = (2, (8,)) if args.quick else (HOSTS, SIZES)
    with tempfile.TemporaryDirectory(prefix="pitstop-bench-watch-") as tmp:
        root = Path(tmp)
        procs, infos = start_hosts(root, hosts)
        sleepers = start_sleepers(root, max(sizes))
        try:
            rows = []
            healthy: list[str] = []
            all_ok = True
            for size in sizes:
                config = make_config(root, infos, size)
                p_cpu, p_wall, seen = await pitstop_cpu(config, args.cycles)
                healthy.append(seen)
                all_ok = all_ok and seen.startswith(f"{size}/{size} ")
                s_cpu, s_wall = await ssh_per_check_cpu(config, args.baseline_cycles, args.concurrency)
                rows.append((size, p_cpu, p_wall, s_cpu, s_wall))
                print(
                    f"{size:4d} jobs on {hosts} hosts: pitstop {p_cpu:.3f} cpu-s/cycle "
                    f"({p_wall:.2f} s wall)  ssh-per-check {s_cpu:.3f} cpu-s/cycle "
                    f"({s_wall:.2f} s wall)  ratio {s_cpu / p_cpu:.1f}x",
                    flush=True,
                )
        finally:
            for proc in sleepers:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            stop_hosts(procs)
    size, p_cpu, _, s_cpu, _ = rows[-1]
    share = 100.0 * p_cpu / INTERVAL
    checks = Checks(quick=args.quick)
    checks.correct("every job seen healthy at every size", all_ok, "; ".join(healthy))
    checks.bound(f"{size} jobs under 10% of a core at {INTERVAL:g} s", share < 10.0, f"{share:.1f}%")
    print(
        checks.summary(
            f"watch: {size} jobs {p_cpu:.3f} cpu-s/cycle ({share:.1f}% of a core at {INTERVAL:g} s) "
            f"vs ssh-per-check {s_cpu:.3f} cpu-s/cycle ratio {s_cpu / p_cpu:.1f}x"
        )
    )
    return checks.status


def main() -> int:
    """Entry point: ``python bench/watch.py [--cycles N] [--baseline-cycles N]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=10, help="Pitstop cycles measured per size")
    parser.add_argument("--baseline-cycles", type=int, default=1, help="ssh-per-check cycles per size")
    parser.add_argument("--concurrency", type=int, default=8, help="ssh clients at once in the baseline")
    parser.add_argument("--quick", action="store_true", help="2 hosts, 8 jobs, one cycle each")
    parser.add_argument("--serve", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return 0
    if args.quick:
        args.cycles, args.baseline_cycles = 1, 1
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
