"""A job's ``[jobs.NAME]`` table and its sub-tables (``gpus``, ``metrics``, ``auth``, ``watch`` with
``auto_restart`` and the crash classes, ``digest``, and ``approval``: the two-person rule — which
actions on a job wait for a second person; the rules: :mod:`handlers.approval.twoperson`, the
record: :mod:`pipeline.state.approvals`).  What suits the
job's ``engine``, and the engine's own table (``[jobs.NAME.slurm]``), the engine checks
(:func:`pipeline.engines.base.check_engines`)."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, model_validator

from pipeline.config.base import LocalPath, Seconds, _Model, matching, must, seconds_setting

HostPath = Annotated[str, matching("(?s)/.*", "must be an absolute path on the host")]


def _regex(v: str) -> str:
    try:
        re.compile(v)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from exc
    return v


_NOT_PERSON = (
    "owner {v!r}: use a user id (U…) or a user-group id (S…), as Slack shows them "
    "in a profile's ⋮ → Copy member ID"
)
_UNSAFE = "{v!r}: must be an absolute path, not '/', without '..'"
_PATCH_NAME = "patch name {v!r}: letters, digits, '_', '.', '-' only"


def _known(host: str, info: ValidationInfo) -> str:
    hosts = (info.context or {}).get("hosts")  # as read from the file (Config checks it again)
    if isinstance(hosts, dict) and host not in hosts:
        raise ValueError(f"unknown host '{host}' (known: {', '.join(hosts) or 'none'})")
    return host


def _found(path: Path, info: ValidationInfo) -> Path:
    if (info.context or {}).get(
        "base"
    ) and not path.is_file():  # read from a file: a patch it names must be there
        raise ValueError(f"file not found: {path}")
    return path


def _safe(path: str) -> bool:
    return path.startswith("/") and path.rstrip("/") != "" and ".." not in path.split("/")


class LostDuration(_Model):
    """``max_lost = "10m"``: the most training time a restart may lose, in seconds."""

    seconds: float


def _lost(v: object) -> object:
    if isinstance(v, str):
        return LostDuration(seconds=seconds_setting(v))
    if isinstance(v, bool) or (isinstance(v, int) and v < 0):
        raise ValueError("a number of steps (int >= 0) or a duration such as '10m'")
    return v


class GpuRoles(_Model):
    """``gpus = {target=[...], drafter=[...]}``: GPU indices per pipeline role."""

    target: list[int] = []
    drafter: list[int] = []

    @property
    def all(self) -> list[int]:
        """Every GPU index, targets first."""
        return [*self.target, *self.drafter]


class MetricsPattern(_Model):
    """``metrics = {pattern = '...'}``: a regex whose named groups are metric keys."""

    pattern: Annotated[
        str,
        AfterValidator(_regex),
        must(lambda v: re.compile(v).groupindex, "needs named groups, e.g. (?P<tokens_per_s>[0-9.]+)"),
    ]


class JobAuth(_Model):
    """``[jobs.NAME.auth]``: per-job role overrides (replace the global list when set)."""

    admins: list[str] | None = None
    operators: list[str] | None = None
    viewers: list[str] | None = None


#: what ``actions`` may list: ``restart_with_patch`` is a restart that applies or reverts a patch;
#: ``restart`` is every restart (with or without patches)
ApprovalAction = Literal["restart_with_patch", "restart", "start", "stop", "unlock"]

#: the role names ``approvers`` may list besides user and user-group ids (roles of ``[auth]``,
#: or of ``[jobs.NAME.auth]`` where the job sets them)
APPROVER_ROLES = ("admin", "operator", "viewer")

DEFAULT_EXPIRES = 900.0  #: seconds a request stays open (15 min)


_TOO_LONG = "at most 7 days (a request older than that is stale)"


def _approvers(v: list[str]) -> list[str]:
    for who in v:
        if who.endswith("s") and who[:-1] in APPROVER_ROLES:
            raise ValueError(f"approver {who!r}: the role is written {who[:-1]!r}")
        if not who.strip() or who != who.strip() or who == "*":
            raise ValueError(
                f"approver {who!r}: use a role ({', '.join(APPROVER_ROLES)}), a user id (U…) or a "
                "user-group id (S…); '*' would let anyone approve"
            )
    return v


class ApprovalSettings(_Model):
    """An action in ``actions`` becomes a request that waits until someone in ``approvers`` other than
    the requester approves it (or denies it, or ``expires`` seconds pass)."""

    actions: list[ApprovalAction] = Field(min_length=1)
    #: role names (``admin``, ``operator``, ``viewer``), user ids (``U…``) or user-group ids (``S…``)
    approvers: Annotated[list[str], AfterValidator(_approvers)] = Field(min_length=1)
    expires: Annotated[Seconds, must(lambda v: v <= 7 * 86400, _TOO_LONG)] = DEFAULT_EXPIRES


class CrashClass(StrEnum):
    """Why a job failed; the values appear in alerts and in ``auto_restart.on``."""

    NCCL_TIMEOUT = "nccl_timeout"
    NCCL_ERROR = "nccl_error"
    CUDA_OOM = "cuda_oom"
    HOST_OOM = "host_oom"  #: the kernel's OOM killer, by its own line (log or dmesg)
    KILLED = "killed"  #: a SIGKILL with no OOM kill in the kernel's log (kill -9, a scheduler, a preemption)
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
    CrashClass.KILLED,
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


class JobConfig(_Model):
    """``[jobs.NAME]``: a training job on a host (``engine = "ssh"``) or a Slurm cluster's login node."""

    host: Annotated[str, AfterValidator(_known)]
    engine: str = "ssh"  #: the engine's name in :data:`pipeline.engines.ENGINES`, which checks it
    #: ``[jobs.NAME.slurm]`` as written: the Slurm engine's table (``pipeline.engines.slurm.SlurmSettings``)
    slurm: dict[str, Any] | None = None
    exec: list[str] = []  #: argv prefix, e.g. ["pct","exec","200","--"]
    workdir: HostPath
    #: argv run in workdir (the ssh engine's; unused on Slurm)
    launch: Annotated[list[str], must(lambda v: v and v[0], "needs at least the program to run")] = []
    log: HostPath  #: training log path on the host
    match: Annotated[str, AfterValidator(_regex)]  #: regex searched in each process's full command line
    processes: int = Field(default=1, ge=1)
    start_window: Seconds = 10.0
    stop_timeout: Seconds = 30.0
    lock_scope: Literal["job", "host"] = "job"
    clear_cache: Annotated[list[str], must(_safe, _UNSAFE, each=True)] = []
    confirm: bool = False
    channel: str | None = None
    gpus: GpuRoles | None = None
    metrics: Literal["jsonl"] | MetricsPattern = "jsonl"
    metrics_log: str | None = None
    checkpoint_dir: HostPath | None = None  #: where the job's checkpoints are; verify checks the run resumed
    total_steps: int | None = Field(default=None, ge=1)  #: the run's last step: digests give % and ETA
    #: the most a restart may lose: an int is steps, a duration string ("10m") is seconds of training
    max_lost: Annotated[int | LostDuration | None, BeforeValidator(_lost)] = None
    patches: Annotated[
        dict[str, Annotated[LocalPath, AfterValidator(_found)]],
        matching(r"[A-Za-z0-9][A-Za-z0-9_.-]*", _PATCH_NAME, each=True),
    ] = {}
    watch: WatchSettings = WatchSettings()
    digest: DigestSettings = DigestSettings()
    auth: JobAuth = JobAuth()
    approval: ApprovalSettings | None = None  #: the two-person rule (:class:`ApprovalSettings`)
    #: who the job's alerts page and DM: user ids (``U…``/``W…``) or user-group ids (``S…``)
    owners: Annotated[list[str], matching(r"[SUW][A-Z0-9]{2,}", _NOT_PERSON, each=True)] = []
    notify_last_actor: bool = False  #: the user who last started or restarted it is an owner too

    @property
    def metrics_path(self) -> str:
        """The file metric lines are read from (``metrics_log``, else ``log``)."""
        return self.metrics_log or self.log
