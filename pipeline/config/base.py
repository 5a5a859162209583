"""What every config table is built from: strict frozen models and durations in seconds."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationInfo

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


def must(ok: Callable[[Any], object], problem: str, *, each: bool = False) -> AfterValidator:
    """A setting's check, for ``Annotated[T, must(...)]``: ``ok(value)`` is true, or with ``each``
    true of each item of the value (a list's items, a table's keys).

    :param problem: the problem otherwise; ``{v!r}`` in it is the value (or the first item that
        fails).
    """

    def check(value: Any) -> Any:
        for v in value if each else [value]:
            if not ok(v):
                raise ValueError(problem.format(v=v))
        return value

    return AfterValidator(check)


def matching(pattern: str, problem: str, *, each: bool = False) -> AfterValidator:
    """:func:`must`: the whole value (or each item) matches ``pattern``, a regular expression."""
    return must(re.compile(pattern).fullmatch, problem, each=each)


#: a Slack user id (``U…``/``W…``) or user-group id (``S…``), as Slack shows them
SLACK_ID = r"[SUW][A-Z0-9]{2,}"
_NOT_MEMBER = (
    "{v!r} is not a Slack id: use a user id (U…/W…) or a user-group id (S…), as Slack shows them "
    'in a profile\'s ⋮ → Copy member ID, or "*" for everyone'
)
#: a role's members in ``[auth]`` or ``[jobs.NAME.auth]``: Slack ids, or ``"*"`` (everyone)
Members = Annotated[list[str], matching(rf"{SLACK_ID}|\*", _NOT_MEMBER, each=True)]


def _local(path: Path, info: ValidationInfo) -> Path:
    """A local file named in the config, resolved against the config file's directory (the
    validation context's ``base``; as written without one)."""
    base = (info.context or {}).get("base")  # None: built in code, or parsed without a directory
    return path if base is None else (base / path.expanduser()).resolve()


LocalPath = Annotated[Path, AfterValidator(_local)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
