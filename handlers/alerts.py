"""Replies for the watcher's posts: alerts, their headline updates and thread notes.

An incident's alert is the headline message under key ``incident:JOB:N``
(:meth:`~handlers.outbox.Outbox.announce`); reminders, kind changes, acknowledgements,
automatic restarts and the "resolved after N min" note go in its thread, and the headline
is updated in place (resolved, acknowledged) — built here from the stored
:class:`~pipeline.watch.Incident` alone, so any process can rebuild it.
"""

from __future__ import annotations

import time
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from handlers.reply import Reply, Status
from pipeline import messages
from pipeline.config import Config
from pipeline.errors import ExitCode
from pipeline.watch import LOG_LINES, Incident, IncidentKind


def clock(ts: float, timezone: str) -> str:
    """``14:02:11 UTC`` (with the date when not today) in the configured timezone."""
    try:
        tz = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        tz = ZoneInfo("UTC")
    at = datetime.fromtimestamp(ts, tz)
    today = datetime.now(tz).date()
    fmt = "%H:%M:%S %Z" if at.date() == today else "%Y-%m-%d %H:%M:%S %Z"
    return at.strftime(fmt)


def mention_of(config: Config) -> str | None:
    """The configured ``alert_mention`` in Slack syntax, or None."""
    target = config.slack.alert_mention
    return messages.slack_mention(target) if target else None


def _fields(incident: Incident, config: Config, now: float) -> tuple[tuple[str, str], ...]:
    label = messages.alert_field_labels()
    tz = config.scheduler.timezone
    out: list[tuple[str, str]] = [
        (label["job"], incident.job),
        (label["host"], incident.host),
        (label["processes"], f"{incident.count}/{incident.expected}"),
    ]
    if incident.last_pid is not None:
        out.append((label["last_pid"], str(incident.last_pid)))
    if incident.last_alive_at is not None:
        out.append(
            (
                label["last_alive"],
                messages.alert_when(clock(incident.last_alive_at, tz), now - incident.last_alive_at),
            )
        )
    else:
        out.append((label["last_alive"], messages.alert_never_seen()))
    if incident.exit_cause:
        out.append((label["exit"], incident.exit_cause))
    if incident.error:
        out.append((label["error"], incident.error))
    out.append((label["opened"], clock(incident.opened_at, tz)))
    if incident.auto_restarts:
        out.append((label["auto"], str(incident.auto_restarts)))
    if incident.acked_by:
        out.append((label["acked"], messages.slack_mention(incident.acked_by)))
    return tuple(out)


def _title(incident: Incident, config: Config, now: float) -> str:
    quiet = None
    if incident.kind is IncidentKind.STALLED and incident.job in config.jobs:
        quiet = config.jobs[incident.job].watch.stall_after + (now - incident.opened_at)
    return messages.alert_title(
        incident.kind.value, incident.job, incident.host, incident.count, incident.expected, quiet
    )


def alert_reply(
    incident: Incident, config: Config, *, now: float | None = None, mention: bool = True
) -> Reply:
    """The headline of an open incident: what, where, since when, the cause and the log tail.

    :param incident: the stored incident (numbered).
    :param config: for the job's log path, ``alert_mention`` and the timezone.
    :param now: unix s (default: the current time), for "N min ago".
    :param mention: include ``alert_mention`` (the first post); headline updates leave it out.
    :returns: a WARNING reply (ERROR for dead and crash loops) keyed ``incident:JOB:N``.
    """
    now = time.time() if now is None else now
    lines: list[str] = []
    who = mention_of(config) if mention else None
    lines.append(messages.alert_mention_line(who, incident.job))
    if incident.cause:
        lines.append(messages.alert_detected_cause(incident.cause))
    if incident.kind is IncidentKind.CRASH_LOOP:
        policy = config.jobs[incident.job].watch.auto_restart if incident.job in config.jobs else None
        within = policy.within if policy else 0.0
        lines.append(messages.crash_loop_gave_up(incident.job, incident.auto_restarts, within))
    if incident.next_auto_at is not None:
        policy = config.jobs[incident.job].watch.auto_restart if incident.job in config.jobs else None
        limit = policy.max if policy else 0
        lines.append(
            messages.auto_restart_planned(
                incident.job, incident.next_auto_at - now, incident.auto_restarts + 1, limit
            )
        )
    severe = incident.kind in (IncidentKind.DEAD, IncidentKind.CRASH_LOOP)
    log_path = config.jobs[incident.job].log if incident.job in config.jobs else ""
    log = incident.log
    if log is None and incident.kind is not IncidentKind.UNREACHABLE:
        lines.append(messages.alert_no_log())
    return Reply(
        title=_title(incident, config, now),
        page=config.slack.alert_mention if who else None,
        status=Status.ERROR if severe else Status.WARNING,
        lines=tuple(lines),
        fields=_fields(incident, config, now),
        log=log or None,
        log_title=messages.alert_log_title(LOG_LINES, log_path) if log else "",
        thread_key=incident.thread_key,
        exit_code=ExitCode.FAILED,
    )


