"""A job's ``[jobs.NAME.watch]`` (with ``auto_restart``) and ``[jobs.NAME.digest]`` tables."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from pipeline.config.base import Seconds, _Model, must


class CrashClass(StrEnum):
    """Why a job failed; the values appear in alerts and in ``auto_restart.on``."""

    NCCL_TIMEOUT = "nccl_timeout"
    NCCL_ERROR = "nccl_error"
    CUDA_OOM = "cuda_oom"
    HOST_OOM = "host_oom"
    XID = "xid"
    PYTHON_EXCEPTION = "python_exception"
    SIGNAL = "signal"
    UNKNOWN = "unknown"


#: The classes a restart may cure: ``auto_restart.on``'s default.
TRANSIENT: tuple[CrashClass, ...] = (
    CrashClass.NCCL_TIMEOUT,
    CrashClass.NCCL_ERROR,
    CrashClass.XID,
    CrashClass.HOST_OOM,
    CrashClass.UNKNOWN,
)


class AutoRestart(_Model):
    """``auto_restart = {max, within, backoff, on}``: restart a crashed job, bounded."""

    max: int = Field(default=3, ge=1)  #: restarts allowed within ``within``
    within: Seconds = 3600.0  #: seconds
    backoff: Seconds = 10.0  #: first delay in seconds, doubled after each restart
    #: crash classes restarted automatically (classified by :mod:`pipeline.observe.crashes`)
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
    #: seconds after a RUNNING verdict when throughput since the restart is compared with before it
    recovery_window: Seconds = 300.0
    #: below this fraction of the previous run's median throughput → a "slower since" alert
    slow_after_restart: float = Field(default=0.8, gt=0, le=1)
    #: automatic restarts stop after this many consecutive attempts that made no progress
    no_progress_after: int = Field(default=3, ge=1)
    #: steps past its resume step an attempt must advance to count as progress
    min_progress: int = Field(default=1, ge=1)
    #: a job GPU under this utilisation (percent) for ``idle_gpu_for`` → an ``idle_gpus`` incident
    idle_gpu_below: float | None = Field(default=None, gt=0, le=100)
    idle_gpu_for: Seconds | None = None  #: seconds; both idle keys set, or neither (off)

    @model_validator(mode="after")
    def _idle_pair(self) -> WatchSettings:
        if (self.idle_gpu_below is None) != (self.idle_gpu_for is None):
            raise ValueError("set both idle_gpu_below and idle_gpu_for, or neither")
        return self


_NOT_CRON = "a cron expression has 5 fields: minute hour day month weekday"


class DigestSettings(_Model):
    """``[jobs.NAME.digest]``: periodic throughput digests, ``every`` or ``cron``."""

    every: Seconds | None = None
    cron: Annotated[str, must(lambda v: len(v.split()) == 5, _NOT_CRON)] | None = None

    @model_validator(mode="after")
    def _one(self) -> DigestSettings:
        if self.every is not None and self.cron is not None:
            raise ValueError("set either every or cron, not both")
        return self
