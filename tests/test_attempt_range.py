"""An attempt's byte range of its metric file, read over real SSH when the file changed since."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from pipeline.config import Config
from pipeline.observe.attempts import read_attempt
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
        whole = await read_attempt(h.ctx.ssh, "m", job, 0, end)
        assert [ln.step for ln in whole] == list(range(1, 41))
        metrics.write_bytes(_lines("drafter", range(31, 36)))  # the next attempt's, written afresh
        assert metrics.stat().st_size < end
        assert await read_attempt(h.ctx.ssh, "m", job, 0, end) == []
        assert [ln.step for ln in await read_attempt(h.ctx.ssh, "m", job, end)] == list(range(31, 36))
