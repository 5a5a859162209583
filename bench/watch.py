"""Benchmark: watching 200 jobs on 4 hosts and 1,000 jobs on 50 hosts — Pitstop's wall time, CPU
and memory per watch cycle, against one ``ssh`` per check.

Every SSH host runs on 127.0.0.1, an in-process asyncssh server
(:func:`devhost.sshhost.start_local_ssh_host`) in **its own subprocess**, so its CPU — and that of
the helpers it runs, as a real fleet runs them on its own hosts — is not counted as Pitstop's.
Every job is a real process (``sleep 9NNNNN``, matched by ``^sleep 9NNNNN$``) with a metric log
its host appends a step line to every :data:`WRITE_EVERY` s, so each cycle reads every job's new
lines (per-rank progress); jobs are spread round-robin over the hosts.

- **pitstop**: one :class:`~handlers.watch.cycle.Watcher` cycle per host, the hosts concurrently,
  exactly as the scheduler runs them: Redis reads (embedded Redis, its own process), one probe
  per host covering all its jobs — processes, log sizes, metric-log bytes — over a pooled SSH
  connection, the state machine, Redis writes.  :data:`CYCLES` cycles back to back (harder than
  one per interval); per cycle its wall time and this process's CPU (``os.times()``: user +
  system of this process only, its children apart); its resident memory (``/proc/self/statm``)
  before and after; the helper calls per host per cycle (counted at the SSH pool).
- **ssh-per-check**: the naive watcher — one OpenSSH ``ssh`` client per job per cycle running
  ``pgrep -fc PATTERN; stat -c %s LOG``; the CPU of the ``ssh`` children
  (``getrusage(RUSAGE_CHILDREN)``) plus this process's own spawning overhead.

Targets at 1,000 jobs on 50 hosts and a 10 s interval: every cycle's wall time at p95 at most half
the interval, at most 10 % of one core, memory flat (growth within :data:`FLAT_MIB` MiB or 5 %)
over the cycles — reported as met or missed.  Bounds (exit 1): a job not seen healthy, more than
one helper call per host per cycle, a p95 beyond twice the interval or a CPU share beyond 25 %
(bounds only a regression crosses: on this shared 2-core machine the simulated hosts' own CPU,
about 5 s a cycle at 1,000 jobs, competes with Pitstop's for the same cores, so wall times vary
with whatever else runs).
- **storm**: the 200 jobs on 4 hosts killed at once (issue 23's storm of 200 incidents), told to
  the strict Slack stand-in (``tests/fixtures/slack.py``, its rate limits on) through the real
  outbox at ``[slack] pace`` 1 s: first all in one channel, then spread over 4; the seconds from
  the kill until the grouped posts list every incident, and until every incident's own line is in
  Slack (the last ``chat.postMessage``), each incident checked there once.

``--quick``: 8 jobs on 2 hosts and 24 on 6, 3 cycles each, a storm of 12 on 2; no speed checks.
``--storm``: the storm only.  Ends with ONE line:
``watch: 1,000 jobs on 50 hosts X.XXX cpu-s/cycle (Y.Y% of a core at 10 s) wall p95 Z.ZZ s; …``.
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
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the stand-in Slack lives under tests/
    sys.path.insert(0, str(ROOT))

from benchlib import Checks  # noqa: E402

from bot.runtime.assembly import build_context, close_context  # noqa: E402
from bot.slack.api import Delivery, web_client  # noqa: E402
from bot.slack.outbox import SlackOutbox  # noqa: E402
from handlers.outbox import MemoryOutbox  # noqa: E402
from handlers.watch.cycle import Watcher  # noqa: E402
from pipeline.config import (  # noqa: E402
    Config,
    HostConfig,
    JobConfig,
    RedisSettings,
    SlackSettings,
    StateSettings,
    WatchSettings,
)
from pipeline.state.deliveries import Posts  # noqa: E402
from tests.fixtures.slack import BOT_TOKEN, Channel, FakeSlack  # noqa: E402

SIZES = ((200, 4), (1000, 50))  #: (jobs, hosts): today's size, and the scale target
QUICK_SIZES = ((8, 2), (24, 6))
CYCLES = 30  #: measured cycles per size
INTERVAL = 10.0  #: seconds: the watch interval the percentages are quoted at
WRITE_EVERY = 2.0  #: seconds between the step lines a host appends to each of its jobs' logs
FLAT_MIB = 4.0  #: memory growth over the cycles still counted as flat (MiB), or 5 % if larger
STORM, QUICK_STORM = (200, 4), (12, 2)  #: (jobs, hosts) killed at once
STORM_CHANNELS = (1, 4)  #: the storm told in one channel, then spread over this many
PACE = 1.0  #: ``[slack] pace``'s default: Slack's chat.postMessage limit of about 1/s per channel


# --- the SSH hosts, each in its own process -------------------------------------------------------


async def _serve(state_dir: str) -> None:
    """One SSH host; appends a step line to every log named in ``STATE_DIR/logs.json`` (re-read
    when it changes) every :data:`WRITE_EVERY` s, as a training job writes its metrics."""
    from devhost.sshhost import start_local_ssh_host

    # python3 first on the hosts' PATH is the interpreter itself, as on a GPU host, not a version
    # manager's shim (pyenv's is a bash script: 50 ms of CPU more per helper call)
    real = Path(state_dir) / "bin"
    real.mkdir(exist_ok=True)
    with contextlib.suppress(FileExistsError):
        (real / "python3").symlink_to(os.path.realpath(sys.executable))
    host = await start_local_ssh_host(Path(state_dir), path_prepend=[real])
    info = {
        "port": host.port,
        "user": host.user,
        "known_hosts": str(host.known_hosts),
        "client_key": str(host.client_key),
    }
    print(json.dumps(info), flush=True)
    writer = asyncio.ensure_future(_write_steps(Path(state_dir) / "logs.json"))
    await asyncio.to_thread(sys.stdin.read)  # until the benchmark closes our stdin
    writer.cancel()
    await host.close()


async def _write_steps(listing: Path) -> None:
    step, seen, logs = 1, 0.0, []
    while True:
        await asyncio.sleep(WRITE_EVERY)
        with contextlib.suppress(OSError, ValueError):
            if listing.stat().st_mtime != seen:
                seen, logs = listing.stat().st_mtime, json.loads(listing.read_text())
        step += 1
        line = json.dumps({"step": step, "role": "drafter", "rank": 0, "tokens_per_s": 1000.0}) + "\n"
        for path in logs:
            with contextlib.suppress(OSError), open(path, "a") as f:
                f.write(line)


def start_hosts(root: Path, count: int) -> tuple[list[subprocess.Popen[str]], list[dict[str, Any]]]:
    """Start ``count`` SSH host subprocesses (all at once); return them and their connection details."""
    procs = []
    for i in range(count):
        (root / f"host{i}").mkdir(parents=True, exist_ok=True)
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--serve", str(root / f"host{i}")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    infos = []
    for proc in procs:
        assert proc.stdout is not None
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
    """``jobs`` jobs spread over the hosts of ``infos``, each matching one sleeping process, with a
    metric log; tells each host which logs to append to."""
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
        f"job{j:04d}": JobConfig(
            host=f"h{j % len(infos)}",
            workdir=str(root),
            launch=["sleep"],
            log=str(root / "logs" / f"job{j:04d}.log"),
            match=f"^sleep 9{j:05d}$",
            watch=WatchSettings(interval=INTERVAL, stall_after=3600, degraded_after=3600),
        )
        for j in range(jobs)
    }
    for i in range(len(infos)):
        logs = [spec.log for spec in specs.values() if spec.host == f"h{i}"]
        (root / f"host{i}" / "logs.json").write_text(json.dumps(logs))
    return Config(
        hosts=hosts,
        jobs=specs,
        redis=RedisSettings(prefix=f"bench{uuid.uuid4().hex[:8]}:"),
        state=StateSettings(dir=root / "state"),
    )


def start_sleepers(root: Path, jobs: int) -> list[subprocess.Popen[bytes]]:
    """One sleeping process and one metric log per job, each running inside the jobs' workdir.

    Without a recorded session a job's processes are the matching ones whose working directory
    is the job's ``workdir`` (:mod:`pipeline.host.probe`), so the sleepers start there.
    """
    (root / "logs").mkdir(exist_ok=True)
    out = []
    for j in range(jobs):
        line = json.dumps({"step": 1, "role": "drafter", "rank": 0, "tokens_per_s": 1000.0})
        (root / "logs" / f"job{j:04d}.log").write_text(line + "\n")
        out.append(subprocess.Popen(["sleep", f"9{j:05d}"], cwd=root, start_new_session=True))
    return out


# --- the two watchers ---------------------------------------------------------------------------------


class Measured:
    """Pitstop's figures for one size.

    :ivar cpu: this process's CPU seconds per cycle (mean); ``walls`` each cycle's wall seconds.
    :ivar rss: resident memory (MiB) after the warm-up cycles and after the last one.
    :ivar calls: helper calls per host per cycle (the most any host had in a cycle).
    :ivar hosts_cpu: the SSH hosts' CPU seconds per cycle (their helpers included), counted apart.
    :ivar seen: ``N/N healthy``, else the conditions found.
    """

    def __init__(self) -> None:
        self.cpu = 0.0
        self.walls: list[float] = []
        self.rss = (0.0, 0.0)
        self.calls = 0
        self.hosts_cpu = 0.0
        self.seen = ""

    def p(self, q: float) -> float:
        """The ``q`` quantile of the cycles' wall times (s)."""
        walls = sorted(self.walls)
        return walls[min(len(walls) - 1, int(q * len(walls)))]


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _hosts_cpu(pids: list[int]) -> float:
    """CPU seconds of the host processes and of the children they waited for (bash, the helpers):
    fields 14-17 of ``/proc/PID/stat``."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", "rb") as f:
            ticks += sum(int(x) for x in f.read().rsplit(b")", 1)[1].split()[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system  # this process only: the SSH hosts and their helpers are children


async def pitstop_cycles(config: Config, cycles: int, host_pids: list[int]) -> Measured:
    """Pitstop's watcher over every host, ``cycles`` cycles back to back after two warm-up cycles."""
    ctx = await build_context(config, MemoryOutbox(), instance="bench")
    out = Measured()
    try:
        watcher = Watcher(ctx)
        hosts = sorted({j.host for j in config.jobs.values()})
        calls: Counter[str] = Counter()
        run = ctx.ssh.run

        async def counted(host: str, *args: Any, **kwargs: Any) -> Any:
            calls[host] += 1
            return await run(host, *args, **kwargs)

        ctx.ssh.run = counted  # type: ignore[method-assign]

        async def cycle() -> dict[str, Any]:
            results = await asyncio.gather(*(watcher.cycle(h) for h in hosts))
            merged: dict[str, Any] = {}
            for r in results:
                merged.update(r)
            return merged

        decisions = await cycle()  # connect, learn the jobs (seen alive)
        decisions = await cycle()
        healthy = sum(1 for d in decisions.values() if d.condition == "ok")
        out.seen = f"{healthy}/{len(config.jobs)} healthy"
        if healthy != len(config.jobs):
            out.seen += f" (conditions: {', '.join(sorted({d.condition for d in decisions.values()}))})"
        out.rss = (_rss_mib(), 0.0)
        cpu0, hosts0 = _own_cpu(), _hosts_cpu(host_pids)
        for _ in range(cycles):
            calls.clear()
            wall0 = time.perf_counter()
            await cycle()
            out.walls.append(time.perf_counter() - wall0)
            out.calls = max(out.calls, max(calls.values(), default=0))
            if len(calls) != len(hosts):
                out.calls = max(out.calls, 99)  # a host not probed at all
        out.cpu = (_own_cpu() - cpu0) / cycles
        out.hosts_cpu = (_hosts_cpu(host_pids) - hosts0) / cycles
        out.rss = (out.rss[0], _rss_mib())
        return out
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


