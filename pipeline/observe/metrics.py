"""Metric lines: the training log's throughput records, parsed from bytes, in the job's
``metrics`` format:

- ``"jsonl"`` (the default): JSON objects without an ``event`` key, keyed as :class:`MetricLine`
  (``pipeline/dflash/README.md``), that have a string ``role`` — or, any JSON job's lines, a
  ``step`` and one of ``tokens_per_s``, ``samples_per_s`` or ``loss`` (then role ``worker``, rank 0
  unless given: ``{"step": 12, "tokens_per_s": 900, "loss": 1.0}``); other lines are skipped,
  and :func:`why_none` says why when none counts;
- ``{pattern = '...'}``: a regular expression whose named groups are those keys (role ``worker``
  and rank 0 when absent; ``"1,234"``, ``"2.5e3"``, and for ``ts`` ISO 8601 times, UTC when naive).

Parsing never raises on log content: a value of the wrong type (``NaN``, ``true``, a string where
a number belongs) is read as ``None``, never 0; a ``loss`` that is NaN or infinite (JSON ``NaN``,
``Infinity``, the strings ``"nan"``, ``"inf"``) is kept aside as ``loss_not_finite`` (the loss-health
rule's, :mod:`pipeline.observe.loss`).  JSON is decoded with orjson (a line it refuses by
the standard library, which reads the same); ``bench/digest.py`` measures both paths.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

import orjson

from pipeline.config import MetricsPattern

DEFAULT_ROLE = "worker"  #: role of a metric line without a ``role`` (group)
TARGET = "target"  #: the reference pipeline's target ranks (they produce; the drafters consume)
DRAFTER = "drafter"
_FLOAT_KEYS = (
    "tokens",
    "tokens_per_s",
    "step_time_s",
    "queue_depth",
    "loss",
    "top1",
    "top4",
    "top8",
    "samples_per_s",
)
RATE_KEYS = (
    "tokens_per_s",
    "samples_per_s",
    "loss",
)  #: one of these and ``step``: a line without ``role`` counts
MAX_READ = 4 * 1024 * 1024  #: bytes of a metric log read at once at most (its last ones)
_NUMBER = re.compile(r"^[+-]?(\d[\d,_]*)?(\.\d*)?([eE][+-]?\d+)?$")


class MetricLine(NamedTuple):
    """One metric record of one rank (immutable)."""

    ts: float | None  #: unix s; None when the log has no timestamps
    role: str  #: ``target``, ``drafter`` (the reference pipeline) or another role name
    rank: int  #: global rank
    step: int | None = None
    role_rank: int | None = None  #: rank within the role
    device: str | None = None  #: ``cpu``, ``cuda:5``, …
    tokens: float | None = None  #: cumulative tokens this rank processed since its launch
    tokens_per_s: float | None = None  #: the rank's own rate since its previous line
    step_time_s: float | None = None  #: mean seconds per step since the previous line
    queue_depth: float | None = None  #: hidden states waiting in the target→drafter queue
    loss: float | None = None  #: drafter loss (nats/token)
    top1: float | None = None  #: drafter top-1 accuracy in [0, 1] (likewise ``top4``, ``top8``)
    top4: float | None = None
    top8: float | None = None
    samples_per_s: float | None = None  #: the rank's own rate in samples (a job that counts no tokens)
    gpu_mem_bytes: int | None = None  #: peak GPU memory allocated by the rank
    #: ``NaN``, ``Inf`` or ``-Inf`` when the line's ``loss`` was not finite (``loss`` is then None)
    loss_not_finite: str | None = None


def parse_number(value: Any) -> float | None:
    """A finite float from a JSON number or a numeric string (``"1,234"``, ``" 2.5e3 "``), else None:
    for ``[N/A]``, ``NaN``, an empty string, a bool (not a number) or anything else."""
    if type(value) is str:
        value = value.strip()
        if not value or not _NUMBER.match(value):
            return None
        value = value.replace(",", "").replace("_", "")
    elif type(value) is not float and type(value) is not int:
        return None  # bool, None, list, dict
    try:
        out = float(value)
    except (ValueError, OverflowError):  # "+", ".", an integer beyond a float
        return None
    return out if math.isfinite(out) else None


_NOT_FINITE = re.compile(r"^([+-]?)(nan|inf|infinity)$", re.IGNORECASE)


def not_finite(value: Any) -> str | None:
    """``NaN``, ``Inf`` or ``-Inf`` for a float or string that is NaN or infinite (``NaN``,
    ``Infinity`` as Python's json writes them, ``"nan"``, ``"-inf"``), else None."""
    if type(value) is float:
        return (
            None if math.isfinite(value) else "NaN" if math.isnan(value) else "Inf" if value > 0 else "-Inf"
        )
    if type(value) is str and (m := _NOT_FINITE.match(value.strip())):
        return "NaN" if m.group(2).lower() == "nan" else f"{'-' if m.group(1) == '-' else ''}Inf"
    return None


def _int(value: Any) -> int | None:
    out = value if type(value) is int else parse_number(value)
    return int(out) if out is not None and out == int(out) else None


def _ts(value: Any) -> float | None:
    """Unix seconds from a number, a numeric string or an ISO 8601 time (UTC if naive)."""
    out = parse_number(value)
    if out is not None or type(value) is not str:
        return out
    try:
        when = datetime.fromisoformat(value.strip().replace(",", "."))
    except ValueError:
        return None
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()


def _record(raw: dict[str, Any], default_role: str | None) -> MetricLine | None:
    """A :class:`MetricLine` from a dict of raw values, or None if it is not a metric record."""
    role = raw.get("role")
    if (role := role if type(role) is str and role else default_role) is None:
        return None
    rank, device = _int(raw.get("rank")), raw.get("device")
    return MetricLine._make(
        [
            _ts(raw.get("ts")),
            role,
            rank if rank is not None else 0,
            _int(raw.get("step")),
            _int(raw.get("role_rank")),
            device if type(device) is str and device else None,
            *(parse_number(raw.get(key)) for key in _FLOAT_KEYS),
            _int(raw.get("gpu_mem_bytes")),
            not_finite(raw.get("loss")),
        ]
    )


def _complete_lines(data: bytes) -> list[bytes]:
    """The newline-terminated lines of ``data``; a partial last line (no newline yet) is left out."""
    return data[: data.rfind(b"\n") + 1].splitlines()


def _json_line(line: bytes, loads: Callable[[bytes], Any]) -> MetricLine | None:
    """A line's metric record, or None; a line orjson refused (``NaN``, a huge integer, …) is read
    as the standard library reads it."""
    try:
        raw = loads(line)
    except ValueError:  # both decoders' errors, UnicodeDecodeError included
        return None if loads is json.loads else _json_line(line, json.loads)
    if type(raw) is not dict or "event" in raw:
        return None
    return _record(raw, DEFAULT_ROLE if _generic(raw) else None)


def _generic(raw: dict[str, Any]) -> bool:
    """Whether a JSON object without ``role`` is a metric line: a ``step`` and a rate or loss (a NaN
    loss too)."""
    rated = any(parse_number(raw.get(k)) is not None for k in RATE_KEYS) or not_finite(raw.get("loss"))
    return _int(raw.get("step")) is not None and bool(rated)


def parse_jsonl(data: bytes, loads: Callable[[bytes], Any] = orjson.loads) -> list[MetricLine]:
    """Metric lines from JSON-lines bytes (complete lines only), in file order.

    :param loads: the JSON decoder tried first (a line it refuses is read by ``json.loads``).
    """
    # a line whose first non-blank byte is not "{" holds no object
    records = (_json_line(ln, loads) for ln in _complete_lines(data) if ln.lstrip()[:1] == b"{")
    return [rec for rec in records if rec is not None]


def parse_pattern(data: bytes, pattern: MetricsPattern | re.Pattern[str]) -> list[MetricLine]:
    """Metric lines from a plain-text log (UTF-8, undecodable bytes replaced): ``pattern``, whose
    named groups are the metric keys, searched in each complete line; in file order."""
    rx = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern.pattern)
    found = (rx.search(line.decode("utf-8", "replace")) for line in _complete_lines(data))
    groups = ({k: v for k, v in m.groupdict().items() if v is not None} for m in found if m is not None)
    records = (_record(g, DEFAULT_ROLE) for g in groups if g)
    return [rec for rec in records if rec is not None]


