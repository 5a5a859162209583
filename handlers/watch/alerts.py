"""Replies for the watcher's posts: an incident's alert (the headline ``incident:JOB:N``), its
headline updates (resolved, acknowledged) and its thread notes — built from the stored
:class:`~pipeline.state.incidents.Incident` alone, so any process can rebuild them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import replace

from handlers import text as words
from handlers.reply import Reply, Status
from pipeline import fmt
from pipeline.config import AutoRestart, Config
from pipeline.errors import ExitCode
from pipeline.state.incidents import LOG_LINES, Incident, IncidentKind


def job_owners(config: Config, job: str, last_actor: str | None) -> tuple[str, ...]:
    """Who owns ``job``: ``[jobs.NAME] owners``, plus with ``notify_last_actor`` ``last_actor``
    (the user who last started or restarted it, if a user id)."""
    spec = config.jobs.get(job)
    if spec is None:
        return ()
    actor = last_actor if spec.notify_last_actor else None
    extra = [actor] if actor and actor.startswith(("U", "W")) else []
    return tuple(dict.fromkeys([*spec.owners, *extra]))


def paged(config: Config, incidents: Iterable[Incident]) -> tuple[tuple[str, ...], str]:
    """The owners of the incidents' jobs (:func:`job_owners`, with the actor recorded when each
    opened), and the mentions that page ``alert_mention`` and them ("" for nobody)."""
    owners = tuple(dict.fromkeys(o for i in incidents for o in job_owners(config, i.job, i.last_actor)))
    page = config.slack.alert_mention
    return owners, " ".join(w for w in (page and words.mention(page), *map(words.mention, owners)) if w)


def page_by_dm(config: Config, key: str) -> list[str]:
    """Who gets an alert (key ``incident:JOB:N``) by DM when no channel takes it: its job's owners,
    then the admins (user and user-group ids, without ``"*"``)."""
    job = key.removeprefix("incident:").rpartition(":")[0]
    owners = config.jobs[job].owners if job in config.jobs else []
    return [who for who in dict.fromkeys([*owners, *config.auth.admins]) if who != "*"]


def _fields(incident: Incident, config: Config, now: float) -> tuple[tuple[str, str], ...]:
    """The alert's fields, those without a value left out."""
    tz, seen, auto = config.scheduler.timezone, incident.last_alive_at, incident.auto_restarts
    values = {
        "job": incident.job,
        "host": incident.host,
        "processes": f"{incident.count}/{incident.expected}",
        "last_pid": str(incident.last_pid) if incident.last_pid is not None else "",
        "last_alive": f"{fmt.clock(seen, tz)} ({fmt.duration(now - seen)} ago)"
        if seen is not None
        else words.ALERT_NEVER_SEEN,
        "exit": incident.exit_cause or "",
        "error": incident.error or "",
        "opened": fmt.clock(incident.opened_at, tz),
        "auto": str(auto) if auto else "",
        "acked": words.mention(incident.acked_by) if incident.acked_by else "",
    }
    return tuple((words.ALERT_FIELD_LABELS[key], value) for key, value in values.items() if value)


def _title(i: Incident, config: Config, now: float) -> str:
    """The headline of a new alert, by incident kind (:data:`~handlers.text.ALERT_TITLES`)."""
    quiet = config.jobs[i.job].watch.stall_after + (now - i.opened_at) if i.job in config.jobs else None
    idle = f" for {fmt.duration(quiet)}" if quiet is not None else ""
    said = words.ALERT_TITLES.get(i.kind, "{job}: {kind} on {host}")
    procs, kind = f"{i.count}/{i.expected}", i.kind.value
    return said.format(job=i.job, host=i.host, procs=procs, expected=i.expected, idle=idle, kind=kind)


_SEVERE = (IncidentKind.DEAD, IncidentKind.CRASH_LOOP)  #: alerts shown as errors, the others as warnings