class Storm:
    """One storm's figures.

    :ivar listed: seconds from the kill until the grouped posts (every incident listed) were in Slack.
    :ivar complete: seconds from the kill until every incident's own line was (the last post).
    :ivar told: ``N/N incidents in Slack once``, else what was found.
    :ivar rest: other posts in the threads (a grouped post too long for one message goes on there).
    :ivar limited: 429s answered; ``failures``: posts the outbox gave up.
    """

    def __init__(self) -> None:
        self.listed = self.complete = 0.0
        self.told = ""
        self.limited = self.rest = 0
        self.failures: list[str] = []


async def storm(
    root: Path, infos: list[dict[str, Any]], jobs: int, channels: int, sleepers: list[subprocess.Popen[bytes]]
) -> Storm:
    """Kill the first ``jobs`` sleepers at once, watched over ``infos``' hosts and told in
    ``channels`` channels of the Slack stand-in; restart them after.  Seconds are wall time."""
    teams = [f"C0STORM{k}" for k in range(channels)]
    base = make_config(root, infos, jobs)
    specs = {
        n: spec.model_copy(update={"channel": teams[j % channels]})
        for j, (n, spec) in enumerate(base.jobs.items())
    }
    config = base.model_copy(
        update={"jobs": specs, "slack": SlackSettings(announce_channel=teams[0], pace=PACE)}
    )
    out = Storm()
    async with FakeSlack() as fake:
        for team in teams:
            fake.add_channel(Channel(team))
        outbox = SlackOutbox(
            web_client(BOT_TOKEN, base_url=fake.api_url),
            Delivery(default_channel=teams[0], pace=PACE, settle=0.0),
        )
        ctx = await build_context(config, outbox, instance="bench")
        outbox.bind(ctx.redis.open_store(Posts), ctx.runs)
        try:
            watcher = Watcher(ctx)
            hosts = sorted({j.host for j in config.jobs.values()})
            for _ in range(2):  # connect, learn the jobs (seen alive)
                await asyncio.gather(*(watcher.cycle(h) for h in hosts))
            killed = time.monotonic()
            for proc in sleepers[:jobs]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            await asyncio.gather(*(watcher.cycle(h) for h in hosts))
            await watcher.teller.told(4 * jobs * PACE + 120)
            calls = await fake.calls("chat.postMessage")
            posted = [c for c in calls if c.ok]
            heads = [c for c in posted if not c.args.get("thread_ts")]
            threads = [str(c.args["text"]) for c in posted if c.args.get("thread_ts")]
            lines = sorted(w for w in (t.split(" ", 1)[0] for t in threads) if w in specs)
            once = lines == sorted(specs) and len(heads) == channels
            out.told = f"{len(set(lines))}/{jobs} incidents in Slack" + (
                " once" if once else f" ({len(lines)} lines, {len(heads)} grouped posts)"
            )
            out.rest = len(threads) - len(lines)
            out.listed = max((c.at for c in heads), default=killed) - killed
            out.complete = max((c.at for c in posted), default=killed) - killed
            out.limited = sum(1 for c in calls if c.status == 429)
            out.failures = list(outbox.failures)
        finally:
            await close_context(ctx)
    sleepers[:jobs] = start_sleepers(root, jobs)
    return out


