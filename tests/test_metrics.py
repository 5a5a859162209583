"""Metric line parsing: JSON lines from the dflash pipeline and regex-mapped plain-text logs."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import MetricsPattern, parse_config
from pipeline.digest.stats import summarise
from pipeline.observe.metrics import (
    DEFAULT_ROLE,
    MetricLine,
    parse_jsonl,
    parse_metric_lines,
    parse_pattern,
    why_none,
)

DATA = Path(__file__).parent / "data"
DFLASH_LOG = (DATA / "dflash_metrics.log").read_bytes()
PLAIN_LOG = (DATA / "plain_metrics.log").read_bytes()
PLAIN_PATTERN = MetricsPattern(
    pattern=r"^(?P<ts>\S+) \[rank (?P<rank>\d+)\] step (?P<step>\d+) tokens (?P<tokens>[\d,]+) "
    r"\((?P<tokens_per_s>[\d,.]+) tok/s\) loss (?P<loss>[\d.]+) step_time (?P<step_time_s>[\d.]+)s"
)


def test_jsonl_keeps_only_metric_records() -> None:
    """The start-up line, traceback, non-record JSON, malformed JSON and the partial last line are skipped."""
    lines = parse_metric_lines(DFLASH_LOG, "jsonl")
    assert len(lines) == 28  # 15 target + 12 drafter lines + 1 drafter line with unusable values
    assert {ln.role for ln in lines} == {"target", "drafter"}
    assert sorted({ln.rank for ln in lines}) == list(range(8))
    assert max(ln.tokens or 0 for ln in lines) < 99_999_999  # the partial last line was not read
    assert all(ln.ts is not None and 1_700_000_000 <= ln.ts <= 1_700_000_030 for ln in lines)


def test_jsonl_reads_every_documented_key() -> None:
    """A dflash drafter line maps each documented key onto MetricLine."""
    line = (
        b'{"ts":1796087882.44,"step":30,"role":"drafter","rank":5,"role_rank":0,"device":"cpu",'
        b'"tokens":1920,"tokens_per_s":2881.3,"step_time_s":0.022212,"queue_depth":8,"loss":3.802478,'
        b'"top1":0.234375,"top4":0.3125,"top8":0.65625,"gpu_mem_bytes":null}\n'
    )
    assert parse_jsonl(line) == [
        MetricLine(
            ts=1796087882.44,
            role="drafter",
            rank=5,
            step=30,
            role_rank=0,
            device="cpu",
            tokens=1920.0,
            tokens_per_s=2881.3,
            step_time_s=0.022212,
            queue_depth=8.0,
            loss=3.802478,
            top1=0.234375,
            top4=0.3125,
            top8=0.65625,
            gpu_mem_bytes=None,
        )
    ]


@pytest.mark.parametrize(
    "value",
    [b'"lots"', b"true", b"NaN", b"Infinity", b"null", b"[1]", b'""'],
)
def test_unusable_values_are_absent_not_zero(value: bytes) -> None:
    """Strings, booleans, NaN/Infinity and null read as None, never 0, and never raise."""
    line = b'{"ts":1.0,"role":"drafter","rank":5,"tokens":' + value + b',"loss":' + value + b"}\n"
    (rec,) = parse_jsonl(line)
    assert rec.tokens is None and rec.loss is None


def test_jsonl_without_role_or_with_binary_junk_is_skipped() -> None:
    """JSON objects without a string role, non-objects and undecodable bytes are not records."""
    data = b'{"ts":1,"rank":0}\n{"role":5}\n"text"\n\xff\xfe{"role":"x"\n{"role":"drafter","rank":"7"}\n'
    (rec,) = parse_jsonl(data)
    assert (rec.role, rec.rank, rec.ts) == ("drafter", 7, None)


def test_plain_json_lines_with_a_step_and_a_rate_or_loss_are_metric_lines() -> None:
    """``{"step", "tokens_per_s"|"samples_per_s"|"loss"}`` without role or ts is a worker rank-0 line;
    a step alone, or a rate alone, is not."""
    data = (
        b'{"step": 1, "tokens_per_s": 900, "loss": 1.0}\n{"step": 2, "samples_per_s": 32.5}\n'
        b'{"step": 3, "loss": "0.9"}\n{"step": 4}\n{"tokens_per_s": 900}\n{"step": 5, "loss": null}\n'
        b'{"step": 6, "tokens_per_s": 900, "rank": 3, "event": "waiting"}\n'
    )
    lines = parse_jsonl(data)
    assert [(ln.role, ln.rank, ln.step, ln.ts) for ln in lines] == [
        (DEFAULT_ROLE, 0, s, None) for s in (1, 2, 3)
    ]
    assert (lines[0].tokens_per_s, lines[0].loss, lines[1].samples_per_s, lines[2].loss) == (
        900.0,
        1.0,
        32.5,
        0.9,
    )
    assert parse_jsonl(data, json.loads) == lines


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"".join(b'{"epoch": %d}\n' % i for i in range(40)), "40 JSON lines, none with step"),
        (
            b'{"step": 1}\n{"step": 2, "lr": 0.1}\n',
            "2 JSON lines, none with step and one of tokens_per_s, samples_per_s, loss (or a role)",
        ),
        (b'{"event": "waiting", "step": 1}\n', "1 JSON line, all events"),
        (b"epoch 1 done\nepoch 2 done\n[1, 2]\n", "3 lines, none a JSON object"),
        (b'{"step": 1, "loss": 1.0}', "no complete line"),
    ],
)
def test_why_no_line_counts(data: bytes, why: str) -> None:
    """When lines are read and none counts, the reason names what the lines lacked."""
    assert parse_metric_lines(data, "jsonl") == []
    assert why_none(data, "jsonl") == why


def test_why_no_line_matches_the_pattern() -> None:
    """A plain-text log none of whose lines matches: the count of lines and the pattern."""
    data = b"epoch 1 done\nepoch 2 done\n"
    pattern = MetricsPattern(pattern=r"step (?P<step>\d+)")
    assert (
        parse_metric_lines(data, pattern) == []
        and why_none(data, pattern) == "2 lines, none matching the pattern"
    )


def test_wait_events_are_not_metric_records_under_either_role_name() -> None:
    """A waiting event (``role`` since one name, ``rank_role`` in older logs) is read by no metric parser."""
    metric = b'{"ts":1.0,"step":40,"role":"drafter","rank":5,"tokens":100.0}\n'
    data = (
        metric + b'{"ts":3.0,"event":"waiting","rank":5,"role":"drafter","step":40,"on":"all_reduce"}\n'
        b'{"ts":5.0,"event":"waiting","rank":7,"rank_role":"drafter","step":40,"on":"all_reduce"}\n'
    )
    assert parse_jsonl(data) == parse_jsonl(data, json.loads) == parse_jsonl(metric)


def test_regex_mapping_reads_plain_text_log() -> None:
    """Named groups become keys; '1,000.0' and ISO times are converted; non-matching lines are skipped."""
    lines = parse_metric_lines(PLAIN_LOG, PLAIN_PATTERN)
    assert len(lines) == 6  # the partial last line and the two prose lines are not records
    first = lines[0]
    assert first.ts == datetime(2024, 5, 1, 12, 0, tzinfo=UTC).timestamp()
    assert (first.role, first.rank, first.step) == (DEFAULT_ROLE, 0, 100)
    assert (first.tokens, first.tokens_per_s, first.loss, first.step_time_s) == (10_000, 1000.0, 3.5, 0.25)
    assert lines[-1].tokens == 260_000


def test_regex_mapping_feeds_the_digest() -> None:
    """A plain-text log summarises like JSON lines: ranks without a role all count toward the pipeline."""
    s = summarise(parse_pattern(PLAIN_LOG, PLAIN_PATTERN))
    # rank 0: (130,000 - 10,000) / 120 s = 1000; rank 1: (260,000 - 20,000) / 120 s = 2000
    assert [r.tokens_per_s for r in s.ranks] == [1000.0, 2000.0]
    assert s.pipeline_tokens_per_s == 3000.0
    assert s.target_tokens_per_s is None
    assert s.step_p50 == pytest.approx(0.285)  # median of 0.25 .26 .27 .30 .35 .40
    assert s.loss_last == pytest.approx(2.35)  # mean of each rank's last loss (2.5, 2.2)
    assert s.loss_mean == pytest.approx(2.9)


def test_regex_mapping_with_role_and_unix_ts_from_config() -> None:
    """A pattern from the TOML config may name role and a unix-seconds ts."""
    config = parse_config(
        {
            "hosts": {"h": {"address": "127.0.0.1"}},
            "jobs": {
                "j": {
                    "host": "h",
                    "workdir": "/w",
                    "launch": ["x"],
                    "log": "/w/log",
                    "match": "x",
                    "metrics": {"pattern": r"(?P<ts>[\d.]+) (?P<role>\w+)/(?P<rank>\d) tok=(?P<tokens>\d+)"},
                }
            },
        }
    )
    mapping = config.jobs["j"].metrics
    assert isinstance(mapping, MetricsPattern)
    lines = parse_metric_lines(b"100.5 target/3 tok=7\nnoise\n101.5 drafter/6 tok=9\n", mapping)
    assert [(ln.ts, ln.role, ln.rank, ln.tokens) for ln in lines] == [
        (100.5, "target", 3, 7.0),
        (101.5, "drafter", 6, 9.0),
    ]


def test_pattern_matching_nothing_gives_no_lines() -> None:
    """A log the pattern does not fit gives no records rather than an error."""
    assert parse_metric_lines(DFLASH_LOG, PLAIN_PATTERN) == []


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["1,234", "2.5e3", " 7 ", "", "x", "NaN", "2026-12-01T10:00:00"]),
)
_KEYS = st.sampled_from(
    ["ts", "step", "role", "rank", "role_rank", "device", "tokens", "tokens_per_s", "step_time_s",
     "queue_depth", "loss", "top1", "top4", "top8", "gpu_mem_bytes", "event", "other"]
)  # fmt: skip
_OBJECTS = st.dictionaries(_KEYS, _VALUES | st.sampled_from(["drafter", "target"]), max_size=16)
_LINES = st.one_of(
    _OBJECTS.map(lambda d: json.dumps(d).encode()),
    st.just(b'{"role":"drafter","rank":5,"tokens":NaN,"loss":Infinity}'),
    st.just(b'  {"role":"target","rank":1}  '),
    st.just(b'{"role":"target"},{"role":"drafter"}'),
    st.just(b"[1, 2]"),
    st.just(b"{not json"),
    st.binary(max_size=40),
)


@given(st.lists(_LINES, max_size=30))
def test_fast_jsonl_parser_reads_exactly_as_the_stdlib_one(lines: list[bytes]) -> None:
    """orjson-based parse_jsonl gives the same records as the standard-library reference, line for line."""
    data = b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n"
    assert parse_jsonl(data) == parse_jsonl(data, json.loads)


def test_fast_jsonl_parser_on_the_recorded_log() -> None:
    """On the recorded dflash log (start-up line, traceback, malformed and partial lines) both parsers agree."""
    assert parse_jsonl(DFLASH_LOG) == parse_jsonl(DFLASH_LOG, json.loads)
