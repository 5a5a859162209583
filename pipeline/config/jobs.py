"""A job's ``[jobs.NAME]`` table and its sub-tables (``gpus``, ``metrics``, ``auth``, ``watch`` with
``auto_restart`` and the crash classes, ``digest``, and ``approval``: the two-person rule — which
actions on a job wait for a second person; the rules: :mod:`handlers.approval.twoperson`, the
record: :mod:`pipeline.state.approvals`).  What suits the
job's ``engine``, and the engine's own table (``[jobs.NAME.slurm]``), the engine checks
(:func:`pipeline.engines.base.check_engines`)."""

from __future__ import annotations

import datetime as dt
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, model_validator

from pipeline import fmt
from pipeline.config.base import (
    SLACK_ID,
    LocalPath,
    Members,
    Seconds,
    _Model,
    matching,
    must,
    seconds_setting,
)

HostPath = Annotated[str, matching("(?s)/.*", "must be an absolute path on the host")]


def _regex(v: str) -> str:
    try:
        re.compile(v)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from exc
    return v


_NOT_PERSON = (
    "owner {v!r}: use a user id (U…/W…) or a user-group id (S…), as Slack shows them "
    "in a profile's ⋮ → Copy member ID"
)
_NO_STEP = 'names no {{step}}: give the step as an argument, e.g. ["--resume-step", "{{step}}"]'
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

    admins: Members | None = None
    operators: Members | None = None
    viewers: Members | None = None


