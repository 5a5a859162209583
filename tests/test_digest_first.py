"""A first digest reads only its tail (FIRST_WINDOW_BYTES), later ones everything since; the
metric lines parsed in one orjson call read exactly as line by line (real Redis, a local log)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pipeline.config import Config, JobConfig
from pipeline.digest.report import build_digest
from pipeline.digest.window import WindowKind
from pipeline.observe.metrics import parse_jsonl, parse_metric_lines
from pipeline.state.events import Events
from pipeline.state.redisconn import RedisHandle, open_redis
from tests.fixtures.localread import local_reader


def line(step: int, rank: int) -> bytes:
    """One drafter metric line of ``rank`` at ``step`` (cumulative tokens, 2 s a step)."""
    rec = {"ts": 1000.0 + 2 * step, "step": step, "role": "drafter", "rank": rank, "tokens": 100 * step,
           "tokens_per_s": 50.0, "step_time_s": 0.5, "queue_depth": 1}  # fmt: skip
    return json.dumps(rec).encode() + b"\n"


@pytest.fixture
async def handle(redis_config: Config) -> AsyncIterator[RedisHandle]:
    """The test's Redis."""
    h = await open_redis(redis_config)
    try:
        yield h
    finally:
        await h.aclose()


async def test_a_first_digest_reads_only_its_tail_and_the_next_everything_since(
    tmp_path: Path, redis_config: Config, handle: RedisHandle
) -> None:
    """No offset: the last first_bytes only, from a line start; the next scheduled digest reads
    all that was written since, up to max_bytes."""
    log = tmp_path / "m.log"
    log.write_bytes(b"".join(line(s, r) for s in range(1, 200) for r in (5, 6)))
    job = JobConfig(host="h", workdir=str(tmp_path), launch=["true"], log=str(log), match="never")
    config = redis_config.model_copy(update={"jobs": {"j": job}})
    events = Events(handle.client, handle.prefix)

    async def digest() -> object:
        return await build_digest(
            "j", config=config, redis=handle, ssh=None, events=events, scheduled=True,  # type: ignore[arg-type]
            max_bytes=20_000, first_bytes=2_000, reader=local_reader(log), chart=False,
        )  # fmt: skip

    first = await digest()
    assert first.window.kind is WindowKind.LAST_BYTES and first.max_bytes == 2_000  # type: ignore[attr-defined]
    assert 0 < first.summary.bytes_read <= 2_000 and first.window.end == log.stat().st_size  # type: ignore[attr-defined]
    added = b"".join(line(s, r) for s in range(200, 260) for r in (5, 6))
    with log.open("ab") as f:
        f.write(added)
    nxt = await digest()
    assert nxt.window.kind is WindowKind.SINCE_LAST and nxt.max_bytes == 20_000  # type: ignore[attr-defined]
    assert nxt.summary.bytes_read == len(added) > 2_000  # type: ignore[attr-defined]


def test_lines_parsed_in_one_call_read_as_line_by_line() -> None:
    """Plain lines, a line holding two objects, an event and a NaN: the same metric lines as the
    standard library finds line by line."""
    plain = line(1, 5) + line(2, 5) + b"not json\n" + line(1, 6)
    two = plain + line(3, 5).rstrip(b"\n") + b"," + line(3, 6)  # one line, two objects: not a metric line
    event = plain + b'{"event": "waiting", "rank": 5, "role": "drafter", "on": "all_reduce"}\n'
    nan = plain + b'{"step": 4, "role": "drafter", "rank": 5, "tokens_per_s": NaN}\n'
    for data in (plain, two, event, nan):
        ours = len(parse_metric_lines(data, "jsonl"))
        assert ours == len(parse_jsonl(data, json.loads)), data
