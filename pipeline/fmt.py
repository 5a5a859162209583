"""Formatting for people: exactly one function per kind of quantity (:func:`duration`,
:func:`size`, :func:`clock`, :func:`number`, :func:`signed_pct`), used by every layer.

A leaf module: standard library only, so ``pipeline``, ``handlers`` and ``bot`` format alike.
"""

from __future__ import annotations

import itertools
import math
import re
import time
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

UNKNOWN = "n/a"  #: what an unknown number shows (an unknown is never shown as 0)

_UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def duration(seconds: float | None) -> str:
    """A length of time in at most two units: ``45 s``, ``12 min``, ``3 h 5 min``, ``2 d 4 h``;
    rounded down to the smaller unit shown.  None, negative, NaN or infinite seconds: ``n/a``."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return UNKNOWN
    s = round(seconds)
    for (big, n), (small, m) in itertools.pairwise(_UNITS[:3]):  # days and hours, hours and minutes
        if s >= n:
            return f"{s // n} {big} {s % n // m} {small}" if s % n // m else f"{s // n} {big}"
    return f"{s // 60} min" if s >= 60 else f"{s} s"


_SHORT = re.compile(
    r"^\s*(\d{1,15}(?:\.\d{1,9})?)\s*(ms|s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?|d|days?)?\s*$",
    re.ASCII,
)
_SHORT_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_LONG = re.compile(r"^\s*(\d{1,15})\s*(d|h|min|s)(?:\s+(\d{1,15})\s*(d|h|min|s))?\s*$", re.ASCII)
_LONG_UNITS = dict(_UNITS)


def parse_duration(text: str) -> float:
    """Seconds (float, finite, may be 0) from a duration as people type it or :func:`duration` shows it.

    Reads a bare number of seconds (``90``, ``2.5``), a number with one unit (``500ms``, ``90s``,
    ``30m``, ``2h``, ``1d``, ``30mins``, ``2hours``, ``1day``; any case) and :func:`duration`'s
    output (``3 h 5 min``).  Digits are ASCII, at most 15 before the point.

    :raises ValueError: if ``text`` is not a duration.
    """
    if m := _SHORT.match(text.lower()):
        unit = m.group(2) or "s"
        return float(m.group(1)) * _SHORT_UNITS["ms" if unit == "ms" else unit[0]]
    if m := _LONG.match(text.lower()):  # one or two (number, unit) pairs
        return float(sum(int(n) * _LONG_UNITS[u] for n, u in (m.group(1, 2), m.group(3, 4)) if n is not None))
    raise ValueError(f"expected a duration such as '30m', '2h' or '90s', got {text!r}")


_SIZES = (("B", 0, 0), ("KiB", 1, 1), ("MiB", 2, 1), ("GiB", 3, 2), ("TiB", 4, 2))  # unit, power, digits


def size(n: float) -> str:
    """Bytes in binary units (as ``du -h`` counts): ``512 B``, ``1.5 KiB``, ``8.0 MiB``, ``1.00 GiB``,
    ``2.00 TiB``; NaN or infinity: ``n/a``."""
    if not math.isfinite(n):
        return UNKNOWN
    unit, power, digits = next(u for u in _SIZES if round(n / 1024 ** u[1], u[2]) < 1024 or u[0] == "TiB")
    return f"{n / 1024**power:.{digits}f} {unit}"


def timezone_of(name: str) -> ZoneInfo:
    """The IANA timezone ``name`` (``[scheduler] timezone``), or UTC when it is unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder of zones, a name too long
        return ZoneInfo("UTC")


def clock(ts: float, timezone: str = "UTC", *, date: bool | None = None, now: float | None = None) -> str:
    """A moment (``ts``, unix seconds) as wall-clock time in ``timezone`` (an unknown name shows
    UTC): ``14:02:11 UTC``, or ``2026-12-01 14:02:11 UTC``.

    :param date: True always shows the date, False never; None shows it when the moment is not
        today (``now``, unix seconds, default the clock).
    """
    tz = timezone_of(timezone)
    at = datetime.fromtimestamp(ts, tz)
    if date is None:
        date = at.date() != datetime.fromtimestamp(time.time() if now is None else now, tz).date()
    return at.strftime("%Y-%m-%d %H:%M:%S %Z" if date else "%H:%M:%S %Z")


def number(value: float | None, fmt: str = "{:,.0f}", unit: str = "") -> str:
    """``value`` formatted with ``fmt`` and followed by ``unit``, or ``n/a`` when it is unknown.

    :param fmt: a :meth:`str.format` pattern (``"{:.3f}"``, ``"{:.1%}"``).
    """
    return UNKNOWN if value is None or not math.isfinite(value) else fmt.format(value) + unit


def signed_pct(change: float | None) -> str:
    """A change in percent: ``+5.2%``, ``-3.0%``; ``""`` when unknown (None, NaN, infinity)."""
    return "" if change is None or not math.isfinite(change) else f"{change:+.1f}%"


def who(user: str) -> str:
    """A Slack user id as a mention (``<@U012AB>``); any other requester (``console``) as it is."""
    if user.startswith(("U", "W")) and user[1:].isalnum() and user.isupper() and len(user) > 2:
        return f"<@{user}>"
    return user