def alert_reply(
    incident: Incident, config: Config, *, now: float | None = None, mention: bool = True
) -> Reply:
    """The headline of an open incident: what, where, since when, the cause and the log tail.

    :param now: unix s (default: the current time), for "N min ago".
    :param mention: include ``alert_mention`` (the first post); headline updates leave it out.
    :returns: a WARNING reply (ERROR for dead and crash loops) keyed ``incident:JOB:N``.
    """
    now = time.time() if now is None else now
    job, policy = incident.job, _policy(incident, config)
    fields = _fields(incident, config, now)
    lines = [words.alert_detected_cause(incident.cause)] if incident.cause else []
    if incident.story is not None:  # told in a grouped post, whose headline pages and says how to ack
        acked = words.ALERT_FIELD_LABELS["acked"]
        fields, log, mention = tuple((k, v) for k, v in fields if k == acked), None, False
    else:
        log = incident.log
        lines.insert(0, f"`ack {job}` to acknowledge, `watch {job} off for 2h` to pause watching")
        if incident.kind is IncidentKind.CRASH_LOOP:
            lines.append(words.crash_loop_gave_up(incident, policy))
        if incident.next_auto_at is not None:  # an automatic restart will follow
            delay, limit = fmt.duration(incident.next_auto_at - now), policy.max if policy else 0
            lines.append(f"automatic restart {incident.auto_restarts + 1}/{limit} of {job} in {delay}")
        if log is None and incident.kind is not IncidentKind.UNREACHABLE:
            lines.append(words.ALERT_NO_LOG)
    owners, who = paged(config, [incident]) if mention else ((), "")
    if who:
        lines[0] = f"{who} {lines[0]}"
    log_path = config.jobs[job].log if job in config.jobs else ""
    return Reply(
        title=_title(incident, config, now),
        page=config.slack.alert_mention if mention else None,
        owners=owners,
        status=Status.ERROR if incident.kind in _SEVERE else Status.WARNING,
        lines=tuple(lines),
        fields=fields,
        log=log or None,
        log_title=f"last {LOG_LINES} lines of {log_path}" if log else "",
        thread_key=incident.thread_key,
        exit_code=ExitCode.FAILED,
    )


def _policy(incident: Incident, config: Config) -> AutoRestart | None:
    return config.jobs[incident.job].watch.auto_restart if incident.job in config.jobs else None


def _open_for(incident: Incident, now: float) -> float:
    """Seconds from the incident's opening to its resolution (or to ``now``)."""
    return (incident.resolved_at if incident.resolved_at is not None else now) - incident.opened_at


def resolved_headline(incident: Incident, config: Config, *, now: float) -> Reply:
    """The alert's headline updated in place once the incident resolved."""
    was = words.ALERT_WAS.get(incident.kind.value, f"was {incident.kind.value.replace('_', ' ')}")
    return Reply(
        title=f"resolved: {incident.job} {was} for {fmt.duration(_open_for(incident, now))}",
        status=Status.OK,
        lines=(words.incident_resolved(incident, _open_for(incident, now)),),
        fields=_fields(incident, config, now) if incident.story is None else (),
        thread_key=incident.thread_key,
    )


def resolved_reply(incident: Incident, *, now: float) -> Reply:
    """The thread note ``resolved after N min``."""
    text = words.incident_resolved(incident, _open_for(incident, now))
    return Reply(title=text, status=Status.OK, thread_key=incident.thread_key)


def reminder_reply(incident: Incident, config: Config, *, now: float) -> Reply:
    """The thread re-post of an open, unacknowledged incident (mentions ``alert_mention`` and the
    job's owners)."""
    text = words.incident_reminder(incident.job, incident.kind.value, now - incident.opened_at)
    return paging_reminder(config, [incident], text, incident.thread_key)


def paging_reminder(
    config: Config, incidents: Sequence[Incident], text: str, key: str, lines: tuple[str, ...] = ()
) -> Reply:
    """A reminder in the thread ``key``: ``text`` paging ``alert_mention`` and the incidents' owners again."""
    owners, who = paged(config, incidents)
    title = f"{who} {text}" if who else text
    return Reply(title, Status.WARNING, lines, page=config.slack.alert_mention, owners=owners, thread_key=key)


def changed_reply(incident: Incident, previous: IncidentKind) -> Reply:
    """The thread note when the open incident became another kind."""
    new, old = incident.kind.value.replace("_", " "), previous.value.replace("_", " ")
    return Reply(
        title=f"{incident.job} is now {new} (was {old}): {incident.count}/{incident.expected} processes",
        status=Status.WARNING,
        lines=(words.alert_detected_cause(incident.cause),) if incident.cause else (),
        log=incident.log or None,
        thread_key=incident.thread_key,
    )


def acked_reply(incident: Incident, user: str) -> Reply:
    """The thread note and the requester's answer for ``ack JOB``."""
    text = f"acknowledged by {words.mention(user)} - no more reminders for {incident.job} until it resolves"
    return Reply(title=text, status=Status.OK, thread_key=incident.thread_key)


def give_up_reply(incident: Incident, config: Config) -> Reply:
    """The single crash-loop alert, in the incident's thread (mentions ``alert_mention``)."""
    text = incident.no_auto or words.crash_loop_gave_up(incident, _policy(incident, config))
    if incident.no_auto is None and incident.cause:
        text += f" ({words.alert_detected_cause(incident.cause)})"
    return replace(
        paging_reminder(config, [], text, incident.thread_key), status=Status.ERROR, exit_code=ExitCode.FAILED
    )


def auto_restart_reply(incident: Incident, config: Config, answer: Reply) -> Reply:
    """The thread note when an automatic restart was requested, with the dispatcher's answer."""
    policy = _policy(incident, config)
    attempt = f"{incident.auto_restarts}/{policy.max if policy else 0}"
    return Reply(
        title=f"automatic restart {attempt} of {incident.job}: {answer.title}",
        status=Status.INFO,
        thread_key=incident.thread_key,
        run_id=answer.run_id,
    )
