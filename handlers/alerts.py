"""Replies for the watcher's posts: alerts, their headline updates and thread notes.

An incident's alert is the headline message under key ``incident:JOB:N``
(:meth:`~handlers.outbox.Outbox.announce`); reminders, kind changes, acknowledgements,
automatic restarts and the "resolved after N min" note go in its thread, and the headline
is updated in place (resolved, acknowledged) — built here from the stored
:class:`~pipeline.state.incidents.Incident` alone, so any process can rebuild it.
"""

from __future__ import annotations

import time

from handlers.reply import Reply, Status, mention
from handlers.reply import mention as _mention
from handlers.text import ALERT_FIELD_LABELS, ALERT_NEVER_SEEN, ALERT_NO_LOG
from pipeline import fmt
from pipeline.config import AutoRestart, Config
from pipeline.errors import ExitCode
from pipeline.state.incidents import LOG_LINES, Incident, IncidentKind


def mention_of(config: Config) -> str | None:
    """The configured ``alert_mention`` in Slack syntax, or None."""
    target = config.slack.alert_mention
    return mention(target) if target else None


def job_owners(config: Config, job: str, last_actor: str | None) -> tuple[str, ...]:
    """Who owns ``job``: ``[jobs.NAME] owners``, plus with ``notify_last_actor`` ``last_actor``
    (the user who last started or restarted it, if a user id)."""
    spec = config.jobs.get(job)
    if spec is None:
        return ()
    actor = last_actor if spec.notify_last_actor else None
    extra = [actor] if actor and actor.startswith(("U", "W")) else []
    return tuple(dict.fromkeys([*spec.owners, *extra]))


def owners_of(incident: Incident, config: Config) -> tuple[str, ...]:
    """Who owns the incident's job (:func:`job_owners`, with the actor recorded when it opened)."""
    return job_owners(config, incident.job, incident.last_actor)


def page_by_dm(config: Config, key: str) -> list[str]:
    """Who gets an alert by DM when no channel takes it: its job's owners, then the admins.

    :param key: the alert's key, ``incident:JOB:N``.
    :returns: user and user-group ids, in that order, without ``"*"``.
    """
    job = key.removeprefix("incident:").rpartition(":")[0]
    owners = config.jobs[job].owners if job in config.jobs else []
    return [who for who in dict.fromkeys([*owners, *config.auth.admins]) if who != "*"]


def _fields(incident: Incident, config: Config, now: float) -> tuple[tuple[str, str], ...]:
    label = ALERT_FIELD_LABELS
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
                alert_when(fmt.clock(incident.last_alive_at, tz), now - incident.last_alive_at),
            )
        )
    else:
        out.append((label["last_alive"], ALERT_NEVER_SEEN))
    if incident.exit_cause:
        out.append((label["exit"], incident.exit_cause))
    if incident.error:
        out.append((label["error"], incident.error))
    out.append((label["opened"], fmt.clock(incident.opened_at, tz)))
    if incident.auto_restarts:
        out.append((label["auto"], str(incident.auto_restarts)))
    if incident.acked_by:
        out.append((label["acked"], mention(incident.acked_by)))
    return tuple(out)