def parse_metric_lines(data: bytes, mapping: Literal["jsonl"] | MetricsPattern) -> list[MetricLine]:
    """Metric lines from log bytes (a partial last line is not read) in the job's configured
    format (``"jsonl"`` or a :class:`~pipeline.config.MetricsPattern`), in file order."""
    return parse_pattern(data, mapping) if isinstance(mapping, MetricsPattern) else parse_jsonl(data)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile (``q`` in [0, 1]) of ``values``, None for none: numpy's default, linear
    interpolation at position ``(n - 1) * q`` of the sorted values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


# --- text ---------------------------------------------------------------------------------------


def why_none(data: bytes, mapping: Literal["jsonl"] | MetricsPattern) -> str:
    """Why the complete lines of ``data`` hold no metric line, in words for the digest:
    ``40 JSON lines, none with step``, ``12 lines, none matching the pattern``, ``no complete line``.
    Call it only when :func:`parse_metric_lines` found none."""
    lines = _complete_lines(data)
    if not lines:
        return "no complete line"
    if isinstance(mapping, MetricsPattern):
        return f"{_count(len(lines), 'line')}, none matching the pattern"
    objects = []
    for ln in lines:
        with contextlib.suppress(ValueError):
            if ln.lstrip()[:1] == b"{" and type(raw := json.loads(ln)) is dict:
                objects.append(raw)
    if not objects:
        return f"{_count(len(lines), 'line')}, none a JSON object"
    found = _count(len(objects), "JSON line")
    if all("event" in raw for raw in objects):
        return f"{found}, all events"
    if not any(_int(raw.get("step")) is not None for raw in objects):
        return f"{found}, none with step"
    return f"{found}, none with step and one of {', '.join(RATE_KEYS)} (or a role)"


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"
