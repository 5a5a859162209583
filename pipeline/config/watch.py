"""A job's ``[jobs.NAME.watch]`` (with ``auto_restart``) and ``[jobs.NAME.digest]`` tables."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from pipeline.config.base import Seconds, _Model
from pipeline.observe.crashes import TRANSIENT, CrashClass


class AutoRestart(_Model):
    """``auto_restart = {max, within, backoff, on}``: restart a crashed job, bounded."""

    max: int = Field(default=3, ge=1)  #: restarts allowed within ``within``
    within: Seconds = 3600.0  #: seconds
    backoff: Seconds = 10.0  #: first delay in seconds, doubled after each restart
    #: crash classes restarted automatically (pipeline.observe.crashes)
    on: list[CrashClass] = list(TRANSIENT)


class WatchSettings(_Model):
    """``[jobs.NAME.watch]``: liveness and progress checks."""

    interval: Seconds = 15.0
    stall_after: Seconds = 600.0
    degraded_after: Seconds = 120.0
    rank_stall_after: Seconds | None = None  #: None: max(60 s, 20 × observed p95 time between advances)
    warmup: Seconds = 120.0  #: seconds after a launch without stuck-rank or stalled alerts
    unreachable_after: int = Field(default=3, ge=1)  #: consecutive failed probes (over >= 2 intervals)
    auto_restart: AutoRestart | None = None


class DigestSettings(_Model):
    """``[jobs.NAME.digest]``: periodic throughput digests, ``every`` or ``cron``."""

    every: Seconds | None = None
    cron: str | None = None

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, v: str | None) -> str | None:
        if v is not None and len(v.split()) != 5:
            raise ValueError("a cron expression has 5 fields: minute hour day month weekday")
        return v

    @model_validator(mode="after")
    def _one(self) -> DigestSettings:
        if self.every is not None and self.cron is not None:
            raise ValueError("set either every or cron, not both")
        return self
