"""Benchmark: digest time for a 10 MB and a 1 GB metric log, side by side.

A digest reads only what was written since the last scheduled digest, bounded to the last
8 MiB, so its cost must not grow with the log: the target is a 1 GB / 10 MB time ratio under
1.2x.

Both logs hold real dflash metric lines (5 target + 3 drafter ranks, monotonic counters and
timestamps, a start-up line), generated into a temporary directory and deleted afterwards.  The
path measured is the real one: :func:`pipeline.digest.report.build_digest` reading the log through the
host helper over SSH (an in-process asyncssh host on 127.0.0.1, reached by
:class:`~pipeline.host.remote.SSHPool`), parsing, aggregating and storing the offset in an embedded
Redis.  The chart is not drawn and the job has no ``gpus`` (both cost the same for any log size
and would only dilute the ratio).

Two cases per log, each the median of ``--repeat`` runs:

- **first**: no stored offset — the digest reads the log's last 8 MiB;
- **next**: a scheduled digest after 1 MiB more was appended — it reads just that.

Beside them, the first digest's three steps on the 10 MB log — read the window over SSH, parse,
aggregate — are timed against the reference path they replaced, interleaved, median of
``--repeat``: two helper calls (size, then the bytes) sending the last 8 MiB uncompressed, the
standard library's ``json`` per line into a record per line
(:func:`pipeline.observe.metrics.parse_jsonl` with ``json.loads``), and the statistics over those records
(:func:`pipeline.digest.stats.summarise`).  Now: one call reading only the tail a first digest
needs (the last :data:`~pipeline.digest.window.FIRST_WINDOW_BYTES`, 1 MiB, by a negative offset)
zlib-compressed, orjson reading its lines (:func:`pipeline.observe.metrics.parse_metric_lines`),
and the same statistics.  Target: 5x faster.  Both paths must agree:
the reference's 8 MiB parsed by both parsers give the same metric lines.

The SSH host runs ``python3`` itself, as a GPU host does (not a version manager's shim, which
costs both paths 50 ms of CPU per helper call on a machine that has one).

Fails (exit 1) when a digest reads more than its bound, the next digest does not start where
the first ended, or the 1 GB / 10 MB ratio exceeds 2x (the read is no longer bounded).
``--quick``: 2 MB and 4 MB logs, a 1 MiB window (256 KiB for a first digest), one repeat, no speed
checks.

Ends with ONE line: ``digest: 10MB X ms 1GB Y ms ratio Z.ZZx; first digest A ms vs reference B ms
speedup C.Cx`` (first + next, summed; then the three steps of a first digest).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchlib import Checks

from devhost.sshhost import start_local_ssh_host
from handlers.context import Context
from handlers.outbox import MemoryOutbox
from pipeline.config import Config, JobConfig, RedisSettings, StateSettings
from pipeline.digest.report import Digest, build_digest
from pipeline.digest.stats import summarise
from pipeline.digest.window import (
    FIRST_WINDOW_BYTES,
    MAX_WINDOW_BYTES,
    LogRead,
    LogReader,
    WindowKind,
    _read_from,
    read_window,
    remote_reader,
)
from pipeline.engines.runner import Runner as Restarter
from pipeline.host.probe import Ops, call_helper
from pipeline.host.remote import SSHPool
from pipeline.observe.metrics import parse_jsonl, parse_metric_lines
from pipeline.state.events import Events
from pipeline.state.redisconn import open_redis
from pipeline.state.runs import RunStore

MB = 1_000_000
T0 = 1_760_000_000.0
_TARGET = (
    '{"ts":%.3f,"step":%d,"role":"target","rank":%d,"role_rank":%d,"device":"cuda:%d","tokens":%d,'
    '"tokens_per_s":%.3f,"step_time_s":%.6f,"queue_depth":%d,"gpu_mem_bytes":%d}\n'
)
_DRAFTER = (
    '{"ts":%.3f,"step":%d,"role":"drafter","rank":%d,"role_rank":%d,"device":"cuda:%d","tokens":%d,'
    '"tokens_per_s":%.3f,"step_time_s":%.6f,"queue_depth":%d,"loss":%.6f,"top1":%.6f,"top4":%.6f,'
    '"top8":%.6f,"gpu_mem_bytes":%d}\n'
)


class LogWriter:
    """Appends realistic dflash metric lines: one line per rank per metric step, counters continuing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step = 0
        self.size = 0
        with path.open("wb") as f:
            head = b"dflash-main pid 4242 targets=[cuda:0,cuda:1,cuda:2,cuda:3,cuda:4] drafters=[cuda:5,cuda:6,cuda:7]\n"
            f.write(head)
            self.size = len(head)

    def _chunk(self, steps: int) -> bytes:
        out: list[str] = []
        for _ in range(steps):
            self.step += 1
            s = self.step
            ts = T0 + s * 2.0
            q = s % 7
            for r in range(5):
                out.append(
                    _TARGET % (ts + r * 0.01, s * 5, r, r, r, s * 81920, 40960.0 + r, 0.0488, q, 7 << 30)
                )
            loss = 4.0 / (1.0 + s * 1e-5)
            for d in range(3):
                r = 5 + d
                out.append(
                    _DRAFTER
                    % (
                        ts + r * 0.01,
                        s * 50,
                        r,
                        d,
                        r,
                        s * 6400,
                        3200.0 + d,
                        0.0312,
                        q,
                        loss,
                        0.31,
                        0.52,
                        0.66,
                        9 << 30,
                    )
                )
        return "".join(out).encode()

    def grow(self, nbytes: int) -> None:
        """Append about ``nbytes`` of metric lines (whole lines)."""
        target = self.size + nbytes
        with self.path.open("ab") as f:
            while self.size < target:
                steps = max(1, min(4000, (target - self.size) // 1900 + 1))
                data = self._chunk(steps)
                f.write(data)
                self.size += len(data)


def reference_reader(ssh: SSHPool, job: JobConfig) -> LogReader:
    """The reader the digest used before: the helper's ``read`` with the bytes sent uncompressed."""

    async def reader(offset: int, max_bytes: int) -> LogRead:
        args = {"path": job.log, "offset": offset, "max_bytes": max_bytes, "inode": None}
        answer = await call_helper(ssh, Ops.read(args), host=job.host, exec_prefix=job.exec)
        data = base64.b64decode(answer["data"])
        return LogRead(data, int(answer["offset"]) - len(data), int(answer["size"]), answer.get("inode"))

    return reader


async def steps(
    ctx: Context, job: str, *, reference: bool, max_bytes: int, first_bytes: int
) -> tuple[float, float, float, int, bytes]:
    """A first digest's read, parse and aggregate (seconds each) by the current or the reference path.

    :returns: the three times, the metric lines found and the bytes read.
    """
    spec = ctx.config.jobs[job]
    t0 = time.perf_counter()
    if reference:  # size first, then the bytes: two helper calls
        reader = reference_reader(ctx.ssh, spec)
        probe = await reader(0, 0)
        window = await _read_from(reader, 0, probe.size, max_bytes, WindowKind.LAST_BYTES)
    else:
        window = await read_window(
            remote_reader(ctx.ssh, job, spec), None, scheduled=True, max_bytes=min(max_bytes, first_bytes)
        )
    t1 = time.perf_counter()
    if reference:  # a MetricLine per line, then the statistics over them
        lines = parse_jsonl(window.data, json.loads)
        t2 = time.perf_counter()
        s = summarise(lines, lines_read=window.data.count(b"\n"), bytes_read=len(window.data))
    else:  # orjson per line
        lines = parse_metric_lines(window.data, spec.metrics)
        t2 = time.perf_counter()
        s = summarise(lines, lines_read=window.data.count(b"\n"), bytes_read=len(window.data))
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, s.metric_lines, window.data


async def _build(ctx: Context, job: str, **options: Any) -> Digest:
    """:func:`build_digest` with the dependencies the Context holds."""
    return await build_digest(
        job,
        config=ctx.config,
        redis=ctx.redis,
        ssh=ctx.ssh,
        events=ctx.events,
        **options,
    )


async def _case(
    ctx: Context, job: str, writer: LogWriter, run: int, max_bytes: int, first_bytes: int, checks: Checks
) -> tuple[float, float, str]:
    """One first digest (no stored offset) and one next digest after 1 MB more; seconds each."""
    ctx.redis.prefix = f"{ctx.config.redis.prefix}{job}{run}:"  # a fresh prefix: no stored offset
    t = time.perf_counter()
    first = await _build(ctx, job, scheduled=True, chart=False, max_bytes=max_bytes, first_bytes=first_bytes)
    t_first = time.perf_counter() - t
    writer.grow(MB)
    t = time.perf_counter()
    nxt = await _build(ctx, job, scheduled=True, chart=False, max_bytes=max_bytes)
    t_next = time.perf_counter() - t
    s = first.summary
    checks.correct(
        f"{job} run {run}: first digest within {first_bytes:,} bytes, with metric lines",
        s.bytes_read <= first_bytes and s.metric_lines > 0 and bool(s.pipeline_tokens_per_s),
        f"{s.bytes_read:,} bytes, {s.metric_lines:,} lines",
    )
    checks.correct(
        f"{job} run {run}: next digest starts where the first ended and reads only what was added",
        nxt.window.start == first.window.end and nxt.summary.bytes_read < 2 * MB,
        f"{nxt.window.start} vs {first.window.end}, {nxt.summary.bytes_read:,} bytes",
    )
    note = (
        f"{s.bytes_read / MB:.1f} MB / {s.metric_lines:,} lines read, {s.pipeline_tokens_per_s:,.0f} tokens/s; "
        f"next read {nxt.summary.bytes_read / MB:.1f} MB"
    )
    return t_first, t_next, note


Steps = tuple[float, float, float]


async def run(
    tmp: Path, sizes: dict[str, int], repeat: int, max_bytes: int, first_bytes: int, checks: Checks
) -> tuple[dict[str, tuple[float, float]], dict[str, Steps]]:
    """Generate the logs, then time digests of each, alternating so load drift hits both alike.

    :returns: per log (first, next) seconds; per path ("now", "reference") the first digest's steps.
    """
    writers: dict[str, LogWriter] = {}
    for label, nbytes in sizes.items():
        started = time.perf_counter()
        writers[label] = LogWriter(tmp / f"{label}.log")
        writers[label].grow(nbytes)
        took = time.perf_counter() - started
        print(f"  generated {label}: {writers[label].size / MB:,.0f} MB in {took:.1f} s", flush=True)
    real = tmp / "bin"  # python3 itself first on the host's PATH, as on a GPU host
    real.mkdir()
    (real / "python3").symlink_to(os.path.realpath(sys.executable))
    host = await start_local_ssh_host(tmp / "ssh", path_prepend=[real])
    config = Config(
        redis=RedisSettings(prefix=f"bench{uuid.uuid4().hex[:8]}:"),
        state=StateSettings(dir=tmp / "state"),
        hosts={"gpu1": host.host_config()},
        jobs={
            label: JobConfig(
                host="gpu1",
                workdir=str(tmp),
                launch=["true"],
                log=str(w.path),
                match=f"never-{uuid.uuid4().hex}",
            )
            for label, w in writers.items()
        },
    )
    redis = await open_redis(config)
    ssh = SSHPool(config)
    runs = RunStore(redis.client, redis.prefix)
    events = Events(redis.client, redis.prefix)
    ctx = Context(
        config, redis, ssh, runs, Restarter(config, ssh, runs, events), events, MemoryOutbox(), "bench"
    )
    times: dict[str, list[tuple[float, float]]] = {label: [] for label in sizes}
    path_times: dict[str, list[tuple[float, float, float]]] = {"now": [], "reference": []}
    notes: dict[str, str] = {}
    small = next(iter(sizes))
    try:
        await _build(ctx, small, scheduled=False, chart=False)  # open the SSH connection
        for i in range(repeat):
            order = list(sizes) if i % 2 == 0 else list(reversed(sizes))
            for label in order:
                t_first, t_next, notes[label] = await _case(
                    ctx, label, writers[label], i, max_bytes, first_bytes, checks
                )
                times[label].append((t_first, t_next))
            ref_data = b""
            for path in ("now", "reference") if i % 2 == 0 else ("reference", "now"):
                *took, _, data = await steps(
                    ctx, small, reference=path == "reference", max_bytes=max_bytes, first_bytes=first_bytes
                )
                path_times[path].append((took[0], took[1], took[2]))
                ref_data = data if path == "reference" else ref_data
            counts = [
                len(parse_metric_lines(ref_data, "jsonl")),
                len(parse_jsonl(ref_data, json.loads)),
            ]
            checks.correct(
                f"run {i}: both parsers find the same metric lines in the reference's window",
                counts[0] == counts[1],
                f"{counts}",
            )
    finally:
        await ssh.close()
        await redis.aclose()
        await host.close()
        for w in writers.values():
            w.path.unlink(missing_ok=True)
    out = {}
    for label, pairs in times.items():
        first = statistics.median(p[0] for p in pairs)
        nxt = statistics.median(p[1] for p in pairs)
        print(
            f"  {label}: first {first * 1000:.0f} ms, next {nxt * 1000:.0f} ms ({notes[label]})", flush=True
        )
        out[label] = (first, nxt)
    medians: dict[str, Steps] = {}
    for path, triples in path_times.items():
        read, parse, agg = (statistics.median(t[k] for t in triples) for k in range(3))
        medians[path] = (read, parse, agg)
        print(
            f"  first digest, {path:9s}: read {read * 1000:4.0f} ms  parse {parse * 1000:4.0f} ms  "
            f"aggregate {agg * 1000:4.0f} ms  total {(read + parse + agg) * 1000:4.0f} ms",
            flush=True,
        )
    return out, medians


async def main(argv: list[str]) -> int:
    """Run the benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per case (median)")
    parser.add_argument("--big-mb", type=int, default=1000, help="size of the large log in MB (default 1000)")
    parser.add_argument("--quick", action="store_true", help="2 MB and 4 MB logs, 1 MiB window, one repeat")
    args = parser.parse_args(argv)
    checks = Checks(quick=args.quick)
    small_mb, big_mb, repeat, max_bytes, first_bytes = (
        (2, 4, 1, 2**20, 2**18)
        if args.quick
        else (10, args.big_mb, args.repeat, MAX_WINDOW_BYTES, FIRST_WINDOW_BYTES)
    )
    small_label = f"{small_mb}MB"
    big_label = "1GB" if big_mb == 1000 else f"{big_mb}MB"
    with tempfile.TemporaryDirectory(prefix="pitstop-bench-digest-") as d:
        result, paths = await run(
            Path(d),
            {small_label: small_mb * MB, big_label: big_mb * MB},
            repeat,
            max_bytes,
            first_bytes,
            checks,
        )
    small, big = result[small_label], result[big_label]
    s_ms, b_ms = sum(small) * 1000, sum(big) * 1000
    now, ref = sum(paths["now"]) * 1000, sum(paths["reference"]) * 1000
    size_ratio = f"{big_label} / {small_label}"
    checks.bound(f"{size_ratio} within 2x (reads only the window)", b_ms / s_ms <= 2.0, f"{b_ms / s_ms:.2f}x")
    checks.target(f"{size_ratio} within 1.2x", b_ms / s_ms <= 1.2, f"{b_ms / s_ms:.2f}x")
    checks.target("first digest 5x faster than the reference path", ref / now >= 5.0, f"{ref / now:.1f}x")
    print(
        checks.summary(
            f"digest: {small_label} {s_ms:.0f} ms {big_label} {b_ms:.0f} ms ratio {b_ms / s_ms:.2f}x; "
            f"first digest {now:.0f} ms vs reference {ref:.0f} ms speedup {ref / now:.1f}x"
        )
    )
    return checks.status


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