def resolved_headline(incident: Incident, config: Config, *, now: float | None = None) -> Reply:
    """The alert's headline updated in place once the incident resolved."""
    now = time.time() if now is None else now
    ended = incident.resolved_at if incident.resolved_at is not None else now
    return Reply(
        title=messages.alert_resolved_title(incident.kind.value, incident.job, ended - incident.opened_at),
        status=Status.OK,
        lines=(
            messages.incident_resolved(
                incident.job,
                incident.kind.value,
                ended - incident.opened_at,
                incident.resolution or "running",
                incident.count,
                incident.expected,
            ),
        ),
        fields=_fields(incident, config, now),
        thread_key=incident.thread_key,
    )


def resolved_reply(incident: Incident, *, now: float | None = None) -> Reply:
    """The thread note ``resolved after N min``."""
    now = time.time() if now is None else now
    ended = incident.resolved_at if incident.resolved_at is not None else now
    return Reply(
        title=messages.incident_resolved(
            incident.job,
            incident.kind.value,
            ended - incident.opened_at,
            incident.resolution or "running",
            incident.count,
            incident.expected,
        ),
        status=Status.OK,
        thread_key=incident.thread_key,
    )


def reminder_reply(incident: Incident, config: Config, *, now: float | None = None) -> Reply:
    """The thread re-post of an open, unacknowledged incident (mentions ``alert_mention``)."""
    now = time.time() if now is None else now
    who = mention_of(config)
    text = messages.incident_reminder(incident.job, incident.kind.value, now - incident.opened_at)
    return Reply(
        title=f"{who} {text}" if who else text,
        page=config.slack.alert_mention,
        status=Status.WARNING,
        thread_key=incident.thread_key,
    )


def changed_reply(incident: Incident, previous: IncidentKind) -> Reply:
    """The thread note when the open incident became another kind."""
    return Reply(
        title=messages.incident_changed(
            incident.job, previous.value, incident.kind.value, incident.count, incident.expected
        ),
        status=Status.WARNING,
        lines=(messages.alert_detected_cause(incident.cause),) if incident.cause else (),
        log=incident.log or None,
        thread_key=incident.thread_key,
    )


def acked_reply(incident: Incident, user: str) -> Reply:
    """The thread note and the requester's answer for ``ack JOB``."""
    return Reply(
        title=messages.incident_acked(incident.job, user),
        status=Status.OK,
        thread_key=incident.thread_key,
    )


def give_up_reply(incident: Incident, config: Config) -> Reply:
    """The single crash-loop alert, in the incident's thread (mentions ``alert_mention``)."""
    policy = config.jobs[incident.job].watch.auto_restart if incident.job in config.jobs else None
    text = incident.no_auto or messages.crash_loop_gave_up(
        incident.job, incident.auto_restarts, policy.within if policy else 0.0
    )
    if incident.no_auto is None and incident.cause:
        text += f" ({messages.alert_detected_cause(incident.cause)})"
    who = mention_of(config)
    return Reply(
        title=f"{who} {text}" if who else text,
        page=config.slack.alert_mention,
        status=Status.ERROR,
        thread_key=incident.thread_key,
        exit_code=ExitCode.FAILED,
    )


def auto_restart_reply(incident: Incident, config: Config, answer: Reply) -> Reply:
    """The thread note when an automatic restart was requested, with the dispatcher's answer."""
    policy = config.jobs[incident.job].watch.auto_restart if incident.job in config.jobs else None
    return Reply(
        title=messages.auto_restart_started(
            incident.job, incident.auto_restarts, policy.max if policy else 0, answer.title
        ),
        status=Status.INFO,
        thread_key=incident.thread_key,
        run_id=answer.run_id,
    )