def size_name(jobs: int, hosts: int) -> str:
    """``1,000 jobs on 50 hosts``."""
    return f"{jobs:,} jobs on {hosts} hosts"


async def run(args: argparse.Namespace) -> int:
    """Measure every size; print one line per size, the conditions and the summary line."""
    sizes = () if args.storm else QUICK_SIZES if args.quick else SIZES
    storm_size = QUICK_STORM if args.quick else STORM
    checks = Checks(quick=args.quick)
    summary: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pitstop-bench-watch-") as tmp:
        root = Path(tmp)
        procs, infos = start_hosts(root, max(h for _, h in (*sizes, storm_size)))
        sleepers = start_sleepers(root, max(j for j, _ in (*sizes, storm_size)))
        try:
            ratios = []
            for jobs, nhosts in sizes:
                name = size_name(jobs, nhosts)
                config = make_config(root, infos[:nhosts], jobs)
                m = await pitstop_cycles(config, args.cycles, [p.pid for p in procs[:nhosts]])
                s_cpu, s_wall = await ssh_per_check_cpu(config, args.baseline_cycles, args.concurrency)
                share, p95 = 100.0 * m.cpu / INTERVAL, m.p(0.95)
                grew = m.rss[1] - m.rss[0]
                ratios.append(s_cpu / m.cpu)
                print(
                    f"{name}: pitstop {m.cpu:.3f} cpu-s/cycle ({share:.1f}% of a core at {INTERVAL:g} s), "
                    f"wall p50 {m.p(0.5):.2f} s p95 {p95:.2f} s ({100 * p95 / INTERVAL:.0f}% of the interval), "
                    f"RSS {m.rss[0]:.1f} -> {m.rss[1]:.1f} MiB over {args.cycles} cycles, "
                    f"{m.calls} helper call(s) per host per cycle (the hosts: {m.hosts_cpu:.2f} cpu-s/cycle); "
                    f"ssh-per-check {s_cpu:.3f} cpu-s/cycle ({s_wall:.2f} s wall) ratio {s_cpu / m.cpu:.1f}x",
                    flush=True,
                )
                checks.correct(
                    f"{name}: every job seen healthy", m.seen.startswith(f"{jobs}/{jobs} "), m.seen
                )
                checks.correct(f"{name}: one helper call per host per cycle", m.calls == 1, f"{m.calls}")
                last = (jobs, nhosts) == sizes[-1]
                if last:
                    checks.target(
                        f"{name}: wall p95 at most half the interval", p95 <= INTERVAL / 2, f"{p95:.2f} s"
                    )
                    checks.target(f"{name}: at most 10% of a core", share <= 10.0, f"{share:.1f}%")
                    flat = grew <= max(FLAT_MIB, 0.05 * m.rss[0])
                    checks.target(f"{name}: memory flat over {args.cycles} cycles", flat, f"{grew:+.1f} MiB")
                checks.bound(
                    f"{name}: wall p95 within twice the interval", p95 <= 2 * INTERVAL, f"{p95:.2f} s"
                )
                checks.bound(f"{name}: under 25% of a core", share < 25.0, f"{share:.1f}%")
                summary.append(
                    f"{name} {m.cpu:.3f} cpu-s/cycle ({share:.1f}% of a core at {INTERVAL:g} s) "
                    f"wall p95 {p95:.2f} s RSS {grew:+.1f} MiB"
                )
            stormed = []
            jobs, nhosts = storm_size
            for channels in STORM_CHANNELS:
                st = await storm(root, infos[:nhosts], jobs, channels, sleepers)
                where = "1 channel" if channels == 1 else f"{channels} channels"
                print(
                    f"storm: {jobs} jobs on {nhosts} hosts killed at once, told in {where} at pace {PACE:g} s: "
                    f"the grouped post(s) in Slack after {st.listed:.1f} s, every incident's line after "
                    f"{st.complete:.1f} s; {st.told} (and {st.rest} continuation(s) of a long grouped post), "
                    f"{st.limited} 429s, {len(st.failures)} posts given up",
                    flush=True,
                )
                checks.correct(
                    f"storm in {where}: every incident in Slack once", st.told.endswith(" once"), st.told
                )
                checks.correct(f"storm in {where}: no post given up", not st.failures, "; ".join(st.failures))
                per = -(-jobs // channels)
                checks.bound(
                    f"storm in {where}: complete within twice its lines at pace and a minute",
                    st.complete <= 2 * per * PACE + 60,
                    f"{st.complete:.1f} s",
                )
                stormed.append(f"{st.complete:.0f} s in {where}")
        finally:
            for proc in sleepers:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            stop_hosts(procs)
    parts = [*reversed(summary), *([f"vs ssh-per-check ratio {ratios[-1]:.1f}x"] if ratios else [])]
    parts.append(f"a storm of {storm_size[0]} incidents in Slack completely after " + ", ".join(stormed))
    line = "watch: " + "; ".join(parts)
    print(checks.summary(line))
    return checks.status


def main() -> int:
    """Entry point: ``python bench/watch.py [--cycles N] [--baseline-cycles N]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=CYCLES, help="Pitstop cycles measured per size")
    parser.add_argument("--baseline-cycles", type=int, default=1, help="ssh-per-check cycles per size")
    parser.add_argument("--concurrency", type=int, default=8, help="ssh clients at once in the baseline")
    parser.add_argument(
        "--quick", action="store_true", help="8 jobs on 2 hosts, 24 on 6, 3 cycles each, a storm of 12"
    )
    parser.add_argument("--storm", action="store_true", help="the storm only (no cycles measured)")
    parser.add_argument("--serve", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return 0
    if args.quick:
        args.cycles, args.baseline_cycles = 3, 1
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
