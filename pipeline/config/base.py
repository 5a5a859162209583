"""What every config table is built from: strict frozen models and durations in seconds."""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from pipeline import fmt


def seconds_setting(value: object) -> float:
    """A config duration in seconds: a number, or a string :func:`pipeline.fmt.parse_duration` reads
    (``"90"``, ``"30m"``, ``"1h"``, ``"2.5s"``).

    :returns: seconds (float, finite, > 0).
    :raises ValueError: for anything else, or a value that is not positive and finite.
    """
    if isinstance(value, bool):
        raise ValueError("expected seconds or a duration such as '30m'")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError("too large for a duration") from None
    elif isinstance(value, str):
        seconds = fmt.parse_duration(value)
    else:
        raise ValueError(f"expected seconds or a duration such as '30m', got {value!r}")
    if not math.isfinite(seconds):
        raise ValueError("must be a finite number of seconds")
    if seconds <= 0:
        raise ValueError("must be positive")
    return seconds


Seconds = Annotated[float, BeforeValidator(seconds_setting)]


def matching(pattern: str, problem: str) -> AfterValidator:
    """A string setting's check: the whole value matches ``pattern`` (a regular expression).

    :param problem: the problem when it does not; ``{v!r}`` in it is the value.
    """

    def check(v: str) -> str:
        if not re.fullmatch(pattern, v):
            raise ValueError(problem.format(v=v))
        return v

    return AfterValidator(check)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