#: what ``actions`` may list: ``restart_with_patch`` is a restart that applies or reverts a patch;
#: ``restart`` is every restart (with or without patches); ``drain``: ``drain`` and ``undrain`` of a node
#: of the job's Slurm cluster
ApprovalAction = Literal["restart_with_patch", "restart", "start", "stop", "unlock", "drain"]

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
        if who not in APPROVER_ROLES and not re.fullmatch(SLACK_ID, who):
            raise ValueError(
                f"approver {who!r} is not a role ({', '.join(APPROVER_ROLES)}) nor a Slack id: use a user "
                "id (U…/W…) or a user-group id (S…), as Slack shows them in a profile's ⋮ → Copy member ID"
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
    PREEMPTED = "preempted"  #: the scheduler preempted it (Slurm's ``PREEMPTED``): not a crash
    TIME_LIMIT = "time_limit"  #: it reached its time limit (Slurm's ``TIMEOUT``): not a crash
    NODE_FAIL = "node_fail"  #: a node of it failed (Slurm's ``NODE_FAIL``): the node is suspect


#: Stops the scheduler made, never crashes: restarted automatically whatever ``auto_restart.on``
#: says, without spending an attempt, and never stopped by the no-progress rule.
SCHEDULED: tuple[CrashClass, ...] = (CrashClass.PREEMPTED, CrashClass.TIME_LIMIT)


class ExitPolicy(StrEnum):
    """What a job's own exit code asks of the next automatic restart (``[jobs.NAME] exit_codes``)."""

    NO_RESTART = "no_restart"  #: no automatic restart: the job said another would not help
    RESTART_ELSEWHERE = "restart_elsewhere"  #: restart without the node the failing rank ran on


#: ``exit_codes``' default, as the resiliency tools define them: nvidia-resiliency-ext exits 93 when
#: it gives up on no progress; Megatron-LM's rerun state machine exits 17 on a failed validation and
#: 16 to be rerun on other hardware.
DEFAULT_EXIT_CODES: dict[int, ExitPolicy] = {
    93: ExitPolicy.NO_RESTART,
    17: ExitPolicy.NO_RESTART,
    16: ExitPolicy.RESTART_ELSEWHERE,
}


#: The classes a restart may cure: ``auto_restart.on``'s default.
TRANSIENT: tuple[CrashClass, ...] = (
    CrashClass.NCCL_TIMEOUT,
    CrashClass.NCCL_ERROR,
    CrashClass.XID,
    CrashClass.HOST_OOM,
    CrashClass.KILLED,
    CrashClass.UNKNOWN,
    CrashClass.NODE_FAIL,
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
    #: seconds a job the scheduler requeued (a preemption) may stay PENDING before it is an incident
    pending_after: Seconds = 600.0
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
    #: a loss above this many times its rolling median (over ``loss_window`` steps) for
    #: ``loss_spike_steps`` steps → a ``loss_spike`` incident (:mod:`pipeline.observe.loss`)
    loss_spike: float = Field(default=3.0, gt=1)
    loss_window: int = Field(default=200, ge=2)  #: steps whose losses make the rolling median
    loss_spike_steps: int = Field(default=20, ge=1)  #: steps a spike lasts before it is an incident
    #: a NaN or infinite loss (``loss_nan``): ``alert`` only, or ``stop`` the job too (no GPU hours on garbage)
    on_loss_nan: Literal["alert", "stop"] = "alert"

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


_NOT_NOTIFIED = (
    'notify {v!r}: use "owners", "channel" (@here in the job\'s channel), "pager", a user id (U…) '
    "or a user-group id (S…)"
)


class EscalationStep(_Model):
    """One step of an escalation policy: ``{ after = "30m", notify = ["S0LEADS", "pager"] }``."""

    after: Seconds  #: seconds from the incident's start after which it is taken, if nobody acked
    #: who is told: ``owners``, ``channel`` (@here), ``pager``, user ids (``U…``/``W…``), user-group ids (``S…``)
    notify: Annotated[
        list[str], matching(r"owners|channel|pager|[SUW][A-Z0-9]{2,}", _NOT_NOTIFIED, each=True)
    ] = Field(min_length=1)


_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_BAD_HOURS = (
    "hours {v!r}: write days, a time range and a timezone, e.g. 'mon-fri 09:00-19:00 Europe/Berlin' "
    "(days: mon…sun, ranges and lists such as 'mon-fri' or 'sat,sun'; a range past midnight such as "
    "'22:00-06:00' belongs to the day it starts)"
)


class PageHours(_Model):
    """``hours = "mon-fri 09:00-19:00 Europe/Berlin"``: when an escalation step may page."""

    text: str  #: as written
    days: frozenset[int]  #: weekdays, Monday 0
    start: int  #: minutes after midnight
    end: int  #: minutes after midnight (<= start: the window ends the next day)
    timezone: str  #: an IANA name

    def contains(self, ts: float) -> bool:
        """True if the moment ``ts`` (unix s) is within these hours."""
        local = dt.datetime.fromtimestamp(ts, fmt.timezone_of(self.timezone))
        minute, day = local.hour * 60 + local.minute, local.weekday()
        if self.start < self.end:
            return day in self.days and self.start <= minute < self.end
        if minute >= self.start:
            return day in self.days
        return minute < self.end and (day - 1) % 7 in self.days


def _page_hours(value: object) -> object:
    if not isinstance(value, str):
        return value
    problem = ValueError(_BAD_HOURS.format(v=value))
    parts = value.split()
    if len(parts) != 3:
        raise problem
    days: set[int] = set()
    for item in parts[0].lower().split(","):
        first, _, last = item.partition("-")
        if first not in _DAYS or (last and last not in _DAYS):
            raise problem
        a, b = _DAYS.index(first), _DAYS.index(last or first)
        days.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    times = re.fullmatch(r"([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-4]):([0-5]\d)", parts[1])
    if times is None or fmt.timezone_of(parts[2]).key != parts[2]:
        raise problem
    h1, m1, h2, m2 = (int(g) for g in times.groups())
    start, end = h1 * 60 + m1, h2 * 60 + m2
    if start == end or end > 24 * 60:
        raise problem
    return PageHours(text=value, days=frozenset(days), start=start, end=end, timezone=parts[2])


class EscalationPolicy(_Model):
    """``[jobs.NAME.escalation]`` or ``[escalation.NAME]``: the steps an unacknowledged incident
    escalates through, each taken once at its ``after`` (:mod:`handlers.watch.escalate`)."""

    steps: list[EscalationStep] = Field(min_length=1)
    #: when a step may page (``"mon-fri 09:00-19:00 Europe/Berlin"``); outside them it goes to Slack only
    hours: Annotated[PageHours | None, BeforeValidator(_page_hours)] = None

    @model_validator(mode="after")
    def _in_order(self) -> EscalationPolicy:
        afters = [step.after for step in self.steps]
        if afters != sorted(set(afters)):
            raise ValueError("steps: each step's after must be later than the one before")
        return self

    @property
    def pages(self) -> bool:
        """True if a step notifies the pager."""
        return any("pager" in step.notify for step in self.steps)

    def may_page(self, ts: float) -> bool:
        """True if a step taken at ``ts`` (unix s) may page: within ``hours``, or always without."""
        return self.hours is None or self.hours.contains(ts)


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
    #: how pre-flight checks the checkpoint a restart resumes from: its manifest's sizes, or SHA-256 too
    verify_checkpoint: Literal["size", "sha256"] = "size"
    #: argv appended to ``launch`` by ``restart JOB from step S`` (``{step}`` is S), e.g.
    #: ``["--resume-step", "{step}"]``; empty: the job cannot be rolled back
    resume_from: Annotated[list[str], must(lambda v: not v or any("{step}" in a for a in v), _NO_STEP)] = []
    total_steps: int | None = Field(default=None, ge=1)  #: the run's last step: digests give % and ETA
    #: the most a restart may lose: an int is steps, a duration string ("10m") is seconds of training
    max_lost: Annotated[int | LostDuration | None, BeforeValidator(_lost)] = None
    patches: Annotated[
        dict[str, Annotated[LocalPath, AfterValidator(_found)]],
        matching(r"[A-Za-z0-9][A-Za-z0-9_.-]*", _PATCH_NAME, each=True),
    ] = {}
    watch: WatchSettings = WatchSettings()
    #: the job's own exit codes (1-255) → what the next automatic restart does; replaces the default
    exit_codes: dict[Annotated[int, Field(ge=1, le=255)], ExitPolicy] = dict(DEFAULT_EXIT_CODES)
    digest: DigestSettings = DigestSettings()
    auth: JobAuth = JobAuth()
    approval: ApprovalSettings | None = None  #: the two-person rule (:class:`ApprovalSettings`)
    #: who the job's alerts page and DM: user ids (``U…``/``W…``) or user-group ids (``S…``)
    owners: Annotated[list[str], matching(r"[SUW][A-Z0-9]{2,}", _NOT_PERSON, each=True)] = []
    notify_last_actor: bool = False  #: the user who last started or restarted it is an owner too
    #: how its unacknowledged incidents escalate: a table, or the name of an ``[escalation.NAME]``
    escalation: EscalationPolicy | str | None = None

    @property
    def metrics_path(self) -> str:
        """The file metric lines are read from (``metrics_log``, else ``log``)."""
        return self.metrics_log or self.log
