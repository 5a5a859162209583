"""One formatting module: one way to show a duration, a size, a moment and an unknown number."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import fmt


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (45.4, "45 s"),
        (59.6, "1 min"),
        (125, "2 min"),
        (720, "12 min"),
        (3 * 3600 + 5 * 60 + 7, "3 h 5 min"),
        (3 * 3600, "3 h"),
        (2 * 86400 + 4 * 3600 + 59, "2 d 4 h"),
        (7 * 86400, "7 d"),
        (None, "n/a"),
        (-1, "n/a"),
    ],
)
def test_duration(seconds: float | None, text: str) -> None:
    """A length of time in at most two units, unknown as n/a."""
    assert fmt.duration(seconds) == text


@given(st.integers(0, 400 * 86400))
def test_duration_reads_back_to_the_units_shown(seconds: int) -> None:
    """parse_duration(duration(x)) is x rounded down to the smaller unit shown."""
    text = fmt.duration(seconds)
    back = fmt.parse_duration(text)
    assert back <= seconds
    assert fmt.duration(back) == text


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("2.5", 2.5),
        ("90s", 90),
        ("30m", 1800),
        ("2H", 7200),
        ("1d", 86400),
        ("500ms", 0.5),
        ("3 h 5 min", 11100),
    ],
)
def test_parse_duration_reads_typed_and_configured_forms(text: str, seconds: float) -> None:
    """The short forms people type and configs hold, and the long form Pitstop shows."""
    assert fmt.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5 weeks", "-3s", "1h30", "2 h 3"])
def test_parse_duration_refuses_what_is_not_a_duration(text: str) -> None:
    """Anything else is a ValueError that names the text."""
    with pytest.raises(ValueError, match="duration"):
        fmt.parse_duration(text)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (512, "512 B"),
        (1536, "1.5 KiB"),
        (8 * 1024**2, "8.0 MiB"),
        (1024**3, "1.00 GiB"),
        (3 * 1024**4, "3.00 TiB"),
    ],
)
def test_size_is_binary(n: int, text: str) -> None:
    """Bytes in binary units, as du -h counts them."""
    assert fmt.size(n) == text


def test_clock_shows_the_date_only_when_not_today() -> None:
    """14:02:11 UTC today; the date in front on another day; an unknown timezone shows UTC."""
    ts = 1_796_133_731.0  # 2026-12-01 14:02:11 UTC
    assert fmt.clock(ts, now=ts + 60) == "14:02:11 UTC"
    assert fmt.clock(ts, now=ts + 86400) == "2026-12-01 14:02:11 UTC"
    assert fmt.clock(ts, "Europe/Paris", date=True) == "2026-12-01 15:02:11 CET"
    assert fmt.clock(ts, "Not/AZone", date=False) == "14:02:11 UTC"


def test_numbers_unknown_and_signed() -> None:
    """An unknown number is n/a, never 0; a change carries its sign."""
    assert fmt.number(None) == "n/a"
    assert fmt.number(1234.4) == "1,234"
    assert fmt.number(0.4123, "{:.1%}") == "41.2%"
    assert fmt.number(0.12, "{:.3f}", " s") == "0.120 s"
    assert fmt.signed_pct(4.1) == "+4.1%" and fmt.signed_pct(-3) == "-3.0%" and fmt.signed_pct(None) == ""
