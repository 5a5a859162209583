"""An attempt's byte range of its metric file, read over real SSH when the file changed since."""

from __future__ import annotations

import json
import uuid
from functools import partial
from pathlib import Path

from pipeline.config import Config
from pipeline.host.probe import CRASH_BYTES, JobProbe, read_log_chunk
from pipeline.observe.attempts import read_attempt
from pipeline.observe.evidence import crash_evidence
from tests.test_watch import job_config, open_harness


def _lines(role: str, steps: range) -> bytes:
    rank = 0 if role == "target" else 5
    return b"".join(
        json.dumps({"ts": 1_796_000_000.0 + s, "step": s, "role": role, "rank": rank}).encode() + b"\n"
        for s in steps
    )


async def test_a_range_truncated_since_is_not_read_as_the_attempts(
    tmp_path: Path, redis_config: Config
) -> None:
    """A metric file the next attempt started afresh (opened with "w", copytruncate) no longer holds
    the previous attempt's range: reading it gives no lines, not the new attempt's as the old's."""
    root = tmp_path / "jobs"
    metrics = root / "m" / "metrics.jsonl"
    job = job_config(root, "m", uuid.uuid4().hex).model_copy(update={"metrics_log": str(metrics)})
    metrics.write_bytes(_lines("drafter", range(1, 41)))  # the previous attempt's 40 steps
    end = metrics.stat().st_size  # the next launch noted this size
    async with open_harness(tmp_path, redis_config, {"m": job}) as h:
        whole = await read_attempt(partial(read_log_chunk, h.ctx.ssh), "m", job, 0, end)
        assert [ln.step for ln in whole] == list(range(1, 41))
        metrics.write_bytes(_lines("drafter", range(31, 36)))  # the next attempt's, written afresh
        assert metrics.stat().st_size < end
        assert await read_attempt(partial(read_log_chunk, h.ctx.ssh), "m", job, 0, end) == []
        assert [
            ln.step for ln in await read_attempt(partial(read_log_chunk, h.ctx.ssh), "m", job, end)
        ] == list(range(31, 36))


async def test_a_crash_read_of_a_log_truncated_since_launch_is_its_end(
    tmp_path: Path, redis_config: Config
) -> None:
    """The crash check's own read (the probe brought none: an older death) of a log now shorter
    than its size at launch and longer than ``CRASH_BYTES`` is its last ``CRASH_BYTES``, where
    the traceback is, not its first."""
    root = tmp_path / "jobs"
    job = job_config(root, "c", uuid.uuid4().hex)
    log = Path(job.log)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"x" * CRASH_BYTES + b"step 9\nRuntimeError: boom\n")
    size = log.stat().st_size
    async with open_harness(tmp_path, redis_config, {"c": job}) as h:
        seen = JobProbe("c", state="gone", log_size=size, tail="")  # the probe's look, no crash bytes
        got = await crash_evidence(h.ctx.ssh, "c", job, {}, size + 10**6, seen)
        assert got.crash is not None
        assert got.crash.data.endswith(b"RuntimeError: boom\n")
        assert len(got.crash.data) == CRASH_BYTES