def _title(incident: Incident, config: Config, now: float) -> str:
    quiet = None
    if incident.kind is IncidentKind.STALLED and incident.job in config.jobs:
        quiet = config.jobs[incident.job].watch.stall_after + (now - incident.opened_at)
    return alert_title(
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
    if incident.story is not None:
        return _member_reply(incident, config, now)
    lines: list[str] = []
    owners = owners_of(incident, config) if mention else ()
    who = " ".join(w for w in (mention_of(config) if mention else None, *map(_mention, owners)) if w)
    lines.append(alert_mention_line(who or None, incident.job))
    if incident.cause:
        lines.append(alert_detected_cause(incident.cause))
    if incident.kind is IncidentKind.CRASH_LOOP:
        policy = _policy(incident, config)
        within = policy.within if policy else 0.0
        lines.append(crash_loop_gave_up(incident.job, incident.auto_restarts, within))
    if incident.next_auto_at is not None:
        policy = _policy(incident, config)
        limit = policy.max if policy else 0
        lines.append(
            auto_restart_planned(incident.job, incident.next_auto_at - now, incident.auto_restarts + 1, limit)
        )
    severe = incident.kind in (IncidentKind.DEAD, IncidentKind.CRASH_LOOP)
    log_path = config.jobs[incident.job].log if incident.job in config.jobs else ""
    log = incident.log
    if log is None and incident.kind is not IncidentKind.UNREACHABLE:
        lines.append(ALERT_NO_LOG)
    return Reply(
        title=_title(incident, config, now),
        page=config.slack.alert_mention if mention else None,
        owners=owners,
        status=Status.ERROR if severe else Status.WARNING,
        lines=tuple(lines),
        fields=_fields(incident, config, now),
        log=log or None,
        log_title=alert_log_title(LOG_LINES, log_path) if log else "",
        thread_key=incident.thread_key,
        exit_code=ExitCode.FAILED,
    )


def _member_reply(incident: Incident, config: Config, now: float) -> Reply:
    """An incident told in a grouped post (:mod:`handlers.storm`): its own short message, one line
    (and the cause found, who acknowledged it); the story's headline pages and says how to ack."""
    lines = [alert_detected_cause(incident.cause)] if incident.cause else []
    severe = incident.kind in (IncidentKind.DEAD, IncidentKind.CRASH_LOOP)
    fields = ((ALERT_FIELD_LABELS["acked"], mention(incident.acked_by)),) if incident.acked_by else ()
    return Reply(
        title=_title(incident, config, now),
        status=Status.ERROR if severe else Status.WARNING,
        lines=tuple(lines),
        fields=fields,
        thread_key=incident.thread_key,
        exit_code=ExitCode.FAILED,
    )


def _policy(incident: Incident, config: Config) -> AutoRestart | None:
    return config.jobs[incident.job].watch.auto_restart if incident.job in config.jobs else None


def _open_for(incident: Incident, now: float) -> float:
    """Seconds from the incident's opening to its resolution (or to ``now``)."""
    return (incident.resolved_at if incident.resolved_at is not None else now) - incident.opened_at


def _resolved_text(i: Incident, now: float) -> str:
    return incident_resolved(
        i.job, i.kind.value, _open_for(i, now), i.resolution or "running", i.count, i.expected
    )


def resolved_headline(incident: Incident, config: Config, *, now: float | None = None) -> Reply:
    """The alert's headline updated in place once the incident resolved."""
    now = time.time() if now is None else now
    return Reply(
        title=alert_resolved_title(incident.kind.value, incident.job, _open_for(incident, now)),
        status=Status.OK,
        lines=(_resolved_text(incident, now),),
        fields=_fields(incident, config, now) if incident.story is None else (),
        thread_key=incident.thread_key,
    )


def resolved_reply(incident: Incident, *, now: float | None = None) -> Reply:
    """The thread note ``resolved after N min``."""
    now = time.time() if now is None else now
    return Reply(title=_resolved_text(incident, now), status=Status.OK, thread_key=incident.thread_key)


def reminder_reply(incident: Incident, config: Config, *, now: float | None = None) -> Reply:
    """The thread re-post of an open, unacknowledged incident (mentions ``alert_mention`` and the
    job's owners)."""
    now = time.time() if now is None else now
    owners = owners_of(incident, config)
    who = " ".join(w for w in (mention_of(config), *map(_mention, owners)) if w)
    text = incident_reminder(incident.job, incident.kind.value, now - incident.opened_at)
    return Reply(
        title=f"{who} {text}" if who else text,
        page=config.slack.alert_mention,
        owners=owners,
        status=Status.WARNING,
        thread_key=incident.thread_key,
    )


def changed_reply(incident: Incident, previous: IncidentKind) -> Reply:
    """The thread note when the open incident became another kind."""
    return Reply(
        title=incident_changed(
            incident.job, previous.value, incident.kind.value, incident.count, incident.expected
        ),
        status=Status.WARNING,
        lines=(alert_detected_cause(incident.cause),) if incident.cause else (),
        log=incident.log or None,
        thread_key=incident.thread_key,
    )


def acked_reply(incident: Incident, user: str) -> Reply:
    """The thread note and the requester's answer for ``ack JOB``."""
    return Reply(title=incident_acked(incident.job, user), status=Status.OK, thread_key=incident.thread_key)


def give_up_reply(incident: Incident, config: Config) -> Reply:
    """The single crash-loop alert, in the incident's thread (mentions ``alert_mention``)."""
    policy = _policy(incident, config)
    text = incident.no_auto or crash_loop_gave_up(
        incident.job, incident.auto_restarts, policy.within if policy else 0.0
    )
    if incident.no_auto is None and incident.cause:
        text += f" ({alert_detected_cause(incident.cause)})"
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
    policy = _policy(incident, config)
    return Reply(
        title=auto_restart_started(
            incident.job, incident.auto_restarts, policy.max if policy else 0, answer.title
        ),
        status=Status.INFO,
        thread_key=incident.thread_key,
        run_id=answer.run_id,
    )


# --- text ---------------------------------------------------------------------------------------


def alert_title(kind: str, job: str, host: str, count: int, expected: int, quiet_for: float | None) -> str:
    """The headline of a new alert, by incident kind."""
    if kind == "dead":
        return f"{job} is down: no processes left on {host} (expected {expected})"
    if kind == "degraded":
        return f"{job} is degraded: {count}/{expected} processes on {host}"
    if kind == "stalled":
        idle = f" for {fmt.duration(quiet_for)}" if quiet_for is not None else ""
        return f"{job} has stalled: alive ({count}/{expected}) but no new log output{idle}"
    if kind == "stuck_rank":
        return f"{job} has a stuck rank on {host}: one rank stopped advancing while the others wait"
    if kind == "unreachable":
        return f"host {host} unreachable - cannot check {job}"
    if kind == "crash_loop":
        return f"{job} is crash-looping on {host} - automatic restarts given up"
    if kind == "idle_gpus":
        return f"{job} has idle GPUs on {host}: alive ({count}/{expected}) but GPUs it holds are not working"
    return f"{job}: {kind} on {host}"


def alert_resolved_title(kind: str, job: str, after: float) -> str:
    """The alert's headline once its incident resolved."""
    was = _WAS.get(kind, f"was {kind.replace('_', ' ')}")
    return f"resolved: {job} {was} for {fmt.duration(after)}"


#: how a resolved incident's headline says what the job was, by incident kind
_WAS = {
    "dead": "was down",
    "degraded": "was degraded",
    "stalled": "was stalled",
    "stuck_rank": "had a stuck rank",
    "unreachable": "was unreachable",
    "crash_loop": "was crash-looping",
    "idle_gpus": "had idle GPUs",
}


def alert_mention_line(mention: str | None, job: str) -> str:
    """The first line of an alert: who is called, and how to silence it."""
    who = f"{mention} " if mention else ""
    return f"{who}`ack {job}` to acknowledge, `watch {job} off for 2h` to pause watching"


def alert_detected_cause(cause: str) -> str:
    """The cause found in the log."""
    return f"detected cause: {cause}"


def alert_log_title(lines: int, path: str) -> str:
    """The caption of an alert's log excerpt."""
    return f"last {lines} lines of {path}"


def alert_when(clock: str, ago: float) -> str:
    """A moment as clock time and age: ``14:02:11 UTC (3 min ago)``."""
    return f"{clock} ({fmt.duration(ago)} ago)"


def alert_exit_cause(code: int | None, signal: str | None) -> str:
    """How the job's launched process ended, from its waiter's record."""
    if signal:
        hint = " (the kernel's OOM killer, or someone's kill -9)" if signal == "SIGKILL" else ""
        return f"killed by {signal}{hint}"
    if code is None:
        return "ended (status unknown)"
    return f"exited with code {code}"


def incident_resolved(job: str, kind: str, after: float, resolution: str, count: int, expected: int) -> str:
    """The thread reply when an incident resolves."""
    if resolution == "stopped":
        return f"resolved after {fmt.duration(after)}: {job} was stopped on purpose"
    if resolution == "reachable":
        return f"resolved after {fmt.duration(after)}: the host of {job} is reachable again"
    if kind == "idle_gpus":
        return f"resolved after {fmt.duration(after)}: the GPUs of {job} are working again"
    return f"resolved after {fmt.duration(after)}: {job} is running again ({count}/{expected} processes)"


def incident_reminder(job: str, kind: str, open_for: float) -> str:
    """The thread re-post of an incident still open and not acknowledged."""
    return (
        f"still {kind.replace('_', ' ')}: {job}, for {fmt.duration(open_for)} - `ack {job}` to stop reminders"
    )


def incident_changed(job: str, old: str, new: str, count: int, expected: int) -> str:
    """The open incident became another kind."""
    return f"{job} is now {new.replace('_', ' ')} (was {old.replace('_', ' ')}): {count}/{expected} processes"


def incident_acked(job: str, user: str) -> str:
    """The thread note and reply of ``ack JOB``."""
    return f"acknowledged by {mention(user)} - no more reminders for {job} until it resolves"


def auto_restart_planned(job: str, delay: float, attempt: int, limit: int) -> str:
    """An alert's note that an automatic restart will follow."""
    return f"automatic restart {attempt}/{limit} of {job} in {fmt.duration(delay)}"


def auto_restart_started(job: str, attempt: int, limit: int, answer: str) -> str:
    """The incident thread note when an automatic restart is requested."""
    return f"automatic restart {attempt}/{limit} of {job}: {answer}"


def crash_loop_gave_up(job: str, restarts: int, within: float) -> str:
    """The single give-up alert of a crash loop."""
    return (
        f"{job} crashed again after {restarts} automatic restarts within {fmt.duration(within)} - "
        "crash loop, giving up; restart it by hand once the cause is fixed"
    )
