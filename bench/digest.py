"""Benchmark: digest time for a 10 MB and a 1 GB metric log, side by side.

A digest reads only what was written since the last scheduled digest, bounded to the last
8 MiB, so its cost must not grow with the log: the target is a 1 GB / 10 MB time ratio under
1.2x.

Both logs hold real dflash metric lines (5 target + 3 drafter ranks, monotonic counters and
timestamps, a start-up line), generated into a temporary directory and deleted afterwards.  The
path measured is the real one: :func:`pipeline.digest.build_digest` reading the log through the
host helper over SSH (an in-process asyncssh host on 127.0.0.1, reached by
:class:`~pipeline.remote.SSHPool`), parsing, aggregating and storing the offset in an embedded
Redis.  The chart is not drawn and the job has no ``gpus`` (both cost the same for any log size
and would only dilute the ratio).

Two cases per log, each the median of ``--repeat`` runs:

- **first**: no stored offset — the digest reads the log's last 8 MiB;
- **next**: a scheduled digest after 1 MiB more was appended — it reads just that.

Ends with ONE line: ``digest: 10MB X ms 1GB Y ms ratio Z.ZZx`` (first + next, summed).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from handlers.context import Context
from handlers.outbox import MemoryOutbox
from pipeline.config import Config, JobConfig, RedisSettings, StateSettings
from pipeline.digest import MAX_WINDOW_BYTES, build_digest
from pipeline.events import Events
from pipeline.redisconn import open_redis
from pipeline.remote import SSHPool
from pipeline.restart import Restarter
from pipeline.runs import RunStore
from pipeline.testhost import start_local_ssh_host

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


async def _case(ctx: Context, job: str, writer: LogWriter, run: int) -> tuple[float, float, str]:
    """One first digest (no stored offset) and one next digest after 1 MB more; seconds each."""
    ctx.redis.prefix = f"{ctx.config.redis.prefix}{job}{run}:"  # a fresh prefix: no stored offset
    t = time.perf_counter()
    first = await build_digest(ctx, job, scheduled=True, chart=False)
    t_first = time.perf_counter() - t
    writer.grow(MB)
    t = time.perf_counter()
    nxt = await build_digest(ctx, job, scheduled=True, chart=False)
    t_next = time.perf_counter() - t
    s = first.summary
    assert s.bytes_read <= MAX_WINDOW_BYTES and s.metric_lines > 0 and s.pipeline_tokens_per_s
    assert nxt.window.start == first.window.end and nxt.summary.bytes_read < 2 * MB
    note = (
        f"{s.bytes_read / MB:.1f} MB / {s.metric_lines:,} lines read, {s.pipeline_tokens_per_s:,.0f} tokens/s; "
        f"next read {nxt.summary.bytes_read / MB:.1f} MB"
    )
    return t_first, t_next, note


async def run(tmp: Path, sizes: dict[str, int], repeat: int) -> dict[str, tuple[float, float]]:
    """Generate the logs, then time digests of each, alternating so load drift hits both alike."""
    writers: dict[str, LogWriter] = {}
    for label, nbytes in sizes.items():
        started = time.perf_counter()
        writers[label] = LogWriter(tmp / f"{label}.log")
        writers[label].grow(nbytes)
        took = time.perf_counter() - started
        print(f"  generated {label}: {writers[label].size / MB:,.0f} MB in {took:.1f} s", flush=True)
    host = await start_local_ssh_host(tmp / "ssh")
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
    notes: dict[str, str] = {}
    try:
        await build_digest(ctx, next(iter(sizes)), scheduled=False, chart=False)  # open the SSH connection
        for i in range(repeat):
            order = list(sizes) if i % 2 == 0 else list(reversed(sizes))
            for label in order:
                t_first, t_next, notes[label] = await _case(ctx, label, writers[label], i)
                times[label].append((t_first, t_next))
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
    return out


async def main(argv: list[str]) -> int:
    """Run the benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per case (median)")
    parser.add_argument("--big-mb", type=int, default=1000, help="size of the large log in MB (default 1000)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pitstop-bench-digest-") as d:
        result = await run(Path(d), {"10MB": 10 * MB, "1GB": args.big_mb * MB}, args.repeat)
    small, big = result["10MB"], result["1GB"]
    s_ms, b_ms = sum(small) * 1000, sum(big) * 1000
    print(f"digest: 10MB {s_ms:.0f} ms 1GB {b_ms:.0f} ms ratio {b_ms / s_ms:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
